/* uvm/place-expect.c: names before bytes (woffload_expect; docs/placement.md,
 * "Names before bytes").
 *
 * The managed cap serves placeable memory in the order it arrives: past the
 * free device memory less a margin, an allocation becomes pinned host memory
 * and can never reach the device. A model larger than the free memory then
 * keeps on the device what came first, whatever it is worth (issue 41: the
 * late layers' attention in host memory, 2.6 GiB of experts on the device).
 *
 * An engine that knows its tensors before it allocates them (the Python hook:
 * the meta-device model transformers builds before it loads a byte) announces
 * each name with its size. Before the next allocation, the policy places every
 * announced name, and under fit: fit chooses among them as it would at seal
 * (policy/fit.c, the tensor classes, the same budget). An allocation that
 * comes without a name is then matched by size to the announced names not yet
 * claimed (the size the engine asked for may be rounded up: PyTorch's caching
 * allocator asks whole 2 MiB for a tensor of 10 MiB or more). Within a size,
 * the names planned for the device are claimed first, so each size gets as
 * many device allocations as the plan has device names of it; once those are
 * claimed, an allocation whose candidates all go to the host is served as
 * pinned host memory at once, without taking the cap's room. What the plan
 * keeps on the device is then all managed, movable memory, and fit at seal
 * chooses among it.
 *
 * A match decides where the bytes are served, never a name: the names still
 * come from the tags. A wrong match (another tensor of the same size, a
 * temporary) costs placement, never data: its tag says what the policy wanted,
 * and the stats count it (missed). Under fit, two names of one size and one
 * class that came in the other order trade plans instead (swapped). A claim
 * of an allocation freed before seal is given back. Every function here runs
 * under wo_uvm.lock. */
#include "uvm/place-int.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"

/* the rounding an engine's allocator may add to a tensor's bytes */
#define SLACK (2ull << 20)
/* smaller tensors share their allocator's segments: never matched */
#define MATCH_MIN (1ull << 20)

void wo_place_expect_free(void)
{
    for (size_t i = 0; i < wo_uvm.expect.n; i++)
        free(wo_uvm.expect.v[i].name);
    free(wo_uvm.expect.v);
    memset(&wo_uvm.expect, 0, sizeof(wo_uvm.expect));
}

int wo_place_expect_add(const char *name, uint64_t bytes)
{
    struct wo_expect_entry *e;

    if (wo_uvm.expect.n == wo_uvm.expect.cap) {
        size_t cap = wo_uvm.expect.cap ? wo_uvm.expect.cap * 2 : 256;
        struct wo_expect_entry *v = realloc(wo_uvm.expect.v, cap * sizeof(*v));
        if (!v)
            return -ENOMEM;
        wo_uvm.expect.v = v;
        wo_uvm.expect.cap = cap;
    }
    e = &wo_uvm.expect.v[wo_uvm.expect.n];
    memset(e, 0, sizeof(*e));
    if (!(e->name = strdup(name)))
        return -ENOMEM;
    e->bytes = bytes;
    e->plan = WO_PLACE_UNSET;
    wo_uvm.expect.n++;
    wo_uvm.expect.bytes += bytes;
    wo_uvm.expect.dirty = true;
    return 0;
}

/* The explicit rule's placement of name, or UNSET when no rule names it
 * (*rule: whether one did). */
static enum wo_placement rule_place(const char *name, uint64_t bytes, bool *rule)
{
    struct wo_match m;

    *rule = false;
    if (!wo_uvm.policy)
        return WO_PLACE_UNSET;
    (void)wo_policy_match(wo_uvm.policy, name, bytes, &m);
    *rule = m.rule >= 0;
    return m.rule >= 0 ? m.place : wo_uvm.g->default_place;
}

/* fit's choice among the announced names, as wo_place_fit() makes it at
 * seal: the same budget, reserve, staging room and lending. False: no
 * choice (no memory, or the driver cannot say how much is free). */
