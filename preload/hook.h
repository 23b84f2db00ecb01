/* preload/hook.h: what the logic files of preload/ share: the prototypes of
 * the hook logic (generated from the lists in real.h), the lazy-init gate and
 * the per-thread nesting flag, and the internal interfaces between the logic
 * files (launch attribution, capture state, resolver substitution).
 *
 * Every hook logic function has the shape
 *     RET hook(real, id, ra, ARGS...)
 * real: the real function to forward to; id: which entry point was called
 * (WO_HOOK_* or WO_RT_*; says whether it is a per-thread variant); ra: the
 * return address of the exported or resolved wrapper (the calling library). */
#pragma once

#include <string.h>

#include "core/counters.h"
#include "core/event.h"
#include "preload/real.h"
#include "uvm/uvm.h"

#define WO_HOOK_LOGIC_DECL(sym, pt, hook, RET, PARAMS, ARGS)                                       \
    RET hook(wo_pfn_##sym real, int id, void *ra, WO_UNPACK PARAMS);
WO_DRIVER_HOOKS(WO_HOOK_LOGIC_DECL)
WO_RUNTIME_HOOKS(WO_HOOK_LOGIC_DECL)
#undef WO_HOOK_LOGIC_DECL

/* Code that may run while a preloaded sanitizer runtime initialises (its
 * dlsym(RTLD_NEXT) calls reach our export): no instrumentation. */
#define WO_RAW __attribute__((no_sanitize("address", "undefined", "thread")))

void *wo_h_dlsym(void *handle, const char *name, void *ra);
void *wo_h_dlvsym(void *handle, const char *name, const char *version, void *ra);
/* The C side of the exported dlsym/dlvsym and libc's own (exports-dl.c). */
void *wo_dlsym_c(void *handle, const char *name);
void *wo_dlvsym_c(void *handle, const char *name, const char *version);
void wo_libc_dl_init(void);
extern void *wo_libc_dlsym_ptr;
extern void *wo_libc_dlvsym_ptr;

/* Per-thread-variant flags and call counters, in enum order. */
extern const unsigned char wo_hook_pt[WO_NHOOKS];
extern const unsigned char wo_rt_pt[WO_NRT];
extern uint64_t wo_hook_calls[WO_NHOOKS + WO_NRT];

/* --- lazy init (init.c) --------------------------------------------------- */

enum { WO_STATE_UNINIT = 0, WO_STATE_ACTIVE = 1, WO_STATE_OFF = 2 };
extern int wo_preload_state;
/* Runs the one-time init; returns the state (UNINIT while this thread is the
 * one initialising: the caller passes through). */
int wo_preload_init_slow(void);

/* 1 while this thread is inside a hook: the runtime calls the driver through
 * pointers that are our wrappers, and one engine call must be routed and
 * recorded once, by the outermost hook. Initial-exec TLS: the launch path
 * reads it on every call. */
extern __thread int wo_depth __attribute__((tls_model("initial-exec")));

/* True when this call is to be observed: the shim is active and this is the
 * outermost hook on this thread (then wo_leave() must follow). */
static inline bool wo_enter(void)
{
    if (WO_UNLIKELY(__atomic_load_n(&wo_preload_state, __ATOMIC_ACQUIRE) != WO_STATE_ACTIVE) &&
        wo_preload_init_slow() != WO_STATE_ACTIVE)
        return false;
    if (wo_depth)
        return false;
    wo_depth = 1;
    return true;
}

static inline void wo_leave(void)
{
    wo_depth = 0;
}

static inline void wo_count_call(int idx)
{
    __atomic_fetch_add(&wo_hook_calls[idx], 1, __ATOMIC_RELAXED);
}

/* The first lines of every hook: count the call (counter `idx`), return
 * `missing` when the library lacks the entry point, and forward `call`
 * untouched unless this is the outermost hook of an active shim (then the
 * hook must end with wo_leave()). WO_HOOK_ENTER for driver hooks
 * `wo_h_*(real, id, ...)`, WO_RT_HOOK_ENTER for runtime ones. */
#define WO_HOOK_ENTER_AS(idx, missing, call)                                                       \
    do {                                                                                           \
        wo_count_call(idx);                                                                        \
        if (WO_UNLIKELY(!real))                                                                    \
            return missing;                                                                        \
        if (!wo_enter())                                                                           \
            return call;                                                                           \
    } while (0)
#define WO_HOOK_ENTER(call) WO_HOOK_ENTER_AS(id, CUDA_ERROR_NOT_FOUND, call)
#define WO_RT_HOOK_ENTER(call) WO_HOOK_ENTER_AS(WO_NHOOKS + id, cudaErrorSharedObjectSymbolNotFound, call)

/* Stream 0 of a per-thread variant is the calling thread's stream. */
static inline uint64_t wo_stream_id(const void *s, int pt)
{
    return (!s && pt) ? (uint64_t)(uintptr_t)CU_STREAM_PER_THREAD : (uint64_t)(uintptr_t)s;
}

/* Pushes an event (time and thread filled in here) when the ring exists. */
void wo_push_event(struct wo_event *ev);
/* The same, with a priority (core/event.h: wo_ring_push_low). 0, -ENOSPC
 * (ring full: dropped and counted in events_dropped) or -ENODEV (no ring). */
int wo_push_event_prio(struct wo_event *ev, bool low);

/* --- launch attribution (launch.c) ---------------------------------------- */

/* The parameter buffer of a launch's `extra` form: the
 * CU_LAUNCH_PARAM_BUFFER_POINTER / _SIZE pairs before CU_LAUNCH_PARAM_END
 * (8 pairs at most are looked at). *buf is NULL when there is none. The
 * scan (launch.c) and the redirection (redirect.c) read it this one way, so
 * they see the same words. */
static inline void wo_launch_extra(void **extra, const void **buf, size_t *size)
{
    *buf = NULL;
    *size = 0;
    for (int i = 0; i < 16 && extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
        if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER)
            *buf = extra[i + 1];
        else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE && extra[i + 1])
            memcpy(size, extra[i + 1], sizeof(*size));
    }
}

