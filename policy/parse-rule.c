/* policy/parse-rule.c: one rule of `rules:` (parse-int.h): its matchers
 * (name segments, globs, regular expressions, layer groups), placement and
 * options, and the shadowed-rule check across them. */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "policy/parse-int.h"

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
        wo_schema_err(c, n, "found a mapping in '%s', expected a pattern or a list of patterns",
                     key);
        return -EINVAL;
    }
    if (n->kind == WO_NODE_SEQ) {
        if (n->n == 0) {
            wo_schema_err(c, n, "found an empty list in '%s', expected at least one pattern", key);
            return -EINVAL;
        }
        count = n->n;
    }
    for (size_t i = 0; i < count; i++) {
        if (n->kind == WO_NODE_SEQ)
            one = n->items[i];
        if (one->kind != WO_NODE_SCALAR || one->null) {
            wo_schema_err(c, one, "found %s in '%s', expected a pattern (a string)",
                         wo_schema_found(one, b, sizeof(b)), key);
            r = -EINVAL;
            continue;
        }
        if (!one->value[0]) {
            wo_schema_err(c, one, "found an empty pattern in '%s', expected a non-empty string",
                         key);
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
        wo_schema_err(c, n,
                     "found %s with an empty component, expected whole name components joined by "
                     "dots such as 'experts' or 'experts.w2_weight'",
                     wo_schema_found(n, b, sizeof(b)));
        return -EINVAL;
    }
    if (strpbrk(s, "*?[")) {
        /* segments are literal; a wildcard here is almost surely meant as a glob */
        wo_schema_warn(c, n, "'match' is literal: %s contains a wildcard that matches only itself; "
             "use 'glob' for wildcards", wo_schema_found(n, b, sizeof(b)));
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
        wo_schema_err(c, n, "found a regular expression of %zu bytes, expected at most %d",
                     strlen(s), WO_REGEX_MAX_LEN);
        return -EINVAL;
    }
    for (const char *p = s; *p; p++) {
        if (p[0] == '\\' && p[1] >= '1' && p[1] <= '9') {
            /* glibc accepts back-references in ERE; matching them can take exponential time */
            wo_schema_err(c, n,
                         "found back-reference '\\%c' in regular expression %s, expected a POSIX "
                         "extended regular expression without back-references",
                         p[1], wo_schema_found(n, b, sizeof(b)));
            return -EINVAL;
        }
        if (p[0] == '\\' && p[1])
            p++;
    }
    cost = wo_regex_cost(s);
    if (cost == WO_REGEX_STACKED) {
        wo_schema_err(c, n, "found regular expression %s with a quantifier applied to a quantifier "
            "(such as 'a+*', 'a?+' or 'a{2}{3}'), expected one quantifier per item (use a group: "
            "'(a+)*')", wo_schema_found(n, b, sizeof(b)));
        return -EINVAL;
    }
    if (cost > WO_REGEX_MAX_NODES) {
        wo_schema_err(c, n,
                     "found regular expression %s whose repetitions expand too far (nested '+' or "
                     "{n,m}), expected a simpler pattern",
                     wo_schema_found(n, b, sizeof(b)));
        return -EINVAL;
    }
    /* bounds the memory of all compiled expressions together */
    c->regex_nodes += cost;
    if (c->regex_nodes > WO_REGEX_MAX_TOTAL_NODES) {
        wo_schema_err(
            c, n,
            "found more regular expressions than a policy can hold (about %d nodes in all), "
            "expected fewer or simpler ones",
            WO_REGEX_MAX_TOTAL_NODES);
        return -EINVAL;
    }
    r = regcomp(&re, s, REG_EXTENDED | REG_NOSUB);
    if (r != 0) {
        regerror(r, &re, msg, sizeof(msg));
        wo_schema_err(c, n, "found invalid regular expression %s (%s), expected a POSIX extended "
            "regular expression", wo_schema_found(n, b, sizeof(b)), msg);
        return -EINVAL;
    }
    regfree(&re);
    for (const char *p = s; *p; p++) {
        if (p[0] == '\\' && p[1]) {
            if (p[1] == 'd' || p[1] == 'D') {
                wo_schema_warn(c, n,
                              "regular expression %s uses '\\%c', which POSIX ERE does not know "
                              "(it matches the letter '%c'); write [0-9] instead",
                              wo_schema_found(n, b, sizeof(b)), p[1], p[1]);
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
        if (wo_schema_map(c, n, keys, 2, "a layer group", v) < 0)
            return -EINVAL;
        if (!v[0] || !v[1]) {
            wo_schema_err(c, n, "found a layer group without '%s', expected {every: N, last: K} "
                "(vLLM offload_group_size and offload_num_in_group)", v[0] ? "last" : "every");
            return -EINVAL;
        }
        if (wo_schema_uint(c, v[0], 1, (uint64_t)LAYER_MAX, "a group size", &every) < 0 ||
            wo_schema_uint(c, v[1], 1, (uint64_t)LAYER_MAX, "a number of layers", &last) < 0)
            return -EINVAL;
        if (last > every) {
            wo_schema_err(
                c, v[1],
                "found last: %llu greater than every: %llu, expected at most the group size",
                (unsigned long long)last, (unsigned long long)every);
            return -EINVAL;
        }
        it.kind = WO_LAYER_GROUP;
        it.every = (long)every;
        it.last = (long)last;
        return add_layer(m, &it);
    }
    if (n->kind != WO_NODE_SCALAR || n->null) {
        wo_schema_err(c, n, "found %s, expected %s", wo_schema_found(n, b, sizeof(b)),
                     LAYERS_EXPECTED);
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
            wo_schema_err(c, n, "found %s, expected layer indices up to %ld",
                         wo_schema_found(n, b, sizeof(b)), LAYER_MAX);
            return -EINVAL;
        }
        if (r < 0 || *e) {
            if (s[0] == '-')
                wo_schema_err(c, n, "found negative layer %s, expected %s",
                             wo_schema_found(n, b, sizeof(b)), LAYERS_EXPECTED);
            else
                wo_schema_err(c, n, "found %s, expected %s", wo_schema_found(n, b, sizeof(b)),
                             LAYERS_EXPECTED);
            return -EINVAL;
        }
        if (it.hi < it.lo) {
            wo_schema_err(c, n, "found range %s that runs backwards, expected 'LOW-HIGH'",
                         wo_schema_found(n, b, sizeof(b)));
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
        wo_schema_err(
            c, n, "found an empty list in 'layers', expected at least one layer, range or group");
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
const char *const wo_schema_place_names[3] = {"device", "host", "managed"};

/* A placement: device, host or managed; cpu (any case, as llama.cpp's
 * -ot ...=CPU writes it) is host. names is wo_schema_place_names or rest_names. */
int wo_schema_place(struct ctx *c, const struct wo_node *n, const char *const *names, size_t nn,
                    enum wo_placement *ret)
{
    int idx;

    if (n->kind == WO_NODE_SCALAR && !n->null && n->value && strcasecmp(n->value, "cpu") == 0) {
        *ret = WO_PLACE_HOST;
        return 0;
    }
    if (wo_schema_enum(c, n, names, nn, &idx) < 0)
        return -EINVAL;
    *ret = wo_placement_from_string(names[idx]);
    return 0;
}
static const char *const slices_names[] = {"auto", "none"};

int wo_schema_rule(struct ctx *c, const struct wo_node *n, struct wo_rule *rule,
                   struct wo_matchers *m)
{
    const struct wo_node *v[K_RULE_MAX];
    char b[128];
    int r = 0, idx;

    rule->line = n->line;
    rule->column = n->column;
    rule->pin = true;
    rule->m = m;
    r = wo_schema_map(c, n, rule_keys, K_RULE_MAX, "a rule", v);
    if (n->kind != WO_NODE_MAP)
        return -EINVAL;
    if (v[K_NAME]) {
        const char *s = wo_schema_scalar(c, v[K_NAME], "a rule name (a string)");
        bool ctl = false;
        for (const char *q = s ? s : ""; *q && !ctl; q++)
            ctl = (unsigned char)*q < 0x20 || *q == 0x7f;
        if (!s) {
            r = -EINVAL;
        } else if (ctl) {
            /* the name goes into one-line log messages and stats */
            wo_schema_err(c, v[K_NAME],
                         "found %s with control characters, expected a rule name on one line",
                         wo_schema_found(v[K_NAME], b, sizeof(b)));
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
        if (wo_schema_size(c, v[K_MIN], &m->min_size) < 0)
            r = -EINVAL;
        else
            m->has_min = true;
    }
    if (v[K_MAX]) {
        if (wo_schema_size(c, v[K_MAX], &m->max_size) < 0)
            r = -EINVAL;
        else
            m->has_max = true;
    }
    if (m->has_min && m->has_max && m->min_size > m->max_size) {
        char s1[32], s2[32];
        wo_schema_err(c, v[K_MAX],
                     "found max_size %s below min_size %s (line %u), expected max_size >= "
                     "min_size: the rule could never match",
                     wo_format_size(m->max_size, s1, sizeof(s1)),
                     wo_format_size(m->min_size, s2, sizeof(s2)), v[K_MIN]->line);
        r = -EINVAL;
    }
    if (!v[K_MATCH] && !v[K_GLOB] && !v[K_REGEX] && !v[K_LAYERS] && !v[K_MIN] && !v[K_MAX]) {
        wo_schema_err(c, n,
                     "found a rule without a matcher, expected at least one of match, glob, regex, "
                     "layers, min_size, max_size (glob: '*' matches every name)");
        r = -EINVAL;
    }
    if (!v[K_PLACE]) {
        wo_schema_err(c, n, "found a rule without 'place', expected place: device, host or managed");
        return -EINVAL;
    }
    if (wo_schema_place(c, v[K_PLACE], wo_schema_place_names, 3, &rule->place) < 0)
        return -EINVAL;
    if (v[K_PIN]) {
        if (rule->place != WO_PLACE_HOST) {
            wo_schema_err(c, v[K_PIN],
                         "found 'pin' in a rule with place: %s, expected it only with place: host",
                         wo_placement_to_string(rule->place));
            r = -EINVAL;
        } else if (wo_schema_bool(c, v[K_PIN], &rule->pin) < 0) {
            r = -EINVAL;
        }
    }
    if (v[K_PRIO]) {
        uint64_t pr;
        if (rule->place != WO_PLACE_MANAGED) {
            wo_schema_err(c, v[K_PRIO],
                         "found 'priority' in a rule with place: %s, expected it only with "
                         "place: managed",
                         wo_placement_to_string(rule->place));
            r = -EINVAL;
        } else if (wo_schema_uint(c, v[K_PRIO], 0, 100, "a priority", &pr) < 0) {
            r = -EINVAL;
        } else {
            rule->priority = (int)pr;
        }
    }
    if (v[K_SLICES]) {
        if (rule->place != WO_PLACE_MANAGED) {
            wo_schema_err(c, v[K_SLICES],
                         "found 'slices' in a rule with place: %s, expected it only with "
                         "place: managed",
                         wo_placement_to_string(rule->place));
            r = -EINVAL;
        } else if (wo_schema_enum(c, v[K_SLICES], slices_names, 2, &idx) < 0) {
            r = -EINVAL;
        } else {
            rule->slices = (enum wo_slices)idx;
        }
    }
    return r;
}

/* ---- shadowed rules ---- */

void wo_schema_check_shadowed(struct ctx *c, const struct wo_node *rules)
{
    struct wo_policy *p = c->p;
    for (size_t j = 1; j < p->nrules; j++)
        for (size_t i = 0; i < j; i++)
            if (wo_matchers_shadow(&p->m[i], &p->m[j])) {
                char lab[160];
                wo_policy_rule_label(p, i, lab, sizeof(lab));
                wo_schema_warn(c, rules->items[j],
                              "rule %zu can never match: every name it matches is "
                              "matched first by %s (first match wins); move it above or remove it",
                              j + 1, lab);
                break;
            }
}
