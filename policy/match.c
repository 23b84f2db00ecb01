/* policy/match.c: name -> rule. First match wins; within a rule every
 * matcher must hold, and the patterns listed in one matcher are
 * alternatives. Explain gives, for each rule tried, why it did or did not
 * match. No allocation: called from the alloc/tag paths. */
#include <fnmatch.h>
#include <stdio.h>
#include <string.h>

#include "policy/policy-internal.h"

/* vLLM --cpu-offload-params: pat is a contiguous run of whole dot-separated
 * components of name ("experts.w2_weight" in "mlp.experts.w2_weight"). */
static bool segment_match(const char *name, const char *pat)
{
    size_t pl = strlen(pat);
    for (const char *s = name; s; s = strchr(s, '.')) {
        if (*s == '.')
            s++;
        if (strncmp(s, pat, pl) == 0 && (s[pl] == '\0' || s[pl] == '.'))
            return true;
    }
    return false;
}

static bool is_layer_word(const char *s, size_t n)
{
    static const char *const words[] = {"layers", "layer", "h", "blocks", "block", "blk"};
    for (size_t i = 0; i < WO_ARRAY_SIZE(words); i++)
        if (strlen(words[i]) == n && memcmp(s, words[i], n) == 0)
            return true;
    return false;
}

long wo_policy_layer_of(const char *name)
{
    const char *s = name;
    bool after_word = false;

    if (!name)
        return -1;
    while (*s) {
        const char *e = strchr(s, '.');
        size_t n = e ? (size_t)(e - s) : strlen(s);
        if (after_word && n > 0 && n <= 9 && strspn(s, "0123456789") == n) {
            long v = 0;
            for (size_t i = 0; i < n; i++)
                v = v * 10 + (s[i] - '0');
            return v;
        }
        /* the index must follow the word directly: "layers.mlp.experts.5" is an expert, not a layer */
        after_word = is_layer_word(s, n);
        if (!e)
            break;
        s = e + 1;
    }
    return -1;
}

static bool layer_item_has(const struct wo_layer_item *it, long l)
{
    if (it->kind == WO_LAYER_RANGE)
        return l >= it->lo && l <= it->hi;
    return l % it->every >= it->every - it->last;
}

static void fmt_layers(const struct wo_matchers *m, char *buf, size_t len)
{
    size_t o = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < m->nlayers && o + 1 < len; i++) {
        const struct wo_layer_item *it = &m->layers[i];
        int w;
        if (it->kind == WO_LAYER_GROUP)
            w = snprintf(buf + o, len - o, "%s{every: %ld, last: %ld}", i ? ", " : "", it->every,
                         it->last);
        else if (it->lo == it->hi)
            w = snprintf(buf + o, len - o, "%s%ld", i ? ", " : "", it->lo);
        else
            w = snprintf(buf + o, len - o, "%s%ld-%ld", i ? ", " : "", it->lo, it->hi);
        if (w < 0)
            break;
        o += (size_t)w;
    }
}

static void fmt_list(char **v, size_t n, char *buf, size_t len)
{
    size_t o = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < n && o + 1 < len; i++) {
        int w = snprintf(buf + o, len - o, "%s'%s'", i ? ", " : "", v[i]);
        if (w < 0)
            break;
        o += (size_t)w;
    }
}

/* Whether rule m matches; why (may be NULL) says the first matcher that
 * failed, or what held. */
