/* uvm/consumer.c: the one consumer thread of the event ring (wo_events).
 *
 * It drains the ring in batches, keeps per-name accounting (launches that
 * touch each name, hits) by resolving each launch hit (registry id + offset)
 * to the tags covering it, off the engine's threads, and hands every event to
 * dispatch(), where the trace writer and the executors (uvm/executor.h) plug
 * in.
 *
 * Producers (the hooks) never make a syscall, so they cannot wake this
 * thread: it sleeps on a condition variable with a timeout that doubles from
 * 50 us to 2 ms while the ring stays empty, and shutdown signals the same
 * variable to wake it at once. A 2 ms sleep fills 16384 slots only above
 * 8M events/s, far beyond any engine; what did fill the ring (issue 21) is
 * this thread sitting in the prefetcher's driver calls (a collapse costs
 * 38 ms per GiB, synchronous). So before each such call the prefetcher
 * calls wo_consumer_relieve(), which moves the ring's events into a backlog
 * of this thread's own, drained first, in order; the ring then only has to
 * hold what arrives during one call. The backlog grows on demand up to
 * WO_BACKLOG_RINGS rings' worth and is freed once empty: memory stays bounded,
 * and a stall longer than that drops (counted) as before. */
#include "uvm/internal.h"

#include <signal.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/log.h"
#include "core/registry.h"
#include "core/settings.h"
#include "core/trace.h"
#include "uvm/executor.h"
#include "uvm/graph.h"
#include "uvm/plan-budget.h"
#include "uvm/plan.h"
#include "uvm/record.h"

#define BATCH 64
#define BACKLOG_MIN 1024u
#define BACKLOG_KEEP_NS (UINT64_C(1000) * 1000 * 1000)
#define SLEEP_MIN_NS 50000L
#define SLEEP_MAX_NS 2000000L
#define JOIN_WAIT_S 2

static pthread_t thread;
static bool running;         /* a thread was started and not yet joined (caller side) */
static int stop;             /* under sleep_lock */
static bool accepting_tags;  /* under wo_uvm.lock: tag events will be drained */
static pthread_mutex_t sleep_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t sleep_cond;
/* fork(): the forking thread asks this one to park (fork_hold) and waits,
 * bounded, until it has (parked), so that the child never inherits the
 * memory allocator or a lock in the middle of this thread's use. glibc's
 * malloc needs no help, but an allocator without fork handlers does (ASan's
 * in gcc 12 left the child of a busy parent deadlocked in calloc: 12 of 40
 * fork-fresh runs of reliability-lifecycle). Both under sleep_lock. */
static int fork_hold, parked;
static pthread_cond_t park_cond;
#define PARK_WAIT_NS 200000000L
static pthread_once_t cond_once = PTHREAD_ONCE_INIT;

/* Only the consumer thread touches these. */
static struct wo_event batch[BATCH];
static struct wo_trace_tag batch_tag[BATCH];
static char batch_name[BATCH][WO_TAG_NAME_MAX + 1];
static bool batch_has_tag[BATCH];
static uint64_t launch_no;
static struct wo_graphs *graphs; /* captures, for accounting graph replays */
/* The backlog: a FIFO of events taken out of the ring early (power-of-two
 * capacity, grown by doubling). Consumer thread only, but for the figures. */
static struct wo_event *bl;
static size_t bl_cap, bl_head, bl_n;
static uint64_t bl_used_ns;                      /* when relieve last moved an event */
static struct wo_graphs *volatile forked_graphs; /* a fork child's copy of the parent's */
static struct wo_event *volatile forked_bl;      /* the same for the backlog */

static void cond_init(void)
{
    pthread_condattr_t a;

    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&sleep_cond, &a);
    pthread_cond_init(&park_cond, &a);
    pthread_condattr_destroy(&a);
}

/* On this thread, between batches: no allocation, no lock but sleep_lock. */
static void park_for_fork(void)
{
    pthread_mutex_lock(&sleep_lock);
    if (__atomic_load_n(&fork_hold, __ATOMIC_RELAXED)) {
        parked = 1;
        pthread_cond_broadcast(&park_cond);
        while (__atomic_load_n(&fork_hold, __ATOMIC_RELAXED) && !stop)
            pthread_cond_wait(&sleep_cond, &sleep_lock);
        parked = 0;
    }
    pthread_mutex_unlock(&sleep_lock);
}

