/* preload/capture.c: capture awareness: which streams are capturing, the
 * launches each capture recorded, the graph each capture produced, the graph
 * exec instantiated from it, and the graph launches that replay it (the
 * hooks on graph execs are graph-exec.c's; they call in here).
 *
 * Writers (begin/end capture, instantiate) are rare and take cap_lock.
 * Readers on the launch paths never lock: the launch hook asks
 * wo_capture_of(stream), which is one relaxed load while nothing captures,
 * and a bounded scan of CAP_SLOTS atomics while something does; graph
 * launches look their exec up in a lock-free open-addressing table.
 *
 * The event stream carries the rest (uvm/'s consumer replays it): a
 * WO_EV_CAPTURE_BEGIN (g.handle: capture id, g.aux: mode), launches tagged
 * with the capture id (ev.capture), WO_EV_CAPTURE_END (g.handle: graph, g.aux:
 * capture id), WO_EV_GRAPH_INSTANTIATE (exec, graph), WO_EV_GRAPH_LAUNCH
 * (exec, graph; ev.stream).
 *
 * A stream that joined a capture through an event wait (cross-stream
 * capture) is not in the table: wo_capture_joined asks the driver, so that
 * its launches read in place; their events are recorded as ordinary
 * launches. */
#include <pthread.h>
#include <sched.h>
#include <string.h>
#include <time.h>

#include "core/log.h"
#include "preload/hook.h"
#include "uvm/hotpath.h"

#define CAP_SLOTS 64
#define GRAPH_SLOTS 4096u /* power of two */
#define GRAPH_PROBES 64u

struct cap_slot {
    uint64_t stream;
    uint32_t id; /* 0: free */
    bool strict; /* global or thread-local mode (uvm.h: wo_captures_strict) */
    uint64_t launches, hit_launches, hits;
    uint64_t wr_hits; /* hits on allocations kernels may write (not woffload_readonly) */
};

struct graph_slot {
    uint64_t key; /* graph handle; set once by its writer under cap_lock */
    uint32_t capture;
    uint64_t launches, hits, wr_hits;
};

struct exec_slot {
    uint64_t key; /* graph exec handle */
    uint64_t graph;
};

static pthread_mutex_t cap_lock = PTHREAD_MUTEX_INITIALIZER;
static struct cap_slot caps[CAP_SLOTS];
static int caps_active;
static uint32_t next_id;
static struct graph_slot graphs[GRAPH_SLOTS];
static struct exec_slot execs[GRAPH_SLOTS];

#define LOAD(x) __atomic_load_n(&(x), __ATOMIC_ACQUIRE)
#define STORE(x, v) __atomic_store_n(&(x), (v), __ATOMIC_RELEASE)

static uint32_t hash64(uint64_t k)
{
    return (uint32_t)((k * UINT64_C(0x9E3779B97F4A7C15)) >> 40);
}

uint32_t wo_capture_of(uint64_t stream)
{
    if (WO_LIKELY(__atomic_load_n(&caps_active, __ATOMIC_RELAXED) == 0))
        return 0;
    for (int i = 0; i < CAP_SLOTS; i++) {
        uint32_t id = LOAD(caps[i].id);
        /* Re-reading the id after the stream guards against a slot being
         * reused between the two loads. */
        if (id && LOAD(caps[i].stream) == stream && LOAD(caps[i].id) == id)
            return id;
    }
    return 0;
}

bool wo_capture_joined(uint64_t stream)
{
    const struct wo_real *r;
    CUresult (*is)(CUstream, CUstreamCaptureStatus *);
    CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;

    if (WO_LIKELY(__atomic_load_n(&wo_captures_live, __ATOMIC_RELAXED) == 0))
        return false;
    r = wo_real_driver_peek();
    is = r ? (CUresult(*)(CUstream, CUstreamCaptureStatus *))r->cuStreamIsCapturing : NULL;
    if (!is)
        return false;
    if (is((CUstream)(uintptr_t)stream, &cs) != CUDA_SUCCESS || cs != CU_STREAM_CAPTURE_STATUS_NONE) {
        wo_count(WO_CTR_launch_joined_capture, 1);
        return true;
    }
    return false;
}

