/* uvm/internal.h: state shared by the files of uvm/ (names, placements,
 * consumer thread, stats) and the few entry points tests, tools and the
 * prefetcher use beyond uvm/uvm.h.
 *
 * One mutex (wo_uvm.lock) guards every map here: names, allocation records,
 * tags, budgets, per-rule counts. The launch path never takes it: launches
 * reach uvm/ only as ring events, resolved by the consumer thread. */
#pragma once

#include <pthread.h>
#include <stdio.h>

#include "policy/policy.h"
#include "uvm/progress.h"
#include "uvm/uvm.h"

#define WO_TAG_NAME_MAX 1023 /* longest name in bytes, without the NUL */
#define WO_TAG_DEPTH_MAX 64  /* deepest tag scope nesting per thread */

/* An interned name. Reference-counted by the tags that carry it and by tag
 * events still in the ring, so names of freed memory do not pile up. */
struct wo_name {
    char *s;
    uint32_t id;   /* index in wo_uvm.names_by_id; reused after release */
    uint32_t refs;
    uint64_t hash;
    struct wo_name *next; /* hash chain */
    long rule;            /* wo_policy_match() rule, -1 default, -2 not matched yet */
    enum wo_placement want;  /* what the policy asks */
    enum wo_placement place; /* what it got (host budget spent: device) */
    bool pin;
    bool over_budget;
    bool unplaceable;     /* at least one tag of it is on memory the shim only observed */
    uint64_t bytes;       /* live tagged bytes */
    uint32_t ntags;       /* live tags (tensors) */
    uint64_t launches;    /* launches touching it (consumer) */
    uint64_t hits;        /* (launch, range) hits resolved to it (consumer) */
    uint64_t last_launch; /* consumer's launch number that last counted it */
    uint64_t touched;     /* bytes launches touched, each a slice extent (consumer) */
    uint64_t peak_bytes;  /* the most bytes tagged at once */
    uint32_t peak_tags;   /* the most tags at once (0: never tagged) */
};

/* A name whose last tag went: the engine freed its memory (llama.cpp frees
 * its model buffer before it exits). What it was and where it went, for the
 * stats written after (names.c, released_names); one record a name string,
 * no more of them than the most names live at once (at least 64, at most
 * WO_NAMES_GONE_MAX): an engine that frees its model keeps every record, one
 * that makes new names all the time does not grow. */
struct wo_name_gone {
    char *s;
    uint64_t hash;
    long rule;
    enum wo_placement want, place;
    bool unplaceable, over_budget;
    uint64_t peak_bytes;
    uint32_t peak_tags;
    uint64_t launches, hits, touched; /* over every life of the name */
    uint32_t lives;                   /* times its last tag went */
};

#define WO_NAMES_GONE_MAX 65536

enum wo_alloc_kind {
    WO_KIND_OBSERVED = 0, /* the engine's own allocation: tags are recorded only */
    WO_KIND_MANAGED,      /* served by uvm/ with cuMemAllocManaged */
    WO_KIND_PINNED,       /* served by uvm/ with cuMemHostAlloc (host + pin) */
    WO_KIND_BOUND,        /* served by uvm/ as a late-bound VMM range (place-bind.c) */
};

struct wo_bound;

struct wo_tag {
    uint64_t off, size;
    struct wo_name *name;
    uint64_t order;          /* global tag order: the host budget is charged in it */
    enum wo_placement place; /* decided placement */
    bool charged;            /* holds host budget bytes */
    bool applied;            /* advice/residency applied for `place` */
    bool lent;               /* fit made it managed, in the staging room (fit-split.c) */
    uint64_t slice;          /* gcd of the non-zero offsets launches pointed at in it; 0 none yet (consumer) */
};

/* A name announced before its bytes (woffload_expect, place-expect.c). */
struct wo_expect_entry {
    char *name;
    uint64_t bytes;
    enum wo_placement plan; /* the policy's or fit's placement of it */
    bool claimed;           /* an allocation was matched to it */
    bool pinned;            /* ... and served as pinned host memory */
    bool tagged;            /* the tag of the allocation that claimed it came */
};

