/* core/counters.h: process-wide event counters of the interposer.
 *
 * The hooks in preload/ bump these with one relaxed atomic add (no lock, no
 * allocation: they sit on the launch path); the stats JSON (woffload_stats,
 * built by uvm/) embeds wo_counters_json() under the key "interpose".
 *
 * Three parts:
 *  - fixed counters (enum wo_ctr), one per thing the hooks observe;
 *  - per-entry-point call counts, a table preload/ registers once with the
 *    names of its hooks (so tests can see that a per-thread variant was
 *    reached through its own wrapper);
 *  - per-caller counts: allocations, copies and launches keyed by the return
 *    address of the hook, resolved to the calling library only when the JSON
 *    is built (that is how the GPU tests tell cuBLAS, NCCL and Triton apart:
 *    each carries its own static CUDA runtime, so the caller is the library). */
#pragma once

#include "core/macro.h"

#define WO_COUNTERS(X)                                                                             \
    X(alloc_calls)             /* allocations that succeeded (device, async, managed) */          \
    X(alloc_bytes)                                                                                 \
    X(alloc_placed)            /* ... of them served by uvm/ (placeable) */                       \
    X(alloc_failed)            /* allocation calls the driver/runtime failed */                   \
    X(free_calls)              /* frees of a non-NULL pointer */                                  \
    X(vmm_create)              /* cuMemCreate that succeeded */                                   \
    X(vmm_release)                                                                                 \
    X(vmm_map)                 /* cuMemMap that succeeded (observed as a range) */                \
    X(vmm_unmap)                                                                                   \
    X(copy_calls)                                                                                  \
    X(copy_bytes)                                                                                  \
    X(copy_h2d)                                                                                    \
    X(copy_d2h)                                                                                    \
    X(copy_d2d)                                                                                    \
    X(copy_other)              /* default (unified), host-to-host, peer, arrays */                \
    X(gated_copies)            /* copies and memsets behind the copy engine's gate (copy.c) */    \
    X(gated_waits)             /* stream and event waits behind it */                             \
    X(gated_first_launches)    /* a kernel's first launch or use behind it (lazy loading) */     \
    X(launch_calls)            /* every kernel launch seen (runtime and driver) */                \
    X(launch_runtime)          /* cudaLaunchKernel(ExC) */                                        \
    X(launch_driver)           /* cuLaunchKernel */                                               \
    X(launch_ex)               /* cuLaunchKernelEx */                                             \
    X(launch_scanned)          /* launches whose parameters were scanned */                       \
    X(launch_no_layout)        /* tracked ranges existed but the layout was unknown */            \
    X(launch_with_hits)        /* launches that touched at least one tracked range */             \
    X(launch_hits)             /* (launch, range) pairs found */                                  \
    X(launch_hit_overflow)     /* launches that touched more ranges than an event holds */        \
    X(launch_hit_notptr)       /* hits dropped: found only in words that held small integers */  \
    X(launch_captured)         /* launches recorded into a stream capture */                      \
    X(scan_words)              /* 8-byte parameter words compared with the registry */           \
    X(layouts_cached)          /* parameter layouts read from the driver and cached */            \
    X(layout_table_full)                                                                           \
    X(layouts_forgotten)       /* cached layouts marked stale by a module or library unload */   \
    X(launch_watched)          /* launches that touched a watched range (named or served) */      \
    X(launch_skipped)          /* launches that touched none: no event (no trace, no OBSERVE) */ \
    X(events_pushed)                                                                               \
    X(events_dropped)          /* ring full: dropped, never blocked (all kinds) */                \
    X(events_dropped_watched)  /* ... launches that touched a watched range */                    \
    X(events_dropped_unwatched) /* ... launches that touched none (trace, OBSERVE) */              \
    X(events_skipped)          /* syncs and copies nothing consumes: no event (no trace) */       \
    X(capture_begin)                                                                               \
    X(capture_end)                                                                                 \
    X(capture_table_full)                                                                          \
    X(capture_waits)           /* begin-capture calls that waited for a driver call of the shim's */ \
    X(capture_wait_us)         /* ... the time they waited, in all (uvm/uvm.h: the handshake) */  \
    X(launch_joined_capture)   /* launches on a stream that joined a capture (wo_capture_joined) */ \
    X(graph_instantiate)       /* instantiations of a graph the shim saw captured */              \
    X(graph_instantiate_other) /* instantiations of graphs not captured (built by hand) */        \
    X(graph_launch)                                                                                \
    X(graph_launch_attributed) /* graph launches tied to a captured graph */                      \
    X(graph_launch_kernels)    /* captured kernel launches replayed by those */                   \
    X(graph_launch_hits)       /* (launch, range) pairs replayed by those */                      \
    X(graph_replays)           /* graph launches replayed kernel by kernel (graph-replay.c) */   \
    X(graph_replay_kernels)    /* ... the kernels they launched */                                \
    X(graph_replay_failed)     /* ... replays a failed call ended (its error returned) */         \
    X(graph_replay_ns)         /* ... the engine thread's time in the replays that ran */         \
    X(graph_snapshots)         /* graphs read for replay at instantiation or update */            \
    X(graph_snapshot_unsupported) /* ... that hold nodes a replay cannot make (launched whole) */  \
    X(graph_snapshot_ns)       /* ... the time spent reading them */                              \
    X(graph_exec_changed)      /* exec nodes changed in place: the exec is launched whole since */ \
    X(dlsym_calls)             /* dlsym/dlvsym hook calls */                                      \
    X(dlsym_next)              /* ... RTLD_NEXT searched by the C hook (not x86-64) */             \
    X(dlsym_substituted)       /* ... answered with a hook instead of the driver's function */    \
    X(proc_calls)              /* cuGetProcAddress(_v2) and the inner resolver */                 \
    X(proc_substituted)                                                                            \
    X(proc_conflict)           /* a wrapper slot already held another real function */            \
    X(entry_point_calls)       /* cudaGetDriverEntryPoint(ByVersion) */                           \
    X(entry_point_substituted)

