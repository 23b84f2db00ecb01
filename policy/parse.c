/* policy/parse.c: the schema: a YAML node tree -> struct wo_policy, with a
 * located diagnostic for everything that is not exactly what the schema
 * expects ("found X, expected Y"), did-you-mean for unknown keys and
 * values, and the checks across keys (contradictions, shadowed rules). */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "policy/policy-internal.h"

struct ctx {
    const char *file;
    struct wo_diags *diags;
    struct wo_policy *p;
    uint64_t regex_nodes; /* estimated regcomp nodes of every regex so far */
    /* While a rule is parsed: the error count at its start. Its first error
     * is reported, the rest dropped: they follow from the first (a key
     * misspelt makes the rule lack it too). SIZE_MAX outside a rule. */
    size_t rule_errors_from;
};

static void err(struct ctx *c, const struct wo_node *n, const char *fmt, ...) WO_PRINTF(3, 4);
static void err(struct ctx *c, const struct wo_node *n, const char *fmt, ...)
{
    va_list ap;
    if (c->rule_errors_from != SIZE_MAX && c->diags && c->diags->nerrors > c->rule_errors_from)
        return;
    va_start(ap, fmt);
    wo_diag_addv(c->diags, c->file, n ? n->line : 0, n ? n->column : 0, WO_DIAG_ERROR, fmt, ap);
    va_end(ap);
}

static void warn(struct ctx *c, const struct wo_node *n, const char *fmt, ...) WO_PRINTF(3, 4);
static void warn(struct ctx *c, const struct wo_node *n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    wo_diag_addv(c->diags, c->file, n ? n->line : 0, n ? n->column : 0, WO_DIAG_WARNING, fmt, ap);
    va_end(ap);
}

/* "'value'", "an empty value", "a sequence", "a mapping": the X of "found X". */
static const char *found(const struct wo_node *n, char *buf, size_t len)
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

static const char *scalar(struct ctx *c, const struct wo_node *n, const char *expected)
{
    char b[128];
    if (n->kind != WO_NODE_SCALAR || n->null) {
        err(c, n, "found %s, expected %s", found(n, b, sizeof(b)), expected);
        return NULL;
    }
    return n->value;
}

static int get_bool(struct ctx *c, const struct wo_node *n, bool *ret)
{
    static const char *const yes[] = {"true", "yes", "on"};
    static const char *const no[] = {"false", "no", "off"};
    const char *s = scalar(c, n, "true or false");
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
    err(c, n, "found %s, expected true or false", found(n, b, sizeof(b)));
    return -EINVAL;
}

static int get_uint(struct ctx *c, const struct wo_node *n, uint64_t lo, uint64_t hi,
                    const char *what, uint64_t *ret)
{
    const char *s = scalar(c, n, what);
    char b[128];
    uint64_t v = 0;
    int r;

    if (!s)
        return -EINVAL;
    r = wo_parse_uint(s, &v);
    if (r < 0 || v < lo || v > hi) {
        err(c, n, "found %s%s, expected %s from %llu to %llu", found(n, b, sizeof(b)),
            r == -ERANGE ? " that overflows" : "", what, (unsigned long long)lo,
            (unsigned long long)hi);
        return r < 0 ? r : -ERANGE;
    }
    *ret = v;
    return 0;
}

#define SIZE_EXPECTED                                                                              \
    "a size such as 4096, 512MiB, 1.5GiB or 350GB (units B, KB, MB, GB, TB = powers of 1000; "     \
    "KiB, MiB, GiB, TiB = powers of 1024)"

