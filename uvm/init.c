/* uvm/init.c: the life cycle of uvm/: lazy init (policy, event ring,
 * consumer thread), shutdown at exit, reset for tests, and the fork child
 * (the state it sets up lives in state.c).
 *
 * Exit ordering: preload/ calls wo_uvm_shutdown() from its destructor or
 * atexit handler. The driver may already be tearing itself down then, so
 * shutdown makes no driver call at all: it stops the thread, logs the
 * summary and writes the stats file. Served memory is left to the process's
 * end. The ring stays allocated (reachable through wo_events) because hooks
 * on other threads may still push into it; nobody drains it any more. */
#include "uvm/internal.h"
#include "uvm/place-int.h"

#include <string.h>

#include "core/log.h"
#include "core/registry.h"
#include "core/settings.h"
#include "uvm/executor.h"
#include "uvm/picks.h"

/* Loads the policy; a bad one is logged (located diagnostics) and leaves
 * uvm/ passing everything through, names still recorded for stats. */
static void load_policy(const char *path)
{
    struct wo_policy *p = NULL;
    int r;

    wo_uvm.policy_error = 0;
    if (!path || !*path)
        return;
    wo_uvm.policy_path = strdup(path);
    r = wo_policy_load_file(path, NULL, &p, NULL);
    if (r < 0) {
        wo_uvm.policy_error = r;
        wo_error("policy %s not loaded (%s): every allocation passes through untouched", path,
                 strerror(-r));
        return;
    }
    wo_uvm.policy = p;
}

static int setup_policy_state(void)
{
    size_t nr = wo_uvm.policy ? wo_policy_nrules(wo_uvm.policy) : 0;

    wo_uvm.nrule_counts = nr + 1;
    wo_uvm.rule_counts = calloc(nr + 1, sizeof(*wo_uvm.rule_counts));
    if (!wo_uvm.rule_counts)
        return -ENOMEM;
    wo_host_budget_init(&wo_uvm.host_budget, wo_uvm.policy);
    if (!wo_uvm.policy)
        return 0;
    wo_uvm.g = wo_policy_globals(wo_uvm.policy);
    wo_uvm.window_open = wo_uvm.g->window.open == WO_WINDOW_OPEN_AT_START;
    __atomic_store_n(&wo_uvm.placing, !wo_policy_passthrough(wo_uvm.policy), __ATOMIC_RELEASE);
    return 0;
}

#define WO_DRV_ONE(name) +1
_Static_assert(sizeof(struct wo_driver) == (0 WO_DRIVER_FUNCS(WO_DRV_ONE)) * sizeof(void (*)(void)),
               "WO_DRIVER_FUNCS (uvm.h) must list every member of struct wo_driver");
#undef WO_DRV_ONE

