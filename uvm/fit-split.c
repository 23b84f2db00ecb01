/* uvm/fit-split.c: fit's budget split (fit-split.h): the reserve, the
 * streaming executor's slots, the picked copies' buffers, the weights
 * policy/fit.c chooses within the rest, and the slots' room lent. The same
 * code at seal (place-fit.c), in the plan before the bytes (place-expect.c)
 * and in `woffload-policy gguf`, which predicts fit's choice for llama.cpp
 * from a GGUF's header: no CUDA and none of uvm/'s state, the settings
 * and the policy's globals passed or read as the tool reads them. */
#include "uvm/fit-split.h"

#include <stdlib.h>

#include "core/macro.h"
#include "core/settings.h"
#include "uvm/plan-stream.h"

/* The device bytes fit keeps for the streaming executor's slots when the
 * policy asks for streaming (prefetch.mode stream or auto): a slot holds
 * a tensor fit sends off the device (fit's first choice, with the whole
 * budget), sized as the executor sizes it (wo_stream_slot_size: 90% of
 * the bytes; larger ones read in place), and the executor wants
 * prefetch.slots of them. Not counted: embeddings (gathered by token,
 * never streamed) and, with WOFFLOAD_PICKS on, routed experts, unless
 * lend_experts and their memory can be lent (lendable[i]): the router's
 * picks carry them below WOFFLOAD_PICKS_WHOLE (picked copies, buffers of
 * their own), and slots sized for them stayed empty with nothing to hold
 * meanwhile (issue 41: 3 GiB kept for slots, one staging copy in 160
 * steps, bench/results/bigload-20261201-2210-moe-h200). At seal routed
 * experts in managed memory (llama.cpp's one model buffer) count: a batch
 * that picks nearly every expert hands them to the executor
 * (WOFFLOAD_GGML_STREAM, WOFFLOAD_PICKS_WHOLE), and while the slots stay
 * empty their room is lent to managed weights (fit_lend). Not counted, a
 * fit under llama-server at 32 requests kept 0 B for slots and read its
 * host experts in place: 0.75x of the same split under a hand policy,
 * whose executor staged them (0.78x of llama.cpp's --n-cpu-moe 8)
 * (bench/results/llamacpp-serve-20261205-p32-ncmoe8-h100). Nothing off the
 * device for slots: no room kept. Never more than half the budget: below
 * that, fewer slots (uvm/stream.c takes as many as fit, at least two),
 * and none where even two take more, unless the room is lent (lends:
 * WOFFLOAD_FIT_LEND with room for the weights in managed memory). Then two
 * slots may take more than half: at llama.cpp's own `-ot exps=CPU` memory
 * on the 32-expert GGUF (4816 MiB on the H100) the half rule kept no room
 * at all, and every expert was to be read in place by the kernels, where
 * staged they decode at -ot's speed (bench/results/
 * llamacpp-serve-20261206e-p32-fitlend-ot-h100: 0.993x with three slots,
 * every expert host). Sets v[].out (the first choice). */
static uint64_t fit_staging(const struct wo_policy_globals *g, const struct wo_fit *fit,
                            struct wo_fit_item *v, const bool *lendable, bool lend_experts,
                            size_t n, uint64_t budget, bool lends)
{
    uint64_t largest = 0, want, *sizes;
    size_t k = 0;

    if (!g || !g->prefetch.enabled || wo_stream_mode_of(g->prefetch.mode).measure_only)
        return 0;
    sizes = malloc((n ? n : 1) * sizeof(*sizes));
    if (!sizes)
        return 0;
    (void)wo_fit_choose(fit, v, n, budget);
    /* every tensor fit sends off the device, pinned ones too: those are
     * off the device already, and exactly what the slots will carry */
    for (size_t i = 0; i < n; i++)
        if (v[i].fixed == WO_PLACE_UNSET && v[i].out != WO_PLACE_DEVICE &&
            !wo_stream_gathered(v[i].name) &&
            !(wo_settings()->picks && !(lend_experts && lendable[i]) &&
              wo_fit_class(v[i].name) == WO_FIT_CLASS_EXPERTS))
            sizes[k++] = v[i].size;
    largest = k ? wo_stream_slot_size(sizes, k) : 0;
    free(sizes);
    if (!largest)
        return 0;
    want = largest * wo_stream_slots_wanted(g);
    while (want > budget / 2 && want > largest * WO_STREAM_SLOTS_MIN)
        want -= largest;
    if (want <= budget / 2)
        return want;
    /* the fewest slots past half the budget only where their room is lent
     * (fit_lend): while the slots stay empty it holds weights all the same */
    return lends && want <= budget ? want : 0;
}

