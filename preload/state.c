/* preload/state.c: the ground floor of preload/: what every hook reads
 * before it does anything (the shim's state, this thread's nesting depth:
 * hook.h's gate) and the one thing every hook may do after (push an event
 * for uvm/'s consumer). Nothing here calls another file of preload/: the
 * life cycle that sets the state is init.c's. */
#include <errno.h>
#include <unistd.h>

#include "core/counters.h"
#include "core/event.h"
#include "core/macro.h"
#include "preload/hook.h"

int wo_preload_state;
__thread int wo_depth __attribute__((tls_model("initial-exec")));

int wo_push_event_prio(struct wo_event *ev, bool low)
{
    static __thread uint32_t tid;
    struct wo_ring *ring = __atomic_load_n(&wo_events, __ATOMIC_ACQUIRE);

    if (!ring)
        return -ENODEV;
    /* gettid once per thread: the one syscall the hooks make, amortised. */
    if (WO_UNLIKELY(!tid))
        tid = (uint32_t)gettid();
    ev->t_ns = wo_now_ns();
    ev->tid = tid;
    if ((low ? wo_ring_push_low(ring, ev) : wo_ring_push(ring, ev)) < 0) {
        wo_count(WO_CTR_events_dropped, 1);
        return -ENOSPC;
    }
    wo_count(WO_CTR_events_pushed, 1);
    return 0;
}

void wo_push_event(struct wo_event *ev)
{
    (void)wo_push_event_prio(ev, false);
}