enum wo_ctr {
#define WO_CTR_ENUM(name) WO_CTR_##name,
    WO_COUNTERS(WO_CTR_ENUM)
#undef WO_CTR_ENUM
        WO_CTR_MAX
};

extern uint64_t wo_counter_values[WO_CTR_MAX];

static inline void wo_count(enum wo_ctr c, uint64_t n)
{
    __atomic_fetch_add(&wo_counter_values[c], n, __ATOMIC_RELAXED);
}

uint64_t wo_counter_get(enum wo_ctr c);

/* Per-entry-point call counts: preload/ registers its hook names and a
 * matching array of counters once (the arrays must outlive the process). */
void wo_counters_register_calls(const char *const *names, uint64_t *values, size_t n);
/* The hooked entry points' call counts as registered, up to cap of them
 * into out (how many: 0 before registration), and the i-th one's name
 * (NULL past the end). */
size_t wo_counters_calls(uint64_t *out, size_t cap);
const char *wo_counters_call_name(size_t i);

/* Per-caller counts. The hook passes its own return address; the table is
 * lock-free (open addressing keyed by the address) and bounded: addresses
 * beyond its capacity are counted under "other". */
enum wo_caller_ctr { WO_CALLER_ALLOC = 0, WO_CALLER_COPY, WO_CALLER_LAUNCH, WO_CALLER_MAX };
void wo_count_caller(const void *ra, enum wo_caller_ctr c);

/* The counters as one JSON object: {"alloc_calls":N,...,"calls":{...},
 * "callers":{"libfoo.so.1":{"alloc":N,"copy":N,"launch":N},...}}.
 * snprintf semantics: returns the length the whole object needs (excluding
 * the NUL); buf is always NUL-terminated when len > 0. */
long wo_counters_json(char *buf, size_t len);