/* The device bytes the router's picked copies take (policy/fit.c,
 * wo_fit_picks_room) when WOFFLOAD_PICKS is on: 1.5 GiB on the H200's
 * 128-expert shape, which fit did not count (the process's peak passed the
 * fit size). llama.cpp's expert tensors get picks only where the ggml hook
 * registers them: WOFFLOAD_GGML_PICKS, hot experts, or _PICKS_FROM, whose
 * default under fit is 0 (ggml/woffload-ggml.c reads the same rule off the
 * stats' fit object): with the band of 80-92% picked the buffers took 768
 * MiB of llama-server's 14 GiB at --fit 14012MiB and served 16 of 485 steps
 * per expert tensor, and the band's copies ran on the engine's stream, a
 * pass of their own before each MUL_MAT_ID, which without them reads the
 * picked experts in place inside its kernels (the hook's claim below
 * WOFFLOAD_GGML_STREAM). Without it fit decoded 1.15-1.31x faster at the same size
 * (bench/results/llamacpp-serve-20261206c-p32-fitpicks-h100). An engine that
 * never registers picks leaves the room unused. */
bool wo_place_fit_ggml_picks(const struct wo_settings *s, const struct wo_policy_globals *g)
{
    return s->ggml_picks > 0 ||
           (s->ggml_picks_from > 0 && wo_settings_given(s, "WOFFLOAD_GGML_PICKS_FROM")) ||
           s->picks_hot_mib > 0 || (g && g->prefetch.hot_experts != 0);
}

/* The room for the picked copies' buffers (above), with WOFFLOAD_PICKS on. */
static uint64_t fit_picks_room(const struct wo_policy_globals *g, const struct wo_fit_item *v,
                               size_t n)
{
    const struct wo_settings *s = wo_settings();

    return s->picks ? wo_fit_picks_room(v, n, s->picks_buffers, wo_place_fit_ggml_picks(s, g)) : 0;
}

/* The staging room, lent (rest: host): the tensors fit would choose next,
 * up to `staging` bytes, become managed rather than host, among those in
 * managed memory (lendable[i]). The prefetcher keeps managed ranges on the
 * device within the device budget less what the slots hold (plan-budget.h),
 * so while auto reads in place and the slots stay empty the room holds
 * weights, and when the slots grow the planner gives it back. Returns the
 * bytes lent. */
static uint64_t fit_lend(const struct wo_fit *fit, struct wo_fit_item *v, const bool *lendable,
                         size_t n, uint64_t staging)
{
    struct wo_fit_item *c;
    size_t *at, nc = 0;
    uint64_t lent = 0;

    if (!staging || fit->rest != WO_PLACE_HOST)
        return 0;
    c = malloc((n ? n : 1) * sizeof(*c));
    at = malloc((n ? n : 1) * sizeof(*at));
    if (c && at) {
        for (size_t i = 0; i < n; i++)
            if (lendable[i] && v[i].fixed == WO_PLACE_UNSET && v[i].out == WO_PLACE_HOST) {
                c[nc] = v[i];
                at[nc++] = i;
            }
        lent = wo_fit_choose(fit, c, nc, staging);
        for (size_t k = 0; k < nc; k++)
            if (c[k].out == WO_PLACE_DEVICE)
                v[at[k]].out = WO_PLACE_MANAGED;
    }
    free(c);
    free(at);
    return lent;
}

void wo_place_fit_split(const struct wo_policy_globals *g, const struct wo_fit *fit,
                        struct wo_fit_item *v, const bool *lendable, bool lend_experts, size_t n,
                        uint64_t budget, uint64_t limit, struct wo_fit_split *sp)
{
    uint64_t weights;
    struct wo_fit eff = *fit;
    bool lends, any = false;

    /* equal-value tensors spread through the step, or in the engine's
     * order (WOFFLOAD_FIT_SPREAD=0); the plan at announce and seal alike */
    eff.in_order = !wo_settings()->fit_spread;
    eff.by_layer = wo_settings()->fit_layers;
    fit = &eff;
    sp->budget = budget;
    /* the engine's allocations after seal come out of the same budget:
     * bigload's peak device memory was its weights plus 0.23-0.35 GiB */
    sp->reserve = wo_fit_reserve(fit, budget);
    weights = budget - sp->reserve;
    lends = wo_settings()->fit_lend && fit->rest == WO_PLACE_HOST;
    for (size_t i = 0; lends && i < n && !any; i++)
        any = lendable[i] && v[i].fixed == WO_PLACE_UNSET;
    sp->staging = fit_staging(g, fit, v, lendable, lend_experts, n, weights, lends && any);
    sp->picks = WO_MIN(fit_picks_room(g, v, n), weights - sp->staging);
    sp->weights = weights - sp->staging - sp->picks;
    sp->chosen = wo_fit_choose(fit, v, n, WO_MIN(sp->weights, limit));
    /* WOFFLOAD_FIT_LEND=0: the room stays empty, those weights host */
    sp->lent = wo_settings()->fit_lend ? fit_lend(fit, v, lendable, n, sp->staging) : 0;
}
