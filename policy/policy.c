/* policy/policy.c: what every part of policy/ stands on: the placement
 * names, freeing a policy, its accessors and the budget helpers. Loading
 * one (file or buffer -> tree -> schema) is policy/load.c's. */
#include <stdio.h>
#include <string.h>

#include "policy/policy-internal.h"


static const char *const place_str[] = {"unset", "device", "host", "managed"};

const char *wo_placement_to_string(enum wo_placement p)
{
    if ((unsigned)p >= WO_ARRAY_SIZE(place_str))
        return "?";
    return place_str[p];
}

int wo_placement_from_string(const char *s)
{
    if (!s)
        return -EINVAL;
    for (size_t i = WO_PLACE_DEVICE; i < WO_ARRAY_SIZE(place_str); i++)
        if (strcmp(s, place_str[i]) == 0)
            return (int)i;
    return -EINVAL;
}

static void matchers_free(struct wo_matchers *m)
{
    for (size_t i = 0; i < m->nmatch; i++)
        free(m->match[i]);
    free(m->match);
    for (size_t i = 0; i < m->nglob; i++)
        free(m->glob[i]);
    free(m->glob);
    for (size_t i = 0; i < m->nregex; i++) {
        if (m->regex)
            regfree(&m->regex[i]);
        free(m->regex_src[i]);
    }
    free(m->regex);
    free(m->regex_src);
    free(m->layers);
}

struct wo_policy *wo_policy_free(struct wo_policy *p)
{
    if (!p)
        return NULL;
    for (size_t i = 0; i < p->nrules; i++) {
        free((char *)p->rules[i].name);
        matchers_free(&p->m[i]);
    }
    free(p->rules);
    free(p->m);
    free(p->source);
    free(p);
    return NULL;
}

const char *wo_policy_source(const struct wo_policy *p)
{
    return p ? p->source : "";
}

/* What `rules: []` gives: nothing placeable, everything passes through
 * (the window opens only when the API asks). */
static const struct wo_policy_globals passthrough_globals =
    WO_POLICY_DEFAULTS(WO_WINDOW_OPEN_API);

const struct wo_policy_globals *wo_policy_globals(const struct wo_policy *p)
{
    return p ? &p->g : &passthrough_globals;
}

size_t wo_policy_nrules(const struct wo_policy *p)
{
    return p ? p->nrules : 0;
}

const struct wo_rule *wo_policy_rule(const struct wo_policy *p, size_t i)
{
    if (!p || i >= p->nrules)
        return NULL;
    return &p->rules[i];
}

const char *wo_policy_rule_label(const struct wo_policy *p, size_t i, char *buf, size_t len)
{
    const char *base;
    if (!p || i >= p->nrules) {
        snprintf(buf, len, "the default");
        return buf;
    }
    base = strrchr(p->source, '/');
    base = base ? base + 1 : p->source;
    if (p->rules[i].name)
        snprintf(buf, len, "rule %zu '%s' (%s:%u)", i + 1, p->rules[i].name, base, p->rules[i].line);
    else
        snprintf(buf, len, "rule %zu (%s:%u)", i + 1, base, p->rules[i].line);
    return buf;
}

bool wo_policy_passthrough(const struct wo_policy *p)
{
    if (!p)
        return true;
    if (p->g.default_place != WO_PLACE_DEVICE || p->g.fit.enabled)
        return false;
    for (size_t i = 0; i < p->nrules; i++)
        if (p->rules[i].place != WO_PLACE_DEVICE)
            return false;
    return true;
}

void wo_host_budget_init(struct wo_host_budget *b, const struct wo_policy *p)
{
    b->limit = p && p->g.host_budget.kind == WO_BUDGET_BYTES ? p->g.host_budget.bytes : UINT64_MAX;
    b->used = 0;
    b->spent = false;
}

int wo_host_budget_take(struct wo_host_budget *b, uint64_t bytes)
{
    if (b->spent || bytes > b->limit - b->used) {
        b->spent = true;
        return 0;
    }
    b->used += bytes;
    return 1;
}

void wo_host_budget_release(struct wo_host_budget *b, uint64_t bytes)
{
    b->used = bytes > b->used ? 0 : b->used - bytes;
}

uint64_t wo_budget_resolve(const struct wo_budget *b, uint64_t device_total, uint64_t device_free)
{
    __extension__ typedef unsigned __int128 u128;
    switch (b->kind) {
    case WO_BUDGET_UNLIMITED:
        return UINT64_MAX;
    case WO_BUDGET_AUTO:
        return device_free / 2;
    case WO_BUDGET_BYTES:
        return b->bytes;
    case WO_BUDGET_PERCENT:
        return (uint64_t)((u128)device_total * b->ppm / 1000000u);
    }
    return 0;
}

uint64_t wo_policy_device_budget(const struct wo_policy *p, uint64_t device_total,
                                 uint64_t device_free)
{
    return wo_budget_resolve(&wo_policy_globals(p)->device_budget, device_total, device_free);
}
