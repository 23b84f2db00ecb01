/* policy/parse-value.c: the schema's readers of scalars (booleans,
 * numbers, sizes, percentages, one of a list) and mappings (known keys,
 * did-you-mean, where a misplaced key belongs), each with a located
 * "found X, expected Y" diagnostic (parse-int.h). */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "policy/parse-int.h"

void wo_schema_err(struct ctx *c, const struct wo_node *n, const char *fmt, ...)
{
    va_list ap;
    if (c->rule_errors_from != SIZE_MAX && c->diags && c->diags->nerrors > c->rule_errors_from)
        return;
    va_start(ap, fmt);
    wo_diag_addv(c->diags, c->file, n ? n->line : 0, n ? n->column : 0, WO_DIAG_ERROR, fmt, ap);
    va_end(ap);
}

void wo_schema_warn(struct ctx *c, const struct wo_node *n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    wo_diag_addv(c->diags, c->file, n ? n->line : 0, n ? n->column : 0, WO_DIAG_WARNING, fmt, ap);
    va_end(ap);
}

/* "'value'", "an empty value", "a sequence", "a mapping": the X of "found X". */
const char *wo_schema_found(const struct wo_node *n, char *buf, size_t len)
{
    if (n->kind == WO_NODE_SEQ)
        return n->n ? "a sequence" : "an empty sequence";
    if (n->kind == WO_NODE_MAP)
        return "a mapping";
    if (n->null || !n->value[0])
        return "an empty value";
    {
        /* one diagnostic is one line: control characters are shown escaped */
        size_t o = 0, i = 0;
        const unsigned char *v = (const unsigned char *)n->value;
        buf[o++] = '\'';
        /* stop at 80 bytes, but never inside a UTF-8 sequence */
        for (; v[i] && (i < 80 || (v[i] & 0xc0) == 0x80) && o + 8 < len; i++) {
            if (v[i] < 0x20 || v[i] == 0x7f)
                o += (size_t)snprintf(buf + o, len - o, "\\x%02x", v[i]);
            else
                buf[o++] = (char)v[i];
        }
        if (v[i] && o + 5 < len) {
            memcpy(buf + o, "...", 3);
            o += 3;
        }
        buf[o++] = '\'';
        buf[o] = '\0';
    }
    return buf;
}

/* The closest of names to s, when it is close enough to be a likely typo. */
static const char *closest(const char *s, const char *const *names, size_t n)
{
    const char *best = NULL;
    unsigned bestd = 3;
    size_t len = strlen(s);
    unsigned cap = len <= 3 ? 1 : len <= 6 ? 2 : 3;

    for (size_t i = 0; i < n; i++) {
        unsigned d = wo_edit_distance(s, names[i], cap);
        if (d <= cap && d < bestd) {
            best = names[i];
            bestd = d;
        }
    }
    /* a case slip is always a typo */
    for (size_t i = 0; !best && i < n; i++)
        if (strcasecmp(s, names[i]) == 0)
            best = names[i];
    return best;
}

static void join(char *buf, size_t len, const char *const *names, size_t n, const char *last_sep)
{
    size_t o = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < n && o < len; i++) {
        const char *sep = i == 0 ? "" : i + 1 == n ? last_sep : ", ";
        int w = snprintf(buf + o, len - o, "%s%s", sep, names[i]);
        if (w < 0)
            break;
        o += (size_t)w;
    }
}

/* ---- scalars ---- */

const char *wo_schema_scalar(struct ctx *c, const struct wo_node *n, const char *expected)
{
    char b[128];
    if (n->kind != WO_NODE_SCALAR || n->null) {
        wo_schema_err(c, n, "found %s, expected %s", wo_schema_found(n, b, sizeof(b)), expected);
        return NULL;
    }
    return n->value;
}

int wo_schema_bool(struct ctx *c, const struct wo_node *n, bool *ret)
{
    static const char *const yes[] = {"true", "yes", "on"};
    static const char *const no[] = {"false", "no", "off"};
    const char *s = wo_schema_scalar(c, n, "true or false");
    char b[128];
    if (!s)
        return -EINVAL;
    for (size_t i = 0; i < WO_ARRAY_SIZE(yes); i++) {
        if (strcasecmp(s, yes[i]) == 0) {
            *ret = true;
            return 0;
        }
        if (strcasecmp(s, no[i]) == 0) {
            *ret = false;
            return 0;
        }
    }
    wo_schema_err(c, n, "found %s, expected true or false", wo_schema_found(n, b, sizeof(b)));
    return -EINVAL;
}