void wo_consumer_fork_prepare(void)
{
    struct timespec ts;

    if (!running)
        return;
    pthread_mutex_lock(&sleep_lock);
    __atomic_store_n(&fork_hold, 1, __ATOMIC_RELAXED);
    pthread_cond_broadcast(&sleep_cond);
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += PARK_WAIT_NS;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    /* bounded: a thread inside a long driver call forks as before */
    while (!parked && !stop)
        if (pthread_cond_timedwait(&park_cond, &sleep_lock, &ts) != 0)
            break;
    pthread_mutex_unlock(&sleep_lock);
}

static void wake(void)
{
    /* without sleep_lock: a wake that comes just before the thread waits is
     * lost, and it sleeps out its timeout (2 ms at most), as without one.
     * The condition is initialised once and never destroyed. */
    pthread_once(&cond_once, cond_init);
    (void)pthread_cond_signal(&sleep_cond);
}

void wo_consumer_fork_parent(void)
{
    if (!running)
        return;
    pthread_mutex_lock(&sleep_lock);
    __atomic_store_n(&fork_hold, 0, __ATOMIC_RELAXED);
    pthread_cond_broadcast(&sleep_cond);
    pthread_mutex_unlock(&sleep_lock);
}

/* The executors, in the order they are called (uvm/executor.h). */
const struct wo_executor *const wo_executors[] = {&wo_stream_executor, &wo_prefetch_executor,
                                                   NULL};

/* The longest single executor call (an event's or a tick), and whose: this
 * thread is away from the ring for that long, and what arrives meanwhile
 * must fit in the ring (and the backlog, for the prefetcher's driver calls).
 * Written here into wo_consumer_figs (uvm/state.c), read by the stats
 * (relaxed). */

static void note_call(uint64_t t0, const struct wo_executor *const *e, bool tick)
{
    uint64_t d = wo_now_ns() - t0;

    if (d > __atomic_load_n(&wo_consumer_figs.longest_ns, __ATOMIC_RELAXED)) {
        __atomic_store_n(&wo_consumer_figs.longest_in, (*e)->name, __ATOMIC_RELAXED);
        __atomic_store_n(&wo_consumer_figs.longest_tick, tick, __ATOMIC_RELAXED);
        __atomic_store_n(&wo_consumer_figs.longest_ns, d, __ATOMIC_RELAXED);
    }
}

/* Every event, in ring order, on the consumer thread, with no uvm/ lock
 * held. tag is the resolved tag for WO_EV_TAG events (its name valid only
 * during the call), NULL otherwise.
 * Plug-in points: the trace writer (issue 7) and the executors. */
static void dispatch(const struct wo_event *ev, const struct wo_trace_tag *tag)
{
    wo_record_event(ev, tag);
    for (const struct wo_executor *const *e = wo_executors; *e; e++) {
        uint64_t t0 = wo_now_ns();
        (*e)->on_event(ev);
        note_call(t0, e, false);
    }
}

/* fit's staging room goes back to weights once the slots stayed empty
 * through this many graph replays (wo_place_fit_return): an engine whose
 * steps are graphs. llama.cpp replays one graph a token; 32 is a few
 * tokens into the first request. */
#define FIT_RETURN_BLIND 32
static bool fit_return_done;
static uint64_t fit_sample_ns; /* the next wo_place_fit_sample */

/* On the consumer thread each time the ring was found empty, before it
 * sleeps: where queued prefetches go out once a capture has ended. */
static void idle(void)
{
    for (const struct wo_executor *const *e = wo_executors; *e; e++) {
        uint64_t t0 = wo_now_ns();
        (*e)->tick();
        note_call(t0, e, true);
    }
    if (!fit_return_done && wo_budget_staging_unused(FIT_RETURN_BLIND)) {
        fit_return_done = true;
        if (wo_place_fit_return())
            wo_budget_close_staging(); /* the prefetcher's budget follows; no slots now */
    }
    if (wo_now_ns() >= fit_sample_ns) {
        fit_sample_ns = wo_now_ns() + UINT64_C(1000000000);
        wo_place_fit_sample();
    }
}

/* Once, on the consumer thread, after the last event was dispatched (exit
 * or reset): where the trace is closed and the executors stop. */
static void finish(void)
{
    wo_record_finish();
    for (const struct wo_executor *const *e = wo_executors; *e; e++)
        (*e)->finish();
}

/* The bytes of tag t that a hit spanning [lo, hi) of its allocation read,
 * as the planner counts them (docs/prefetch.md, Units): a launch hands a
 * pointer, not a length, so a hit covers one slice from the lowest pointer
 * (or up to the highest), the slice being the gcd of the non-zero offsets
 * seen in the tag (one expert of a stacked expert tensor); while only the
 * tag's start was seen, the whole tag. Host-placed names' totals are the
 * bytes their launches read over PCIe (per step: the difference over a
 * known number of steps; bench/e2e.py does that). */
