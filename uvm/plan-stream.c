/* uvm/plan-stream.c: the streaming executor's pure rules (no clock, no
 * driver, no executor state): what prefetch.mode asks of it, how many slots
 * it wants, which tensors are gathered, the staging slot size, and the slot
 * sizes for a cyclic read order. Shared with fit and the replay
 * (tools/replay-sim.c), which restate no copy of them. */
#include "uvm/plan-stream.h"

#include <stdlib.h>

#include "policy/policy.h"
#include "uvm/hotpath.h" /* WO_STREAM_MAX_SLOTS */

struct wo_stream_mode wo_stream_mode_of(enum wo_prefetch_mode mode)
{
    return (struct wo_stream_mode){
        .all = mode == WO_PREFETCH_MODE_STREAM,
        .by_auto = mode == WO_PREFETCH_MODE_AUTO,
        .measure_only = mode == WO_PREFETCH_MODE_HOT_SET,
    };
}

unsigned wo_stream_slots_wanted(const struct wo_policy_globals *g)
{
    return g->prefetch.slots ? g->prefetch.slots : WO_STREAM_SLOTS_DEFAULT;
}

static int cmp_desc(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x > y ? -1 : x < y;
}

uint64_t *wo_stream_size_slots(const uint64_t *sizes, size_t n, unsigned nslots, uint64_t cap,
                               uint64_t *out)
{
    uint64_t w[WO_STREAM_MAX_SLOTS];

    if (!n || !nslots || nslots > WO_STREAM_MAX_SLOTS)
        return NULL;
    for (unsigned i = 0; i < nslots; i++)
        out[i] = 0;
    /* slot i: the largest i-th largest size of any nslots ranges in a row
     * (the order is a cycle): the executor holds at most that many at once
     * (the next ones and the one behind) and gives each the smallest free
     * slot it fits */
    for (size_t j = 0; j < (n > nslots ? n : 1); j++) {
        unsigned m = (unsigned)(n < nslots ? n : nslots);
        for (unsigned k = 0; k < m; k++)
            w[k] = sizes[(j + k) % n];
        qsort(w, m, sizeof(*w), cmp_desc);
        for (unsigned k = 0; k < m; k++)
            out[k] = out[k] > w[k] ? out[k] : w[k];
    }
    /* fewer ranges than slots: the spare ones take the smallest */
    for (unsigned i = 1; i < nslots; i++)
        if (!out[i])
            out[i] = out[i - 1];
    for (unsigned i = 0; i < nslots; i++)
        if (out[i] > cap || !out[i])
            out[i] = cap;
    return out;
}

bool wo_stream_gathered(const char *name)
{
    return name && wo_fit_class(name) == 5;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

uint64_t wo_stream_slot_size(uint64_t *sizes, size_t n)
{
    uint64_t total = 0, sum = 0;

    if (!n)
        return 0;
    qsort(sizes, n, sizeof(*sizes), cmp_u64);
    for (size_t i = 0; i < n; i++)
        total += sizes[i];
    for (size_t i = 0; i < n; i++) {
        sum += sizes[i];
        if (sum >= total - total / 10)
            return sizes[i];
    }
    return sizes[n - 1];
}