static bool rule_matches(const struct wo_matchers *m, const char *name, uint64_t size, long layer,
                         char *why, size_t wlen)
{
    char list[256], s1[32], s2[32];
    size_t i;

    if (m->nmatch) {
        for (i = 0; i < m->nmatch && !segment_match(name, m->match[i]); i++)
            ;
        if (i == m->nmatch) {
            if (why) {
                fmt_list(m->match, m->nmatch, list, sizeof(list));
                snprintf(why, wlen, "match: no run of whole name components equals %s", list);
            }
            return false;
        }
    }
    if (m->nglob) {
        for (i = 0; i < m->nglob && fnmatch(m->glob[i], name, 0) != 0; i++)
            ;
        if (i == m->nglob) {
            if (why) {
                fmt_list(m->glob, m->nglob, list, sizeof(list));
                snprintf(why, wlen, "glob: the name does not match %s", list);
            }
            return false;
        }
    }
    if (m->nregex) {
        for (i = 0; i < m->nregex && regexec(&m->regex[i], name, 0, NULL, 0) != 0; i++)
            ;
        if (i == m->nregex) {
            if (why) {
                fmt_list(m->regex_src, m->nregex, list, sizeof(list));
                snprintf(why, wlen, "regex: no match for %s", list);
            }
            return false;
        }
    }
    if (m->nlayers) {
        if (layer < 0) {
            if (why)
                snprintf(why, wlen, "layers: the name has no layer index (such as layers.N. or blk.N.)");
            return false;
        }
        for (i = 0; i < m->nlayers && !layer_item_has(&m->layers[i], layer); i++)
            ;
        if (i == m->nlayers) {
            if (why) {
                fmt_layers(m, list, sizeof(list));
                snprintf(why, wlen, "layers: layer %ld is not in %s", layer, list);
            }
            return false;
        }
    }
    if ((m->has_min || m->has_max) && size == WO_SIZE_UNKNOWN) {
        if (why)
            snprintf(why, wlen, "%s: the size is not known", m->has_min ? "min_size" : "max_size");
        return false;
    }
    if (m->has_min && size < m->min_size) {
        if (why)
            snprintf(why, wlen, "min_size: %s is below %s", wo_format_size(size, s1, sizeof(s1)),
                     wo_format_size(m->min_size, s2, sizeof(s2)));
        return false;
    }
    if (m->has_max && size > m->max_size) {
        if (why)
            snprintf(why, wlen, "max_size: %s is above %s", wo_format_size(size, s1, sizeof(s1)),
                     wo_format_size(m->max_size, s2, sizeof(s2)));
        return false;
    }
    if (why) {
        size_t o = 0;
        int w;
        why[0] = '\0';
#define ADD(...)                                                                                   \
    do {                                                                                           \
        if (o + 1 < wlen && (w = snprintf(why + o, wlen - o, __VA_ARGS__)) > 0)                    \
            o += (size_t)w;                                                                        \
    } while (0)
        if (m->nmatch)
            ADD("match");
        if (m->nglob)
            ADD("%sglob", o ? ", " : "");
        if (m->nregex)
            ADD("%sregex", o ? ", " : "");
        if (m->nlayers)
            ADD("%slayers (layer %ld)", o ? ", " : "", layer);
        if (m->has_min)
            ADD("%smin_size", o ? ", " : "");
        if (m->has_max)
            ADD("%smax_size", o ? ", " : "");
        ADD(strchr(why, ',') ? " hold" : " holds");
#undef ADD
    }
    return true;
}

int wo_policy_explain(const struct wo_policy *p, const char *name, uint64_t size,
                      struct wo_match *ret, wo_explain_fn fn, void *ud)
{
    char why[512];
    long layer;

    if (!p || !name || !ret)
        return -EINVAL;
    layer = wo_policy_layer_of(name);
    for (size_t i = 0; i < p->nrules; i++) {
        bool ok = rule_matches(&p->m[i], name, size, layer, fn ? why : NULL, sizeof(why));
        if (fn)
            fn(ud, i, ok, why);
        if (ok) {
            ret->rule = (long)i;
            ret->place = p->rules[i].place;
            ret->r = &p->rules[i];
            return 1;
        }
    }
    ret->rule = -1;
    ret->place = p->g.default_place;
    ret->r = NULL;
    return 0;
}

int wo_policy_match(const struct wo_policy *p, const char *name, uint64_t size,
                    struct wo_match *ret)
{
    return wo_policy_explain(p, name, size, ret, NULL, NULL);
}

struct print_ud {
    const struct wo_policy *p;
    FILE *f;
};

static void print_one(void *ud, size_t rule, bool matched, const char *why)
{
    struct print_ud *u = ud;
    char lab[200];
    wo_policy_rule_label(u->p, rule, lab, sizeof(lab));
    if (matched)
        fprintf(u->f, "  %s: matches (%s) -> %s\n", lab, why,
                wo_placement_to_string(u->p->rules[rule].place));
    else
        fprintf(u->f, "  %s: no: %s\n", lab, why);
}

int wo_policy_explain_print(const struct wo_policy *p, const char *name, uint64_t size, FILE *f)
{
    struct print_ud u = {p, f};
    struct wo_match m;
    char s1[32];
    long layer;
    int r;

    if (!p || !name || !f)
        return -EINVAL;
    layer = wo_policy_layer_of(name);
    fprintf(f, "%s", name);
    if (size != WO_SIZE_UNKNOWN)
        fprintf(f, " (%s)", wo_format_size(size, s1, sizeof(s1)));
    if (layer >= 0)
        fprintf(f, " [layer %ld]", layer);
    fprintf(f, "\n");
    r = wo_policy_explain(p, name, size, &m, print_one, &u);
    if (r == 0)
        fprintf(f, "  no rule matches: the default applies\n");
    if (r == 1) {
        char lab[200];
        fprintf(f, "  => %s, by %s\n", wo_placement_to_string(m.place),
                wo_policy_rule_label(p, (size_t)m.rule, lab, sizeof(lab)));
    } else {
        fprintf(f, "  => %s, by the default\n", wo_placement_to_string(m.place));
    }
    return r;
}