static int get_size(struct ctx *c, const struct wo_node *n, uint64_t *ret)
{
    const char *s = scalar(c, n, SIZE_EXPECTED);
    char b[128];
    int r;
    if (!s)
        return -EINVAL;
    r = wo_parse_size(s, ret);
    if (r == -ERANGE) {
        err(c, n, "found size %s that does not fit in 64 bits, expected at most 16EiB",
            found(n, b, sizeof(b)));
    } else if (r < 0) {
        const char *t = s;
        while (*t == ' ')
            t++;
        if (*t == '-')
            err(c, n, "found negative size %s, expected %s", found(n, b, sizeof(b)), SIZE_EXPECTED);
        else if (strchr(s, '%'))
            err(c, n, "found percentage %s where only a size is allowed, expected %s",
                found(n, b, sizeof(b)), SIZE_EXPECTED);
        else
            err(c, n, "found %s, expected %s", found(n, b, sizeof(b)), SIZE_EXPECTED);
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
static int get_percent(struct ctx *c, const struct wo_node *n, uint32_t *ppm, int *r)
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
        err(c, n, "found %s, expected a percentage from 0%% to 100%% such as 50%% or 12.5%%",
            found(n, b, sizeof(b)));
    return 1;
}

static int get_enum(struct ctx *c, const struct wo_node *n, const char *const *names, size_t nn,
                    int *ret)
{
    char list[256], b[128];
    const char *s, *near;

    join(list, sizeof(list), names, nn, " or ");
    if (!(s = scalar(c, n, list)))
        return -EINVAL;
    for (size_t i = 0; i < nn; i++)
        if (strcmp(s, names[i]) == 0) {
            *ret = (int)i;
            return 0;
        }
    near = closest(s, names, nn);
    if (near)
        err(c, n, "found %s, expected %s; did you mean '%s'?", found(n, b, sizeof(b)), list, near);
    else
        err(c, n, "found %s, expected %s", found(n, b, sizeof(b)), list);
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
    {"pinned_copies", "prefetch:"},
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
static int walk_map(struct ctx *c, const struct wo_node *n, const char *const *keys, size_t nkeys,
                    const char *where, const struct wo_node **out)
{
    char b[128];
    int r = 0;

    for (size_t i = 0; i < nkeys; i++)
        out[i] = NULL;
    if (n->kind != WO_NODE_MAP) {
        char list[512];
        join(list, sizeof(list), keys, nkeys, ", ");
        err(c, n, "found %s, expected %s: a mapping with keys %s", found(n, b, sizeof(b)), where,
            list);
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
                err(c, k, "found a YAML merge key '<<' in %s, expected the keys written out "
                    "(merge keys are not supported; anchors and aliases of whole values are)", where);
            else if (near)
                err(c, k, "found unknown key %s in %s, expected one of: %s; did you mean '%s'?",
                    found(k, b, sizeof(b)), where, list, near);
            else if (belongs)
                err(c, k, "found key %s in %s, expected one of: %s; '%s' belongs in %s",
                    found(k, b, sizeof(b)), where, list, k->value, belongs);
            else
                err(c, k, "found unknown key %s in %s, expected one of: %s",
                    found(k, b, sizeof(b)), where, list);
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
                err(c, k, "found duplicate key '%s' in %s (first at line %u, column %u), "
                    "expected each key once", keys[j], where, first->line, first->column);
            else
                err(c, k, "found duplicate key '%s' in %s, expected each key once", keys[j], where);
            r = -EINVAL;
            continue;
        }
        out[j] = v;
    }
    return r;
}

/* ---- rules ---- */

static char **add_str(char ***v, size_t *n, const char *s)
{
    char **nv = realloc(*v, (*n + 1) * sizeof(char *));
    if (!nv)
        return NULL;
    *v = nv;
    if (!(nv[*n] = strdup(s)))
        return NULL;
    (*n)++;
    return nv;
}

/* A matcher value: one pattern or a non-empty list of them. Calls check on
 * each; adds accepted ones to v. */
static int get_patterns(struct ctx *c, const struct wo_node *n, const char *key, char ***v,
                        size_t *nv, int (*check)(struct ctx *, const struct wo_node *, const char *))
{
    const struct wo_node *one = n;
    size_t count = 1;
    char b[128];
    int r = 0;

    if (n->kind == WO_NODE_MAP) {
        err(c, n, "found a mapping in '%s', expected a pattern or a list of patterns", key);
        return -EINVAL;
    }
    if (n->kind == WO_NODE_SEQ) {
        if (n->n == 0) {
            err(c, n, "found an empty list in '%s', expected at least one pattern", key);
            return -EINVAL;
        }
        count = n->n;
    }
    for (size_t i = 0; i < count; i++) {
        if (n->kind == WO_NODE_SEQ)
            one = n->items[i];
        if (one->kind != WO_NODE_SCALAR || one->null) {
            err(c, one, "found %s in '%s', expected a pattern (a string)", found(one, b, sizeof(b)),
                key);
            r = -EINVAL;
            continue;
        }
        if (!one->value[0]) {
            err(c, one, "found an empty pattern in '%s', expected a non-empty string", key);
            r = -EINVAL;
            continue;
        }
        if (check && check(c, one, one->value) < 0) {
            r = -EINVAL;
            continue;
        }
        if (!add_str(v, nv, one->value))
            return -ENOMEM;
    }
    return r;
}

static int check_segment(struct ctx *c, const struct wo_node *n, const char *s)
{
    char b[128];
    size_t len = strlen(s);
    if (s[0] == '.' || s[len - 1] == '.' || strstr(s, "..")) {
        err(c, n, "found %s with an empty component, expected whole name components joined by "
            "dots such as 'experts' or 'experts.w2_weight'", found(n, b, sizeof(b)));
        return -EINVAL;
    }
    if (strpbrk(s, "*?[")) {
        /* segments are literal; a wildcard here is almost surely meant as a glob */
        warn(c, n, "'match' is literal: %s contains a wildcard that matches only itself; "
             "use 'glob' for wildcards", found(n, b, sizeof(b)));
    }
    return 0;
}

static int check_regex(struct ctx *c, const struct wo_node *n, const char *s)
{
    regex_t re;
    char msg[256], b[128];
    uint64_t cost;
    int r;

    if (strlen(s) > WO_REGEX_MAX_LEN) {
        err(c, n, "found a regular expression of %zu bytes, expected at most %d", strlen(s),
            WO_REGEX_MAX_LEN);
        return -EINVAL;
    }
    for (const char *p = s; *p; p++) {
        if (p[0] == '\\' && p[1] >= '1' && p[1] <= '9') {
            /* glibc accepts back-references in ERE; matching them can take exponential time */
            err(c, n, "found back-reference '\\%c' in regular expression %s, expected a POSIX "
                "extended regular expression without back-references", p[1], found(n, b, sizeof(b)));
            return -EINVAL;
        }
        if (p[0] == '\\' && p[1])
            p++;
    }
    cost = wo_regex_cost(s);
    if (cost == WO_REGEX_STACKED) {
        err(c, n, "found regular expression %s with a quantifier applied to a quantifier "
            "(such as 'a+*', 'a?+' or 'a{2}{3}'), expected one quantifier per item (use a group: "
            "'(a+)*')", found(n, b, sizeof(b)));
        return -EINVAL;
    }
    if (cost > WO_REGEX_MAX_NODES) {
        err(c, n, "found regular expression %s whose repetitions expand too far (nested '+' or "
            "{n,m}), expected a simpler pattern", found(n, b, sizeof(b)));
        return -EINVAL;
    }
    /* bounds the memory of all compiled expressions together */
    c->regex_nodes += cost;
    if (c->regex_nodes > WO_REGEX_MAX_TOTAL_NODES) {
        err(c, n, "found more regular expressions than a policy can hold (about %d nodes in all), "
            "expected fewer or simpler ones", WO_REGEX_MAX_TOTAL_NODES);
        return -EINVAL;
    }
    r = regcomp(&re, s, REG_EXTENDED | REG_NOSUB);
    if (r != 0) {
        regerror(r, &re, msg, sizeof(msg));
        err(c, n, "found invalid regular expression %s (%s), expected a POSIX extended "
            "regular expression", found(n, b, sizeof(b)), msg);
        return -EINVAL;
    }
    regfree(&re);
    for (const char *p = s; *p; p++) {
        if (p[0] == '\\' && p[1]) {
            if (p[1] == 'd' || p[1] == 'D') {
                warn(c, n, "regular expression %s uses '\\%c', which POSIX ERE does not know "
                     "(it matches the letter '%c'); write [0-9] instead",
                     found(n, b, sizeof(b)), p[1], p[1]);
                break;
            }
            p++;
        }
    }
    return 0;
}

#define LAYER_MAX 1000000L

static int parse_layer_int(const char *s, const char **end, long *ret)
{
    long v = 0;
    if (*s < '0' || *s > '9')
        return -EINVAL;
    for (; *s >= '0' && *s <= '9'; s++) {
        v = v * 10 + (*s - '0');
        if (v > LAYER_MAX)
            return -ERANGE;
    }
    *end = s;
    *ret = v;
    return 0;
}

#define LAYERS_EXPECTED                                                                            \
    "a layer index (3), a range ('0-3'), a list of them, or a group {every: N, last: K}"

static int add_layer(struct wo_matchers *m, const struct wo_layer_item *it)
{
    struct wo_layer_item *v = realloc(m->layers, (m->nlayers + 1) * sizeof(*v));
    if (!v)
        return -ENOMEM;
    m->layers = v;
    m->layers[m->nlayers++] = *it;
    return 0;
}

static int layer_item(struct ctx *c, const struct wo_node *n, struct wo_matchers *m)
{
    struct wo_layer_item it = {0};
    char b[128];

    if (n->kind == WO_NODE_MAP) {
        static const char *const keys[] = {"every", "last"};
        const struct wo_node *v[2];
        uint64_t every = 0, last = 0;
        if (walk_map(c, n, keys, 2, "a layer group", v) < 0)
            return -EINVAL;
        if (!v[0] || !v[1]) {
            err(c, n, "found a layer group without '%s', expected {every: N, last: K} "
                "(vLLM offload_group_size and offload_num_in_group)", v[0] ? "last" : "every");
            return -EINVAL;
        }
        if (get_uint(c, v[0], 1, (uint64_t)LAYER_MAX, "a group size", &every) < 0 ||
            get_uint(c, v[1], 1, (uint64_t)LAYER_MAX, "a number of layers", &last) < 0)
            return -EINVAL;
        if (last > every) {
            err(c, v[1], "found last: %llu greater than every: %llu, expected at most the group size",
                (unsigned long long)last, (unsigned long long)every);
            return -EINVAL;
        }
        it.kind = WO_LAYER_GROUP;
        it.every = (long)every;
        it.last = (long)last;
        return add_layer(m, &it);
    }
    if (n->kind != WO_NODE_SCALAR || n->null) {
        err(c, n, "found %s, expected %s", found(n, b, sizeof(b)), LAYERS_EXPECTED);
        return -EINVAL;
    }
    {
        const char *s = n->value, *e;
        int r = parse_layer_int(s, &e, &it.lo);
        if (r == 0) {
            it.hi = it.lo;
            if (*e == '-') {
                r = parse_layer_int(e + 1, &e, &it.hi);
            }
        }
        if (r == -ERANGE) {
            err(c, n, "found %s, expected layer indices up to %ld", found(n, b, sizeof(b)), LAYER_MAX);
            return -EINVAL;
        }
        if (r < 0 || *e) {
            if (s[0] == '-')
                err(c, n, "found negative layer %s, expected %s", found(n, b, sizeof(b)),
                    LAYERS_EXPECTED);
            else
                err(c, n, "found %s, expected %s", found(n, b, sizeof(b)), LAYERS_EXPECTED);
            return -EINVAL;
        }
        if (it.hi < it.lo) {
            err(c, n, "found range %s that runs backwards, expected 'LOW-HIGH'", found(n, b, sizeof(b)));
            return -EINVAL;
        }
        it.kind = WO_LAYER_RANGE;
        return add_layer(m, &it);
    }
}

static int get_layers(struct ctx *c, const struct wo_node *n, struct wo_matchers *m)
{
    int r = 0;
    if (n->kind != WO_NODE_SEQ)
        return layer_item(c, n, m);
    if (n->n == 0) {
        err(c, n, "found an empty list in 'layers', expected at least one layer, range or group");
        return -EINVAL;
    }
    for (size_t i = 0; i < n->n; i++)
        if (layer_item(c, n->items[i], m) < 0)
            r = -EINVAL;
    return r;
}

enum {
    K_NAME, K_MATCH, K_GLOB, K_REGEX, K_LAYERS, K_MIN, K_MAX, K_PLACE, K_PIN, K_PRIO, K_SLICES,
    K_RULE_MAX
};
static const char *const rule_keys[] = {"name", "match", "glob", "regex", "layers", "min_size",
                                        "max_size", "place", "pin", "priority", "slices"};
static const char *const place_names[] = {"device", "host", "managed"};

/* A placement: device, host or managed; cpu (any case, as llama.cpp's
 * -ot ...=CPU writes it) is host. names is place_names or rest_names. */
static int get_place(struct ctx *c, const struct wo_node *n, const char *const *names, size_t nn,
                     enum wo_placement *ret)
{
    int idx;

    if (n->kind == WO_NODE_SCALAR && !n->null && n->value && strcasecmp(n->value, "cpu") == 0) {
        *ret = WO_PLACE_HOST;
        return 0;
    }
    if (get_enum(c, n, names, nn, &idx) < 0)
        return -EINVAL;
    *ret = wo_placement_from_string(names[idx]);
    return 0;
}
static const char *const slices_names[] = {"auto", "none"};

static int parse_rule(struct ctx *c, const struct wo_node *n, struct wo_rule *rule,
                      struct wo_matchers *m)
{
    const struct wo_node *v[K_RULE_MAX];
    char b[128];
    int r = 0, idx;

    rule->line = n->line;
    rule->column = n->column;
    rule->pin = true;
    rule->m = m;
    r = walk_map(c, n, rule_keys, K_RULE_MAX, "a rule", v);
    if (n->kind != WO_NODE_MAP)
        return -EINVAL;
    if (v[K_NAME]) {
        const char *s = scalar(c, v[K_NAME], "a rule name (a string)");
        bool ctl = false;
        for (const char *q = s ? s : ""; *q && !ctl; q++)
            ctl = (unsigned char)*q < 0x20 || *q == 0x7f;
        if (!s) {
            r = -EINVAL;
        } else if (ctl) {
            /* the name goes into one-line log messages and stats */
            err(c, v[K_NAME], "found %s with control characters, expected a rule name on one line",
                found(v[K_NAME], b, sizeof(b)));
            r = -EINVAL;
        } else if (!(rule->name = strdup(s))) {
            return -ENOMEM;
        }
    }
    if (v[K_MATCH] && get_patterns(c, v[K_MATCH], "match", &m->match, &m->nmatch, check_segment) < 0)
        r = -EINVAL;
    if (v[K_GLOB] && get_patterns(c, v[K_GLOB], "glob", &m->glob, &m->nglob, NULL) < 0)
        r = -EINVAL;
    if (v[K_REGEX]) {
        if (get_patterns(c, v[K_REGEX], "regex", &m->regex_src, &m->nregex, check_regex) < 0) {
            r = -EINVAL;
        } else {
            m->regex = calloc(m->nregex, sizeof(regex_t));
            if (!m->regex)
                return -ENOMEM;
            for (size_t i = 0; i < m->nregex; i++)
                if (regcomp(&m->regex[i], m->regex_src[i], REG_EXTENDED | REG_NOSUB) != 0) {
                    /* compiled fine a moment ago; only memory can fail now */
                    for (size_t j = 0; j < i; j++)
                        regfree(&m->regex[j]);
                    free(m->regex);
                    m->regex = NULL;
                    return -ENOMEM;
                }
        }
    }
    if (v[K_LAYERS] && get_layers(c, v[K_LAYERS], m) < 0)
        r = -EINVAL;
    if (v[K_MIN]) {
        if (get_size(c, v[K_MIN], &m->min_size) < 0)
            r = -EINVAL;
        else
            m->has_min = true;
    }
    if (v[K_MAX]) {
        if (get_size(c, v[K_MAX], &m->max_size) < 0)
            r = -EINVAL;
        else
            m->has_max = true;
    }
    if (m->has_min && m->has_max && m->min_size > m->max_size) {
        char s1[32], s2[32];
        err(c, v[K_MAX], "found max_size %s below min_size %s (line %u), expected max_size >= "
            "min_size: the rule could never match", wo_format_size(m->max_size, s1, sizeof(s1)),
            wo_format_size(m->min_size, s2, sizeof(s2)), v[K_MIN]->line);
        r = -EINVAL;
    }
    if (!v[K_MATCH] && !v[K_GLOB] && !v[K_REGEX] && !v[K_LAYERS] && !v[K_MIN] && !v[K_MAX]) {
        err(c, n, "found a rule without a matcher, expected at least one of match, glob, regex, "
            "layers, min_size, max_size (glob: '*' matches every name)");
        r = -EINVAL;
    }
    if (!v[K_PLACE]) {
        err(c, n, "found a rule without 'place', expected place: device, host or managed");
        return -EINVAL;
    }
    if (get_place(c, v[K_PLACE], place_names, 3, &rule->place) < 0)
        return -EINVAL;
    if (v[K_PIN]) {
        if (rule->place != WO_PLACE_HOST) {
            err(c, v[K_PIN], "found 'pin' in a rule with place: %s, expected it only with place: host",
                wo_placement_to_string(rule->place));
            r = -EINVAL;
        } else if (get_bool(c, v[K_PIN], &rule->pin) < 0) {
            r = -EINVAL;
        }
    }
    if (v[K_PRIO]) {
        uint64_t pr;
        if (rule->place != WO_PLACE_MANAGED) {
            err(c, v[K_PRIO], "found 'priority' in a rule with place: %s, expected it only with "
                "place: managed", wo_placement_to_string(rule->place));
            r = -EINVAL;
        } else if (get_uint(c, v[K_PRIO], 0, 100, "a priority", &pr) < 0) {
            r = -EINVAL;
        } else {
            rule->priority = (int)pr;
        }
    }
    if (v[K_SLICES]) {
        if (rule->place != WO_PLACE_MANAGED) {
            err(c, v[K_SLICES], "found 'slices' in a rule with place: %s, expected it only with "
                "place: managed", wo_placement_to_string(rule->place));
            r = -EINVAL;
        } else if (get_enum(c, v[K_SLICES], slices_names, 2, &idx) < 0) {
            r = -EINVAL;
        } else {
            rule->slices = (enum wo_slices)idx;
        }
    }
    return r;
}

/* ---- shadowed rules ---- */

static void check_shadowed(struct ctx *c, const struct wo_node *rules)
{
    struct wo_policy *p = c->p;
    for (size_t j = 1; j < p->nrules; j++)
        for (size_t i = 0; i < j; i++)
            if (wo_matchers_shadow(&p->m[i], &p->m[j])) {
                char lab[160];
                wo_policy_rule_label(p, i, lab, sizeof(lab));
                warn(c, rules->items[j], "rule %zu can never match: every name it matches is "
                     "matched first by %s (first match wins); move it above or remove it",
                     j + 1, lab);
                break;
            }
}

/* ---- the document ---- */

enum { G_VERSION, G_DEFAULT, G_HOST, G_DEVICE, G_PINFB, G_WINDOW, G_PREFETCH, G_RULES, G_FIT, G_MAX };
static const char *const top_keys[] = {"version", "default", "host_budget", "device_budget",
                                       "pin_fallback", "window", "prefetch", "rules", "fit"};
static const char *const fit_keys[] = {"device", "keep_free", "rest", "reserve"};
static const char *const rest_names[] = {"host", "managed"};
static const char *const window_keys[] = {"open", "close", "min_size"};
static const char *const open_names[] = {"at-start", "on-first-tag", "api"};
static const char *const close_names[] = {"at-seal", "on-first-tag", "api"};
static const char *const prefetch_keys[] = {"enabled", "lookahead",    "piece_size",
                                            "hot_set", "eviction",     "mode",
                                            "slots",   "experimental", "pinned_copies"};
static const char *const mode_names[] = {"auto", "hot-set", "stream"};
static const char *const eviction_names[] = {"auto", "read-mostly", "copy-back"};
static const char *const pinfb_names[] = {"managed", "stop"};

static int parse_window(struct ctx *c, const struct wo_node *n, bool *open_given)
{
    struct wo_policy_globals *g = &c->p->g;
    const struct wo_node *v[3];
    int r = walk_map(c, n, window_keys, 3, "window", v), idx;

    if (n->kind != WO_NODE_MAP)
        return r;
    if (v[0]) {
        if (get_enum(c, v[0], open_names, 3, &idx) < 0)
            r = -EINVAL;
        else {
            g->window.open = (enum wo_window_open)idx;
            *open_given = true;
        }
    }
    if (v[1]) {
        if (get_enum(c, v[1], close_names, 3, &idx) < 0)
            r = -EINVAL;
        else
            g->window.close = (enum wo_window_close)idx;
    }
    if (v[2] && get_size(c, v[2], &g->window.min_size) < 0)
        r = -EINVAL;
    if (r == 0 && v[1] && g->window.open != WO_WINDOW_OPEN_API &&
        g->window.close != WO_WINDOW_CLOSE_API) {
        /* the events come in the order start < first tag < seal */
        int o = g->window.open == WO_WINDOW_OPEN_AT_START ? 0 : 1;
        int cl = g->window.close == WO_WINDOW_CLOSE_ON_FIRST_TAG ? 1 : 2;
        if (cl <= o) {
            err(c, v[1], "found close: %s with open: %s, expected the window to close after it "
                "opens (the events come in the order at-start, on-first-tag, at-seal)",
                close_names[g->window.close], open_names[g->window.open]);
            r = -EINVAL;
        }
    }
    return r;
}

static int parse_prefetch(struct ctx *c, const struct wo_node *n)
{
    struct wo_policy_globals *g = &c->p->g;
    const struct wo_node *v[9];
    int r = walk_map(c, n, prefetch_keys, 9, "prefetch", v), idx;
    uint64_t slots;
    bool experimental = false;

    if (n->kind != WO_NODE_MAP)
        return r;
    if (v[0] && get_bool(c, v[0], &g->prefetch.enabled) < 0)
        r = -EINVAL;
    if (v[1]) {
        const char *s = scalar(c, v[1], "a number of ranges (4) or bytes (2GiB)");
        bool bare = s && *s && strspn(s, "0123456789") == strlen(s);
        if (!s) {
            r = -EINVAL;
        } else if (bare) {
            if (get_uint(c, v[1], 1, 100000, "a number of upcoming ranges", &g->prefetch.lookahead) < 0)
                r = -EINVAL;
            g->prefetch.lookahead_kind = WO_LOOKAHEAD_RANGES;
        } else if (get_size(c, v[1], &g->prefetch.lookahead) < 0) {
            r = -EINVAL;
        } else if (g->prefetch.lookahead == 0) {
            err(c, v[1], "found lookahead 0 bytes, expected more than 0 (set enabled: false to "
                "turn prefetching off)");
            r = -EINVAL;
        } else {
            g->prefetch.lookahead_kind = WO_LOOKAHEAD_BYTES;
        }
    }
    if (v[2]) {
        if (get_size(c, v[2], &g->prefetch.piece_size) < 0) {
            r = -EINVAL;
        } else if (g->prefetch.piece_size < WO_PIECE_SIZE_MIN) {
            char s1[32];
            err(c, v[2], "found piece_size %s, expected at least 16MiB (each prefetch call costs "
                "~100 us of CPU: small pieces cannot keep up)",
                wo_format_size(g->prefetch.piece_size, s1, sizeof(s1)));
            r = -EINVAL;
        }
    }
    if (v[3] && get_bool(c, v[3], &g->prefetch.hot_set) < 0)
        r = -EINVAL;
    if (v[4]) {
        if (get_enum(c, v[4], eviction_names, 3, &idx) < 0)
            r = -EINVAL;
        else
            g->prefetch.eviction = (enum wo_eviction)idx;
    }
    if (v[5]) {
        if (get_enum(c, v[5], mode_names, 3, &idx) < 0)
            r = -EINVAL;
        else
            g->prefetch.mode = (enum wo_prefetch_mode)idx;
    }
    if (v[7] && get_bool(c, v[7], &experimental) < 0)
        r = -EINVAL;
    /* `experimental: true` was required beside auto and stream while
     * streamed calls at batch 8 gave other tokens (2026-11-26): stale
     * addresses in unfilled struct members were taken for reads (launch.c,
     * notptr). Still accepted, so older policies load; it changes nothing. */
    (void)experimental;
    if (v[6]) {
        /* each slot holds the largest streamed range: two is the least that
         * overlaps a copy with the reads of the range before it */
        if (get_uint(c, v[6], WO_STREAM_SLOTS_MIN, WO_STREAM_SLOTS_MAX,
                     "a number of device staging slots", &slots) < 0)
            r = -EINVAL;
        else
            g->prefetch.slots = (uint32_t)slots;
    }
    if (v[8]) {
        /* auto, off, or a size: host memory for pinned copies of managed
         * ranges, the staging source (uvm/stream-pin.h) */
        const char *s = scalar(c, v[8], "auto, off or a size (16GiB)");
        if (!s)
            r = -EINVAL;
        else if (strcmp(s, "auto") == 0)
            g->prefetch.pinned_copies = WO_PIN_COPIES_AUTO;
        else if (strcmp(s, "off") == 0)
            g->prefetch.pinned_copies = 0;
        else if (wo_parse_size(s, &g->prefetch.pinned_copies) < 0) {
            char b[128];
            err(c, v[8], "found pinned_copies %s, expected auto, off or a size (16GiB)",
                found(v[8], b, sizeof(b)));
            r = -EINVAL;
        }
    }
    return r;
}

static int parse_budget(struct ctx *c, const struct wo_node *n, bool device, struct wo_budget *b)
{
    const char *special = device ? "auto" : "unlimited";
    char bb[128];
    int r = 0;

    if (n->kind != WO_NODE_SCALAR || n->null) {
        err(c, n, "found %s, expected %s", found(n, bb, sizeof(bb)),
            device ? "auto, a size (40GiB) or a percentage of device memory (50%)"
                   : "unlimited or a size (200GiB)");
        return -EINVAL;
    }
    if (strcmp(n->value, special) == 0) {
        b->kind = device ? WO_BUDGET_AUTO : WO_BUDGET_UNLIMITED;
        return 0;
    }
    if (device && get_percent(c, n, &b->ppm, &r)) {
        if (r == 0)
            b->kind = WO_BUDGET_PERCENT;
        return r;
    }
    if (!device && strchr(n->value, '%')) {
        err(c, n, "found %s, expected unlimited or a size: host_budget is bytes of host memory, "
            "not a share of the device", found(n, bb, sizeof(bb)));
        return -EINVAL;
    }
    if (get_size(c, n, &b->bytes) < 0)
        return -EINVAL;
    b->kind = WO_BUDGET_BYTES;
    return 0;
}

#define FIT_DEVICE_EXPECTED                                                                        \
    "a size of device memory (20GiB) or a percentage of the device's total memory (90%)"

/* fit's device: a size or a percentage, above 0. */
static int parse_fit_device(struct ctx *c, const struct wo_node *n, struct wo_budget *b)
{
    char bb[128];
    int r = 0;

    if (n->kind != WO_NODE_SCALAR || n->null) {
        err(c, n, "found %s, expected %s", found(n, bb, sizeof(bb)), FIT_DEVICE_EXPECTED);
        return -EINVAL;
    }
    if (get_percent(c, n, &b->ppm, &r)) {
        if (r < 0)
            return r;
        if (b->ppm == 0) {
            err(c, n, "found fit device 0%%, expected more than 0%%: fit needs room on the device "
                "for the weights it keeps there");
            return -EINVAL;
        }
        b->kind = WO_BUDGET_PERCENT;
        return 0;
    }
    if (get_size(c, n, &b->bytes) < 0)
        return -EINVAL;
    if (b->bytes == 0) {
        err(c, n, "found fit device 0, expected more than 0 bytes (%s): fit needs room on the "
            "device for the weights it keeps there", FIT_DEVICE_EXPECTED);
        return -EINVAL;
    }
    b->kind = WO_BUDGET_BYTES;
    return 0;
}

/* fit: SIZE | PCT, or fit: {device, keep_free, rest, reserve}. */
static int parse_fit(struct ctx *c, const struct wo_node *n)
{
    struct wo_fit *f = &c->p->g.fit;
    const struct wo_node *v[4];
    int r;
    bool dev_ok = false, kf_ok = false;

    if (n->kind == WO_NODE_SCALAR && !n->null) {
        /* the short form: fit: 20GiB */
        r = parse_fit_device(c, n, &f->device);
        f->enabled = r == 0;
        return r;
    }
    if (n->kind != WO_NODE_MAP) {
        char bb[128];
        err(c, n,
            "found %s, expected fit: with %s, or a mapping with keys device, keep_free, rest, "
            "reserve",
            found(n, bb, sizeof(bb)), FIT_DEVICE_EXPECTED);
        return -EINVAL;
    }
    r = walk_map(c, n, fit_keys, 4, "fit", v);
    if (!v[0]) {
        err(c, n, "found fit: without 'device', expected device: with %s", FIT_DEVICE_EXPECTED);
        r = -EINVAL;
    } else if (parse_fit_device(c, v[0], &f->device) < 0) {
        r = -EINVAL;
    } else {
        dev_ok = true;
    }
    if (v[1]) {
        if (get_size(c, v[1], &f->keep_free) < 0)
            r = -EINVAL;
        else
            kf_ok = true;
    }
    if (v[2]) {
        if (get_place(c, v[2], rest_names, 2, &f->rest) < 0)
            r = -EINVAL;
    }
    if (v[3] && get_size(c, v[3], &f->reserve) < 0)
        r = -EINVAL;
    if (dev_ok && kf_ok && f->device.kind == WO_BUDGET_BYTES && f->keep_free >= f->device.bytes) {
        char s1[32], s2[32];
        err(c, v[1], "found keep_free %s with fit device %s (line %u), expected keep_free below "
            "device: nothing would be left for the weights",
            wo_format_size(f->keep_free, s1, sizeof(s1)),
            wo_format_size(f->device.bytes, s2, sizeof(s2)), v[0]->line);
        r = -EINVAL;
    }
    f->enabled = r == 0;
    return r;
}

/* A policy file's defaults: the window open from the start. A static
 * object, so its padding is zero as the memset it replaced left it. */
static const struct wo_policy_globals file_defaults = WO_POLICY_DEFAULTS(WO_WINDOW_OPEN_AT_START);

static void defaults(struct wo_policy_globals *g)
{
    memcpy(g, &file_defaults, sizeof(*g));
}

int wo_policy_from_tree(struct wo_policy *p, const struct wo_node *root, const char *file,
                        struct wo_diags *diags)
{
    struct ctx c = {.file = file, .diags = diags, .p = p, .rule_errors_from = SIZE_MAX};
    const struct wo_node *v[G_MAX];
    bool open_given = false;
    int r, idx;

    defaults(&p->g);
    r = walk_map(&c, root, top_keys, G_MAX, "the policy", v);
    if (root->kind != WO_NODE_MAP)
        return -EINVAL;
    if (v[G_VERSION]) {
        uint64_t ver;
        if (get_uint(&c, v[G_VERSION], 1, 1, "policy version", &ver) < 0)
            r = -EINVAL;
    }
    if (v[G_DEFAULT]) {
        if (get_place(&c, v[G_DEFAULT], place_names, 3, &p->g.default_place) < 0)
            r = -EINVAL;
    }
    if (v[G_HOST] && parse_budget(&c, v[G_HOST], false, &p->g.host_budget) < 0)
        r = -EINVAL;
    if (v[G_DEVICE] && parse_budget(&c, v[G_DEVICE], true, &p->g.device_budget) < 0)
        r = -EINVAL;
    if (v[G_PINFB]) {
        if (get_enum(&c, v[G_PINFB], pinfb_names, 2, &idx) < 0)
            r = -EINVAL;
        else
            p->g.pin_fallback = (enum wo_pin_fallback)idx;
    }
    if (v[G_WINDOW] && parse_window(&c, v[G_WINDOW], &open_given) < 0)
        r = -EINVAL;
    if (v[G_PREFETCH] && parse_prefetch(&c, v[G_PREFETCH]) < 0)
        r = -EINVAL;
    if (v[G_FIT] && parse_fit(&c, v[G_FIT]) < 0)
        r = -EINVAL;
    if (v[G_RULES]) {
        const struct wo_node *rn = v[G_RULES];
        char b[128];
        if (rn->kind != WO_NODE_SEQ) {
            err(&c, rn, "found %s, expected a list of rules (rules: [] for none)",
                found(rn, b, sizeof(b)));
            r = -EINVAL;
        } else if (rn->n) {
            p->rules = calloc(rn->n, sizeof(*p->rules));
            p->m = calloc(rn->n, sizeof(*p->m));
            if (!p->rules || !p->m)
                return -ENOMEM;
            for (size_t i = 0; i < rn->n; i++) {
                int q;
                c.rule_errors_from = c.diags ? c.diags->nerrors : SIZE_MAX;
                q = parse_rule(&c, rn->items[i], &p->rules[i], &p->m[i]);
                c.rule_errors_from = SIZE_MAX;
                p->nrules = i + 1; /* what was parsed is freed with the policy */
                if (q == -ENOMEM)
                    return q;
                if (q < 0)
                    r = -EINVAL;
            }
        }
    }
    if (r < 0)
        return r;

    /* across keys: only once every value is known to be well-formed */
    {
        bool managed = p->g.default_place == WO_PLACE_MANAGED, host = p->g.default_place == WO_PLACE_HOST;
        size_t first_managed = SIZE_MAX, first_host = SIZE_MAX;
        const struct wo_budget *db = &p->g.device_budget;
        for (size_t i = 0; i < p->nrules; i++) {
            if (p->rules[i].place == WO_PLACE_MANAGED && first_managed == SIZE_MAX)
                first_managed = i;
            if (p->rules[i].place == WO_PLACE_HOST && first_host == SIZE_MAX)
                first_host = i;
        }
        managed |= first_managed != SIZE_MAX;
        managed |= p->g.fit.enabled && p->g.fit.rest == WO_PLACE_MANAGED;
        host |= first_host != SIZE_MAX;
        if (managed && ((db->kind == WO_BUDGET_BYTES && db->bytes == 0) ||
                        (db->kind == WO_BUDGET_PERCENT && db->ppm == 0))) {
            char lab[160];
            if (first_managed != SIZE_MAX)
                wo_policy_rule_label(p, first_managed, lab, sizeof(lab));
            else if (p->g.default_place == WO_PLACE_MANAGED)
                snprintf(lab, sizeof(lab), "default: managed");
            else
                snprintf(lab, sizeof(lab), "fit: rest: managed");
            err(&c, v[G_DEVICE], "found device_budget 0 with managed placements (%s), expected a "
                "budget above 0: managed memory needs room on the device (use place: host to "
                "keep it on the host)", lab);
            r = -EINVAL;
        }
        if (host && p->g.host_budget.kind == WO_BUDGET_BYTES && p->g.host_budget.bytes == 0)
            warn(&c, v[G_HOST], "host_budget is 0: every name placed on the host stays on the device");
        if (!open_given)
            p->g.window.open = wo_policy_passthrough(p) ? WO_WINDOW_OPEN_API : WO_WINDOW_OPEN_AT_START;
        if (v[G_RULES] && v[G_RULES]->kind == WO_NODE_SEQ)
            check_shadowed(&c, v[G_RULES]);
    }
    return r;
}