struct wo_uvm_expect {
    struct wo_expect_entry *v;
    size_t n, cap;
    bool dirty;                         /* announced since the last plan */
    uint64_t bytes;                     /* announced */
    uint64_t plan_host, plan_host_bytes, plan_device, plan_device_bytes;
    uint64_t matched, matched_bytes;    /* allocations matched to a name */
    uint64_t served_host, served_host_bytes; /* ... served as pinned host memory */
    uint64_t pin_failures;              /* ... that could not be: served as before */
    uint64_t unmatched;                 /* allocations of at least 1 MiB matched to none */
    uint64_t released;                  /* claims given back by a free before seal */
    uint64_t missed_tags, missed_bytes; /* tags in such host memory the plan did not want there */
    uint64_t swapped_tags, swapped_bytes; /* ... traded with a host name of their size and class */
};

struct wo_alloc {
    uint64_t base, size;
    uint32_t id, gen;  /* registry range */
    uint32_t flags;    /* WO_RANGE_* */
    int api;
    enum wo_alloc_kind kind;
    bool ours_in_registry;    /* uvm/ added the registry range (and removes it) */
    bool below_min_size;      /* observed while the window was open, but too small */
    void *host;               /* WO_KIND_PINNED: the host pointer */
    size_t host_len;          /* WO_KIND_PINNED: 0 (cuMemHostAlloc), or the length of
                               * our huge-page mapping registered with cuMemHostRegister */
    bool capped;              /* pinned because managed memory would have passed the cap */
    uint32_t expect_ix;       /* 1 + the announced name it was matched to (place-expect.c); 0 none */
    bool after_seal;          /* the engine's device memory after seal, under fit: in fit.engine_after */
    struct wo_bound *bound;   /* WO_KIND_BOUND: the range (uvm/bind.h) */
    enum wo_placement place;  /* untagged bytes: placement applied so far (UNSET: none) */
    bool default_charged;     /* untagged bytes hold host budget (default: host) */
    uint64_t default_bytes;
    struct wo_tag *tags;      /* sorted by off, non-overlapping */
    size_t ntags, cap;
    struct wo_alloc *next;    /* hash chain by base */
};

/* Bytes and tensors per placement (stats, summaries). */
struct wo_place_count {
    uint64_t bytes, tensors;
};

/* The shim's threads that copy the engine's memory by CPU (wo_uvm_copy_live) */
enum { WO_READER_PIN, WO_READER_MIRROR, WO_CPU_READERS };

struct wo_uvm_state {
    pthread_mutex_t lock;
    int state; /* 0 not initialised, 1 running, 2 shut down, 3 fork child before init */
    struct wo_policy *policy;  /* NULL: none or bad: everything passes through */
    char *policy_path;         /* as asked (stats), NULL when none */
    int policy_error;          /* load error (-errno), 0 when fine */
    bool placing;              /* a policy that can place something off the device */
    const struct wo_policy_globals *g;

    /* window and seal; window_open is read without the lock by wo_uvm_alloc() */
    int window_open;
    bool sealed;
    bool first_tag_seen;

    /* names: chained hash + dense id table */
    struct wo_name **name_hash;
    size_t name_hash_size, nnames, nnames_peak;
    struct wo_name **names_by_id;
    uint32_t names_cap;
    uint32_t *free_ids;
    uint32_t nfree_ids;
    struct wo_name_gone *names_gone; /* names whose last tag went, in that order */
    size_t nnames_gone, names_gone_cap;
    uint32_t *names_gone_index;  /* open addressing by hash, 2 x cap slots: index + 1, 0 empty */
    uint64_t names_gone_dropped; /* past the limit (wo_name_gone), or no memory */

    /* allocation records: chained hash by base */
    struct wo_alloc **alloc_hash;
    size_t alloc_hash_size, nallocs;

    uint64_t tag_order;
    struct wo_host_budget host_budget;
    uint64_t device_budget;    /* resolved at seal; 0 before */
    uint64_t device_total;
    struct wo_rule_counts *rule_counts; /* nrules + 1 */
    size_t nrule_counts;

