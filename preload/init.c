/* preload/init.c: the shim's life cycle: a constructor that does nothing,
 * lazy init on the first relevant hook call (settings, the driver table,
 * uvm/), the fork child reset and exit.
 *
 * Why lazy: a preloaded library's constructor runs before the host's own
 * start-up; doing real work there (dlopen, threads) deadlocked hosts in
 * other interposers, and a process that never uses CUDA (python -c pass,
 * /bin/true) must not pay for us at all. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/log.h"
#include "core/settings.h"
#include "preload/hook.h"

int wo_preload_state;
__thread int wo_depth __attribute__((tls_model("initial-exec")));

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
/* Set while this thread runs init: hooks reached from inside init (the
 * driver's constructors, uvm/ start-up) pass straight through. */
static __thread int in_init;
static struct wo_driver driver;

/* uvm/ gets the real functions, never our hooks: its own calls must not be
 * routed or recorded again. By name: a hooked function's real pointer, else
 * one of the functions only the shim itself calls. */
static void *real_by_name(void *ud, const char *name)
{
    const struct wo_real *r = ud;

    for (int i = 0; i < WO_NHOOKS; i++)
        if (strcmp(wo_hook_names[i], name) == 0)
            return r->hook[i];
#define WO_BY_NAME(n)                                                                              \
    if (strcmp(name, #n) == 0)                                                                     \
        return r->n;
    WO_DRIVER_INTERNAL(WO_BY_NAME)
#undef WO_BY_NAME
    return NULL;
}

static void fill_driver(const struct wo_real *r)
{
    wo_driver_fill(&driver, real_by_name, (void *)r);
}

static void atfork_child(void)
{
    /* Handles (streams, graphs, functions) of the parent mean nothing in a
     * child that starts CUDA afresh; locks held by other parent threads are
     * re-created by the reset functions. */
    wo_depth = 0;
    wo_capture_reset();
    wo_launch_reset();
    wo_uvm_atfork_child();
}

static void at_exit(void)
{
    /* From here on every hook passes straight through: destructors of the
     * engine and the runtime still free memory, and uvm/ is going away. */
    __atomic_store_n(&wo_preload_state, WO_STATE_OFF, __ATOMIC_RELEASE);
    wo_uvm_shutdown();
}

static void init_once_fn(void)
{
    const struct wo_settings *s;
    const struct wo_real *r;
    int state = WO_STATE_OFF;

    in_init = 1;
    s = wo_settings();
    if (s->disable) {
        wo_info("WOFFLOAD_DISABLE is set: every call passes straight through");
        goto out;
    }
    r = wo_real_driver();
    if (!r || !r->lib) {
        wo_warn("the CUDA driver library (%s) could not be loaded: every call passes straight through",
                s->cuda_lib ? s->cuda_lib : "libcuda.so.1");
        goto out;
    }
    fill_driver(r);
    wo_uvm_set_driver(&driver);
    wo_launch_setup();
    if (wo_uvm_init() < 0)
        wo_warn("placement is off (see above); calls are still observed");
    pthread_atfork(wo_uvm_atfork_prepare, wo_uvm_atfork_parent, atfork_child);
    atexit(at_exit);
    state = WO_STATE_ACTIVE;
out:
    __atomic_store_n(&wo_preload_state, state, __ATOMIC_RELEASE);
    in_init = 0;
}

int wo_preload_init_slow(void)
{
    if (in_init)
        return WO_STATE_UNINIT;
    pthread_once(&init_once, init_once_fn);
    return __atomic_load_n(&wo_preload_state, __ATOMIC_ACQUIRE);
}

/* The per-hook call counters are registered before main() so the stats name
 * them even when no hook ran; nothing else happens here on purpose. */
__attribute__((constructor)) static void preload_ctor(void)
{
    static const char *names[WO_NHOOKS + WO_NRT];
    for (int i = 0; i < WO_NHOOKS; i++)
        names[i] = wo_hook_names[i];
    for (int i = 0; i < WO_NRT; i++)
        names[WO_NHOOKS + i] = wo_rt_names[i];
    wo_counters_register_calls(names, wo_hook_calls, WO_NHOOKS + WO_NRT);
}

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