void wo_capture_note_launch(uint32_t id, uint32_t nhits, uint32_t nwritable)
{
    for (int i = 0; i < CAP_SLOTS; i++) {
        if (LOAD(caps[i].id) != id)
            continue;
        __atomic_fetch_add(&caps[i].launches, 1, __ATOMIC_RELAXED);
        if (nhits) {
            __atomic_fetch_add(&caps[i].hit_launches, 1, __ATOMIC_RELAXED);
            __atomic_fetch_add(&caps[i].hits, nhits, __ATOMIC_RELAXED);
            __atomic_fetch_add(&caps[i].wr_hits, nwritable, __ATOMIC_RELAXED);
        }
        return;
    }
}

static void push_g(int type, uint64_t stream, uint64_t handle, uint64_t aux, int api)
{
    struct wo_event ev;

    memset(&ev, 0, sizeof(ev));
    ev.type = (uint16_t)type;
    ev.api = (uint16_t)api;
    ev.stream = stream;
    ev.g.handle = handle;
    ev.g.aux = aux;
    wo_push_event(&ev);
}

/* wo_captures_live is raised *before* the real begin-capture call: the
 * shim's threads check it before each driver call, and a call of theirs that
 * starts after the capture exists could invalidate it. Every mode, relaxed
 * too: in relaxed mode the driver forbids the other threads nothing, but the
 * stream executor records on the engine's stream and waits on that record
 * (uvm/stream-stage.c, its fence): a capture begun in between takes the
 * record, the wait joins the executor's streams to the engine's graph, and
 * the capture is invalidated (llama-server aborted so at --parallel 64;
 * llama.cpp captures in relaxed mode). The copy engine's thread touches no
 * engine stream: it keeps out of strict captures only (uvm.h:
 * wo_captures_strict), and a relaxed begin does not wait for it. */
#define CAPTURE_WAIT_NS UINT64_C(5000000000) /* 5 s */

static bool strict_mode(int mode)
{
    return mode != CU_STREAM_CAPTURE_MODE_RELAXED; /* cudaStreamCaptureModeRelaxed too */
}

static void capture_hold(int mode)
{
    bool strict = strict_mode(mode);

    if (strict) /* the copy engine's thread keeps out of these alone */
        __atomic_fetch_add(&wo_captures_strict, 1, __ATOMIC_SEQ_CST);
    __atomic_fetch_add(&wo_captures_live, 1, __ATOMIC_SEQ_CST);
    /* A call of the shim's threads already in flight could invalidate the
     * capture: wait for it (uvm.h: the handshake). An advice on a large
     * range lasts tens of ms, registering a pinned copy of a 768 MiB expert
     * tensor hundreds; never wait forever. The bound is a time: a count of
     * sched_yield() calls was 40 ms on an idle machine and let a 100 ms
     * register invalidate test-stream-preload's capture. The waits are
     * counted (capture_waits, capture_wait_us): the engine's time. */
    uint64_t t0 = 0, first = 0;

    for (int i = 0; __atomic_load_n(&wo_prefetch_busy, __ATOMIC_SEQ_CST) ||
                    (strict && __atomic_load_n(&wo_dma_busy, __ATOMIC_SEQ_CST));
         i++) {
        if (!first)
            first = wo_now_ns();
        if (i < 1024) {
            sched_yield();
            continue;
        }
        if (!t0) {
            t0 = wo_now_ns();
        } else if (wo_now_ns() - t0 > CAPTURE_WAIT_NS) {
            wo_log_once(WO_LOG_WARN,
                        "a driver call of the shim's is still running %.0f s after a capture "
                        "began; not waiting longer (the capture may be invalidated)",
                        CAPTURE_WAIT_NS / 1e9);
            break;
        }
        nanosleep(&(struct timespec){0, 100000}, NULL);
    }
    if (first) {
        wo_count(WO_CTR_capture_waits, 1);
        wo_count(WO_CTR_capture_wait_us, (wo_now_ns() - first) / 1000);
    }
}

static void capture_release(bool strict)
{
    __atomic_fetch_sub(&wo_captures_live, 1, __ATOMIC_SEQ_CST);
    if (strict)
        __atomic_fetch_sub(&wo_captures_strict, 1, __ATOMIC_SEQ_CST);
}

/* After a begin-capture call (capture_hold before it): the capture is
 * known, or the hold is given back. */
static void begin_done(bool ok, uint64_t stream, int mode)
{
    if (ok)
        wo_capture_begin(stream, mode);
    else
        capture_release(strict_mode(mode));
}