    /* The managed cap (docs/placement.md): live managed bytes served never
     * exceed the free device memory at that moment minus cap_margin. */
    struct {
        uint64_t margin;              /* WOFFLOAD_MANAGED_MARGIN */
        uint64_t live, peak;          /* managed bytes served and not freed */
        int64_t min_headroom;         /* least free - margin - live after a served managed
                                       * allocation; INT64_MAX before the first */
        uint64_t checks;              /* managed allocations checked against the cap */
        uint64_t pinned, pinned_bytes; /* served as pinned host memory instead */
        uint64_t pinned_largest;      /* the largest of them (a one-buffer engine's model) */
        uint64_t passed, passed_bytes; /* passed through as device memory (placement device) */
        uint64_t failed, failed_bytes; /* neither worked: passed through, the engine's call decides */
        uint64_t stuck_tags, stuck_bytes; /* tags wanting device/managed on capped pinned memory */
        uint64_t unknown_free;        /* cuMemGetInfo failed: treated as no room */
    } cap;
    struct wo_progress pin_progress;  /* pinning while the engine loads; ended at seal */
    uint64_t seal_ns;                 /* how long seal took */
    uint64_t pin_ns;                  /* time inside cuMemHostAlloc, all served pins */
    struct {                          /* the engine's copies before seal (load-copies.c) */
        uint64_t calls[4], bytes[4], ns[4]; /* by WO_LOAD_COPY_*: time inside the calls */
    } load_copies;
    struct wo_uvm_expect expect;      /* names announced before their bytes (place-expect.c) */
    struct {                          /* late binding (WOFFLOAD_LATE_BIND, place-bind.c) */
        uint64_t ranges;              /* placeable allocations served as bound ranges */
        uint64_t fallbacks;           /* ... that could not be, and were served as before */
        uint64_t moves, moved_bytes;  /* re-backings and the bytes they copied */
        uint64_t failures;            /* re-backings that failed (bytes stayed) */
        int said_in_place;            /* wo_place_bind_in_place: said once */
    } bind;
    struct {                          /* what fit: chose at seal */
        uint64_t budget, device_bytes, rest_bytes, engine_bytes;
        uint64_t staging_bytes; /* kept for the streaming executor's slots */
        uint64_t reserve_bytes; /* kept for what the engine allocates after seal */
        uint64_t lent_bytes;    /* of the staging room, lent to managed weights */
        uint64_t picks_bytes;   /* kept for the picked copies' buffers */
        uint64_t untagged_bytes; /* the engine's placeable allocations' bytes no name covers,
                                  * on the device with the default: out of the budget */
        uint64_t context_bytes;  /* the process's device memory beyond its allocations at
                                  * fit's choice (NVML): its CUDA contexts, modules; out of
                                  * the budget (wo_place_context_bytes); also measured at
                                  * seal for a trace (wo_place_context_for_trace) */
        bool context_known;      /* context_bytes was measured (NVML could tell) */
        uint64_t returned_bytes; /* ... placed on the device for good: the slots stayed empty */
        uint64_t yielded_bytes;  /* fit's device weights moved to the host for the engine's
                                  * allocations after seal (wo_place_fit_yield) */
        uint64_t yields;         /* engine allocations that took them */
        uint64_t squeezed_bytes; /* device memory that came back to the free memory when
                                  * yielded managed weights' cached pages were taken back
                                  * (WOFFLOAD_FIT_SQUEEZE) */
        uint64_t lent_squeezes;  /* squeezes after the prefetcher evicted lent weights for
                                  * the slots (wo_place_fit_squeeze_lent) */
        uint64_t unsqueezed;     /* yields of managed weights whose pages did not come back
                                  * (no squeeze, or less than half): the free memory no
                                  * longer shows the context's growth */
        uint64_t oom_at;         /* the engine's last out-of-memory after seal not yet met
                                  * (wo_uvm_engine_oom: weights yield at the next one) */
        uint64_t engine_after;   /* the engine's device memory allocated after seal and live
                                  * (cuMemAlloc, cudaMalloc): past reserve_bytes, weights yield */
        uint64_t engine_peak;    /* engine_after's high water: the reserve this run needed */
        uint64_t free_at_seal;   /* the device's free memory at seal (0: not known) */
        uint64_t untracked;      /* the high water of its fall beyond the allocations seen
                                  * (wo_place_fit_sample: the context's own growth) */
        bool returned;          /* the room went back to weights (once) */
        size_t names;
    } fit;