int wo_schema_uint(struct ctx *c, const struct wo_node *n, uint64_t lo, uint64_t hi,
                   const char *what, uint64_t *ret)
{
    const char *s = wo_schema_scalar(c, n, what);
    char b[128];
    uint64_t v = 0;
    int r;

    if (!s)
        return -EINVAL;
    r = wo_parse_uint(s, &v);
    if (r < 0 || v < lo || v > hi) {
        wo_schema_err(c, n, "found %s%s, expected %s from %llu to %llu",
                     wo_schema_found(n, b, sizeof(b)), r == -ERANGE ? " that overflows" : "", what,
                     (unsigned long long)lo, (unsigned long long)hi);
        return r < 0 ? r : -ERANGE;
    }
    *ret = v;
    return 0;
}

#define SIZE_EXPECTED                                                                              \
    "a size such as 4096, 512MiB, 1.5GiB or 350GB (units B, KB, MB, GB, TB = powers of 1000; "     \
    "KiB, MiB, GiB, TiB = powers of 1024)"

int wo_schema_size(struct ctx *c, const struct wo_node *n, uint64_t *ret)
{
    const char *s = wo_schema_scalar(c, n, SIZE_EXPECTED);
    char b[128];
    int r;
    if (!s)
        return -EINVAL;
    r = wo_parse_size(s, ret);
    if (r == -ERANGE) {
        wo_schema_err(c, n, "found size %s that does not fit in 64 bits, expected at most 16EiB",
            wo_schema_found(n, b, sizeof(b)));
    } else if (r < 0) {
        const char *t = s;
        while (*t == ' ')
            t++;
        if (*t == '-')
            wo_schema_err(c, n, "found negative size %s, expected %s",
                         wo_schema_found(n, b, sizeof(b)), SIZE_EXPECTED);
        else if (strchr(s, '%'))
            wo_schema_err(c, n, "found percentage %s where only a size is allowed, expected %s",
                wo_schema_found(n, b, sizeof(b)), SIZE_EXPECTED);
        else
            wo_schema_err(c, n, "found %s, expected %s", wo_schema_found(n, b, sizeof(b)),
                         SIZE_EXPECTED);
    }
    return r;
}

/* "50%", "12.5%" -> parts per million, 0% to 100%: 0 or -EINVAL. */
static int parse_percent(const char *p, uint32_t *ppm)
{
    uint64_t ip = 0, frac = 0, scale = 1;

    if (*p < '0' || *p > '9')
        return -EINVAL;
    for (; *p >= '0' && *p <= '9'; p++) {
        ip = ip * 10 + (uint64_t)(*p - '0');
        if (ip > 100)
            return -EINVAL;
    }
    if (*p == '.') {
        p++;
        if (*p < '0' || *p > '9')
            return -EINVAL;
        for (; *p >= '0' && *p <= '9'; p++) {
            if (scale == 10000)
                return -EINVAL; /* finer than a millionth of the device is noise */
            frac = frac * 10 + (uint64_t)(*p - '0');
            scale *= 10;
        }
    }
    while (*p == ' ')
        p++;
    if (*p != '%' || p[1])
        return -EINVAL;
    if (ip * 10000 + frac * 10000 / scale > 1000000)
        return -EINVAL;
    *ppm = (uint32_t)(ip * 10000 + frac * 10000 / scale);
    return 0;
}

/* 1 when the value is meant as a percentage (ends in '%'; *r says whether
 * it is a valid one, the error reported), 0 when it is not one at all. */
int wo_schema_percent(struct ctx *c, const struct wo_node *n, uint32_t *ppm, int *r)
{
    size_t len;
    char b[128];

    if (n->kind != WO_NODE_SCALAR || n->null)
        return 0;
    len = strlen(n->value);
    if (!len || n->value[len - 1] != '%')
        return 0;
    *r = parse_percent(n->value, ppm);
    if (*r < 0)
        wo_schema_err(c, n,
                     "found %s, expected a percentage from 0%% to 100%% such as 50%% or 12.5%%",
                     wo_schema_found(n, b, sizeof(b)));
    return 1;
}

int wo_schema_enum(struct ctx *c, const struct wo_node *n, const char *const *names, size_t nn,
                   int *ret)
{
    char list[256], b[128];
    const char *s, *near;

    join(list, sizeof(list), names, nn, " or ");
    if (!(s = wo_schema_scalar(c, n, list)))
        return -EINVAL;
    for (size_t i = 0; i < nn; i++)
        if (strcmp(s, names[i]) == 0) {
            *ret = (int)i;
            return 0;
        }
    near = closest(s, names, nn);
    if (near)
        wo_schema_err(c, n, "found %s, expected %s; did you mean '%s'?",
                     wo_schema_found(n, b, sizeof(b)), list, near);
    else
        wo_schema_err(c, n, "found %s, expected %s", wo_schema_found(n, b, sizeof(b)), list);
    return -EINVAL;
}

