/* policy/dump.c: the normalized form (canonical YAML that loads back to
 * the same policy) and the per-rule counters report. */
#include <stdio.h>
#include <string.h>

#include "policy/policy-internal.h"

/* A double-quoted YAML string; '$' doubled so that loading the dump does
 * not expand variables a second time. */
static void put_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p == '$')
            fputs("$$", f);
        else if (*p < 0x20 || *p == 0x7f)
            fprintf(f, "\\x%02x", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
}

static void put_list(FILE *f, const char *key, char **v, size_t n)
{
    fprintf(f, "    %s: [", key);
    for (size_t i = 0; i < n; i++) {
        if (i)
            fputs(", ", f);
        put_str(f, v[i]);
    }
    fputs("]\n", f);
}

/* A prefetch key that is auto (UINT64_MAX), off (0) or a size. */
static void put_auto_off_size(FILE *f, const char *key, uint64_t v)
{
    if (v == UINT64_MAX)
        fprintf(f, "  %s: auto\n", key);
    else if (v == 0)
        fprintf(f, "  %s: off\n", key);
    else
        fprintf(f, "  %s: %llu\n", key, (unsigned long long)v);
}

static void put_budget(FILE *f, const char *key, const struct wo_budget *b)
{
    switch (b->kind) {
    case WO_BUDGET_UNLIMITED:
        fprintf(f, "%s: unlimited\n", key);
        break;
    case WO_BUDGET_AUTO:
        fprintf(f, "%s: auto\n", key);
        break;
    case WO_BUDGET_BYTES:
        fprintf(f, "%s: %llu\n", key, (unsigned long long)b->bytes);
        break;
    case WO_BUDGET_PERCENT: {
        char frac[8];
        int n = snprintf(frac, sizeof(frac), "%04u", b->ppm % 10000);
        while (n > 0 && frac[n - 1] == '0')
            frac[--n] = '\0';
        fprintf(f, "%s: \"%u%s%s%%\"\n", key, b->ppm / 10000, n ? "." : "", frac);
        break;
    }
    }
}

int wo_policy_dump_globals(const struct wo_policy_globals *g, FILE *f)
{
    static const char *const open_s[] = {"at-start", "on-first-tag", "api"};
    static const char *const close_s[] = {"at-seal", "on-first-tag", "api"};
    static const char *const evict_s[] = {"auto", "read-mostly", "copy-back"};
    static const char *const mode_s[] = {"auto", "hot-set", "stream"};

    if (!g || !f)
        return -EINVAL;
    fprintf(f, "version: 1\n");
    fprintf(f, "default: %s\n", wo_placement_to_string(g->default_place));
    put_budget(f, "host_budget", &g->host_budget);
    put_budget(f, "device_budget", &g->device_budget);
    fprintf(f, "pin_fallback: %s\n", g->pin_fallback == WO_PIN_FALLBACK_STOP ? "stop" : "managed");
    fprintf(f, "window:\n  open: %s\n  close: %s\n  min_size: %llu\n", open_s[g->window.open],
            close_s[g->window.close], (unsigned long long)g->window.min_size);
    fprintf(f, "prefetch:\n  enabled: %s\n", g->prefetch.enabled ? "true" : "false");
    if (g->prefetch.lookahead_kind == WO_LOOKAHEAD_BYTES)
        fprintf(f, "  lookahead: %lluB\n", (unsigned long long)g->prefetch.lookahead);
    else
        fprintf(f, "  lookahead: %llu\n", (unsigned long long)g->prefetch.lookahead);
    fprintf(f, "  piece_size: %llu\n  hot_set: %s\n  eviction: %s\n",
            (unsigned long long)g->prefetch.piece_size, g->prefetch.hot_set ? "true" : "false",
            evict_s[g->prefetch.eviction]);
    fprintf(f, "  mode: %s\n  slots: %u\n", mode_s[g->prefetch.mode], g->prefetch.slots);
    put_auto_off_size(f, "pinned_copies", g->prefetch.pinned_copies);
    put_auto_off_size(f, "hot_experts", g->prefetch.hot_experts);
    if (g->fit.enabled) {
        fputs("fit:\n", f);
        put_budget(f, "  device", &g->fit.device);
        fprintf(f, "  keep_free: %llu\n", (unsigned long long)g->fit.keep_free);
        if (g->fit.reserve == WO_FIT_RESERVE_AUTO)
            fputs("  reserve: auto\n", f);
        else
            fprintf(f, "  reserve: %llu\n", (unsigned long long)g->fit.reserve);
        fprintf(f, "  rest: %s\n", wo_placement_to_string(g->fit.rest));
    }
    return ferror(f) ? -EIO : 0;
}