    /* cumulative counters */
    uint64_t served_managed, served_pinned;      /* allocations served */
    uint64_t pin_failures, pin_fallbacks;
    uint64_t over_budget_tags, over_budget_bytes;
    uint64_t unplaceable_tags;
    uint64_t misuse;
    uint64_t readonly_allocs; /* woffload_readonly declarations taken */
    uint64_t placement_errors;

    /* consumer results */
    uint64_t launches, launch_hits, hits_stale, hits_untagged;
    uint64_t hits_unaligned; /* on a weight's allocation, a word no weight pointer (core/event.h) */
    uint64_t events;

    /* [lo, hi): bytes a shim thread is reading by CPU outside the lock
     * (wo_uvm_copy_live: the pinned-copy worker, the copy engine's mirror
     * thread); a free of a range that overlaps them waits on cpu_read_cv
     * (with the lock) until they are read. Both 0: none. */
    struct {
        uint64_t lo, hi;
    } cpu_read[WO_CPU_READERS];
    pthread_cond_t cpu_read_cv;

    /* driver state (forgotten in a fork child) */
    CUstream stream;           /* private stream for seal-time prefetches */
    bool stream_failed;
    int device;                /* device ordinal of the first served allocation */
};

extern struct wo_uvm_state wo_uvm;

/* ---- place-bind.c (under wo_uvm.lock) --------------------------------- */
/* WOFFLOAD_LATE_BIND=1: placeable allocations become bound ranges. */
bool wo_place_bind_enabled(void);
/* WOFFLOAD_FIT_BIND=1 under fit (and not WOFFLOAD_LATE_BIND): the
 * placeable allocations not served as pinned host memory for a name the
 * plan puts on the host become bound ranges (no managed memory), so that
 * fit's yields after seal free device memory at once. */
bool wo_place_bind_fit(void);
/* Serves a (size set, kind set to BOUND on success) as a bound range; known
 * is the placement its tag scope decided (UNSET: the window's). 0 and *p,
 * or a negative errno: the caller serves it as before. */
int wo_place_bind_serve(const struct wo_driver *d, struct wo_alloc *a, enum wo_placement known,
                        CUdeviceptr *p);
/* At seal: re-backs a's granules to its tags' placements, the untagged
 * bytes to gaps. After seal: one tag's. 0 or the first error. */
int wo_place_bind_seal(struct wo_alloc *a, enum wo_placement gaps);
int wo_place_bind_tag(struct wo_alloc *a, struct wo_tag *t);
void wo_place_bind_free(struct wo_alloc *a);
/* A late-bound range is never staged by the shim's own copies (the
 * streaming executor's slots, picked copies): its launches read it in
 * place. Called by each that meets one; says why once. Any thread. */
void wo_place_bind_in_place(void);
/* Granule bytes of every live bound range now, by backing. */
void wo_place_bind_bytes(uint64_t *host, uint64_t *device);

/* ---- init.c ---------------------------------------------------------- */
/* wo_uvm_init() with an explicit policy path (NULL: none). Tests and tools. */
int wo_uvm_init_policy(const char *path);
/* Stops the thread and frees everything, memory served to the engine
 * included, and returns to the state before the first init (tests). */
void wo_uvm_reset(void);
/* True once wo_uvm_shutdown() (the exit path) began: the driver may be
 * tearing itself down, so code running from finish() on the consumer thread
 * (prefetcher, trace) must not call into it any more. Not set by reset. */
bool wo_uvm_exiting(void);
/* Calls wo_uvm_init() unless it ran; cheap after the first call. */
void wo_uvm_ensure_init(void);

/* ---- names.c (all under wo_uvm.lock unless said) ---------------------- */
/* The innermost tag scope name of this thread, or NULL. No lock. */
const char *wo_scope_current(void);
/* This thread's tag scopes (woffload_tag_push/pop, uvm/api.c): a name
 * checked and pushed, 0 or -EINVAL, -E2BIG, -ENOMEM (said, misuse
 * counted); the innermost popped, 0 or -EPERM. */