static uint64_t touched_bytes(struct wo_tag *t, uint64_t lo, uint64_t hi)
{
    uint64_t rel = lo > t->off ? lo - t->off : 0;
    uint64_t relhi = hi > t->off ? WO_MIN(hi - t->off, t->size) : 0;

    if (rel >= t->size)
        return 0;
    t->slice = wo_plan_slice_learn(t->slice, rel);
    return wo_plan_extent_end(t->size, t->slice, rel, relhi) - rel;
}

static void account_launch(const struct wo_event *ev)
{
    launch_no++;
    wo_uvm.launches++;
    for (unsigned i = 0; i < ev->nhits && i < WO_EV_MAX_HITS; i++) {
        const struct wo_ev_hit *h = &ev->l.hits[i];
        uint64_t hi = h->hi > h->offset ? h->hi : h->offset + 1;
        struct wo_range r;
        struct wo_alloc *a;
        bool any = false;

        wo_uvm.launch_hits++;
        /* The range may have been freed (and its id reused) since the
         * launch: the generation tells. */
        if (wo_registry_get(h->id, &r) < 0 || r.gen != h->gen) {
            wo_uvm.hits_stale++;
            continue;
        }
        a = wo_alloc_find_base(r.base);
        if (!a || a->gen != h->gen) {
            wo_uvm.hits_untagged++;
            continue;
        }
        if (a->ntags && !wo_hit_pointer_like(h)) {
            /* a word that is no pointer to a weight (core/event.h) */
            wo_uvm.hits_unaligned++;
            continue;
        }
        for (size_t k = wo_alloc_tag_above(a, h->offset); k < a->ntags && a->tags[k].off < hi; k++) {
            struct wo_tag *t = &a->tags[k];
            struct wo_name *n = t->name;
            if (n->last_launch != launch_no) {
                n->last_launch = launch_no;
                n->launches++;
            }
            n->hits++;
            n->touched += touched_bytes(t, h->offset, h->hi);
            any = true;
        }
        if (!any)
            wo_uvm.hits_untagged++;
    }
}

/* Resolves a tag event (the name reference its producer took is dropped
 * here) into batch slot i. */
static void account_tag(size_t i)
{
    const struct wo_event *ev = &batch[i];
    struct wo_name *n = wo_name_by_id((uint32_t)ev->a.seq);
    struct wo_trace_tag *t = &batch_tag[i];
    uint32_t id = (uint32_t)ev->stream, gen = (uint32_t)(ev->stream >> 32);
    struct wo_range r;

    if (!n)
        return;
    snprintf(batch_name[i], sizeof(batch_name[i]), "%s", n->s);
    memset(t, 0, sizeof(*t));
    t->id = id;
    t->gen = gen;
    t->base = ev->a.base;
    t->size = ev->a.size;
    if (wo_registry_get(id, &r) == 0 && r.gen == gen && ev->a.base >= r.base) {
        t->offset = ev->a.base - r.base;
    } else {
        t->id = t->gen = WO_TRACE_NO_ID;
    }
    t->placement = ev->a.device == WO_PLACE_DEVICE    ? WO_TRACE_PLACE_DEVICE
                   : ev->a.device == WO_PLACE_HOST    ? WO_TRACE_PLACE_HOST
                   : ev->a.device == WO_PLACE_MANAGED ? WO_TRACE_PLACE_MANAGED
                                                      : WO_TRACE_PLACE_UNKNOWN;
    t->rule = n->rule >= 0 ? (uint32_t)n->rule : WO_TRACE_NO_ID;
    t->flags = ev->a.flags;
    t->name = batch_name[i];
    batch_has_tag[i] = true;
    wo_name_unref(n);
}

static size_t backlog_limit(void)
{
    return (size_t)wo_ring_capacity(wo_events) * WO_BACKLOG_RINGS;
}

/* Doubles the backlog (keeping its order); false when at its limit or out
 * of memory. */
static bool backlog_grow(void)
{
    size_t ncap = bl_cap ? bl_cap * 2 : BACKLOG_MIN;
    struct wo_event *n;

    if (ncap > backlog_limit())
        return false;
    n = malloc(ncap * sizeof(*n));
    if (!n)
        return false;
    for (size_t i = 0; i < bl_n; i++)
        n[i] = bl[(bl_head + i) & (bl_cap - 1)];
    free(bl);
    bl = n;
    bl_cap = ncap;
    bl_head = 0;
    return true;
}

