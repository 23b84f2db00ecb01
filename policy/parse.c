/* policy/parse.c: the schema: a YAML node tree -> struct wo_policy, with a
 * located diagnostic for everything that is not exactly what the schema
 * expects ("found X, expected Y"), did-you-mean for unknown keys and
 * values, and the checks across keys (contradictions, shadowed rules).
 * This file reads the document (the top level, window:, prefetch:, the
 * budgets, fit:); a rule is read in parse-rule.c, scalars and mappings in
 * parse-value.c. */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "policy/parse-int.h"

/* ---- the document ---- */

enum { G_VERSION, G_DEFAULT, G_HOST, G_DEVICE, G_PINFB, G_WINDOW, G_PREFETCH, G_RULES, G_FIT, G_MAX };
static const char *const top_keys[] = {"version", "default", "host_budget", "device_budget",
                                       "pin_fallback", "window", "prefetch", "rules", "fit"};
static const char *const fit_keys[] = {"device", "keep_free", "rest", "reserve"};
static const char *const rest_names[] = {"host", "managed"};
static const char *const window_keys[] = {"open", "close", "min_size"};
static const char *const open_names[] = {"at-start", "on-first-tag", "api"};
static const char *const close_names[] = {"at-seal", "on-first-tag", "api"};
static const char *const prefetch_keys[] = {
    "enabled", "lookahead", "piece_size",   "hot_set",       "eviction",
    "mode",    "slots",     "experimental", "pinned_copies", "hot_experts"};
static const char *const mode_names[] = {"auto", "hot-set", "stream"};
static const char *const eviction_names[] = {"auto", "read-mostly", "copy-back"};
static const char *const pinfb_names[] = {"managed", "stop"};

static int parse_window(struct ctx *c, const struct wo_node *n, bool *open_given)
{
    struct wo_policy_globals *g = &c->p->g;
    const struct wo_node *v[3];
    int r = wo_schema_map(c, n, window_keys, 3, "window", v), idx;

    if (n->kind != WO_NODE_MAP)
        return r;
    if (v[0]) {
        if (wo_schema_enum(c, v[0], open_names, 3, &idx) < 0)
            r = -EINVAL;
        else {
            g->window.open = (enum wo_window_open)idx;
            *open_given = true;
        }
    }
    if (v[1]) {
        if (wo_schema_enum(c, v[1], close_names, 3, &idx) < 0)
            r = -EINVAL;
        else
            g->window.close = (enum wo_window_close)idx;
    }
    if (v[2] && wo_schema_size(c, v[2], &g->window.min_size) < 0)
        r = -EINVAL;
    if (r == 0 && v[1] && g->window.open != WO_WINDOW_OPEN_API &&
        g->window.close != WO_WINDOW_CLOSE_API) {
        /* the events come in the order start < first tag < seal */
        int o = g->window.open == WO_WINDOW_OPEN_AT_START ? 0 : 1;
        int cl = g->window.close == WO_WINDOW_CLOSE_ON_FIRST_TAG ? 1 : 2;
        if (cl <= o) {
            wo_schema_err(c, v[1],
                         "found close: %s with open: %s, expected the window to close after it "
                         "opens (the events come in the order at-start, on-first-tag, at-seal)",
                         close_names[g->window.close], open_names[g->window.open]);
            r = -EINVAL;
        }
    }
    return r;
}

/* auto (UINT64_MAX: WO_PIN_COPIES_AUTO, WO_HOT_EXPERTS_AUTO), off (0) or a
 * size (example: one in the error), for prefetch.`key`. */
static int parse_auto_off_size(struct ctx *c, const struct wo_node *n, const char *key,
                               const char *example, uint64_t *ret)
{
    char expected[64], b[128];
    const char *s;

    snprintf(expected, sizeof(expected), "auto, off or a size (%s)", example);
    s = wo_schema_scalar(c, n, expected);
    if (!s)
        return -EINVAL;
    if (strcmp(s, "auto") == 0)
        *ret = UINT64_MAX;
    else if (strcmp(s, "off") == 0)
        *ret = 0;
    else if (wo_parse_size(s, ret) < 0) {
        wo_schema_err(c, n, "found %s %s, expected %s", key, wo_schema_found(n, b, sizeof(b)),
                      expected);
        return -EINVAL;
    }
    return 0;
}