static bool plan_fit(const struct wo_driver *d)
{
    const struct wo_fit *fit = &wo_uvm.g->fit;
    /* reserve: auto, the runs before's high water (fit-memo.c) */
    struct wo_fit eff = wo_fit_memo_resolve(fit);
    size_t n = wo_uvm.expect.n, free_b = 0, total_b = 0;
    struct wo_fit_item *v = calloc(n ? n : 1, sizeof(*v));
    bool *lendable = calloc(n ? n : 1, sizeof(*lendable));
    struct wo_fit_split sp;
    uint64_t cap_room, engine, bound_host, bound_device, context;
    char said[320];
    bool ok = false;

    if (!v || !lendable || !d->cuMemGetInfo_v2 ||
        d->cuMemGetInfo_v2(&free_b, &total_b) != CUDA_SUCCESS)
        goto out;
    for (size_t i = 0; i < n; i++) {
        const struct wo_expect_entry *e = &wo_uvm.expect.v[i];
        bool rule;
        enum wo_placement p = rule_place(e->name, e->bytes, &rule);

        v[i] = (struct wo_fit_item){.name = e->name,
                                    .size = e->bytes,
                                    .weight = -1,
                                    .fixed = rule ? p : WO_PLACE_UNSET,
                                    /* served pinned already: it cannot move */
                                    .movable = !e->pinned};
        lendable[i] = !e->pinned;
    }
    /* what the plan keeps on the device is managed memory until seal: no
     * more than the cap lets in (the free memory less its margin and what
     * is served already), or the last of it would be pinned after all */
    cap_room = free_b > wo_uvm.cap.margin + wo_uvm.cap.live
                   ? free_b - wo_uvm.cap.margin - wo_uvm.cap.live
                   : 0;
    /* routed experts get no slot room here (lend_experts false): those the
     * plan sends off the device are served as pinned host memory as they
     * come, where room kept for them could not be lent */
    /* the process's contexts come out of the fit size here too (seal's
     * line says what NVML measured then) */
    engine = wo_place_engine_bytes();
    wo_place_bind_bytes(&bound_host, &bound_device);
    (void)wo_place_context_bytes(engine + bound_device, &context, said, sizeof(said));
    engine += context;
    wo_place_fit_split(wo_uvm.g, &eff, v, lendable, false, n,
                       wo_fit_budget(fit, total_b, free_b, engine), cap_room, &sp);
    for (size_t i = 0; i < n; i++)
        wo_uvm.expect.v[i].plan = v[i].out;
    ok = true;
out:
    free(v);
    free(lendable);
    return ok;
}

/* Places every announced name: its rule's placement, or fit's choice. */
static void plan(const struct wo_driver *d)
{
    struct wo_uvm_expect *x = &wo_uvm.expect;

    x->dirty = false;
    x->plan_host = x->plan_host_bytes = x->plan_device = x->plan_device_bytes = 0;
    if (!(wo_uvm.g->fit.enabled && plan_fit(d)))
        for (size_t i = 0; i < x->n; i++) {
            bool rule;
            x->v[i].plan = wo_uvm.g->fit.enabled ? WO_PLACE_UNSET
                                                 : rule_place(x->v[i].name, x->v[i].bytes, &rule);
        }
    for (size_t i = 0; i < x->n; i++) {
        if (x->v[i].plan == WO_PLACE_HOST) {
            x->plan_host++;
            x->plan_host_bytes += x->v[i].bytes;
        } else if (x->v[i].plan == WO_PLACE_DEVICE) {
            x->plan_device++;
            x->plan_device_bytes += x->v[i].bytes;
        }
    }
    /* what will be served as pinned host memory, pinned ahead of the
     * loader (place-prepin.c) */
    {
        uint64_t *sizes = malloc((x->n ? x->n : 1) * sizeof(*sizes));
        size_t k = 0;

        for (size_t i = 0; sizes && i < x->n; i++)
            if (x->v[i].plan == WO_PLACE_HOST && !x->v[i].claimed && x->v[i].bytes >= MATCH_MIN)
                sizes[k++] = x->v[i].bytes;
        if (sizes)
            wo_place_prepin_plan(d, sizes, k);
        free(sizes);
    }
}