static void backlog_publish(void)
{
    __atomic_store_n(&wo_consumer_figs.bl_now, bl_n, __ATOMIC_RELAXED);
    if (bl_n > __atomic_load_n(&wo_consumer_figs.bl_peak, __ATOMIC_RELAXED))
        __atomic_store_n(&wo_consumer_figs.bl_peak, bl_n, __ATOMIC_RELAXED);
}

static void relieve(void)
{
    uint64_t moved = 0;

    if (!wo_events)
        return;
    for (;;) {
        if (bl_n == bl_cap && !backlog_grow())
            break; /* at the limit: the ring fills, and drops, as before */
        if (!wo_ring_pop(wo_events, &bl[(bl_head + bl_n) & (bl_cap - 1)]))
            break;
        bl_n++;
        moved++;
    }
    if (moved) {
        bl_used_ns = wo_now_ns();
        __atomic_add_fetch(&wo_consumer_figs.bl_moved, moved, __ATOMIC_RELAXED);
        backlog_publish();
    }
}

/* The oldest event: the backlog's, then the ring's. */
static int next_event(struct wo_event *ev)
{
    if (bl_n) {
        *ev = bl[bl_head];
        bl_head = (bl_head + 1) & (bl_cap - 1);
        bl_n--;
        return 1;
    }
    return wo_ring_pop(wo_events, ev);
}

/* Pops up to BATCH events, accounts them under one lock hold, dispatches
 * them without it. Returns how many. */
static size_t drain_batch(void)
{
    size_t n = 0;

    while (n < BATCH && next_event(&batch[n]))
        n++;
    if (bl_cap)
        backlog_publish();
    if (!n)
        return 0;
    pthread_mutex_lock(&wo_uvm.lock);
    for (size_t i = 0; i < n; i++) {
        const struct wo_event *rep;
        ssize_t nrep;

        batch_has_tag[i] = false;
        /* atomic: it may be polled without the lock (tests wait for the consumer) */
        __atomic_add_fetch(&wo_uvm.events, 1, __ATOMIC_RELAXED);
        if (batch[i].type == WO_EV_TAG) {
            account_tag(i);
            continue;
        }
        /* A launch recorded into a capture runs when its graph is launched:
         * it is accounted then, once per replay. Without the graph table,
         * or without memory for this event in it, launches are accounted
         * as they come. */
        nrep = wo_graphs_expand(graphs, &batch[i], &rep);
        if (nrep < 0)
            nrep = wo_graphs_expand(NULL, &batch[i], &rep);
        for (ssize_t k = 0; k < nrep; k++)
            account_launch(&rep[k]);
    }
    pthread_mutex_unlock(&wo_uvm.lock);
    for (size_t i = 0; i < n; i++)
        dispatch(&batch[i], batch_has_tag[i] ? &batch_tag[i] : NULL);
    return n;
}

/* WOFFLOAD_STATS_EVERY: the stats file rewritten while the process runs,
 * from this thread (the engine's never pay for it), so that a run cut
 * short by SIGKILL still leaves figures at most that old, and a load
 * generator can read them as it goes. The first one comes one period
 * after the thread starts; the last one at exit (wo_uvm_shutdown). */
static uint64_t stats_next_ns;

static void stats_refresh(void)
{
    const struct wo_settings *st = wo_settings();
    uint64_t now;

    if (!st->stats || !*st->stats || !st->stats_every)
        return;
    now = wo_now_ns();
    if (now < stats_next_ns)
        return;
    if (stats_next_ns)
        (void)wo_stats_write_file(st->stats);
    stats_next_ns = now + (uint64_t)st->stats_every * UINT64_C(1000000000);
}