int wo_scope_push(const char *name);
int wo_scope_pop(void);
struct wo_name *wo_name_get(const char *s); /* interns; NULL on ENOMEM */
void wo_name_ref(struct wo_name *n);
void wo_name_unref(struct wo_name *n);
struct wo_name *wo_name_by_id(uint32_t id);
struct wo_alloc *wo_alloc_find_base(uint64_t base);
/* The record holding addr: looks the registry up; creates an observed record
 * for a registry range uvm/ had not heard of. NULL when no range holds it. */
struct wo_alloc *wo_alloc_find_addr(uint64_t addr);
int wo_alloc_insert(struct wo_alloc *a);
void wo_alloc_unlink(struct wo_alloc *a);
/* Drops every tag of a (names unreferenced, budget returned) and frees a. */
void wo_alloc_destroy(struct wo_alloc *a);
/* Index of a's first tag whose end lies above off (a->ntags: none). */
size_t wo_alloc_tag_above(const struct wo_alloc *a, uint64_t off);
/* Adds a tag; 0, -EEXIST (overlaps another name; *clash set), 1 (already
 * there, same name), -ENOMEM. */
int wo_alloc_add_tag(struct wo_alloc *a, uint64_t off, uint64_t size, struct wo_name *n,
                     struct wo_tag **ret, const struct wo_tag **clash);
void wo_names_free_all(void);
void wo_scope_forget_thread(void);

/* ---- place-cap.c, place-pin.c (placement's files: place-int.h) --------- */
/* A tag on memory the managed cap pinned wanted `want` for size bytes: counts
 * it as stuck in host memory unless host was asked or fit chooses for it. */
void wo_place_count_stuck(const struct wo_name *n, enum wo_placement want, uint64_t size);
/* Gives back a WO_KIND_PINNED allocation's host memory (unregister + unmap,
 * or cuMemFreeHost); *ret the driver's answer when ret is not NULL. */
void wo_place_unpin(const struct wo_driver *d, struct wo_alloc *a, CUresult *ret);
/* The pages for a pin of size bytes, mapped and populated without a driver
 * call (a caller that registers inside the capture handshake maps first,
 * outside it): *n their length. NULL below a huge page or when the map
 * fails (wo_pin_host then takes cuMemHostAlloc). */
void *wo_pin_pages(size_t size, size_t *n);
/* Pinned, device-mapped host memory of size bytes, the fast way first
 * (pages, from wo_pin_pages with its n, registered; NULL: mapped here;
 * else cuMemHostAlloc): *host, and *len the mapping's length (0:
 * cuMemHostAlloc's). The pages are the pin's or unmapped, whatever the
 * result. No lock; a context current. */
CUresult wo_pin_host(const struct wo_driver *d, size_t size, void *pages, size_t n, void **host,
                     size_t *len);
/* Gives back what wo_pin_host made (len as it returned it). */
CUresult wo_unpin_host(const struct wo_driver *d, void *host, size_t len);

/* ---- api.c ----------------------------------------------------------- */
/* A tag scope opened: counts as the first tag for the window (policy
 * window.open/close: on-first-tag). */
void wo_api_note_tag(void);
/* Logs, once per reason, why a tag on observed memory cannot move it. */
void wo_report_unplaceable(const struct wo_alloc *a, const char *name);

/* ---- place.c, place-seal.c (under wo_uvm.lock) ------------------------- */
/* Waits, the lock released meanwhile, until no shim thread reads anything
 * of [base, base+size) by CPU (wo_uvm_copy_live): called before memory goes
 * back to the driver. */
void wo_uvm_wait_cpu_read(uint64_t base, uint64_t size);
/* Copies [src, src + bytes) of the live range (rid, gen) into dst with the
 * CPU, a piece at a time: each piece is checked live under wo_uvm.lock and
 * announced as reader `who`'s (a free of the range waits for it), then
 * copied outside the lock, so the engine's frees of other memory and
 * everything else that takes the lock go on. False when the engine freed
 * the range meanwhile, or *stop rose (the process exits). Takes the lock:
 * never called with it held. */
bool wo_uvm_copy_live(unsigned who, uint32_t rid, uint32_t gen, uint64_t src, uint64_t bytes,
                      void *dst, const bool *stop);