/* ---- mappings ---- */

/* Known keys elsewhere in the schema, to say where a misplaced key belongs. */
static const struct {
    const char *key, *where;
} elsewhere[] = {
    {"open", "window:"},          {"close", "window:"},         {"enabled", "prefetch:"},
    {"lookahead", "prefetch:"},   {"piece_size", "prefetch:"},  {"hot_set", "prefetch:"},
    {"eviction", "prefetch:"},    {"mode", "prefetch:"},        {"slots", "prefetch:"},
    {"pinned_copies", "prefetch:"}, {"hot_experts", "prefetch:"},
    {"match", "a rule under rules:"},
    {"glob", "a rule under rules:"}, {"regex", "a rule under rules:"},
    {"layers", "a rule under rules:"}, {"place", "a rule under rules:"},
    {"pin", "a rule under rules:"}, {"priority", "a rule under rules:"},
    {"slices", "a rule under rules:"}, {"host_budget", "the top level"},
    {"device_budget", "the top level"}, {"default", "the top level"},
    {"pin_fallback", "the top level"}, {"rules", "the top level"},
    {"window", "the top level"},   {"prefetch", "the top level"},
    {"keep_free", "fit:"},         {"rest", "fit:"},
    {"reserve", "fit:"},
    {"fit", "the top level"},
};

/* Checks keys against the table, fills out[i] with the value of keys[i]
 * (first occurrence). Reports unknown and duplicate keys. 0 or -EINVAL. */
int wo_schema_map(struct ctx *c, const struct wo_node *n, const char *const *keys, size_t nkeys,
                  const char *where, const struct wo_node **out)
{
    char b[128];
    int r = 0;

    for (size_t i = 0; i < nkeys; i++)
        out[i] = NULL;
    if (n->kind != WO_NODE_MAP) {
        char list[512];
        join(list, sizeof(list), keys, nkeys, ", ");
        wo_schema_err(c, n, "found %s, expected %s: a mapping with keys %s",
                     wo_schema_found(n, b, sizeof(b)), where, list);
        return -EINVAL;
    }
    for (size_t i = 0; i + 1 < n->n; i += 2) {
        const struct wo_node *k = n->items[i], *v = n->items[i + 1];
        size_t j;
        for (j = 0; j < nkeys; j++)
            if (strcmp(k->value, keys[j]) == 0)
                break;
        if (j == nkeys) {
            char list[512];
            const char *near = closest(k->value, keys, nkeys);
            const char *belongs = NULL;
            join(list, sizeof(list), keys, nkeys, ", ");
            for (size_t e = 0; !near && e < WO_ARRAY_SIZE(elsewhere); e++)
                if (strcmp(k->value, elsewhere[e].key) == 0)
                    belongs = elsewhere[e].where;
            if (strcmp(k->value, "<<") == 0)
                wo_schema_err(
                    c, k,
                    "found a YAML merge key '<<' in %s, expected the keys written out "
                    "(merge keys are not supported; anchors and aliases of whole values are)",
                    where);
            else if (near)
                wo_schema_err(c, k,
                             "found unknown key %s in %s, expected one of: %s; did you mean '%s'?",
                             wo_schema_found(k, b, sizeof(b)), where, list, near);
            else if (belongs)
                wo_schema_err(c, k, "found key %s in %s, expected one of: %s; '%s' belongs in %s",
                    wo_schema_found(k, b, sizeof(b)), where, list, k->value, belongs);
            else
                wo_schema_err(c, k, "found unknown key %s in %s, expected one of: %s",
                    wo_schema_found(k, b, sizeof(b)), where, list);
            r = -EINVAL;
            continue;
        }
        if (out[j]) {
            /* the key node of the first occurrence is just before its value */
            const struct wo_node *first = NULL;
            for (size_t q = 0; q + 1 < i; q += 2)
                if (n->items[q + 1] == out[j] && strcmp(n->items[q]->value, keys[j]) == 0) {
                    first = n->items[q];
                    break;
                }
            if (first)
                wo_schema_err(c, k, "found duplicate key '%s' in %s (first at line %u, column %u), "
                    "expected each key once", keys[j], where, first->line, first->column);
            else
                wo_schema_err(c, k, "found duplicate key '%s' in %s, expected each key once",
                             keys[j], where);
            r = -EINVAL;
            continue;
        }
        out[j] = v;
    }
    return r;
}