int wo_driver_fill(struct wo_driver *d, void *(*lookup)(void *ud, const char *name), void *ud)
{
    int missing = 0;

#define WO_DRV_FILL(name)                                                                          \
    d->name = (__typeof__(d->name))lookup(ud, #name);                                              \
    missing += !d->name;
    WO_DRIVER_FUNCS(WO_DRV_FILL)
#undef WO_DRV_FILL
    return missing;
}

int wo_uvm_init_policy(const char *path)
{
    int r = 0;

    pthread_mutex_lock(&wo_uvm.lock);
    if (wo_uvm.state == 3) {
        /* A fork child: the policy and records came along, the thread did not. */
        if (wo_events && wo_consumer_start() < 0)
            wo_warn("the consumer thread did not start: launches are not attributed");
        __atomic_store_n(&wo_uvm.state, 1, __ATOMIC_RELEASE);
    }
    if (wo_uvm.state != 0) {
        r = wo_uvm.policy_error;
        goto out;
    }
    wo_scan_words = wo_settings()->scan_words;
    load_policy(path);
    wo_uvm.cap.margin = (uint64_t)wo_settings()->managed_margin_mib << 20;
    wo_uvm.cap.min_headroom = INT64_MAX;
    if (setup_policy_state() < 0) {
        r = -ENOMEM;
        goto out;
    }
    /* Nothing to place and nothing to record: the hooks only forward. No
     * ring, no consumer thread, no parameter scan (the empty policy costs
     * what WOFFLOAD_DISABLE costs, bench/results/e2e-*-overhead-*). */
    __atomic_store_n(&wo_launch_scan, wo_uvm.placing || wo_settings()->trace != NULL ||
                         wo_settings()->observe,
                     __ATOMIC_RELEASE);
    /* The learner and the per-name books need only launches that touch a
     * watched range: in an eager MoE decode that is 7-15% of them
     * (bench/results/e2e-*-issue7-*: 14.5k of 208k launches touch a managed
     * name, 30k any name). Pushing the rest filled the ring while the
     * consumer sat in a prefetch call (docs/architecture.md, issue 21). */
    __atomic_store_n(&wo_events_all, wo_settings()->trace != NULL || wo_settings()->observe,
                     __ATOMIC_RELEASE);
    if (!wo_events && wo_launch_scan) {
        wo_events = wo_ring_new(wo_settings()->ring_events);
        if (!wo_events)
            wo_warn("no memory for the event ring: launches are not attributed");
    }
    if (wo_events && wo_consumer_start() < 0)
        wo_warn("the consumer thread did not start: launches are not attributed");
    if (wo_uvm.policy)
        wo_info("policy %s: %zu rules, default %s%s", wo_policy_source(wo_uvm.policy),
                wo_policy_nrules(wo_uvm.policy), wo_placement_to_string(wo_uvm.g->default_place),
                wo_uvm.placing ? "" : " (nothing leaves the device: pass-through)");
    r = wo_uvm.policy_error;
    __atomic_store_n(&wo_uvm.state, 1, __ATOMIC_RELEASE);
out:
    pthread_mutex_unlock(&wo_uvm.lock);
    return r;
}

int wo_uvm_init(void)
{
    int s = __atomic_load_n(&wo_uvm.state, __ATOMIC_ACQUIRE);

    if (s == 1 || s == 2)
        return wo_uvm.policy_error;
    return wo_uvm_init_policy(wo_settings()->policy);
}

void wo_uvm_ensure_init(void)
{
    int s = __atomic_load_n(&wo_uvm.state, __ATOMIC_ACQUIRE);

    if (WO_UNLIKELY(s == 0 || s == 3))
        (void)wo_uvm_init();
}

static int exiting;

bool wo_uvm_exiting(void)
{
    return __atomic_load_n(&exiting, __ATOMIC_ACQUIRE);
}

void wo_uvm_shutdown(void)
{
    const char *stats = wo_settings()->stats;

    if (__atomic_load_n(&wo_uvm.state, __ATOMIC_ACQUIRE) != 1)
        return;
    __atomic_store_n(&exiting, 1, __ATOMIC_RELEASE);
    wo_consumer_stop();
    wo_place_prepin_stop(); /* a load that never sealed: its buffers go back */
    pthread_mutex_lock(&wo_uvm.lock);
    __atomic_store_n(&wo_uvm.state, 2, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&wo_uvm.lock);
    pthread_mutex_lock(&wo_uvm.lock);
    if (wo_uvm.policy || wo_uvm.nallocs)
        wo_summary_log("exit");
    pthread_mutex_unlock(&wo_uvm.lock);
    if (stats && *stats)
        (void)wo_stats_write_file(stats);
}

void wo_uvm_reset(void)
{
    const struct wo_driver *d = wo_uvm_driver();

    wo_consumer_stop();
    pthread_mutex_lock(&wo_uvm.lock);
    for (size_t i = 0; i < wo_uvm.alloc_hash_size; i++) {
        struct wo_alloc *a = wo_uvm.alloc_hash[i], *next;
        for (; a; a = next) {
            next = a->next;
            if (d && a->kind == WO_KIND_MANAGED)
                d->cuMemFree_v2(a->base);
            else if (d && a->kind == WO_KIND_PINNED)
                wo_place_unpin(d, a, NULL);
            else if (a->kind == WO_KIND_BOUND)
                wo_place_bind_free(a);
            if (a->ours_in_registry)
                (void)wo_registry_remove(a->base, NULL);
            wo_alloc_destroy(a);
        }
    }
    free(wo_uvm.alloc_hash);
    wo_place_expect_free();
    wo_place_prepin_reset();
    wo_names_free_all();
    wo_picks_free(d);
    wo_picks_reset();
    if (d && wo_uvm.stream && d->cuStreamDestroy_v2)
        d->cuStreamDestroy_v2(wo_uvm.stream);
    wo_policy_free(wo_uvm.policy);
    free(wo_uvm.policy_path);
    free(wo_uvm.rule_counts);
    wo_ring_free(wo_events);
    wo_events = NULL;
    __atomic_store_n(&wo_events_all, 1, __ATOMIC_RELAXED);
    wo_scope_forget_thread();
    __atomic_store_n(&exiting, 0, __ATOMIC_RELEASE);
    {
        pthread_mutex_t keep = wo_uvm.lock;
        pthread_cond_t keep_cv = wo_uvm.cpu_read_cv;
        memset(&wo_uvm, 0, sizeof(wo_uvm));
        wo_uvm.lock = keep;
        wo_uvm.cpu_read_cv = keep_cv;
    }
    pthread_mutex_unlock(&wo_uvm.lock);
}

void wo_uvm_atfork_prepare(void)
{
    wo_consumer_fork_prepare();
}

void wo_uvm_atfork_parent(void)
{
    wo_consumer_fork_parent();
}

void wo_uvm_atfork_child(void)
{
    /* Only this thread survived the fork: the lock may have been held by one
     * that did not, and the parent's stream and context mean nothing here. */
    pthread_mutex_init(&wo_uvm.lock, NULL);
    pthread_cond_init(&wo_uvm.cpu_read_cv, NULL);
    memset(wo_uvm.cpu_read, 0, sizeof(wo_uvm.cpu_read)); /* its readers are gone */
    /* nor is any of the threads that may have been inside a driver call
     * (the consumer, the pinned-copy worker): none is here to leave it */
    __atomic_store_n(&wo_prefetch_busy, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&wo_dma_busy, 0, __ATOMIC_SEQ_CST);
    wo_uvm.stream = NULL;
    wo_uvm.stream_failed = false;
    wo_consumer_forget();
    wo_picks_atfork_child();
    for (const struct wo_executor *const *e = wo_executors; *e; e++)
        (*e)->atfork_child();
    /* The next wo_uvm_init() call starts a consumer thread again; the policy,
     * names and records (the child inherits the mappings) stay. */
    if (wo_uvm.state == 1)
        wo_uvm.state = 3;
}