/* After a successful begin (capture_hold already done). */
void wo_capture_begin(uint64_t stream, int mode)
{
    int i;

    pthread_mutex_lock(&cap_lock);
    for (i = 0; i < CAP_SLOTS; i++)
        if (!LOAD(caps[i].id))
            break;
    if (i == CAP_SLOTS) {
        pthread_mutex_unlock(&cap_lock);
        /* Its end cannot be matched: do not hold the prefetcher forever. */
        capture_release(strict_mode(mode));
        wo_count(WO_CTR_capture_table_full, 1);
        wo_log_once(WO_LOG_WARN, "more than %d streams capture at once: launches of the others "
                                 "are recorded as ordinary launches", CAP_SLOTS);
        return;
    }
    if (++next_id == 0)
        next_id = 1;
    STORE(caps[i].stream, stream);
    caps[i].strict = strict_mode(mode); /* read under cap_lock */
    STORE(caps[i].launches, 0);
    STORE(caps[i].hit_launches, 0);
    STORE(caps[i].hits, 0);
    STORE(caps[i].wr_hits, 0);
    STORE(caps[i].id, next_id);
    __atomic_fetch_add(&caps_active, 1, __ATOMIC_RELEASE);
    wo_count(WO_CTR_capture_begin, 1);
    push_g(WO_EV_CAPTURE_BEGIN, stream, next_id, (uint64_t)mode, WO_API_GRAPH);
    pthread_mutex_unlock(&cap_lock);
}

static struct graph_slot *graph_slot(uint64_t graph, bool insert)
{
    uint32_t h = hash64(graph);

    for (uint32_t i = 0; i < GRAPH_PROBES; i++) {
        struct graph_slot *g = &graphs[(h + i) & (GRAPH_SLOTS - 1)];
        uint64_t k = LOAD(g->key);
        if (k == graph)
            return g;
        if (k == 0) {
            if (!insert)
                return NULL;
            STORE(g->key, graph); /* writers hold cap_lock: no CAS needed */
            return g;
        }
    }
    return NULL;
}

static struct exec_slot *exec_slot(uint64_t exec, bool insert)
{
    uint32_t h = hash64(exec);

    for (uint32_t i = 0; i < GRAPH_PROBES; i++) {
        struct exec_slot *e = &execs[(h + i) & (GRAPH_SLOTS - 1)];
        uint64_t k = LOAD(e->key);
        if (k == exec)
            return e;
        if (k == 0) {
            if (!insert)
                return NULL;
            STORE(e->key, exec);
            return e;
        }
    }
    return NULL;
}

void wo_capture_end(uint64_t stream, uint64_t graph, bool ok)
{
    pthread_mutex_lock(&cap_lock);
    for (int i = 0; i < CAP_SLOTS; i++) {
        uint32_t id = LOAD(caps[i].id);
        struct graph_slot *g;
        if (!id || LOAD(caps[i].stream) != stream)
            continue;
        STORE(caps[i].id, 0);
        __atomic_fetch_sub(&caps_active, 1, __ATOMIC_RELEASE);
        capture_release(caps[i].strict);
        wo_count(WO_CTR_capture_end, 1);
        if (ok && graph) {
            /* A graph handle may be reused after cuGraphDestroy: the slot
             * then describes the newest graph at that address. */
            g = graph_slot(graph, true);
            if (g) {
                STORE(g->capture, id);
                STORE(g->launches, LOAD(caps[i].launches));
                STORE(g->hits, LOAD(caps[i].hits));
                STORE(g->wr_hits, LOAD(caps[i].wr_hits));
            } else {
                wo_log_once(WO_LOG_WARN, "graph table full: later graphs are not attributed");
            }
        }
        push_g(WO_EV_CAPTURE_END, stream, ok ? graph : 0, id, WO_API_GRAPH);
        break;
    }
    pthread_mutex_unlock(&cap_lock);
}

uint32_t wo_capture_instantiated(uint64_t exec, uint64_t graph)
{
    struct exec_slot *e;
    struct graph_slot *g;
    uint32_t capture;

    pthread_mutex_lock(&cap_lock);
    g = graph_slot(graph, false);
    capture = g && LOAD(g->hits) != 0 ? LOAD(g->capture) : 0;
    if (g)
        wo_count(WO_CTR_graph_instantiate, 1);
    else
        wo_count(WO_CTR_graph_instantiate_other, 1);
    e = exec_slot(exec, true);
    if (e)
        STORE(e->graph, graph);
    push_g(WO_EV_GRAPH_INSTANTIATE, 0, exec, graph, WO_API_GRAPH);
    pthread_mutex_unlock(&cap_lock);
    return capture;
}

