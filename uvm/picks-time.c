/* uvm/picks-time.c: picked copies timed on the device, sampled
 * (uvm/picks-time.h). */
#include "uvm/picks-time.h"

#include <string.h>

#include "core/event.h"
#include "uvm/internal.h"
#include "uvm/uvm.h"

#define TIME_EVERY 16u /* one copy in this many is timed */
#define SLOTS 4u       /* samples in flight */

static struct {
    struct {
        CUevent a, b;
        bool busy;
    } s[SLOTS];
    bool broken; /* an event could not be made: nothing is timed */
    uint64_t copies, timed;
    double ms;
    uint64_t first_ns, last_ns;
} tm;

int wo_picks_time_before(const struct wo_driver *d, CUstream st)
{
    uint64_t t = wo_now_ns();

    if (!tm.copies)
        tm.first_ns = t;
    tm.last_ns = t;
    if (tm.copies++ % TIME_EVERY || tm.broken || !d->cuEventCreate || !d->cuEventRecord ||
        !d->cuEventQuery || !d->cuEventElapsedTime ||
        __atomic_load_n(&wo_captures_live, __ATOMIC_SEQ_CST))
        return -1;
    wo_picks_time_poll(d);
    for (unsigned k = 0; k < SLOTS; k++) {
        if (tm.s[k].busy)
            continue;
        if (!tm.s[k].a && (d->cuEventCreate(&tm.s[k].a, CU_EVENT_DEFAULT) != CUDA_SUCCESS ||
                           d->cuEventCreate(&tm.s[k].b, CU_EVENT_DEFAULT) != CUDA_SUCCESS)) {
            tm.broken = true;
            return -1;
        }
        if (d->cuEventRecord(tm.s[k].a, st) != CUDA_SUCCESS)
            return -1;
        return (int)k;
    }
    return -1;
}

void wo_picks_time_after(const struct wo_driver *d, CUstream st, int slot, bool ok)
{
    if (slot < 0 || (unsigned)slot >= SLOTS)
        return;
    tm.s[slot].busy = ok && d->cuEventRecord(tm.s[slot].b, st) == CUDA_SUCCESS;
}

void wo_picks_time_poll(const struct wo_driver *d)
{
    if (__atomic_load_n(&wo_captures_live, __ATOMIC_SEQ_CST))
        return;
    for (unsigned k = 0; k < SLOTS; k++) {
        float ms = 0;
        CUresult r;

        if (!tm.s[k].busy || d->cuEventQuery(tm.s[k].b) == CUDA_ERROR_NOT_READY)
            continue;
        r = d->cuEventElapsedTime(&ms, tm.s[k].a, tm.s[k].b);
        tm.s[k].busy = false;
        if (r == CUDA_SUCCESS && ms >= 0) {
            tm.timed++;
            tm.ms += ms;
        }
    }
}

void wo_picks_time_figs(struct wo_picks_time_figs *f)
{
    f->copies = tm.copies;
    f->timed = tm.timed;
    f->timed_ms = tm.ms;
    f->first_ns = tm.first_ns;
    f->last_ns = tm.last_ns;
}

void wo_picks_time_free(const struct wo_driver *d)
{
    for (unsigned k = 0; k < SLOTS; k++) {
        if (tm.s[k].a && d->cuEventDestroy_v2) {
            d->cuEventDestroy_v2(tm.s[k].a);
            d->cuEventDestroy_v2(tm.s[k].b);
        }
        tm.s[k].a = tm.s[k].b = NULL;
        tm.s[k].busy = false;
    }
}

void wo_picks_time_reset(void)
{
    memset(&tm, 0, sizeof(tm));
}