/* Without a policy (one that did not load: placement is off) nothing is
 * planned, and nothing is claimed below: the names wait unplanned and every
 * allocation passes through, as it does without them. */
void wo_place_expect_plan(const struct wo_driver *d)
{
    if (wo_uvm.expect.n && wo_uvm.expect.dirty && !wo_uvm.sealed && d && wo_uvm.g)
        plan(d);
}

enum wo_placement wo_place_expect_claim(const struct wo_driver *d, struct wo_alloc *a)
{
    struct wo_uvm_expect *x = &wo_uvm.expect;
    /* the first candidate of each kind: [of exactly the allocation's size]
     * [planned off the host] */
    size_t first[2][2] = {{SIZE_MAX, SIZE_MAX}, {SIZE_MAX, SIZE_MAX}}, pick;

    if (!x->n || wo_uvm.sealed || !wo_uvm.g)
        return WO_PLACE_UNSET;
    if (x->dirty)
        plan(d);
    for (size_t i = 0; i < x->n; i++) {
        const struct wo_expect_entry *e = &x->v[i];
        if (e->claimed || e->bytes < MATCH_MIN || e->bytes > a->size || a->size - e->bytes >= SLACK)
            continue;
        int exact = e->bytes == a->size, dev = e->plan != WO_PLACE_HOST;
        if (first[exact][dev] == SIZE_MAX)
            first[exact][dev] = i;
        if (exact && dev)
            break;
    }
    /* A name of exactly the allocation's size first: an engine that asks
     * what it announced (the ggml hook's split buffers) must not have a
     * smaller tensor's plan taken within the slack. Within a size the
     * device's (and managed's) first: each size gets as many of them as the
     * plan has, whatever order its tensors arrive in */
    pick = first[1][1] != SIZE_MAX   ? first[1][1]
           : first[1][0] != SIZE_MAX ? first[1][0]
           : first[0][1] != SIZE_MAX ? first[0][1]
                                     : first[0][0];
    if (pick == SIZE_MAX) {
        if (a->size >= MATCH_MIN)
            x->unmatched++;
        return WO_PLACE_UNSET;
    }
    x->v[pick].claimed = true;
    a->expect_ix = (uint32_t)pick + 1;
    x->matched++;
    x->matched_bytes += a->size;
    return x->v[pick].plan;
}

void wo_place_expect_served(struct wo_alloc *a, bool pinned)
{
    if (!a->expect_ix)
        return;
    if (pinned) {
        wo_uvm.expect.v[a->expect_ix - 1].pinned = true;
        wo_uvm.expect.served_host++;
        wo_uvm.expect.served_host_bytes += a->size;
    } else {
        wo_uvm.expect.pin_failures++;
    }
}

void wo_place_expect_release(struct wo_alloc *a)
{
    struct wo_expect_entry *e;

    if (!a->expect_ix || a->expect_ix > wo_uvm.expect.n)
        return;
    e = &wo_uvm.expect.v[a->expect_ix - 1];
    a->expect_ix = 0;
    if (wo_uvm.sealed)
        return;
    /* freed before seal (a temporary of the same size, or a tensor the
     * engine made again): its name may still come */
    e->claimed = false;
    e->pinned = false;
    wo_uvm.expect.released++;
}

/* The announced entry named name other than e (untagged: only one no tag
 * has consumed), or NULL. */
static struct wo_expect_entry *entry_named(const char *name, const struct wo_expect_entry *e,
                                           bool untagged)
{
    for (size_t i = 0; i < wo_uvm.expect.n; i++) {
        struct wo_expect_entry *f = &wo_uvm.expect.v[i];
        if (f != e && !(untagged && f->tagged) && strcmp(f->name, name) == 0)
            return f;
    }
    return NULL;
}

