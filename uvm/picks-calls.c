/* uvm/picks-calls.c: the counts of uvm/picks-calls.h. */
#include "uvm/picks-calls.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "core/counters.h"
#include "uvm/picks-copy.h"

#define CALLS_MAX 512u /* hooked entry points counted (driver and runtime) */
#define SAY_MOST 8u

static struct {
    pthread_mutex_t lock;
    uint64_t at[WO_PICKS_STREAMS][CALLS_MAX]; /* each stream's counts as kept */
    uint32_t seq[WO_PICKS_STREAMS];           /* at its job, 0: none kept */
    size_t n;                                 /* counts registered (fixed at start) */
    unsigned last;                            /* the stream kept last */
} cs = {.lock = PTHREAD_MUTEX_INITIALIZER};

void wo_calls_mark(unsigned ix, uint32_t seq)
{
    if (ix >= WO_PICKS_STREAMS || !seq)
        return;
    pthread_mutex_lock(&cs.lock);
    cs.n = wo_counters_calls(cs.at[ix], CALLS_MAX);
    cs.seq[ix] = seq;
    cs.last = ix;
    pthread_mutex_unlock(&cs.lock);
}

void wo_calls_say(unsigned ix, char *msg, size_t cap, size_t *used)
{
    static uint64_t now[CALLS_MAX]; /* under cs.lock */
    uint64_t top[SAY_MOST];
    size_t which[SAY_MOST], got = 0, n;

    pthread_mutex_lock(&cs.lock);
    if (ix >= WO_PICKS_STREAMS)
        ix = cs.last;
    if (!cs.seq[ix]) {
        pthread_mutex_unlock(&cs.lock);
        return;
    }
    n = wo_counters_calls(now, CALLS_MAX);
    n = n < cs.n ? n : cs.n;
    /* the SAY_MOST largest counts since, largest first */
    for (size_t i = 0; i < n; i++) {
        uint64_t d = now[i] - cs.at[ix][i];
        size_t k;

        if (!d)
            continue;
        if (got < SAY_MOST)
            k = got++;
        else if (d <= top[SAY_MOST - 1])
            continue;
        else
            k = SAY_MOST - 1;
        for (; k > 0 && top[k - 1] < d; k--) {
            top[k] = top[k - 1];
            which[k] = which[k - 1];
        }
        top[k] = d;
        which[k] = i;
    }
    for (size_t k = 0; k < got && *used + 1 < cap; k++) {
        int r =
            k ? snprintf(msg + *used, cap - *used, ", %s %llu", wo_counters_call_name(which[k]),
                         (unsigned long long)top[k])
              : snprintf(msg + *used, cap - *used, " calls since job %u was queued: %s %llu",
                         cs.seq[ix], wo_counters_call_name(which[k]), (unsigned long long)top[k]);
        if (r <= 0)
            break;
        *used = (size_t)r < cap - *used ? *used + (size_t)r : cap - 1;
    }
    if (got && *used + 1 < cap) {
        msg[(*used)++] = ';';
        msg[*used] = '\0';
    }
    pthread_mutex_unlock(&cs.lock);
}