static int parse_prefetch(struct ctx *c, const struct wo_node *n)
{
    struct wo_policy_globals *g = &c->p->g;
    const struct wo_node *v[10];
    int r = wo_schema_map(c, n, prefetch_keys, 10, "prefetch", v), idx;
    uint64_t slots;
    bool experimental = false;

    if (n->kind != WO_NODE_MAP)
        return r;
    if (v[0] && wo_schema_bool(c, v[0], &g->prefetch.enabled) < 0)
        r = -EINVAL;
    if (v[1]) {
        const char *s = wo_schema_scalar(c, v[1], "a number of ranges (4) or bytes (2GiB)");
        bool bare = s && *s && strspn(s, "0123456789") == strlen(s);
        if (!s) {
            r = -EINVAL;
        } else if (bare) {
            if (wo_schema_uint(c, v[1], 1, 100000, "a number of upcoming ranges",
                              &g->prefetch.lookahead) < 0)
                r = -EINVAL;
            g->prefetch.lookahead_kind = WO_LOOKAHEAD_RANGES;
        } else if (wo_schema_size(c, v[1], &g->prefetch.lookahead) < 0) {
            r = -EINVAL;
        } else if (g->prefetch.lookahead == 0) {
            wo_schema_err(c, v[1],
                         "found lookahead 0 bytes, expected more than 0 (set enabled: false to "
                         "turn prefetching off)");
            r = -EINVAL;
        } else {
            g->prefetch.lookahead_kind = WO_LOOKAHEAD_BYTES;
        }
    }
    if (v[2]) {
        if (wo_schema_size(c, v[2], &g->prefetch.piece_size) < 0) {
            r = -EINVAL;
        } else if (g->prefetch.piece_size < WO_PIECE_SIZE_MIN) {
            char s1[32];
            wo_schema_err(c, v[2],
                         "found piece_size %s, expected at least 16MiB (each prefetch call costs "
                         "~100 us of CPU: small pieces cannot keep up)",
                         wo_format_size(g->prefetch.piece_size, s1, sizeof(s1)));
            r = -EINVAL;
        }
    }
    if (v[3] && wo_schema_bool(c, v[3], &g->prefetch.hot_set) < 0)
        r = -EINVAL;
    if (v[4]) {
        if (wo_schema_enum(c, v[4], eviction_names, 3, &idx) < 0)
            r = -EINVAL;
        else
            g->prefetch.eviction = (enum wo_eviction)idx;
    }
    if (v[5]) {
        if (wo_schema_enum(c, v[5], mode_names, 3, &idx) < 0)
            r = -EINVAL;
        else
            g->prefetch.mode = (enum wo_prefetch_mode)idx;
    }
    if (v[7] && wo_schema_bool(c, v[7], &experimental) < 0)
        r = -EINVAL;
    /* `experimental: true` was required beside auto and stream while
     * streamed calls at batch 8 gave other tokens (2026-11-26): stale
     * addresses in unfilled struct members were taken for reads (launch.c,
     * notptr). Still accepted, so older policies load; it changes nothing. */
    (void)experimental;
    if (v[6]) {
        /* each slot holds the largest streamed range: two is the least that
         * overlaps a copy with the reads of the range before it */
        if (wo_schema_uint(c, v[6], WO_STREAM_SLOTS_MIN, WO_STREAM_SLOTS_MAX,
                     "a number of device staging slots", &slots) < 0)
            r = -EINVAL;
        else
            g->prefetch.slots = (uint32_t)slots;
    }
    /* host memory for pinned copies of managed ranges, the staging source
     * (uvm/stream-pin.h) */
    if (v[8] &&
        parse_auto_off_size(c, v[8], "pinned_copies", "16GiB", &g->prefetch.pinned_copies) < 0)
        r = -EINVAL;
    /* device bytes for the hot experts of expert tensors with picks
     * (uvm/picks-hot.h) */
    if (v[9] && parse_auto_off_size(c, v[9], "hot_experts", "8GiB", &g->prefetch.hot_experts) < 0)
        r = -EINVAL;
    return r;
}

