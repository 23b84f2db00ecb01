/* uvm/picks-give.c: hot sets given back when the engine runs out of device
 * memory (uvm/picks.h, wo_picks_give_back; docs/picks.md, "Hot experts",
 * "Memory"): the sets of tensors gone first, then those whose rows saved
 * the least link traffic per device byte. */
#include "uvm/picks.h"

#include <cuda.h>
#include <pthread.h>

#include "core/macro.h"
#include "uvm/internal.h"
#include "uvm/picks-hot.h"
#include "uvm/picks-int.h"
#include "uvm/picks-pool.h"
#include "uvm/plan-budget.h"

uint64_t wo_picks_reserved(void)
{
    return __atomic_load_n(&wo_pk.bytes, __ATOMIC_RELAXED);
}

/* Frees hot set h (its streams synchronised), counted as given back. */
static uint64_t give(const struct wo_driver *d, struct wo_picks_hot *h)
{
    struct wo_hot_figs f;

    wo_hot_figs(h, &f);
    wo_pk.fills_gone += f.fills;
    wo_hot_free(d, h);
    wo_pk.hot_bytes -= WO_MIN(f.bytes, wo_pk.hot_bytes);
    wo_pk.given_back += f.bytes;
    return f.bytes;
}

/* The live hot set whose rows saved the least link traffic per device
 * byte (its rows from hot experts, as last read back), or -1. */
static int least_worth(void)
{
    int best = -1;
    double worst = 0;

    for (unsigned i = 0; i < wo_pk.n; i++) {
        struct wo_hot_figs f;
        double w;
        if (!wo_pk.s[i].hot)
            continue;
        wo_hot_figs(wo_pk.s[i].hot, &f);
        w = wo_pk.rows_host ? (double)wo_pk.rows_host[WO_PICKS_SPANS + i] * (double)wo_pk.s[i].row
                            : 0;
        w /= (double)WO_MAX(f.bytes, 1);
        if (best < 0 || w < worst) {
            best = (int)i;
            worst = w;
        }
    }
    return best;
}

uint64_t wo_picks_give_back(const struct wo_driver *d, uint64_t need, unsigned *sets_left)
{
    uint64_t freed = 0;
    int i;

    *sets_left = 0;
    /* a stream synchronised while a capture is under way could break it:
     * none now, and none begins until this is done (the capture handshake) */
    if (!d || !d->cuStreamSynchronize || !d->cuMemFree_v2 || !wo_driver_enter())
        return 0;
    pthread_mutex_lock(&wo_pk.lock);
    if (wo_pk.hot_bytes) {
        /* every stream with buffers may have copies in flight that read a
         * set (its home's) or count into one (any stream's) */
        wo_pool_sync_all(d);
        /* the sets of tensors gone first, then those worth least, until
         * the engine's allocation has room */
        for (unsigned r = 0; r < wo_pk.nretired; r++)
            freed += give(d, wo_pk.retired[r]);
        wo_pk.nretired = 0;
        while (freed < WO_MAX(need, 1) && (i = least_worth()) >= 0) {
            freed += give(d, wo_pk.s[i].hot);
            wo_pk.s[i].hot = NULL;
            wo_pk.s[i].hot_tried = true;
        }
        wo_budget_picks_bytes(__atomic_sub_fetch(&wo_pk.bytes, freed, __ATOMIC_RELAXED));
    }
    wo_hot_set_ceiling(wo_pk.hot_bytes); /* no more sets from now on than those left */
    for (unsigned k = 0; k < wo_pk.n; k++)
        *sets_left += wo_pk.s[k].hot != NULL;
    pthread_mutex_unlock(&wo_pk.lock);
    wo_driver_leave();
    return freed;
}