/* Decides a tag's placement (policy match, host budget) and counts it. */
void wo_place_decide(struct wo_alloc *a, struct wo_tag *t);
/* fit (place-fit.c), from the consumer thread: the staging room fit lent
 * goes back to weights for good. Its lent managed weights are placed on
 * the device (preferred location the GPU, prefetched there), and the
 * device budget the prefetcher and the slots share loses their bytes.
 * Once; returns the bytes placed (0: nothing lent, or done before). Takes
 * wo_uvm.lock. */
uint64_t wo_place_fit_return(void);
/* The lent weights' device pages back from UVM's cache (issue 41). Under
 * fit the prefetcher evicts the lent weights once the slots stream (their
 * budget follows the stager's reserved bytes), but UVM keeps an evicted
 * range's device pages, and the slots' own allocations took the free
 * memory first: llama-server at --fit 4816MiB held 1.057x its fit size
 * (bench/results/llamacpp-serve-20261207c-p32-lag-fit-h100). The consumer
 * thread calls this after such evictions with the bytes evicted and not
 * prefetched since (what UVM may still cache): fit's squeeze takes them
 * back (WOFFLOAD_FIT_SQUEEZE). Returns false when it could not run now (a
 * capture under way: call again later), true otherwise (also when nothing
 * was lent, the room was returned, or the squeeze is off). Takes
 * wo_uvm.lock. */
bool wo_place_fit_squeeze_lent(uint64_t cached);
/* On the consumer thread, at most once a second: the high water of what
 * the device's free memory fell by since seal beyond the allocations the
 * shim saw (the CUDA context's own growth: `reserve: auto` keeps it). */
void wo_place_fit_sample(void);
/* The same with wo_uvm.lock held (the engine's allocations after seal). */
void wo_place_fit_sample_locked(void);
/* Applies a tag's placement now (after seal, or at allocation time). */
int wo_place_apply_tag(struct wo_alloc *a, struct wo_tag *t, bool residency);
/* A tag that arrives before seal, placed off the device (fit off): in a
 * managed allocation its advice at once (residency waits for seal), in a
 * late-bound range its whole granules re-backed on the host at once; the
 * engine's writes to come then land on the host. */
int wo_place_tag_early(struct wo_alloc *a, struct wo_tag *t);
int wo_place_seal(void);
const char *wo_cu_error_name(CUresult r);

/* The gate (uvm.h: wo_uvm_quiesce_begin) is kept here, on uvm/'s ground
 * floor (state.c): how many are behind it now, and what a higher file does
 * at it, installed once before it has anything to drain (the copy
 * engine's: uvm/picks-dma.c). begin gets the caller's return address and
 * the count it raised; end the count it left. */
extern unsigned wo_uvm_quiescing;
void wo_uvm_gate_install(void (*begin)(void *by, unsigned raised), void (*end)(unsigned left));

/* ---- consumer.c -------------------------------------------------------- */
int wo_consumer_start(void);
/* Stops the thread: drains what is left, joins (bounded wait). */
void wo_consumer_stop(void);
/* In a fork child: the thread is gone; forget it without joining. */
void wo_consumer_forget(void);
/* Wakes the consumer thread if it sleeps between batches (any thread; one
 * futex call when it does: only for a hook that is about to wait on it).
 * Kept in state.c, with wo_consumer_relieve: the doorbell the consumer
 * installs when it starts (nothing to wake or relieve before). */
void wo_consumer_wake(void);
void wo_consumer_install(void (*wake)(void), void (*relieve)(void));
/* fork(): prepare parks the thread between batches (waits 200 ms at most);
 * parent lets it go on. */
void wo_consumer_fork_prepare(void);
void wo_consumer_fork_parent(void);
/* Pushes a tag event for the trace (takes a name reference the consumer
 * drops after dispatching it). Under wo_uvm.lock. */
void wo_consumer_push_tag(const struct wo_alloc *a, const struct wo_tag *t);
/* Consumer thread only: moves what the ring holds into the consumer's
 * backlog (bounded), so the ring has room while the thread is about to block
 * in a driver call (uvm/prefetch.c calls it before each one). */
