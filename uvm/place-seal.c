/* uvm/place-seal.c: seal, the end of loading (place-int.h): the device
 * budget is resolved (fit: chooses first, place-fit.c), and every served
 * allocation gets its placements applied: tags as decided, the bytes
 * between them the policy's default, neighbours with the same placement
 * in one call. */
#include "uvm/place-int.h"

#include "core/log.h"

struct seg {
    uint64_t off, len;
    enum wo_placement place;
    bool advised;
};

/* Applies a served allocation's placements: tags as decided, the gaps
 * between them the policy's default. Neighbours with the same placement
 * become one call: small advice and prefetch calls cost ~100 us each. */
static int seal_alloc(struct wo_alloc *a)
{
    enum wo_placement dp = wo_uvm.g->default_place;
    uint64_t gap, pos;
    struct seg cur = {0, 0, WO_PLACE_UNSET, true};
    int ret = 0, r;

    if (a->kind != WO_KIND_MANAGED && a->kind != WO_KIND_BOUND)
        return 0;
    gap = wo_place_untagged(a);
    if (gap > 0 && dp == WO_PLACE_HOST) {
        if (wo_host_budget_take(&wo_uvm.host_budget, gap)) {
            a->default_charged = true;
            a->default_bytes = gap;
        } else {
            dp = WO_PLACE_DEVICE;
            wo_uvm.over_budget_bytes += gap;
            wo_debug("untagged [0x%llx, +%llu) stays on the device: host budget spent",
                     (unsigned long long)a->base, (unsigned long long)gap);
        }
    }
    if (gap > 0) {
        size_t ci = wo_uvm.nrule_counts - 1;
        wo_uvm.rule_counts[ci].names++;
        wo_uvm.rule_counts[ci].bytes += gap;
    }
    a->place = dp;
    if (a->kind == WO_KIND_BOUND)
        return wo_place_bind_seal(a, dp);

    pos = 0;
    for (size_t i = 0; i <= a->ntags; i++) {
        struct seg next[2];
        int nn = 0;
        uint64_t toff = i < a->ntags ? a->tags[i].off : a->size;

        if (toff > pos)
            next[nn++] = (struct seg){pos, toff - pos, dp, false};
        if (i < a->ntags) {
            next[nn++] = (struct seg){a->tags[i].off, a->tags[i].size, a->tags[i].place,
                                      a->tags[i].applied};
            a->tags[i].applied = true;
            pos = a->tags[i].off + a->tags[i].size;
        }
        for (int k = 0; k < nn; k++) {
            if (cur.len && cur.place == next[k].place && cur.off + cur.len == next[k].off) {
                cur.len += next[k].len;
                cur.advised = cur.advised && next[k].advised;
                continue;
            }
            if (cur.len &&
                (r = wo_place_apply_range(a, cur.off, cur.len, cur.place, !cur.advised, true)) <
                    0 &&
                ret == 0)
                ret = r;
            cur = next[k];
        }
    }
    if (cur.len &&
        (r = wo_place_apply_range(a, cur.off, cur.len, cur.place, !cur.advised, true)) < 0 &&
        ret == 0)
        ret = r;
    return ret;
}

int wo_place_seal(void)
{
    const struct wo_driver *d = wo_uvm_driver();
    size_t free_b = 0, total_b = 0;
    int ret = 0, r;
    char b1[32], b2[32];

    /* nothing is served by announced name from here on: the buffers
     * pinned ahead that no allocation took go back first */
    wo_place_prepin_stop();
    if (wo_uvm.policy && d && d->cuMemGetInfo_v2 &&
        d->cuMemGetInfo_v2(&free_b, &total_b) == CUDA_SUCCESS) {
        wo_uvm.device_total = total_b;
        wo_uvm.device_budget = wo_policy_device_budget(wo_uvm.policy, total_b, free_b);
        if (wo_uvm.g->fit.enabled)
            wo_place_fit(free_b, total_b);
        else
            wo_place_context_for_trace(); /* for woffload-policy fit */
        wo_debug("device budget for managed memory: %s of %s",
                 wo_format_size(wo_uvm.device_budget, b1, sizeof(b1)),
                 wo_format_size(total_b, b2, sizeof(b2)));
    }
    wo_place_expect_log();
    for (size_t i = 0; i < wo_uvm.alloc_hash_size; i++)
        for (struct wo_alloc *a = wo_uvm.alloc_hash[i]; a; a = a->next)
            if ((r = seal_alloc(a)) < 0 && ret == 0)
                ret = r;
    if ((r = wo_place_sync()) < 0 && ret == 0)
        ret = r;
    /* the free memory once the placements took effect (fit's weights on
     * the device): what it falls by from here, beyond the allocations the
     * shim sees, is the context's own (wo_place_fit_sample) */
    if (wo_uvm.g && wo_uvm.g->fit.enabled && d && d->cuMemGetInfo_v2 &&
        d->cuMemGetInfo_v2(&free_b, &total_b) == CUDA_SUCCESS)
        wo_uvm.fit.free_at_seal = free_b;
    return ret;
}
