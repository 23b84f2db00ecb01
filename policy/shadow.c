/* policy/shadow.c: whether an earlier rule matches every name a later rule
 * matches (the later one can then never match: first match wins). Sound,
 * not complete: it never claims a rule is shadowed when it is not, and it
 * bounds its work for any pair of rules. */
#include <string.h>

#include "policy/policy-internal.h"

static bool strs_subset(char **a, size_t na, char **b, size_t nb)
{
    for (size_t i = 0; i < na; i++) {
        bool in = false;
        for (size_t j = 0; j < nb && !in; j++)
            in = strcmp(a[i], b[j]) == 0;
        if (!in)
            return false;
    }
    return true;
}

static bool layer_in(const struct wo_matchers *m, long l)
{
    for (size_t i = 0; i < m->nlayers; i++) {
        const struct wo_layer_item *it = &m->layers[i];
        if (it->kind == WO_LAYER_RANGE ? (l >= it->lo && l <= it->hi)
                                       : (l % it->every >= it->every - it->last))
            return true;
    }
    return false;
}

/* Every layer j accepts, i accepts too (a sound, not complete, test). */
static bool layers_subset(const struct wo_matchers *j, const struct wo_matchers *i)
{
    for (size_t k = 0; k < j->nlayers; k++) {
        const struct wo_layer_item *it = &j->layers[k];
        if (it->kind == WO_LAYER_GROUP) {
            bool same = false;
            for (size_t q = 0; q < i->nlayers && !same; q++)
                same = i->layers[q].kind == WO_LAYER_GROUP && i->layers[q].every == it->every &&
                       i->layers[q].last >= it->last; /* the last K of a group grow with K */
            if (!same)
                return false;
            continue;
        }
        {
            /* one range of i holding all of it, or a short range checked
             * layer by layer: bounded work for any pair of rules */
            bool inside = false;
            for (size_t q = 0; q < i->nlayers && !inside; q++)
                inside = i->layers[q].kind == WO_LAYER_RANGE && i->layers[q].lo <= it->lo &&
                         it->hi <= i->layers[q].hi;
            if (inside)
                continue;
            if (it->hi - it->lo >= 64)
                return false;
            for (long l = it->lo; l <= it->hi; l++)
                if (!layer_in(i, l))
                    return false;
        }
    }
    return true;
}

static bool has_star(char **g, size_t n)
{
    for (size_t k = 0; k < n; k++)
        if (strspn(g[k], "*") == strlen(g[k]))
            return true;
    return false;
}

/* A regex that every name matches (as a search): ".*", "^", "^.*$"... */
static bool has_any_regex(char **r, size_t n)
{
    static const char *const any[] = {".*", "^", "$", "^.*", ".*$", "^.*$", "()", "(.*)"};
    for (size_t k = 0; k < n; k++)
        for (size_t q = 0; q < WO_ARRAY_SIZE(any); q++)
            if (strcmp(r[k], any[q]) == 0)
                return true;
    return false;
}

/* True when every name rule j matches is also matched by the earlier rule i. */
bool wo_matchers_shadow(const struct wo_matchers *i, const struct wo_matchers *j)
{
    if (i->nmatch && !(j->nmatch && strs_subset(j->match, j->nmatch, i->match, i->nmatch)))
        return false;
    if (i->nglob && !has_star(i->glob, i->nglob) &&
        !(j->nglob && strs_subset(j->glob, j->nglob, i->glob, i->nglob)))
        return false;
    if (i->nregex && !has_any_regex(i->regex_src, i->nregex) &&
        !(j->nregex && strs_subset(j->regex_src, j->nregex, i->regex_src, i->nregex)))
        return false;
    if (i->nlayers && !(j->nlayers && layers_subset(j, i)))
        return false;
    if (i->has_min && !(j->has_min && j->min_size >= i->min_size))
        return false;
    if (i->has_max && !(j->has_max && j->max_size <= i->max_size))
        return false;
    return true;
}