void wo_consumer_relieve(void);
/* The backlog's figures for the stats (any thread; relaxed): events it
 * holds now, the most it held, the most it may hold. */
#define WO_BACKLOG_RINGS 4 /* the backlog's limit, in ring capacities */
struct wo_backlog_stats {
    uint64_t now, peak, limit, moved;
};
void wo_consumer_backlog_stats(struct wo_backlog_stats *ret);
/* The longest single executor call on the consumer thread so far (its time
 * away from the ring), the executor's name ("" before any) and whether it
 * was a tick (else an event's). Any thread; relaxed. */
void wo_consumer_longest(uint64_t *ns, const char **who, bool *tick);
/* Where the consumer thread publishes them (state.c; relaxed atomics). */
struct wo_consumer_figs {
    uint64_t bl_now, bl_peak, bl_moved;
    uint64_t longest_ns;
    const char *longest_in; /* the executor's name; NULL before any call */
    bool longest_tick;
};
extern struct wo_consumer_figs wo_consumer_figs;

/* ---- stats.c ----------------------------------------------------------- */
/* The event path's books (stats "ring", the exit summary): drops split into
 * launches that touch a watched range, other launches, other events. */
struct wo_event_books {
    uint64_t capacity, pushed, dropped;
    uint64_t dropped_watched, dropped_unwatched, dropped_other;
    uint64_t skipped_launches, skipped_other;
    bool all; /* wo_events_all */
    struct wo_backlog_stats backlog;
    uint64_t longest_ns; /* wo_consumer_longest */
    const char *longest_in;
    bool longest_tick;
};
void wo_event_books(struct wo_event_books *ret);
/* The JSON snapshot into a malloc'ed string (NULL on ENOMEM); *len set. */
char *wo_stats_json(size_t *len);
int wo_stats_write_file(const char *path);
void wo_summary_log(const char *when);
/* The load's copies by destination (uvm/load-copies.c, wo_uvm.load_copies) */
enum {
    WO_LOAD_COPY_DEVICE,
    WO_LOAD_COPY_HOST,
    WO_LOAD_COPY_MANAGED,
    WO_LOAD_COPY_BOUND,
    WO_LOAD_COPY_KINDS
};
const char *wo_load_copy_kind_name(unsigned k);
/* "into host 12.4 GiB in 3.90 s (3.2 GiB/s), ..." (empty: none counted) */
void wo_load_copies_line(char *out, size_t cap);
struct wo_place_counts {
    struct wo_place_count by[WO_PLACE_MAX]; /* decided placements of served memory */
    uint64_t untagged[WO_PLACE_MAX];        /* of by[].bytes: untagged bytes */
    struct wo_place_count pending;          /* served, untagged, not sealed yet */
    struct wo_place_count unplaceable;      /* tags on memory the shim only observed */
};
void wo_place_counts(struct wo_place_counts *c);

/* Moves [addr, addr+size) of a served managed allocation to placement p
 * now (advice + residency, synchronous on the private stream), at the same
 * address. Tests, the GPU test and tools. 0, -EINVAL, -ENOENT (not served
 * managed memory), -ERANGE, or the driver's error as -errno. */
int wo_uvm_place_range(uint64_t addr, uint64_t size, enum wo_placement p);

/* ---- for the prefetcher ------------------------------------------------ */
/* A managed-placement piece of a served allocation. */
struct wo_uvm_segment {
    uint64_t base, size;   /* device address and length */
    uint32_t id, gen;      /* registry range */
    uint64_t offset;       /* inside the range */
    const char *name;      /* valid only during the callback */
    int priority;          /* the rule's priority (0..100) */
    enum wo_slices slices;
    enum wo_placement place; /* MANAGED, or HOST (wo_uvm_foreach_offdevice only) */
    bool untagged;         /* bytes no tag names (a gap, the allocation's tail) */
    bool bound;            /* of a late-bound range (WOFFLOAD_LATE_BIND, place-bind.c) */
    uint64_t unnamed_before; /* a tag: the longest run of bytes no tag names between it and
                              * the piece given before it of the allocation (0: none) */
};
/* Calls fn for every managed piece, under wo_uvm.lock (fn must not call back
 * into uvm/ API functions). Stops when fn returns non-zero, returning it. */