/* A graph launch: counted, and its event pushed (push false: replayed
 * kernel by kernel, graph-replay.c, whose launches push their own). */
static void graph_launched(uint64_t exec, uint64_t stream, int api, bool push);

void wo_capture_graph_launch(uint64_t exec, uint64_t stream, int api)
{
    graph_launched(exec, stream, api, true);
}

void wo_capture_graph_replayed(uint64_t exec)
{
    graph_launched(exec, 0, WO_API_GRAPH, false);
}

static void graph_launched(uint64_t exec, uint64_t stream, int api, bool push)
{
    struct exec_slot *e = exec_slot(exec, false);
    struct graph_slot *g = NULL;
    uint64_t graph = e ? LOAD(e->graph) : 0;

    if (graph)
        g = graph_slot(graph, false);
    wo_count(WO_CTR_graph_launch, 1);
    if (g) {
        wo_count(WO_CTR_graph_launch_attributed, 1);
        wo_count(WO_CTR_graph_launch_kernels, LOAD(g->launches));
        wo_count(WO_CTR_graph_launch_hits, LOAD(g->hits));
    }
    if (push)
        push_g(WO_EV_GRAPH_LAUNCH, stream, exec, g ? graph : 0, api);
}

/* Whether launching exec may write weights the launch hook never sees: its
 * graph's captured launches reached registered ranges that kernels may
 * write (they replay in place, uvm/hotpath.h: blind launches; ranges
 * declared read-only, woffload_readonly, do not count), or the graph was
 * not captured through the shim (its nodes are unknown). */
static bool graph_blind(uint64_t exec)
{
    struct exec_slot *e = exec_slot(exec, false);
    struct graph_slot *g;
    uint64_t graph = e ? LOAD(e->graph) : 0;

    g = graph ? graph_slot(graph, false) : NULL;
    return !g || LOAD(g->wr_hits) != 0;
}

/* Before a graph launch on stream: a blind launch begun (true) when the
 * streaming executor may have a slot its graph could make stale. Launched
 * into a capture, the graph is a node of the outer one, which is then
 * blind in turn. */
bool wo_capture_graph_launch_begin(uint64_t exec, uint64_t stream)
{
    uint32_t cap;

    if (!__atomic_load_n(&wo_stream_tab.active, __ATOMIC_ACQUIRE) || !graph_blind(exec))
        return false;
    cap = wo_capture_of(stream);
    if (cap) {
        wo_capture_note_launch(cap, 1, 1);
        return false;
    }
    return wo_stream_blind_begin();
}

/* The child of fork: only the forking thread exists, and the parent's
 * streams and graphs mean nothing; start empty. Registered from this file's
 * constructor (the life cycle, init.c, needs no list of the parts); only a
 * process whose shim was active has anything to forget. */
static void capture_atfork_child(void)
{
    if (wo_preload_state != WO_STATE_ACTIVE)
        return;
    pthread_mutex_init(&cap_lock, NULL);
    memset(caps, 0, sizeof(caps));
    memset(graphs, 0, sizeof(graphs));
    memset(execs, 0, sizeof(execs));
    caps_active = 0;
    __atomic_store_n(&wo_captures_live, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&wo_captures_strict, 0, __ATOMIC_RELEASE);
}

__attribute__((constructor)) static void capture_ctor(void)
{
    (void)pthread_atfork(NULL, NULL, capture_atfork_child);
}

/* --- hooks ---------------------------------------------------------------- */

/* Whether a failed end-capture call still ended the capture: only argument
 * and thread errors leave it running. */
static bool end_failed_but_ended_cu(CUresult r)
{
    return r != CUDA_ERROR_INVALID_VALUE && r != CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD &&
           r != CUDA_ERROR_ILLEGAL_STATE;
}

CUresult wo_h_begin_capture(wo_pfn_cuStreamBeginCapture_v2 real, int id, void *ra, CUstream s,
                            CUstreamCaptureMode mode)
{
    CUresult res;
    (void)ra;

    WO_HOOK_ENTER(real(s, mode));
    capture_hold((int)mode);
    res = real(s, mode);
    begin_done(res == CUDA_SUCCESS, wo_stream_id(s, wo_hook_pt[id]), (int)mode);
    wo_leave();
    return res;
}

/* The same for a capture into a graph the caller made
 * (cuStreamBeginCaptureToGraph, CUDA 12.3): its launches are captured as
 * any capture's, and the end returns that graph. */