void wo_place_expect_tagged(const struct wo_alloc *a, const struct wo_tag *t)
{
    struct wo_uvm_expect *x = &wo_uvm.expect;
    struct wo_expect_entry *e, *f;
    enum wo_placement want = t->place;
    const bool by_plan = wo_uvm.g->fit.enabled && t->name->rule < 0;
    bool same;

    if (!a->expect_ix || a->expect_ix > x->n || a->kind != WO_KIND_PINNED)
        return;
    e = &x->v[a->expect_ix - 1];
    /* pinned by the managed cap, not for this match: the cap's books
     * (stuck_tags) count it */
    if (!e->pinned)
        return;
    same = strcmp(e->name, t->name->s) == 0;
    f = same ? NULL : entry_named(t->name->s, e, true);
    /* under fit a name no rule placed goes where the plan put it */
    if (by_plan) {
        const struct wo_expect_entry *g = same ? e : f ? f : entry_named(t->name->s, e, false);
        want = g ? g->plan : WO_PLACE_UNSET;
    }
    /* Another name of its size took this claim, and this name's own entry
     * is still to come: the two trade names when that costs nothing, so the
     * books follow the tags. With one plan it changes no placement. Under
     * fit, a device name in the memory pinned for a host one of its class
     * (within a size the device's claims go first, so a loader that comes
     * in another order than the names makes these) is worth the same to
     * fit: the device's claim holds the other, fit at seal chooses among the
     * managed memory it is in, and this one is the host's now. Counted
     * (swapped), never missed. */
    if (f && f->bytes == e->bytes &&
        (f->plan == e->plan || (by_plan && wo_fit_class(f->name) == wo_fit_class(e->name)))) {
        char *s = e->name;

        if (f->plan != e->plan) {
            x->swapped_tags++;
            x->swapped_bytes += t->size;
        }
        e->name = f->name;
        f->name = s;
        if (by_plan)
            want = e->plan;
    }
    e->tagged = true;
    if (want == WO_PLACE_HOST || want == WO_PLACE_UNSET)
        return;
    x->missed_tags++;
    x->missed_bytes += t->size;
    wo_log_once(WO_LOG_WARN,
                "expect: '%s' lies in memory served as pinned host memory for an announced "
                "tensor of its size that the plan put on the host, but %s on the device: it "
                "stays in host memory (names announced with woffload_expect must be the "
                "tensors the engine allocates, with their sizes)",
                t->name->s, t->name->rule >= 0 ? "its rule places it" : "the plan put it");
}

void wo_place_expect_log(void)
{
    const struct wo_uvm_expect *x = &wo_uvm.expect;
    struct wo_prepin_figs f;
    char b1[32], b2[32], b3[32], b4[32];

    if (!x->n)
        return;
    wo_place_prepin_figs(&f);
    if (f.made || f.missed)
        wo_info("expect: %" PRIu64 " buffers pinned ahead of the loader (%s in %.2f s of the "
                "worker's time), %" PRIu64 " taken by allocations (%" PRIu64 " after a wait for "
                "the one being pinned), %" PRIu64 " allocations pinned their own, %" PRIu64
                " given back unused",
                f.made, wo_format_size(f.made_bytes, b4, sizeof(b4)), (double)f.ns / 1e9, f.taken,
                f.waits, f.missed, f.wasted);
    wo_info("expect: %zu names announced before their bytes (%s), %" PRIu64 " planned on the "
            "host (%s); %" PRIu64 " allocations matched, %" PRIu64 " served as pinned host "
            "memory at once (%s), %" PRIu64 " not matched, %" PRIu64 " claims given back by a "
            "free, %" PRIu64 " tags in host memory the plan did not want there, %" PRIu64
            " traded with a tensor of their size and class",
            x->n, wo_format_size(x->bytes, b1, sizeof(b1)), x->plan_host,
            wo_format_size(x->plan_host_bytes, b2, sizeof(b2)), x->matched, x->served_host,
            wo_format_size(x->served_host_bytes, b3, sizeof(b3)), x->unmatched, x->released,
            x->missed_tags, x->swapped_tags);
}