int wo_uvm_foreach_managed(int (*fn)(const struct wo_uvm_segment *s, void *ud), void *ud);
/* The same for every piece placed `host` or `managed` (the streaming
 * executor's candidates), pinned allocations included. */
int wo_uvm_foreach_offdevice(int (*fn)(const struct wo_uvm_segment *s, void *ud), void *ud);
/* Device budget in bytes for managed memory (resolved at seal); 0 before. */
uint64_t wo_uvm_device_budget(void);
/* The shim's kernels as PTX (uvm/copy-ptx.c: uvm/stream-copy.cu). */
const char *wo_copy_ptx(void);
/* The policy in use (NULL: none); immutable, valid until wo_uvm_reset(). */
const struct wo_policy *wo_uvm_policy(void);

/* One side of a capture handshake (uvm.h: wo_prefetch_busy): raise busy,
 * then look at the captures that forbid the call; true when none is under
 * way, and then none begins until busy falls again. */
static inline bool wo_enter_unless(int *busy, const int *captures)
{
    __atomic_add_fetch(busy, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(captures, __ATOMIC_SEQ_CST) > 0) {
        __atomic_sub_fetch(busy, 1, __ATOMIC_SEQ_CST);
        return false;
    }
    return true;
}

/* The shim's threads' side, for the prefetcher and the stream executor (the
 * consumer thread), the pinned-copy worker (stream-pin.c) and the copy
 * engine's mirror thread alike: true when no capture (any mode) is under
 * way, and then none begins until wo_driver_leave(). A count: two threads
 * may be inside at once. Not nested on one thread. */
static inline bool wo_driver_enter(void)
{
    return wo_enter_unless(&wo_prefetch_busy, &wo_captures_live);
}

static inline void wo_driver_leave(void)
{
    __atomic_sub_fetch(&wo_prefetch_busy, 1, __ATOMIC_SEQ_CST);
}

/* The copy engine's thread's side (uvm.h: wo_captures_strict): true when no
 * global or thread-local capture is under way, and then none begins until
 * wo_dma_driver_leave(); relaxed captures may. */
static inline bool wo_dma_driver_enter(void)
{
    return wo_enter_unless(&wo_dma_busy, &wo_captures_strict);
}

static inline void wo_dma_driver_leave(void)
{
    __atomic_sub_fetch(&wo_dma_busy, 1, __ATOMIC_SEQ_CST);
}

/* The shim's own frees, behind the copy engine's gate (uvm.h:
 * wo_uvm_quiesce_begin). */
static inline CUresult wo_quiet_mem_free(const struct wo_driver *d, CUdeviceptr p)
{
    wo_uvm_quiesce_begin();
    CUresult r = d->cuMemFree_v2(p);
    wo_uvm_quiesce_end();
    return r;
}

static inline CUresult wo_quiet_free_host(const struct wo_driver *d, void *h)
{
    wo_uvm_quiesce_begin();
    CUresult r = d->cuMemFreeHost(h);
    wo_uvm_quiesce_end();
    return r;
}

/* The shim's own module loads after start-up (the streaming executor's copy
 * kernel, at its first slots): a load may wait for the context's work, as
 * a free does. */
static inline CUresult wo_quiet_module_load(const struct wo_driver *d, CUmodule *m,
                                            const void *image)
{
    wo_uvm_quiesce_begin();
    CUresult r = d->cuModuleLoadData(m, image);
    wo_uvm_quiesce_end();
    return r;
}

/* ... and their functions looked up: under CUDA's lazy loading the lookup
 * loads the kernel (preload/launch.c gates the engine's for the same
 * reason). The fake driver's lookup waits as a load does: ungated, the
 * executor's first slots met a picked copy's pending job there
 * (test-slots-gate-preload under TSan). */
static inline CUresult wo_quiet_module_function(const struct wo_driver *d, CUfunction *f,
                                                CUmodule m, const char *name)
{
    wo_uvm_quiesce_begin();
    CUresult r = d->cuModuleGetFunction(f, m, name);
    wo_uvm_quiesce_end();
    return r;
}