CUresult wo_h_begin_capture_to_graph(wo_pfn_cuStreamBeginCaptureToGraph real, int id, void *ra,
                                     CUstream s, CUgraph g, const CUgraphNode *deps,
                                     const CUgraphEdgeData *data, size_t n, CUstreamCaptureMode mode)
{
    CUresult res;
    (void)ra;

    WO_HOOK_ENTER(real(s, g, deps, data, n, mode));
    capture_hold((int)mode);
    res = real(s, g, deps, data, n, mode);
    begin_done(res == CUDA_SUCCESS, wo_stream_id(s, wo_hook_pt[id]), (int)mode);
    wo_leave();
    return res;
}

CUresult wo_h_end_capture(wo_pfn_cuStreamEndCapture real, int id, void *ra, CUstream s, CUgraph *g)
{
    CUresult res;
    (void)ra;

    WO_HOOK_ENTER(real(s, g));
    res = real(s, g);
    if (res == CUDA_SUCCESS || end_failed_but_ended_cu(res))
        wo_capture_end(wo_stream_id(s, wo_hook_pt[id]),
                       res == CUDA_SUCCESS && g ? (uint64_t)(uintptr_t)*g : 0, res == CUDA_SUCCESS);
    wo_leave();
    return res;
}

/* A stream's end: before it, uvm/ gives up what refers to it (the stream
 * executor's slots fence their readers there, picked staging's buffers
 * wait for it: wo_uvm_stream_gone); after it, a capture it was making ends
 * (destroying a capturing stream invalidates the capture, and its end would
 * never come: the shim's threads would keep out of the driver for good). */
CUresult wo_h_stream_destroy(wo_pfn_cuStreamDestroy_v2 real, int id, void *ra, CUstream s)
{
    CUresult res;
    uint64_t sid;
    (void)ra;

    WO_HOOK_ENTER(real(s));
    sid = wo_stream_id(s, wo_hook_pt[id]);
    if (s && s != CU_STREAM_LEGACY && s != CU_STREAM_PER_THREAD)
        wo_uvm_stream_gone(sid);
    res = real(s);
    if (res == CUDA_SUCCESS && wo_capture_of(sid))
        wo_capture_end(sid, 0, false);
    wo_leave();
    return res;
}

/* --- runtime -------------------------------------------------------------- */

static bool end_failed_but_ended_rt(cudaError_t r)
{
    return r != cudaErrorInvalidValue && r != cudaErrorStreamCaptureWrongThread &&
           r != cudaErrorIllegalState;
}

cudaError_t wo_h_cuda_begin_capture(wo_pfn_cudaStreamBeginCapture real, int id, void *ra,
                                    cudaStream_t s, enum cudaStreamCaptureMode mode)
{
    cudaError_t res;
    (void)ra;

    WO_RT_HOOK_ENTER(real(s, mode));
    capture_hold((int)mode);
    res = real(s, mode);
    begin_done(res == cudaSuccess, wo_stream_id(s, wo_rt_pt[id]), (int)mode);
    wo_leave();
    return res;
}

cudaError_t wo_h_cuda_begin_capture_to_graph(wo_pfn_cudaStreamBeginCaptureToGraph real, int id,
                                             void *ra, cudaStream_t s, cudaGraph_t g,
                                             const cudaGraphNode_t *deps,
                                             const cudaGraphEdgeData *data, size_t n,
                                             enum cudaStreamCaptureMode mode)
{
    cudaError_t res;
    (void)ra;

    WO_RT_HOOK_ENTER(real(s, g, deps, data, n, mode));
    capture_hold((int)mode);
    res = real(s, g, deps, data, n, mode);
    begin_done(res == cudaSuccess, wo_stream_id(s, wo_rt_pt[id]), (int)mode);
    wo_leave();
    return res;
}

cudaError_t wo_h_cuda_end_capture(wo_pfn_cudaStreamEndCapture real, int id, void *ra,
                                  cudaStream_t s, cudaGraph_t *g)
{
    cudaError_t res;
    (void)ra;

    WO_RT_HOOK_ENTER(real(s, g));
    res = real(s, g);
    if (res == cudaSuccess || end_failed_but_ended_rt(res))
        wo_capture_end(wo_stream_id(s, wo_rt_pt[id]),
                       res == cudaSuccess && g ? (uint64_t)(uintptr_t)*g : 0, res == cudaSuccess);
    wo_leave();
    return res;
}