int wo_policy_dump_rule(const struct wo_policy *p, size_t i, FILE *f)
{
    const struct wo_rule *r;
    const struct wo_matchers *m;

    if (!p || !f || i >= p->nrules)
        return -EINVAL;
    r = &p->rules[i];
    m = &p->m[i];
    fprintf(f, "  - # rule %zu, line %u\n", i + 1, r->line);
    if (r->name) {
        fputs("    name: ", f);
        put_str(f, r->name);
        fputc('\n', f);
    }
    if (m->nmatch)
        put_list(f, "match", m->match, m->nmatch);
    if (m->nglob)
        put_list(f, "glob", m->glob, m->nglob);
    if (m->nregex)
        put_list(f, "regex", m->regex_src, m->nregex);
    if (m->nlayers) {
        fputs("    layers: [", f);
        for (size_t k = 0; k < m->nlayers; k++) {
            const struct wo_layer_item *it = &m->layers[k];
            if (k)
                fputs(", ", f);
            if (it->kind == WO_LAYER_GROUP)
                fprintf(f, "{every: %ld, last: %ld}", it->every, it->last);
            else if (it->lo == it->hi)
                fprintf(f, "%ld", it->lo);
            else
                fprintf(f, "\"%ld-%ld\"", it->lo, it->hi);
        }
        fputs("]\n", f);
    }
    if (m->has_min)
        fprintf(f, "    min_size: %llu\n", (unsigned long long)m->min_size);
    if (m->has_max)
        fprintf(f, "    max_size: %llu\n", (unsigned long long)m->max_size);
    fprintf(f, "    place: %s\n", wo_placement_to_string(r->place));
    if (r->place == WO_PLACE_HOST)
        fprintf(f, "    pin: %s\n", r->pin ? "true" : "false");
    if (r->place == WO_PLACE_MANAGED)
        fprintf(f, "    priority: %d\n    slices: %s\n", r->priority,
                r->slices == WO_SLICES_NONE ? "none" : "auto");
    return ferror(f) ? -EIO : 0;
}

int wo_policy_dump(const struct wo_policy *p, FILE *f)
{
    if (!p || !f)
        return -EINVAL;
    fprintf(f, "# normalized from %s\n", p->source);
    wo_policy_dump_globals(&p->g, f);
    if (!p->nrules) {
        fprintf(f, "rules: []\n");
        return ferror(f) ? -EIO : 0;
    }
    fprintf(f, "rules:\n");
    for (size_t i = 0; i < p->nrules; i++)
        wo_policy_dump_rule(p, i, f);
    return ferror(f) ? -EIO : 0;
}

void wo_policy_print_counts(const struct wo_policy *p, const struct wo_rule_counts *c, FILE *f)
{
    if (!p || !c || !f)
        return;
    for (size_t i = 0; i <= p->nrules; i++) {
        char lab[200], s1[32], s2[32];
        enum wo_placement pl = i < p->nrules ? p->rules[i].place : p->g.default_place;
        wo_policy_rule_label(p, i, lab, sizeof(lab));
        if (!c[i].names) {
            fprintf(f, "%s -> %s: matched nothing\n", lab, wo_placement_to_string(pl));
            continue;
        }
        fprintf(f, "%s -> %s: %llu names, %s", lab, wo_placement_to_string(pl),
                (unsigned long long)c[i].names, wo_format_size(c[i].bytes, s1, sizeof(s1)));
        if (c[i].over_budget_names)
            fprintf(f, "; %llu names, %s kept on the device (host budget spent)",
                    (unsigned long long)c[i].over_budget_names,
                    wo_format_size(c[i].over_budget_bytes, s2, sizeof(s2)));
        fputc('\n', f);
    }
}
