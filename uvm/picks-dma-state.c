/* uvm/picks-dma-state.c: the copy engine's state (uvm/picks-dma-int.h),
 * shared by its threads (uvm/picks-dma.c) and its watchdog
 * (uvm/picks-watch.c), and what both read of a job: the floor under the
 * two, so that neither calls into the other's file for it. */
#include "uvm/picks-dma-int.h"

#include <string.h>

struct wo_dma_state wo_dm = {.lock = PTHREAD_MUTEX_INITIALIZER,
                             .plock = PTHREAD_MUTEX_INITIALIZER,
                             .cv = PTHREAD_COND_INITIALIZER,
                             .mcv = PTHREAD_COND_INITIALIZER,
                             .wcv = PTHREAD_COND_INITIALIZER};

void wo_dma_picked(const struct slot *sl, uint8_t *pick)
{
    const struct wo_picks_copy *c = &sl->j.c;

    memset(pick, 0, c->n_experts);
    for (uint64_t k = 0; k < c->n_ids; k++) {
        uint64_t at = c->per_row ? k / c->per_row * c->stride + k % c->per_row : k;
        int64_t e = c->width == 8 ? ((const int64_t *)sl->ids)[at]
                                  : (int64_t)((const int32_t *)sl->ids)[at];
        if (e >= 0 && e < (int64_t)c->n_experts)
            pick[e] = 1;
    }
}