static int parse_budget(struct ctx *c, const struct wo_node *n, bool device, struct wo_budget *b)
{
    const char *special = device ? "auto" : "unlimited";
    char bb[128];
    int r = 0;

    if (n->kind != WO_NODE_SCALAR || n->null) {
        wo_schema_err(c, n, "found %s, expected %s", wo_schema_found(n, bb, sizeof(bb)),
            device ? "auto, a size (40GiB) or a percentage of device memory (50%)"
                   : "unlimited or a size (200GiB)");
        return -EINVAL;
    }
    if (strcmp(n->value, special) == 0) {
        b->kind = device ? WO_BUDGET_AUTO : WO_BUDGET_UNLIMITED;
        return 0;
    }
    if (device && wo_schema_percent(c, n, &b->ppm, &r)) {
        if (r == 0)
            b->kind = WO_BUDGET_PERCENT;
        return r;
    }
    if (!device && strchr(n->value, '%')) {
        wo_schema_err(c, n,
                     "found %s, expected unlimited or a size: host_budget is bytes of host memory, "
                     "not a share of the device",
                     wo_schema_found(n, bb, sizeof(bb)));
        return -EINVAL;
    }
    if (wo_schema_size(c, n, &b->bytes) < 0)
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
        wo_schema_err(c, n, "found %s, expected %s", wo_schema_found(n, bb, sizeof(bb)),
                     FIT_DEVICE_EXPECTED);
        return -EINVAL;
    }
    if (wo_schema_percent(c, n, &b->ppm, &r)) {
        if (r < 0)
            return r;
        if (b->ppm == 0) {
            wo_schema_err(
                c, n,
                "found fit device 0%%, expected more than 0%%: fit needs room on the device "
                "for the weights it keeps there");
            return -EINVAL;
        }
        b->kind = WO_BUDGET_PERCENT;
        return 0;
    }
    if (wo_schema_size(c, n, &b->bytes) < 0)
        return -EINVAL;
    if (b->bytes == 0) {
        wo_schema_err(c, n,
                     "found fit device 0, expected more than 0 bytes (%s): fit needs room on the "
                     "device for the weights it keeps there",
                     FIT_DEVICE_EXPECTED);
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
        wo_schema_err(c, n,
            "found %s, expected fit: with %s, or a mapping with keys device, keep_free, rest, "
            "reserve",
            wo_schema_found(n, bb, sizeof(bb)), FIT_DEVICE_EXPECTED);
        return -EINVAL;
    }
    r = wo_schema_map(c, n, fit_keys, 4, "fit", v);
    if (!v[0]) {
        wo_schema_err(c, n, "found fit: without 'device', expected device: with %s",
                     FIT_DEVICE_EXPECTED);
        r = -EINVAL;
    } else if (parse_fit_device(c, v[0], &f->device) < 0) {
        r = -EINVAL;
    } else {
        dev_ok = true;
    }
    if (v[1]) {
        if (wo_schema_size(c, v[1], &f->keep_free) < 0)
            r = -EINVAL;
        else
            kf_ok = true;
    }
    if (v[2]) {
        if (wo_schema_place(c, v[2], rest_names, 2, &f->rest) < 0)
            r = -EINVAL;
    }
    if (v[3]) {
        /* a size, or auto: the last run's high water (uvm/fit-memo.c) */
        const char *rs = v[3]->kind == WO_NODE_SCALAR && !v[3]->null ? v[3]->value : NULL;
        if (rs && strcmp(rs, "auto") == 0)
            f->reserve = WO_FIT_RESERVE_AUTO;
        else if (wo_schema_size(c, v[3], &f->reserve) < 0)
            r = -EINVAL;
    }
    if (dev_ok && kf_ok && f->device.kind == WO_BUDGET_BYTES && f->keep_free >= f->device.bytes) {
        char s1[32], s2[32];
        wo_schema_err(c, v[1],
                     "found keep_free %s with fit device %s (line %u), expected keep_free below "
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
    r = wo_schema_map(&c, root, top_keys, G_MAX, "the policy", v);
    if (root->kind != WO_NODE_MAP)
        return -EINVAL;
    if (v[G_VERSION]) {
        uint64_t ver;
        if (wo_schema_uint(&c, v[G_VERSION], 1, 1, "policy version", &ver) < 0)
            r = -EINVAL;
    }
    if (v[G_DEFAULT]) {
        if (wo_schema_place(&c, v[G_DEFAULT], wo_schema_place_names, 3, &p->g.default_place) < 0)
            r = -EINVAL;
    }
    if (v[G_HOST] && parse_budget(&c, v[G_HOST], false, &p->g.host_budget) < 0)
        r = -EINVAL;
    if (v[G_DEVICE] && parse_budget(&c, v[G_DEVICE], true, &p->g.device_budget) < 0)
        r = -EINVAL;
    if (v[G_PINFB]) {
        if (wo_schema_enum(&c, v[G_PINFB], pinfb_names, 2, &idx) < 0)
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
            wo_schema_err(&c, rn, "found %s, expected a list of rules (rules: [] for none)",
                wo_schema_found(rn, b, sizeof(b)));
            r = -EINVAL;
        } else if (rn->n) {
            p->rules = calloc(rn->n, sizeof(*p->rules));
            p->m = calloc(rn->n, sizeof(*p->m));
            if (!p->rules || !p->m)
                return -ENOMEM;
            for (size_t i = 0; i < rn->n; i++) {
                int q;
                c.rule_errors_from = c.diags ? c.diags->nerrors : SIZE_MAX;
                q = wo_schema_rule(&c, rn->items[i], &p->rules[i], &p->m[i]);
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
            wo_schema_err(
                &c, v[G_DEVICE],
                "found device_budget 0 with managed placements (%s), expected a "
                "budget above 0: managed memory needs room on the device (use place: host to "
                "keep it on the host)",
                lab);
            r = -EINVAL;
        }
        if (host && p->g.host_budget.kind == WO_BUDGET_BYTES && p->g.host_budget.bytes == 0)
            wo_schema_warn(&c, v[G_HOST],
                          "host_budget is 0: every name placed on the host stays on the device");
        if (!open_given)
            p->g.window.open = wo_policy_passthrough(p) ? WO_WINDOW_OPEN_API : WO_WINDOW_OPEN_AT_START;
        if (v[G_RULES] && v[G_RULES]->kind == WO_NODE_SEQ)
            wo_schema_check_shadowed(&c, v[G_RULES]);
    }
    return r;
}