/* For graph replay (graph-replay.c). The sizes of f's parameters (its
 * cached layout), copied into sizes (at most max): their count, or -1 when
 * the driver cannot say or there are max or more. */
int wo_launch_param_sizes(CUfunction f, uint16_t *sizes, int max);
/* The ranges a launch of f with params (or, params NULL, the `extra` form)
 * reaches, as the launch scan finds them (at most max into hits): their
 * count. */
unsigned wo_launch_hits(CUfunction f, void **params, void **extra, struct wo_ev_hit *hits,
                        unsigned max);
/* One kernel of a replayed graph launched on stream as the launch hooks
 * launch one: scanned, redirected into staging slots, its event pushed
 * (params, or params NULL and the `extra` form).
 * cluster: its cluster dimensions (all 0 or 1: none); coop: cooperative. ra:
 * the graph launch's caller. */
CUresult wo_launch_node(CUfunction f, const uint32_t grid[3], const uint32_t block[3],
                        unsigned shmem, const uint32_t cluster[3], bool coop, uint64_t stream,
                        void **params, void **extra, void *ra);

/* --- capture state (capture.c) -------------------------------------------- */

/* Capture id when the stream is capturing now, else 0. Lock-free. */
uint32_t wo_capture_of(uint64_t stream);
/* Whether a stream the table does not know captures all the same: it joined
 * a capture through an event wait (a fork inside the engine's graph). Asks
 * the driver, and only while a capture is under way (wo_captures_live):
 * otherwise one relaxed load. An error counts as capturing (the legacy
 * stream beside a capturing blocking stream). */
bool wo_capture_joined(uint64_t stream);
/* Accounts a launch recorded into capture `id` that touched nhits ranges,
 * nwritable of them not declared read-only to kernels (woffload_readonly):
 * the graph is a blind launch only when some are (graph_blind). */
void wo_capture_note_launch(uint32_t id, uint32_t nhits, uint32_t nwritable);
/* After a successful begin; the hook raised wo_captures_live before it. */
void wo_capture_begin(uint64_t stream, int mode);
void wo_capture_end(uint64_t stream, uint64_t graph, bool ok);
/* exec runs graph's nodes now (instantiated or updated from it); returns
 * the capture that recorded graph when its launches reached registered
 * ranges (else 0), for wo_replay_note. */
uint32_t wo_capture_instantiated(uint64_t exec, uint64_t graph);
/* Before a graph launch on stream: a blind launch begun (true: end it
 * with wo_hook_blind_end) when the streaming executor may have a slot its
 * graph could make stale. */
bool wo_capture_graph_launch_begin(uint64_t exec, uint64_t stream);
void wo_capture_graph_launch(uint64_t exec, uint64_t stream, int api);
/* A graph launch replayed kernel by kernel: counted as a graph launch (the
 * kernels push their own events). */
void wo_capture_graph_replayed(uint64_t exec);

/* --- graph replay (graph-replay.c; its hooks are graph-exec.c's) ----------- */

/* exec runs graph's nodes now (instantiated or updated from it); capture:
 * the capture that recorded it, when its launches reached registered
 * ranges (else 0). Reads the copy a replay launches from
 * (WOFFLOAD_GRAPH_REPLAY on, something placed), once per capture. */
void wo_replay_note(uint64_t exec, uint64_t graph, uint32_t capture);
/* exec's nodes were changed in place (changed), or it is gone: no replay. */
void wo_replay_forget(uint64_t exec, bool changed);
/* Before a graph launch: 0 when the graph is to be launched whole; 1 when
 * its nodes were launched one by one on stream instead (something it reads
 * is streamed and not claimed read in place), -1 when that failed part way
 * (*err: the error to return). */
int wo_replay_launch(uint64_t exec, uint64_t stream, void *ra, CUresult *err);

/* --- resolvers (resolve.c) ------------------------------------------------ */

/* The wrapper to hand out for a driver function the real resolver returned
 * for (name, version, flags), or real itself when we do not wrap it. resolve
 * re-asks the driver at a known version (see resolve.c); may be NULL. */
void *wo_resolve_proc(const char *name, int version, uint64_t flags, void *real,
                      CUresult (*resolve)(const char *name, void **pfn, int ver, uint64_t flags));
/* True when p is one of our wrappers (exported or resolved). */
bool wo_is_our_function(const void *p);