static void *consumer_main(void *arg)
{
    long sleep_ns = SLEEP_MIN_NS;

    (void)arg;
    graphs = wo_graphs_new(); /* NULL: graph replays are not accounted */
    stats_next_ns = 0;
    fit_return_done = false;
    fit_sample_ns = 0;
    __atomic_store_n(&wo_consumer_figs.bl_peak, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&wo_consumer_figs.bl_moved, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&wo_consumer_figs.longest_ns, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&wo_consumer_figs.longest_in, NULL, __ATOMIC_RELAXED);
    __atomic_store_n(&wo_consumer_figs.longest_tick, false, __ATOMIC_RELAXED);
    for (;;) {
        struct timespec ts;
        int st;

        if (__atomic_load_n(&fork_hold, __ATOMIC_RELAXED))
            park_for_fork(); /* benign race: read again under sleep_lock */
        stats_refresh();
        if (drain_batch() > 0) {
            sleep_ns = SLEEP_MIN_NS;
            continue;
        }
        idle();
        if (bl_n)
            continue; /* idle() issued held prefetches, and relieved the ring */
        if (bl && wo_now_ns() - bl_used_ns > BACKLOG_KEEP_NS) {
            /* no stall for a while: give the memory back (kept until then,
             * so that a stall per decode step does not map and unmap it) */
            free(bl);
            bl = NULL;
            bl_cap = bl_head = 0;
        }
        pthread_mutex_lock(&sleep_lock);
        st = stop;
        if (!st) {
            clock_gettime(CLOCK_MONOTONIC, &ts);
            ts.tv_nsec += sleep_ns;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            (void)pthread_cond_timedwait(&sleep_cond, &sleep_lock, &ts);
            st = stop;
        }
        pthread_mutex_unlock(&sleep_lock);
        if (st)
            break;
        sleep_ns = WO_MIN(sleep_ns * 2, SLEEP_MAX_NS);
    }
    /* Tag events pushed from now on would never be drained (and would keep
     * their names alive): stop taking them, then empty the ring. */
    pthread_mutex_lock(&wo_uvm.lock);
    accepting_tags = false;
    pthread_mutex_unlock(&wo_uvm.lock);
    while (drain_batch() > 0)
        ;
    finish();
    /* finish() may have relieved the ring once more: nothing is left to
     * dispatch after it, but what it moved must not leak */
    free(bl);
    bl = NULL;
    bl_cap = bl_head = bl_n = 0;
    pthread_mutex_lock(&wo_uvm.lock);
    wo_graphs_free(graphs);
    graphs = NULL;
    pthread_mutex_unlock(&wo_uvm.lock);
    return NULL;
}

int wo_consumer_start(void)
{
    sigset_t all, old;
    int r;

    pthread_once(&cond_once, cond_init);
    if (running || !wo_events)
        return 0;
    /* the doorbell the hooks and the prefetcher ring (uvm/state.c) */
    wo_consumer_install(wake, relieve);
    stop = 0;
    /* The engine's signals go to its own threads, never to this one. */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    r = pthread_create(&thread, NULL, consumer_main, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (r != 0)
        return -r;
    (void)pthread_setname_np(thread, "woffload");
    running = true;
    accepting_tags = true; /* the caller holds wo_uvm.lock */
    return 0;
}

void wo_consumer_stop(void)
{
    struct timespec ts;
    int r;

    if (!running)
        return;
    pthread_mutex_lock(&sleep_lock);
    stop = 1;
    pthread_cond_signal(&sleep_cond);
    pthread_mutex_unlock(&sleep_lock);
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += JOIN_WAIT_S;
    r = pthread_timedjoin_np(thread, NULL, &ts);
    if (r != 0) {
        /* Stuck in the driver (a prefetch at exit): exit must not hang on it. */
        wo_warn("the consumer thread did not stop within %d s; leaving it", JOIN_WAIT_S);
        pthread_detach(thread);
    }
    running = false;
}

void wo_consumer_forget(void)
{
    /* The parent's graph table came along, maybe in the middle of an update
     * by its consumer thread: never used or freed here, kept reachable. */
    forked_graphs = graphs;
    graphs = NULL;
    forked_bl = bl;
    bl = NULL;
    bl_cap = bl_head = bl_n = 0;
    wo_record_forget();
    running = false;
    stop = 0;
    __atomic_store_n(&fork_hold, 0, __ATOMIC_RELAXED);
    parked = 0;
    accepting_tags = false;
    pthread_mutex_init(&sleep_lock, NULL);
    cond_init();
}

void wo_consumer_push_tag(const struct wo_alloc *a, const struct wo_tag *t)
{
    struct wo_event ev;

    if (!wo_events || !accepting_tags)
        return;
    memset(&ev, 0, sizeof(ev));
    ev.t_ns = wo_now_ns();
    ev.type = WO_EV_TAG;
    ev.tid = (uint32_t)gettid();
    ev.stream = (uint64_t)a->id | (uint64_t)a->gen << 32; /* the range, for the trace */
    ev.a.base = a->base + t->off;
    ev.a.size = t->size;
    ev.a.seq = t->name->id;
    ev.a.flags = a->kind == WO_KIND_OBSERVED ? 0 : WO_TRACE_TAG_PLACEABLE;
    ev.a.device = t->place;
    wo_name_ref(t->name);
    if (wo_ring_push(wo_events, &ev) < 0)
        wo_name_unref(t->name);
}
