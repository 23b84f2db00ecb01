/* tests/fake/fake-exec.c: the fake driver's execution side: streams (the
 * legacy and per-thread default streams included), events, kernels as host
 * functions (modules, libraries, parameter layouts), launches, stream
 * capture with the real driver's rules, graphs and graph launches.
 *
 * All work runs synchronously when it is enqueued, so stream order holds
 * trivially and synchronisation has nothing to wait for (unless
 * WOFAKE_STREAMS_BEHIND: a stream waiting for a value queues its later
 * work, fake-behind.c). Work enqueued on a
 * capturing stream is recorded into the capture's graph instead (parameters
 * copied by value, as the driver does), and a graph launch replays it. */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fake-priv.h"

#define STREAM_MAGIC 0x57524d53u
#define EVENT_MAGIC 0x45564e54u
#define FUNC_MAGIC 0x46554e43u
#define GRAPH_MAGIC 0x47524150u
#define EXEC_MAGIC 0x47455845u
#define NODE_MAGIC 0x4e4f4445u
#define MOD_MAGIC 0x4d4f4455u
#define MAX_PARAMS 64
#define MAX_JOINED 16

struct fk_capture {
    uint64_t id;
    CUstreamCaptureMode mode;
    pthread_t thread;
    bool invalidated;
    bool blocking; /* origin synchronises with the legacy stream */
    struct CUstream_st *origin;
    struct CUstream_st *joined[MAX_JOINED];
    int njoined;
    struct CUgraph_st *graph;
    bool into; /* cuStreamBeginCaptureToGraph: the caller's graph, never freed here */
    struct CUstream_st *defer; /* not a capture: the queue of this stream behind */
};

struct CUstream_st {
    uint32_t magic;
    unsigned flags;
    int priority;
    bool legacy, per_thread;
    CUcontext ctx; /* a user stream's: current at its creation */
    struct fk_capture *cap;
    struct CUstream_st *next; /* live user streams */
    /* WOFAKE_STREAMS_BEHIND (fake-behind.c): its queue, and the capture
     * pointer fk_stream_begin_op hands out while the queue holds work */
    struct fk_behind *bq;
    struct fk_capture dcap;
};

struct CUevent_st {
    uint32_t magic;
    unsigned flags;
    bool recorded;
    uint64_t t_ns;
    CUcontext ctx;          /* current at its creation */
    struct fk_capture *cap; /* recorded inside this capture (it may have ended) */
    uint64_t cap_id;
    /* the records so far (its seq: the last one's), and the seqs of those
     * queued behind, not yet run: a wait or a query is for the record
     * that was the last when it was made (CUDA: "the most recent call to
     * cuEventRecord"), not for one made after */
    uint32_t seq;
    uint32_t *pend;
    unsigned npend, pend_cap;
    struct CUevent_st *dead_next; /* destroyed, kept (dead_events) */
};

/* Adds seq to e's records queued behind (under the fake's lock); false: no
 * memory. */
static bool pend_add_locked(struct CUevent_st *e, uint32_t seq)
{
    if (e->npend == e->pend_cap) {
        unsigned cap = e->pend_cap ? 2 * e->pend_cap : 8;
        uint32_t *p = realloc(e->pend, cap * sizeof(*p));
        if (!p)
            return false;
        e->pend = p;
        e->pend_cap = cap;
    }
    e->pend[e->npend++] = seq;
    return true;
}

/* Takes seq off e's records queued behind (under the lock). */
static void pend_drop_locked(struct CUevent_st *e, uint32_t seq)
{
    for (unsigned i = 0; i < e->npend; i++)
        if (e->pend[i] == seq) {
            e->pend[i] = e->pend[--e->npend];
            return;
        }
}

/* Whether record seq of e is queued behind, not yet run (under the lock). */
static bool pend_has_locked(const struct CUevent_st *e, uint32_t seq)
{
    for (unsigned i = 0; i < e->npend; i++)
        if (e->pend[i] == seq)
            return true;
    return false;
}

struct CUfunc_st {
    uint32_t magic;
    int nparams;
    size_t sizes[MAX_PARAMS], offsets[MAX_PARAMS];
    size_t argbytes;
    fakecuda_kernel_fn fn;
    _Atomic uint64_t runs;
    int loaded;      /* WOFAKE_LAZY: got through a module, or launched once */
    CUmodule module; /* the module cuModuleGetFunction last found it through (cuFuncGetModule) */
    struct CUfunc_st *next;
    char name[];
};

struct CUgraph_st {
    uint32_t magic;
    struct fk_op *ops;
    size_t n, cap;
    struct fk_node **nodes; /* node handles, by op (made on first ask: fk_node) */
    size_t nodes_cap;
};
/* A node handle: op idx of graph g (cuGraphGetNodes, graph nodes below). */
struct fk_node {
    uint32_t magic;
    struct CUgraph_st *g;
    size_t idx;
    void *params[MAX_PARAMS]; /* cuGraphKernelNodeGetParams: into the op's args */
    void *extra[5];           /* ... or, launched packed, the op's args as one buffer */
    size_t size;
};
static struct fk_node *node_locked(struct CUgraph_st *g, size_t i);

struct CUgraphExec_st {
    uint32_t magic;
    struct fk_op *ops;
    size_t n;
};

struct CUmod_st {
    uint32_t magic;
};
struct CUlib_st {
    uint32_t magic;
};

static struct CUstream_st legacy_stream = { .magic = STREAM_MAGIC, .legacy = true };
static __thread struct CUstream_st pt_stream;
static struct CUstream_st *streams;
#define MAX_CAPS 64
static struct fk_capture *active[MAX_CAPS];
static int nactive;
static uint64_t next_capture_id = 1;
static __thread CUstreamCaptureMode thread_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
static struct CUfunc_st *kernels;

static _Atomic uint64_t launch_seq, runs_total, captured_total;
static struct fakecuda_launch last_launch;
static bool have_last;

/* --- streams ------------------------------------------------------------- */

/* Destroyed streams are kept here, never freed, so that a handle used after
 * its destroy is told apart from one never made (the real driver may crash
 * on it): counted by fakecuda_dead_stream_uses, then refused as any bad one. */
static struct CUstream_st *dead_streams;
static _Atomic uint64_t dead_stream_uses;

static struct CUstream_st *stream_locked(CUstream s, bool per_thread)
{
    if (s == NULL)
        s = per_thread ? CU_STREAM_PER_THREAD : CU_STREAM_LEGACY;
    if (s == CU_STREAM_LEGACY) {
        if (!legacy_stream.bq)
            legacy_stream.bq = fk_behind_hw(0);
        return &legacy_stream;
    }
    if (s == CU_STREAM_PER_THREAD) {
        if (pt_stream.magic != STREAM_MAGIC)
            pt_stream = (struct CUstream_st){
                .magic = STREAM_MAGIC, .per_thread = true, .bq = fk_behind_hw(0)};
        return &pt_stream;
    }
    for (struct CUstream_st *st = streams; st; st = st->next)
        if (st == s)
            return st;
    for (struct CUstream_st *st = dead_streams; st; st = st->next)
        if (st == s) {
            dead_stream_uses++;
            break;
        }
    return NULL;
}

struct CUstream_st *fk_stream(CUstream s, bool per_thread)
{
    fk_lock_();
    struct CUstream_st *st = stream_locked(s, per_thread);
    fk_unlock_();
    return st;
}

/* A capture pointer kept outside the active list (an event's, or one a
 * caller got before dropping the lock) may have ended and been freed. */
static bool capture_live_locked(const struct fk_capture *c, uint64_t id)
{
    for (int i = 0; i < nactive; i++)
        if (active[i] == c)
            return id == 0 || c->id == id;
    return false;
}

static void invalidate_locked(struct fk_capture *c)
{
    c->invalidated = true;
}

/* Using the legacy stream while a blocking stream captures is an implicit
 * dependency on the capture: refused, and the capture is invalidated. */
static CUresult legacy_check_locked(void)
{
    CUresult r = CUDA_SUCCESS;
    for (int i = 0; i < nactive; i++)
        if (active[i]->blocking && !active[i]->invalidated) {
            invalidate_locked(active[i]);
            r = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
        }
    return r;
}

CUresult fk_stream_begin_op_in(CUstream s, bool per_thread, CUcontext ctx, struct fk_capture **cap)
{
    *cap = NULL;
    fk_lock_();
    struct CUstream_st *st = stream_locked(s, per_thread);
    CUcontext sctx = st && st->ctx ? st->ctx : fk_current_ctx();
    CUresult r = CUDA_SUCCESS;
    if (!st || (ctx && sctx && ctx != sctx))
        r = CUDA_ERROR_INVALID_HANDLE;
    else if (st->cap)
        r = st->cap->invalidated ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
                                 : (*cap = st->cap, CUDA_SUCCESS);
    else if (st->legacy)
        r = legacy_check_locked();
    if (r == CUDA_SUCCESS && !*cap && fk_behind_busy(st->bq)) {
        /* written once: fk_capture_add reads it outside the lock, on
         * whichever thread enqueues (the shim's executor records events on
         * the stream an engine thread launches on: TSan saw the rewrite) */
        if (st->dcap.defer != st)
            st->dcap.defer = st;
        *cap = &st->dcap;
    }
    fk_unlock_();
    return r;
}

bool fk_capture_deferred(const struct fk_capture *cap)
{
    return cap && cap->defer;
}

CUresult fk_capture_settle(struct fk_capture **cap)
{
    if (!fk_capture_deferred(*cap))
        return CUDA_SUCCESS;
    struct fk_behind *q = (*cap)->defer->bq;
    *cap = NULL;
    return fk_behind_drain(q);
}

CUresult fk_stream_begin_op(CUstream s, bool per_thread, struct fk_capture **cap)
{
    return fk_stream_begin_op_in(s, per_thread, NULL, cap);
}

CUresult fk_capture_check_unsafe(void)
{
    if (thread_mode == CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_SUCCESS;
    pthread_t self = pthread_self();
    CUresult r = CUDA_SUCCESS;
    fk_lock_();
    for (int i = 0; i < nactive; i++) {
        struct fk_capture *c = active[i];
        bool mine = pthread_equal(c->thread, self);
        bool forbids = (mine && c->mode != CU_STREAM_CAPTURE_MODE_RELAXED) ||
                       (!mine && thread_mode == CU_STREAM_CAPTURE_MODE_GLOBAL &&
                        c->mode == CU_STREAM_CAPTURE_MODE_GLOBAL);
        if (forbids) {
            invalidate_locked(c);
            r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        }
    }
    fk_unlock_();
    return r;
}

/* A kernel node with its own copy of the parameter values (the driver
 * copies them when a launch is captured or a node added): from params, or
 * from the packed buffer buf when that is set. */
static CUresult kernel_op(struct fk_op *op, struct CUfunc_st *f, const uint32_t g[3],
                          const uint32_t b[3], unsigned shmem, void **params, const uint8_t *buf)
{
    *op = (struct fk_op){
        .type = FK_OP_KERNEL,
        .k = {.f = f, .grid = {g[0], g[1], g[2]}, .block = {b[0], b[1], b[2]}, .shmem = shmem}};
    op->k.args = malloc(f->argbytes ? f->argbytes : 1);
    if (!op->k.args)
        return CUDA_ERROR_OUT_OF_MEMORY;
    for (int i = 0; i < f->nparams; i++)
        memcpy(op->k.args + f->offsets[i], buf ? buf + f->offsets[i] : params[i], f->sizes[i]);
    return CUDA_SUCCESS;
}

static void op_free(struct fk_op *op)
{
    if (op->type == FK_OP_KERNEL)
        free(op->k.args);
}

void fk_op_release(struct fk_op *op)
{
    op_free(op);
}

static CUresult op_copy(struct fk_op *dst, const struct fk_op *src)
{
    *dst = *src;
    if (src->type == FK_OP_KERNEL && src->k.args) {
        dst->k.args = malloc(src->k.f->argbytes ? src->k.f->argbytes : 1);
        if (!dst->k.args)
            return CUDA_ERROR_OUT_OF_MEMORY;
        memcpy(dst->k.args, src->k.args, src->k.f->argbytes);
    }
    return CUDA_SUCCESS;
}

static CUresult graph_append_locked(struct CUgraph_st *g, const struct fk_op *op)
{
    if (g->n == g->cap) {
        size_t cap = g->cap ? g->cap * 2 : 16;
        struct fk_op *n = realloc(g->ops, cap * sizeof(*n));
        if (!n)
            return CUDA_ERROR_OUT_OF_MEMORY;
        g->ops = n;
        g->cap = cap;
    }
    g->ops[g->n++] = *op;
    return CUDA_SUCCESS;
}

/* Takes ownership of op's argument buffer. */
CUresult fk_capture_add(struct fk_capture *cap, const struct fk_op *op)
{
    if (cap->defer) {
        struct fk_item it = {.kind = FK_ITEM_OP, .op = *op};
        CUresult r = fk_behind_push(&cap->defer->bq, &it);
        if (r != CUDA_SUCCESS) {
            struct fk_op tmp = *op;
            op_free(&tmp);
        }
        return r;
    }
    fk_lock_();
    CUresult r = !capture_live_locked(cap, 0) || cap->invalidated
                     ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
                     : graph_append_locked(cap->graph, op);
    fk_unlock_();
    if (r != CUDA_SUCCESS) {
        struct fk_op tmp = *op;
        op_free(&tmp);
    }
    return r;
}

/* The address a stream-ordered allocation of size bytes captured into cap
 * takes when the capture freed one that fits before it and nothing took it
 * since, as the real driver may give a graph's allocation node the
 * addresses of one whose lifetime ended before it (scratch allocated and
 * freed per call: each at the same address). 0: none. */
CUdeviceptr fk_capture_reuse(struct fk_capture *cap, size_t size)
{
    CUdeviceptr got = 0;
    fk_lock_();
    if (capture_live_locked(cap, 0) && !cap->invalidated) {
        const struct CUgraph_st *g = cap->graph;
        for (size_t i = g->n; i-- > 0 && !got;) {
            CUdeviceptr d = g->ops[i].mem.dptr;
            bool taken = false;
            if (g->ops[i].type != FK_OP_FREE)
                continue;
            for (size_t j = i + 1; j < g->n && !taken; j++)
                taken = g->ops[j].type == FK_OP_ALLOC && g->ops[j].mem.dptr == d;
            for (size_t j = i; !taken && j-- > 0;)
                if (g->ops[j].type == FK_OP_ALLOC && g->ops[j].mem.dptr == d) {
                    got = g->ops[j].mem.size >= size ? d : 0;
                    break;
                }
        }
    }
    fk_unlock_();
    return got;
}

static CUresult stream_create(CUstream *ph, unsigned flags, int prio)
{
    if (!ph || (flags & ~(unsigned)CU_STREAM_NON_BLOCKING))
        return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *st = calloc(1, sizeof(*st));
    if (!st)
        return CUDA_ERROR_OUT_OF_MEMORY;
    st->magic = STREAM_MAGIC;
    st->flags = flags;
    st->ctx = fk_current_ctx();
    st->priority = prio > 0 ? 0 : prio < -5 ? -5 : prio;
    static unsigned long made;
    st->bq = fk_behind_hw(__atomic_add_fetch(&made, 1, __ATOMIC_RELAXED));
    fk_lock_();
    st->next = streams;
    streams = st;
    fk_unlock_();
    *ph = st;
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags)
{
    FK_ENTER(cuStreamCreate);
    return stream_create(phStream, Flags, 0);
}

FK_EXPORT CUresult cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority)
{
    FK_ENTER(cuStreamCreateWithPriority);
    return stream_create(phStream, flags, priority);
}

static void capture_detach_locked(struct fk_capture *c, struct CUstream_st *st)
{
    for (int i = 0; i < c->njoined; i++)
        if (c->joined[i] == st) {
            c->joined[i] = c->joined[--c->njoined];
            break;
        }
    st->cap = NULL;
}

FK_EXPORT CUresult cuStreamDestroy_v2(CUstream hStream)
{
    FK_ENTER(cuStreamDestroy_v2);
    fk_lock_();
    for (struct CUstream_st **pp = &streams; *pp; pp = &(*pp)->next) {
        struct CUstream_st *st = *pp;
        if (st != hStream)
            continue;
        *pp = st->next;
        if (st->cap) {
            /* Destroying a stream in a capture breaks the capture. */
            invalidate_locked(st->cap);
            if (st->cap->origin == st)
                st->cap->origin = NULL;
            capture_detach_locked(st->cap, st);
        }
        st->magic = 0;
        st->next = dead_streams;
        dead_streams = st;
        fk_unlock_();
        return CUDA_SUCCESS;
    }
    fk_unlock_();
    return CUDA_ERROR_INVALID_HANDLE;
}

CUresult fk_sync_op(bool per_thread)
{
    fk_lock_();
    struct CUstream_st *st = stream_locked(NULL, per_thread);
    CUresult r = CUDA_SUCCESS;
    if (st->cap) {
        invalidate_locked(st->cap);
        r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    } else if (st->legacy) {
        r = legacy_check_locked();
    }
    struct fk_behind *q = st->bq;
    fk_unlock_();
    /* a synchronous operation runs after its default stream's work */
    return r == CUDA_SUCCESS && fk_behind_busy(q) ? fk_behind_drain(q) : r;
}

void fk_capture_invalidate(struct fk_capture *cap)
{
    fk_lock_();
    if (capture_live_locked(cap, 0))
        invalidate_locked(cap);
    fk_unlock_();
}

/* Synchronising or querying a capturing stream is illegal and invalidates
 * the capture; the legacy stream synchronises with capturing blocking
 * streams. */
static CUresult stream_sync(CUstream s, bool pt, bool wait)
{
    /* Driver 580: synchronising or querying any stream, the caller's own
     * included, is an unsafe call while a global capture runs elsewhere. */
    struct CUstream_st *own = fk_stream(s, pt);
    if (own && !own->cap) {
        CUresult u = fk_capture_check_unsafe();
        if (u != CUDA_SUCCESS)
            return u;
    }
    fk_lock_();
    struct CUstream_st *st = stream_locked(s, pt);
    CUresult r = CUDA_SUCCESS;
    if (!st) {
        r = CUDA_ERROR_INVALID_HANDLE;
    } else if (st->cap) {
        invalidate_locked(st->cap);
        r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    } else if (st->legacy) {
        r = legacy_check_locked();
    }
    struct fk_behind *q = st ? st->bq : NULL;
    fk_unlock_();
    if (r == CUDA_SUCCESS && fk_behind_busy(q))
        r = wait ? fk_behind_drain(q) : CUDA_ERROR_NOT_READY;
    return r;
}

FK_EXPORT CUresult cuStreamSynchronize(CUstream hStream)
{
    FK_ENTER(cuStreamSynchronize);
    return stream_sync(hStream, false, true);
}
FK_EXPORT CUresult cuStreamSynchronize_ptsz(CUstream hStream)
{
    FK_ENTER(cuStreamSynchronize_ptsz);
    return stream_sync(hStream, true, true);
}
FK_EXPORT CUresult cuStreamQuery(CUstream hStream)
{
    FK_ENTER(cuStreamQuery);
    return stream_sync(hStream, false, false);
}
FK_EXPORT CUresult cuStreamQuery_ptsz(CUstream hStream)
{
    FK_ENTER(cuStreamQuery_ptsz);
    return stream_sync(hStream, true, false);
}

static CUresult stream_wait_event(CUstream s, CUevent e, unsigned flags, bool pt)
{
    if (!e || e->magic != EVENT_MAGIC || (flags & ~(unsigned)CU_EVENT_WAIT_EXTERNAL))
        return e && e->magic == EVENT_MAGIC ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_INVALID_HANDLE;
    fk_lock_();
    struct CUstream_st *st = stream_locked(s, pt);
    CUresult r = CUDA_SUCCESS;
    if (!st) {
        r = CUDA_ERROR_INVALID_HANDLE;
    } else if (e->cap && !capture_live_locked(e->cap, e->cap_id)) {
        /* Its last record belongs to a capture that has ended: there is
         * nothing outside the graph to wait for (driver 580 says so). */
        r = CUDA_ERROR_INVALID_VALUE;
    } else if (e->cap && !e->cap->invalidated) {
        /* Waiting on an event recorded in a capture joins the capture
         * (fork); a stream already in another capture may not. */
        if (st->cap && st->cap != e->cap)
            r = CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
        else if (!st->cap && st->legacy)
            r = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
        else if (!st->cap) {
            if (e->cap->njoined == MAX_JOINED) {
                r = CUDA_ERROR_OUT_OF_MEMORY;
            } else {
                st->cap = e->cap;
                e->cap->joined[e->cap->njoined++] = st;
            }
        }
    } else if (st->cap && st->cap->invalidated) {
        r = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    } else if (!st->cap && st->legacy) {
        r = legacy_check_locked();
    }
    /* an event whose record waits on a stream behind: this stream falls
     * behind until it has run */
    if (r == CUDA_SUCCESS && !st->cap && pend_has_locked(e, e->seq)) {
        struct fk_item it = {.kind = FK_ITEM_WAIT_EVENT, .ev = e, .value = e->seq};
        r = fk_behind_push(&st->bq, &it);
    }
    fk_unlock_();
    return r;
}

FK_EXPORT CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
    FK_ENTER(cuStreamWaitEvent);
    return stream_wait_event(hStream, hEvent, Flags, false);
}
FK_EXPORT CUresult cuStreamWaitEvent_ptsz(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
    FK_ENTER(cuStreamWaitEvent_ptsz);
    return stream_wait_event(hStream, hEvent, Flags, true);
}

#define STREAM_GETTER(sym, pt, type, out, expr)                                                    \
    do {                                                                                           \
        FK_ENTER(sym);                                                                             \
        if (!(out))                                                                                \
            return CUDA_ERROR_INVALID_VALUE;                                                       \
        struct CUstream_st *st = fk_stream(hStream, pt);                                           \
        if (!st)                                                                                   \
            return CUDA_ERROR_INVALID_HANDLE;                                                      \
        *(out) = (type)(expr);                                                                     \
        return CUDA_SUCCESS;                                                                       \
    } while (0)

FK_EXPORT CUresult cuStreamGetFlags(CUstream hStream, unsigned int *flags)
{
    STREAM_GETTER(cuStreamGetFlags, false, unsigned int, flags, st->flags);
}
FK_EXPORT CUresult cuStreamGetFlags_ptsz(CUstream hStream, unsigned int *flags)
{
    STREAM_GETTER(cuStreamGetFlags_ptsz, true, unsigned int, flags, st->flags);
}
FK_EXPORT CUresult cuStreamGetPriority(CUstream hStream, int *priority)
{
    STREAM_GETTER(cuStreamGetPriority, false, int, priority, st->priority);
}
FK_EXPORT CUresult cuStreamGetPriority_ptsz(CUstream hStream, int *priority)
{
    STREAM_GETTER(cuStreamGetPriority_ptsz, true, int, priority, st->priority);
}
FK_EXPORT CUresult cuStreamGetCtx(CUstream hStream, CUcontext *pctx)
{
    STREAM_GETTER(cuStreamGetCtx, false, CUcontext, pctx, st->ctx ? st->ctx : fk_current_ctx());
}
FK_EXPORT CUresult cuStreamGetCtx_ptsz(CUstream hStream, CUcontext *pctx)
{
    STREAM_GETTER(cuStreamGetCtx_ptsz, true, CUcontext, pctx, st->ctx ? st->ctx : fk_current_ctx());
}

/* --- capture ------------------------------------------------------------- */

static bool legacy_implicated_locked(void)
{
    for (int i = 0; i < nactive; i++)
        if (active[i]->blocking)
            return true;
    return false;
}

static CUresult capture_status(CUstream s, bool pt, CUstreamCaptureStatus *status, cuuint64_t *id,
                               CUgraph *graph)
{
    fk_lock_();
    struct CUstream_st *st = stream_locked(s, pt);
    CUresult r = CUDA_SUCCESS;
    if (!st) {
        r = CUDA_ERROR_INVALID_HANDLE;
    } else if (st->legacy && legacy_implicated_locked()) {
        r = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    } else {
        struct fk_capture *c = st->cap;
        if (status)
            *status = !c ? CU_STREAM_CAPTURE_STATUS_NONE
                      : c->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                                       : CU_STREAM_CAPTURE_STATUS_ACTIVE;
        if (id && c)
            *id = c->id;
        if (graph)
            *graph = c && !c->invalidated ? c->graph : NULL;
    }
    fk_unlock_();
    return r;
}

FK_EXPORT CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus)
{
    FK_ENTER(cuStreamIsCapturing);
    if (!captureStatus)
        return CUDA_ERROR_INVALID_VALUE;
    return capture_status(hStream, false, captureStatus, NULL, NULL);
}
FK_EXPORT CUresult cuStreamIsCapturing_ptsz(CUstream hStream, CUstreamCaptureStatus *captureStatus)
{
    FK_ENTER(cuStreamIsCapturing_ptsz);
    if (!captureStatus)
        return CUDA_ERROR_INVALID_VALUE;
    return capture_status(hStream, true, captureStatus, NULL, NULL);
}

static CUresult capture_info(CUstream s, bool pt, CUstreamCaptureStatus *status, cuuint64_t *id,
                             CUgraph *graph, const CUgraphNode **deps,
                             const CUgraphEdgeData **edges, size_t *ndeps)
{
    if (!status)
        return CUDA_ERROR_INVALID_VALUE;
    /* The fake keeps no node graph: a capture has no dependency frontier. */
    if (deps)
        *deps = NULL;
    if (edges)
        *edges = NULL;
    if (ndeps)
        *ndeps = 0;
    return capture_status(s, pt, status, id, graph);
}

FK_EXPORT CUresult cuStreamGetCaptureInfo_v2(CUstream hStream,
                                             CUstreamCaptureStatus *captureStatus_out,
                                             cuuint64_t *id_out, CUgraph *graph_out,
                                             const CUgraphNode **dependencies_out,
                                             size_t *numDependencies_out)
{
    FK_ENTER(cuStreamGetCaptureInfo_v2);
    return capture_info(hStream, false, captureStatus_out, id_out, graph_out, dependencies_out,
                        NULL, numDependencies_out);
}
FK_EXPORT CUresult cuStreamGetCaptureInfo_v2_ptsz(CUstream hStream,
                                                  CUstreamCaptureStatus *captureStatus_out,
                                                  cuuint64_t *id_out, CUgraph *graph_out,
                                                  const CUgraphNode **dependencies_out,
                                                  size_t *numDependencies_out)
{
    FK_ENTER(cuStreamGetCaptureInfo_v2_ptsz);
    return capture_info(hStream, true, captureStatus_out, id_out, graph_out, dependencies_out,
                        NULL, numDependencies_out);
}
FK_EXPORT CUresult cuStreamGetCaptureInfo_v3(CUstream hStream,
                                             CUstreamCaptureStatus *captureStatus_out,
                                             cuuint64_t *id_out, CUgraph *graph_out,
                                             const CUgraphNode **dependencies_out,
                                             const CUgraphEdgeData **edgeData_out,
                                             size_t *numDependencies_out)
{
    FK_ENTER(cuStreamGetCaptureInfo_v3);
    return capture_info(hStream, false, captureStatus_out, id_out, graph_out, dependencies_out,
                        edgeData_out, numDependencies_out);
}
FK_EXPORT CUresult cuStreamGetCaptureInfo_v3_ptsz(CUstream hStream,
                                                  CUstreamCaptureStatus *captureStatus_out,
                                                  cuuint64_t *id_out, CUgraph *graph_out,
                                                  const CUgraphNode **dependencies_out,
                                                  const CUgraphEdgeData **edgeData_out,
                                                  size_t *numDependencies_out)
{
    FK_ENTER(cuStreamGetCaptureInfo_v3_ptsz);
    return capture_info(hStream, true, captureStatus_out, id_out, graph_out, dependencies_out,
                        edgeData_out, numDependencies_out);
}

static void graph_free(struct CUgraph_st *g)
{
    for (size_t i = 0; i < g->n; i++)
        op_free(&g->ops[i]);
    for (size_t i = 0; i < g->nodes_cap; i++)
        if (g->nodes[i]) {
            g->nodes[i]->magic = 0;
            free(g->nodes[i]);
        }
    free(g->nodes);
    free(g->ops);
    g->magic = 0;
    free(g);
}

/* into: the graph cuStreamBeginCaptureToGraph captures into (NULL: a new one) */
static CUresult begin_capture(CUstream s, CUstreamCaptureMode mode, bool pt, struct CUgraph_st *into)
{
    if (mode != CU_STREAM_CAPTURE_MODE_GLOBAL && mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
        mode != CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    if (into && into->magic != GRAPH_MAGIC)
        return CUDA_ERROR_INVALID_VALUE;
    struct fk_capture *c = calloc(1, sizeof(*c));
    struct CUgraph_st *g = into ? into : calloc(1, sizeof(*g));
    if (!c || !g) {
        free(c);
        if (!into)
            free(g);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    g->magic = GRAPH_MAGIC;
    c->into = into != NULL;
    fk_lock_();
    struct CUstream_st *st = stream_locked(s, pt);
    CUresult r = CUDA_SUCCESS;
    if (!st)
        r = CUDA_ERROR_INVALID_HANDLE;
    else if (st->legacy)
        r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    else if (st->cap)
        r = CUDA_ERROR_ILLEGAL_STATE;
    else if (nactive == MAX_CAPS)
        r = CUDA_ERROR_OUT_OF_MEMORY;
    if (r != CUDA_SUCCESS) {
        fk_unlock_();
        free(c);
        if (!into)
            free(g);
        return r;
    }
    c->id = next_capture_id++;
    c->mode = mode;
    c->thread = pthread_self();
    c->origin = st;
    c->blocking = !(st->flags & CU_STREAM_NON_BLOCKING);
    c->graph = g;
    c->joined[c->njoined++] = st;
    st->cap = c;
    active[nactive++] = c;
    fk_unlock_();
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode)
{
    FK_ENTER(cuStreamBeginCapture_v2);
    return begin_capture(hStream, mode, false, NULL);
}
FK_EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode)
{
    FK_ENTER(cuStreamBeginCapture_v2_ptsz);
    return begin_capture(hStream, mode, true, NULL);
}

/* Dependencies on the graph's nodes are not modelled: the captured work
 * follows the graph's earlier nodes, as the fake runs everything in order. */
FK_EXPORT CUresult cuStreamBeginCaptureToGraph(CUstream hStream, CUgraph hGraph,
                                               const CUgraphNode *dependencies,
                                               const CUgraphEdgeData *dependencyData,
                                               size_t numDependencies, CUstreamCaptureMode mode)
{
    FK_ENTER(cuStreamBeginCaptureToGraph);
    (void)dependencies;
    (void)dependencyData;
    (void)numDependencies;
    return hGraph ? begin_capture(hStream, mode, false, hGraph) : CUDA_ERROR_INVALID_VALUE;
}
FK_EXPORT CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream hStream, CUgraph hGraph,
                                                    const CUgraphNode *dependencies,
                                                    const CUgraphEdgeData *dependencyData,
                                                    size_t numDependencies,
                                                    CUstreamCaptureMode mode)
{
    FK_ENTER(cuStreamBeginCaptureToGraph_ptsz);
    (void)dependencies;
    (void)dependencyData;
    (void)numDependencies;
    return hGraph ? begin_capture(hStream, mode, true, hGraph) : CUDA_ERROR_INVALID_VALUE;
}

static CUresult end_capture(CUstream s, CUgraph *phGraph, bool pt)
{
    if (!phGraph)
        return CUDA_ERROR_INVALID_VALUE;
    fk_lock_();
    struct CUstream_st *st = stream_locked(s, pt);
    struct fk_capture *c = st ? st->cap : NULL;
    CUresult r = CUDA_SUCCESS;
    if (!st)
        r = CUDA_ERROR_INVALID_HANDLE;
    else if (!c)
        r = CUDA_ERROR_ILLEGAL_STATE;
    else if (c->origin != st && c->origin)
        r = CUDA_ERROR_STREAM_CAPTURE_UNMATCHED;
    else if (c->mode != CU_STREAM_CAPTURE_MODE_RELAXED && !pthread_equal(c->thread, pthread_self()))
        r = CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
    if (r != CUDA_SUCCESS) {
        fk_unlock_();
        return r;
    }
    while (c->njoined > 0)
        capture_detach_locked(c, c->joined[c->njoined - 1]);
    for (int i = 0; i < nactive; i++)
        if (active[i] == c) {
            active[i] = active[--nactive];
            break;
        }
    fk_unlock_();
    if (c->invalidated) {
        if (!c->into)
            graph_free(c->graph);
        *phGraph = NULL;
        r = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    } else {
        *phGraph = c->graph;
    }
    free(c);
    return r;
}

FK_EXPORT CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph)
{
    FK_ENTER(cuStreamEndCapture);
    return end_capture(hStream, phGraph, false);
}
FK_EXPORT CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph)
{
    FK_ENTER(cuStreamEndCapture_ptsz);
    return end_capture(hStream, phGraph, true);
}

FK_EXPORT CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode)
{
    FK_ENTER(cuThreadExchangeStreamCaptureMode);
    if (!mode || (*mode != CU_STREAM_CAPTURE_MODE_GLOBAL &&
                  *mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
                  *mode != CU_STREAM_CAPTURE_MODE_RELAXED))
        return CUDA_ERROR_INVALID_VALUE;
    CUstreamCaptureMode old = thread_mode;
    thread_mode = *mode;
    *mode = old;
    return CUDA_SUCCESS;
}

static CUresult host_func(CUstream s, CUhostFn fn, void *ud, bool pt)
{
    if (!fn)
        return CUDA_ERROR_INVALID_VALUE;
    struct fk_capture *cap;
    CUresult r = fk_stream_begin_op(s, pt, &cap);
    if (r != CUDA_SUCCESS)
        return r;
    struct fk_op op = { .type = FK_OP_HOST, .host = { .fn = fn, .ud = ud } };
    if (cap)
        return fk_capture_add(cap, &op);
    fn(ud);
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void *userData)
{
    FK_ENTER(cuLaunchHostFunc);
    return host_func(hStream, fn, userData, false);
}
FK_EXPORT CUresult cuLaunchHostFunc_ptsz(CUstream hStream, CUhostFn fn, void *userData)
{
    FK_ENTER(cuLaunchHostFunc_ptsz);
    return host_func(hStream, fn, userData, true);
}

/* --- events -------------------------------------------------------------- */

FK_EXPORT CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags)
{
    FK_ENTER(cuEventCreate);
    if (!phEvent || (Flags & ~(unsigned)(CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING |
                                         CU_EVENT_INTERPROCESS)))
        return CUDA_ERROR_INVALID_VALUE;
    struct CUevent_st *e = calloc(1, sizeof(*e));
    if (!e)
        return CUDA_ERROR_OUT_OF_MEMORY;
    e->magic = EVENT_MAGIC;
    e->flags = Flags;
    e->ctx = fk_current_ctx();
    *phEvent = e;
    return CUDA_SUCCESS;
}

/* An event of the fake's own, its record already counted as queued (the
 * shared copy queue's, fake-behind.c); never freed, kept on a list (a
 * queue may still reach it). */
static struct CUevent_st *own_events;

CUevent fk_event_queued(void)
{
    struct CUevent_st *e = calloc(1, sizeof(*e));
    if (e) {
        e->magic = EVENT_MAGIC;
        e->flags = CU_EVENT_DISABLE_TIMING;
        e->ctx = fk_current_ctx();
        fk_lock_();
        e->seq = 1;
        if (!pend_add_locked(e, 1)) {
            fk_unlock_();
            free(e);
            return NULL;
        }
        e->dead_next = own_events;
        own_events = e;
        fk_unlock_();
    }
    return e;
}

/* Stream s's queue of work behind its caller (made on first push), NULL
 * for a bad handle. */
struct fk_behind **fk_stream_queue(CUstream s, bool pt)
{
    fk_lock_();
    struct CUstream_st *st = stream_locked(s, pt);
    fk_unlock_();
    return st ? &st->bq : NULL;
}

static CUresult event_record(CUevent e, CUstream s, bool pt)
{
    if (!e || e->magic != EVENT_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    /* as the driver: the event and the stream of one context */
    struct fk_capture *cap;
    CUresult r = fk_stream_begin_op_in(s, pt, e->ctx, &cap);
    if (r != CUDA_SUCCESS)
        return r;
    if (fk_capture_deferred(cap)) {
        /* on a stream behind: complete once the stream reaches it */
        struct fk_item it = {.kind = FK_ITEM_EVENT, .ev = e};
        fk_lock_();
        e->cap = NULL;
        e->cap_id = 0;
        it.value = ++e->seq;
        bool added = pend_add_locked(e, it.value);
        fk_unlock_();
        r = added ? fk_behind_push(&cap->defer->bq, &it) : CUDA_ERROR_OUT_OF_MEMORY;
        if (r != CUDA_SUCCESS && added) {
            fk_lock_();
            pend_drop_locked(e, it.value);
            fk_unlock_();
        }
        return r;
    }
    fk_lock_();
    e->cap = cap;
    e->cap_id = cap ? cap->id : 0;
    e->seq++; /* run already: a later wait or query finds it done */
    if (!cap) {
        e->recorded = true;
        e->t_ns = fk_now_ns();
    }
    fk_unlock_();
    return CUDA_SUCCESS;
}

void fk_event_done(CUevent e, uint32_t seq)
{
    fk_lock_();
    pend_drop_locked(e, seq);
    e->recorded = true;
    e->t_ns = fk_now_ns();
    fk_unlock_();
}

bool fk_event_pending(CUevent e, uint32_t seq)
{
    fk_lock_();
    bool p = pend_has_locked(e, seq);
    fk_unlock_();
    return p;
}

FK_EXPORT CUresult cuEventRecord(CUevent hEvent, CUstream hStream)
{
    FK_ENTER(cuEventRecord);
    return event_record(hEvent, hStream, false);
}
FK_EXPORT CUresult cuEventRecord_ptsz(CUevent hEvent, CUstream hStream)
{
    FK_ENTER(cuEventRecord_ptsz);
    return event_record(hEvent, hStream, true);
}
FK_EXPORT CUresult cuEventRecordWithFlags(CUevent hEvent, CUstream hStream, unsigned int flags)
{
    FK_ENTER(cuEventRecordWithFlags);
    if (flags & ~(unsigned)CU_EVENT_RECORD_EXTERNAL)
        return CUDA_ERROR_INVALID_VALUE;
    return event_record(hEvent, hStream, false);
}
FK_EXPORT CUresult cuEventRecordWithFlags_ptsz(CUevent hEvent, CUstream hStream, unsigned int flags)
{
    FK_ENTER(cuEventRecordWithFlags_ptsz);
    if (flags & ~(unsigned)CU_EVENT_RECORD_EXTERNAL)
        return CUDA_ERROR_INVALID_VALUE;
    return event_record(hEvent, hStream, true);
}

/* Stream memory operations (32-bit). Work runs when enqueued, so a wait
 * blocks its caller until the word holds what it waits for (another thread
 * writes it, as a GPU stream would wait in order), or under
 * WOFAKE_STREAMS_BEHIND puts its stream behind and returns; one never satisfied in
 * WOFAKE_WAIT_MS (default 10000) fails with CUDA_ERROR_LAUNCH_TIMEOUT: on a
 * GPU the stream would hang, here the test fails instead. Inside a capture
 * they are not supported (the shim never captures them). No fake lock is
 * held while waiting. */
static CUresult mem_op_begin(CUstream s, CUdeviceptr addr, unsigned flags, unsigned known,
                             struct fk_capture **behind)
{
    struct fk_capture *cap;
    CUresult r;

    *behind = NULL;
    if (!addr || addr % 4 || (flags & ~known))
        return CUDA_ERROR_INVALID_VALUE;
    r = fk_stream_begin_op(s, false, &cap);
    if (r == CUDA_SUCCESS && fk_capture_deferred(cap))
        *behind = cap;
    else if (r == CUDA_SUCCESS && cap)
        r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    return r;
}

/* A value operation queued on stream s (WOFAKE_STREAMS_BEHIND): behind, the
 * pointer fk_stream_begin_op gave, or NULL to put s behind now. */
static CUresult value_push(CUstream s, struct fk_capture *behind, int kind, CUdeviceptr addr,
                           uint32_t value, unsigned flags)
{
    struct fk_item it = {
        .kind = kind, .addr = (uint32_t *)(uintptr_t)addr, .value = value, .flags = flags};
    if (behind)
        return fk_behind_push(&behind->defer->bq, &it);
    fk_lock_();
    struct CUstream_st *st = stream_locked(s, false);
    CUresult r = st ? fk_behind_push(&st->bq, &it) : CUDA_ERROR_INVALID_HANDLE;
    fk_unlock_();
    return r;
}

/* How long a wait is given before it counts as a hang (WOFAKE_WAIT_MS). */
uint64_t fk_wait_limit_ns(void)
{
    const char *env = getenv("WOFAKE_WAIT_MS");

    return (env && *env ? strtoull(env, NULL, 10) : 10000) * 1000000ull;
}

/* The driver's quiet lock (cuMemFree, cuCtxSynchronize). On the H200 a cuMemFree waited for the
 * context's work to finish while holding a lock that another thread's cuMemcpyAsync and
 * cuStreamWriteValue32 needed; with a stream waiting for a value only that thread would write,
 * nothing went on again (llama-batched-bench under the shim's copy engine). Here work runs when
 * enqueued, so "work not finished" is a caller blocked in cuStreamWaitValue32 or a stream behind
 * (fake-behind.c): a free that finds one waits, holding the lock, and fails past WOFAKE_WAIT_MS. */
static pthread_rwlock_t quiet = PTHREAD_RWLOCK_INITIALIZER;
static int stream_waiters;

void fk_quiet_enter(void)
{
    pthread_rwlock_rdlock(&quiet);
}

void fk_quiet_leave(void)
{
    pthread_rwlock_unlock(&quiet);
}

CUresult fk_quiet_wait(void)
{
    uint64_t t0 = fk_now_ns(), limit = fk_wait_limit_ns();
    CUresult r = CUDA_SUCCESS;

    pthread_rwlock_wrlock(&quiet);
    while (__atomic_load_n(&stream_waiters, __ATOMIC_ACQUIRE) > 0 || fk_behind_any()) {
        if (fk_now_ns() - t0 > limit) {
            char who[16] = "?";

            (void)pthread_getname_np(pthread_self(), who, sizeof(who));
            fprintf(stderr,
                    "fakecuda: a free, a module's load or a context synchronize "
                    "waited for the context's work while a stream waits on a value only a blocked "
                    "call would write: a GPU would hang here (thread %s; %d callers blocked in a "
                    "wait)\n",
                    who, __atomic_load_n(&stream_waiters, __ATOMIC_ACQUIRE));
            fk_behind_describe(stderr);
            r = CUDA_ERROR_LAUNCH_TIMEOUT;
            break;
        }
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
    }
    pthread_rwlock_unlock(&quiet);
    return r;
}

bool fk_value_met(uint32_t have, uint32_t want, unsigned how)
{
    switch (how) {
    case CU_STREAM_WAIT_VALUE_GEQ:
        return (int32_t)(have - want) >= 0;
    case CU_STREAM_WAIT_VALUE_EQ:
        return have == want;
    case CU_STREAM_WAIT_VALUE_AND:
        return (have & want) != 0;
    default: /* NOR */
        return ~(have | want) != 0;
    }
}

FK_EXPORT CUresult cuStreamWaitValue32_v2(CUstream stream, CUdeviceptr addr, cuuint32_t value,
                                          unsigned int flags)
{
    FK_ENTER(cuStreamWaitValue32_v2);
    struct fk_capture *behind;
    CUresult r = mem_op_begin(stream, addr, flags, 3u | CU_STREAM_WAIT_VALUE_FLUSH, &behind);
    if (r != CUDA_SUCCESS)
        return r;
    uint64_t limit = fk_wait_limit_ns(), t0 = fk_now_ns();
    const volatile uint32_t *w = (const volatile uint32_t *)(uintptr_t)addr;
    if (!behind && fk_value_met(__atomic_load_n(w, __ATOMIC_ACQUIRE), value, flags & 3u))
        return CUDA_SUCCESS;
    if (behind || fk_behind_enabled())
        return value_push(stream, behind, FK_ITEM_WAIT_VALUE, addr, value, flags & 3u);
    __atomic_add_fetch(&stream_waiters, 1, __ATOMIC_ACQ_REL);
    while (!fk_value_met(__atomic_load_n(w, __ATOMIC_ACQUIRE), value, flags & 3u)) {
        if (fk_now_ns() - t0 > limit) {
            fprintf(stderr, "fakecuda: cuStreamWaitValue32 on %#llx for %u never met (holds %u): "
                            "a GPU stream would hang here\n",
                    (unsigned long long)addr, value, *w);
            r = CUDA_ERROR_LAUNCH_TIMEOUT;
            break;
        }
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
    }
    __atomic_sub_fetch(&stream_waiters, 1, __ATOMIC_ACQ_REL);
    return r;
}

FK_EXPORT CUresult cuStreamWriteValue32_v2(CUstream stream, CUdeviceptr addr, cuuint32_t value,
                                           unsigned int flags)
{
    FK_ENTER(cuStreamWriteValue32_v2);
    struct fk_capture *behind;
    CUresult r =
        mem_op_begin(stream, addr, flags, CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER, &behind);
    if (r == CUDA_SUCCESS && behind) {
        fk_quiet_enter(); /* enqueued under the lock, as an immediate one */
        r = value_push(stream, behind, FK_ITEM_WRITE_VALUE, addr, value, 0);
        fk_quiet_leave();
    } else if (r == CUDA_SUCCESS) {
        fk_quiet_enter();
        __atomic_store_n((uint32_t *)(uintptr_t)addr, value, __ATOMIC_RELEASE);
        fk_quiet_leave();
    }
    return r;
}

/* WOFAKE_EVENT_DELAY_MS: a recorded event completes that long after its
 * record (a GPU still running the work before it), so that a query is
 * CUDA_ERROR_NOT_READY meanwhile and a synchronize waits; 0 (the default):
 * work completes when enqueued. */
static uint64_t event_delay_ns(void)
{
    static uint64_t ns = UINT64_MAX;
    uint64_t v = __atomic_load_n(&ns, __ATOMIC_RELAXED);

    if (v == UINT64_MAX) {
        const char *env = getenv("WOFAKE_EVENT_DELAY_MS");
        v = (env && *env ? strtoull(env, NULL, 10) : 0) * 1000000ull;
        __atomic_store_n(&ns, v, __ATOMIC_RELAXED);
    }
    return v;
}

/* Work completes when enqueued (unless WOFAKE_EVENT_DELAY_MS), so only a
 * record inside a live capture is special: querying it is
 * CUDA_ERROR_CAPTURED_EVENT and breaks the capture (measured on driver
 * 580). */
static CUresult event_wait(CUevent e, bool sync)
{
    if (!e || e->magic != EVENT_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    CUresult r = CUDA_SUCCESS;
    fk_lock_();
    if (pend_has_locked(e, e->seq)) { /* its last record is queued on a stream behind */
        uint32_t seq = e->seq;

        fk_unlock_();
        if (!sync)
            return CUDA_ERROR_NOT_READY;
        uint64_t t0 = fk_now_ns();
        while (fk_event_pending(e, seq)) {
            if (fk_now_ns() - t0 > 2 * fk_wait_limit_ns())
                return CUDA_ERROR_LAUNCH_TIMEOUT;
            struct timespec ts = {0, 50000};
            nanosleep(&ts, NULL);
        }
        fk_lock_();
    }
    uint64_t due = e->recorded && event_delay_ns() ? e->t_ns + event_delay_ns() : 0;
    if (due && fk_now_ns() < due) {
        fk_unlock_();
        if (!sync)
            return CUDA_ERROR_NOT_READY;
        while (fk_now_ns() < due) {
            struct timespec ts = {0, 200000};
            nanosleep(&ts, NULL);
        }
        fk_lock_();
    }
    bool captured = e->cap && capture_live_locked(e->cap, e->cap_id);
    if (captured) {
        invalidate_locked(e->cap);
        r = CUDA_ERROR_CAPTURED_EVENT;
    }
    fk_unlock_();
    /* Otherwise an unsafe call during a global capture (driver 580: 900
     * for an event of another thread's own stream). */
    return captured ? r : fk_capture_check_unsafe();
}

FK_EXPORT CUresult cuEventQuery(CUevent hEvent)
{
    FK_ENTER(cuEventQuery);
    return event_wait(hEvent, false);
}

FK_EXPORT CUresult cuEventSynchronize(CUevent hEvent)
{
    FK_ENTER(cuEventSynchronize);
    return event_wait(hEvent, true);
}

FK_EXPORT CUresult cuEventDestroy_v2(CUevent hEvent)
{
    FK_ENTER(cuEventDestroy_v2);
    if (!hEvent || hEvent->magic != EVENT_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    hEvent->magic = 0;
    if (!fk_behind_enabled()) {
        free(hEvent);
        return CUDA_SUCCESS;
    }
    /* a stream behind may still reach a record or a wait of it: kept */
    static struct CUevent_st *dead_events;
    fk_lock_();
    hEvent->dead_next = dead_events;
    dead_events = hEvent;
    fk_unlock_();
    return CUDA_SUCCESS;
}

static CUresult elapsed(float *ms, CUevent a, CUevent b)
{
    if (!ms)
        return CUDA_ERROR_INVALID_VALUE;
    if (!a || !b || a->magic != EVENT_MAGIC || b->magic != EVENT_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    if ((a->flags | b->flags) & CU_EVENT_DISABLE_TIMING || !a->recorded || !b->recorded)
        return CUDA_ERROR_INVALID_HANDLE;
    *ms = (float)((double)((int64_t)(b->t_ns - a->t_ns)) / 1e6);
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd)
{
    FK_ENTER(cuEventElapsedTime);
    return elapsed(pMilliseconds, hStart, hEnd);
}
FK_EXPORT CUresult cuEventElapsedTime_v2(float *pMilliseconds, CUevent hStart, CUevent hEnd)
{
    FK_ENTER(cuEventElapsedTime_v2);
    return elapsed(pMilliseconds, hStart, hEnd);
}

/* --- kernels, modules, libraries ----------------------------------------- */

static size_t align_of_size(size_t sz)
{
    size_t a = 1;
    while (a < 8 && sz % (a * 2) == 0)
        a *= 2;
    return a;
}

/* f's signature and body (its parameters laid out as nvcc does) */
static void set_signature(struct CUfunc_st *f, int nparams, const size_t *param_sizes,
                          fakecuda_kernel_fn fn)
{
    size_t off = 0;
    for (int i = 0; i < nparams; i++) {
        size_t a = align_of_size(param_sizes[i]);
        off = (off + a - 1) & ~(a - 1);
        f->offsets[i] = off;
        f->sizes[i] = param_sizes[i];
        off += param_sizes[i];
    }
    f->argbytes = off;
    f->nparams = nparams;
    f->fn = fn;
}

FK_EXPORT CUfunction fakecuda_kernel(const char *name, int nparams, const size_t *param_sizes,
                                     fakecuda_kernel_fn fn)
{
    if (!name || !fn || nparams < 0 || nparams > MAX_PARAMS || (nparams && !param_sizes))
        return NULL;
    size_t len = strlen(name);
    struct CUfunc_st *f = calloc(1, sizeof(*f) + len + 1);
    if (!f)
        return NULL;
    memcpy(f->name, name, len + 1);
    f->magic = FUNC_MAGIC;
    set_signature(f, nparams, param_sizes, fn);
    fk_lock_();
    f->next = kernels;
    kernels = f;
    fk_unlock_();
    return f;
}

FK_EXPORT int fakecuda_kernel_redefine(CUfunction f, int nparams, const size_t *param_sizes,
                                       fakecuda_kernel_fn fn)
{
    if (!f || f->magic != FUNC_MAGIC || !fn || nparams < 0 || nparams > MAX_PARAMS ||
        (nparams && !param_sizes))
        return -1;
    fk_lock_();
    set_signature(f, nparams, param_sizes, fn);
    f->module = NULL;
    fk_unlock_();
    return 0;
}

FK_EXPORT CUkernel fakecuda_kernel_handle(CUfunction f)
{
    return (CUkernel)(void *)f;
}

FK_EXPORT uint64_t fakecuda_kernel_runs(CUfunction f)
{
    return f && f->magic == FUNC_MAGIC ? atomic_load(&f->runs) : 0;
}

FK_EXPORT uint64_t fakecuda_kernel_runs_named(const char *name)
{
    uint64_t n = 0;
    fk_lock_();
    for (struct CUfunc_st *f = kernels; name && f; f = f->next)
        if (strcmp(f->name, name) == 0)
            n += atomic_load(&f->runs);
    fk_unlock_();
    return n;
}

static struct CUfunc_st *func_of(const void *h)
{
    const struct CUfunc_st *f = h;
    return f && f->magic == FUNC_MAGIC ? (struct CUfunc_st *)f : NULL;
}

/* The source reads of a staging copy, as a GPU's copy makes them: an
 * engine kernel on another stream may be writing the range at the same
 * moment (a launch that touches it in place, begun after the executor
 * looked). On the GPU the copy then reads torn bytes, and the executor
 * never publishes it (uvm/stream.h: wo_stream_touch_begin; the copy is
 * counted in not_published). Here the copy and the engine's kernel run on
 * two host threads: the reads are left uninstrumented, as the hardware's
 * are, so ThreadSanitizer does not report that discarded copy as a race
 * (volatile: no memcpy call for the sanitizer to intercept). Whatever the
 * slot then holds is still checked by every read the tests make of it. */
__attribute__((no_sanitize("thread"))) static void device_copy(unsigned char *dst,
                                                                const unsigned char *src,
                                                                unsigned long long n)
{
    const volatile unsigned char *s = src;
    unsigned long long k = 0;

    if (((uintptr_t)dst | (uintptr_t)src) % 8 == 0)
        for (; k + 8 <= n; k += 8)
            *(uint64_t *)(void *)(dst + k) = *(const volatile uint64_t *)(const void *)(src + k);
    for (; k < n; k++)
        dst[k] = s[k];
}

/* The shim's own kernel (uvm/stream-copy.cu: the streaming executor's
 * staging copy from managed memory), as the GPU would run it: bytes copied,
 * whatever the grid. */
static void builtin_stream_copy(void **params, const uint32_t grid[3], const uint32_t block[3])
{
    unsigned char *dst;
    const unsigned char *src;
    unsigned long long n;

    (void)grid;
    (void)block;
    memcpy(&dst, params[0], sizeof(dst));
    memcpy(&src, params[1], sizeof(src));
    memcpy(&n, params[2], sizeof(n));
    device_copy(dst, src, n);
}

/* The write checks' kernels (uvm/stream-copy.cu, uvm/stream-check.c), as
 * the GPU computes them: the same hash of a slot, the copy back when it
 * changed, the flag. */
static uint64_t fk_mix(uint64_t x)
{
    x ^= x >> 30;
    x *= UINT64_C(0xbf58476d1ce4e5b9);
    x ^= x >> 27;
    x *= UINT64_C(0x94d049bb133111eb);
    x ^= x >> 31;
    return x;
}

static void builtin_stream_hash(void **params, const uint32_t grid[3], const uint32_t block[3])
{
    const unsigned char *p;
    uint64_t *out, n, nw, h = 0, t = 0, w;

    (void)grid;
    (void)block;
    memcpy(&p, params[0], sizeof(p));
    memcpy(&n, params[1], sizeof(n));
    memcpy(&out, params[4], sizeof(out));
    nw = n / 8;
    for (uint64_t k = 0; k < nw; k++) {
        memcpy(&w, p + 8 * k, 8);
        h += fk_mix(w + k * UINT64_C(0x9e3779b97f4a7c15));
    }
    for (uint64_t k = nw * 8; k < n; k++)
        t |= (uint64_t)p[k] << (8 * (k - nw * 8));
    h += fk_mix(t + nw * UINT64_C(0x9e3779b97f4a7c15)) ^ n;
    *out = h;
}

static void builtin_stream_check(void **params, const uint32_t grid[3], const uint32_t block[3])
{
    const unsigned char *slot;
    const uint64_t *want, *got;
    unsigned char *dst;
    uint64_t n;

    (void)grid;
    (void)block;
    memcpy(&slot, params[0], sizeof(slot));
    memcpy(&n, params[1], sizeof(n));
    memcpy(&want, params[2], sizeof(want));
    memcpy(&got, params[3], sizeof(got));
    memcpy(&dst, params[4], sizeof(dst));
    if (*want != *got)
        memmove(dst, slot, n);
}

static void builtin_stream_flag(void **params, const uint32_t grid[3], const uint32_t block[3])
{
    const uint64_t *want, *got;
    unsigned *flag, tag;

    (void)grid;
    (void)block;
    memcpy(&want, params[0], sizeof(want));
    memcpy(&got, params[1], sizeof(got));
    memcpy(&flag, params[2], sizeof(flag));
    memcpy(&tag, params[3], sizeof(tag));
    if (*want != *got)
        __atomic_store_n(flag, tag, __ATOMIC_RELEASE);
}

/* Picked staging's kernels (uvm/stream-copy.cu, uvm/picks.c): marks[e] =
 * gen for each id e in range; then each marked row copied, and the rows
 * counted, whatever the grid (its y is the experts). */
static void builtin_picks_mark(void **params, const uint32_t grid[3], const uint32_t block[3])
{
    const unsigned char *ids;
    unsigned long long n, per_row, stride;
    unsigned width, ne, gen, *marks;

    (void)grid;
    (void)block;
    memcpy(&ids, params[0], sizeof(ids));
    memcpy(&n, params[1], sizeof(n));
    memcpy(&per_row, params[2], sizeof(per_row));
    memcpy(&stride, params[3], sizeof(stride));
    memcpy(&width, params[4], sizeof(width));
    memcpy(&ne, params[5], sizeof(ne));
    memcpy(&marks, params[6], sizeof(marks));
    memcpy(&gen, params[7], sizeof(gen));
    for (unsigned long long k = 0; k < n; k++) {
        /* the device kernel's indexing (uvm/stream-copy.cu) */
        unsigned long long at = per_row == stride ? k : k / per_row * stride + k % per_row;
        long long e;
        if (width == 8) {
            memcpy(&e, ids + 8 * at, 8);
        } else {
            int32_t v;
            memcpy(&v, ids + 4 * at, 4);
            e = v;
        }
        if (e >= 0 && e < (long long)ne)
            marks[e] = gen;
    }
}

static void builtin_picks_copy(void **params, const uint32_t grid[3], const uint32_t block[3])
{
    unsigned char *dst;
    const unsigned char *src, *cache;
    unsigned long long row, *rows, *hits;
    const unsigned *marks, *where;
    unsigned gen, *counts;

    (void)block;
    memcpy(&dst, params[0], sizeof(dst));
    memcpy(&src, params[1], sizeof(src));
    memcpy(&row, params[2], sizeof(row));
    memcpy(&marks, params[3], sizeof(marks));
    memcpy(&gen, params[4], sizeof(gen));
    memcpy(&rows, params[5], sizeof(rows));
    memcpy(&where, params[6], sizeof(where));
    memcpy(&cache, params[7], sizeof(cache));
    memcpy(&counts, params[8], sizeof(counts));
    memcpy(&hits, params[9], sizeof(hits));
    for (uint32_t e = 0; e < grid[1]; e++) {
        unsigned slot = where ? where[e] : 0xffffffffu;

        /* an atomic read: the marks may be host memory another thread writes
         * (the shim's rescue marks, written by its watchdog) */
        if (__atomic_load_n(&marks[e], __ATOMIC_RELAXED) != gen)
            continue;
        /* a side left out: no src, only the rows from cache; no cache,
         * only the others (uvm/stream-copy.cu) */
        bool skip = slot != 0xffffffffu ? !cache : !src;
        if (!skip)
            device_copy(dst + e * row, slot != 0xffffffffu ? cache + slot * row : src + e * row,
                        row);
        if (rows && !skip)
            __atomic_add_fetch(rows, 1, __ATOMIC_RELAXED);
        if (counts)
            __atomic_add_fetch(&counts[e], 1, __ATOMIC_RELAXED);
        if (hits && slot != 0xffffffffu && !skip)
            __atomic_add_fetch(hits, 1, __ATOMIC_RELAXED);
    }
}

static struct CUfunc_st *kernel_by_name(const char *name)
{
    struct CUfunc_st *r = NULL;
    fk_lock_();
    /* Newest registration wins, so a test can re-register a name. */
    for (struct CUfunc_st *f = kernels; f && !r; f = f->next)
        if (strcmp(f->name, name) == 0)
            r = f;
    fk_unlock_();
    if (!r && strcmp(name, "wo_stream_copy") == 0) {
        static const size_t sizes[3] = {8, 8, 8};
        r = fakecuda_kernel(name, 3, sizes, builtin_stream_copy);
    } else if (!r && strcmp(name, "wo_stream_hash") == 0) {
        static const size_t sizes[5] = {8, 8, 8, 8, 8};
        r = fakecuda_kernel(name, 5, sizes, builtin_stream_hash);
    } else if (!r && strcmp(name, "wo_stream_check") == 0) {
        static const size_t sizes[5] = {8, 8, 8, 8, 8};
        r = fakecuda_kernel(name, 5, sizes, builtin_stream_check);
    } else if (!r && strcmp(name, "wo_stream_flag") == 0) {
        static const size_t sizes[4] = {8, 8, 8, 4};
        r = fakecuda_kernel(name, 4, sizes, builtin_stream_flag);
    } else if (!r && strcmp(name, "wo_picks_mark") == 0) {
        static const size_t sizes[8] = {8, 8, 8, 8, 4, 4, 8, 4};
        r = fakecuda_kernel(name, 8, sizes, builtin_picks_mark);
    } else if (!r && strcmp(name, "wo_picks_copy") == 0) {
        static const size_t sizes[10] = {8, 8, 8, 8, 4, 8, 8, 8, 8, 8};
        r = fakecuda_kernel(name, 10, sizes, builtin_picks_copy);
    }
    return r;
}

static CUresult new_handle(void **out, size_t size, uint32_t magic)
{
    uint32_t *m = calloc(1, size);
    if (!m)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *m = magic;
    *out = m;
    return CUDA_SUCCESS;
}

/* A load waits for the context's work holding the driver's quiet lock, as a
 * free does (fk_quiet_wait): CUDA's programming guide says a module's load
 * may synchronize the context, and on the H200 a kernel's lazy load with the
 * shim's copy engine queued hung so. */
FK_EXPORT CUresult cuModuleLoad(CUmodule *module, const char *fname)
{
    FK_ENTER(cuModuleLoad);
    if (!module || !fname)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult w = fk_quiet_wait();
    if (w != CUDA_SUCCESS)
        return w;
    return new_handle((void **)module, sizeof(struct CUmod_st), MOD_MAGIC);
}

/* Any image loads; its functions are the registered kernels. */
FK_EXPORT CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
    FK_ENTER(cuModuleLoadData);
    if (!module || !image)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = fk_quiet_wait();
    if (r != CUDA_SUCCESS)
        return r;
    r = new_handle((void **)module, sizeof(struct CUmod_st), MOD_MAGIC);
    if (r == CUDA_SUCCESS && fk_module_bytes)
        fk_dev_bytes_add((int64_t)fk_module_bytes);
    return r;
}

FK_EXPORT CUresult cuModuleUnload(CUmodule hmod)
{
    FK_ENTER(cuModuleUnload);
    if (!hmod || hmod->magic != MOD_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    hmod->magic = 0;
    free(hmod);
    if (fk_module_bytes)
        fk_dev_bytes_add(-(int64_t)fk_module_bytes);
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)
{
    FK_ENTER(cuModuleGetFunction);
    if (!hfunc || !name)
        return CUDA_ERROR_INVALID_VALUE;
    if (!hmod || hmod->magic != MOD_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    struct CUfunc_st *f = kernel_by_name(name);
    if (!f)
        return CUDA_ERROR_NOT_FOUND;
    __atomic_store_n(&f->loaded, 1, __ATOMIC_RELEASE);
    fk_lock_();
    f->module = hmod;
    fk_unlock_();
    *hfunc = f;
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuFuncGetModule(CUmodule *hmod, CUfunction hfunc)
{
    FK_ENTER(cuFuncGetModule);
    if (!hmod)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUfunc_st *f = func_of(hfunc);
    if (!f)
        return CUDA_ERROR_INVALID_HANDLE;
    fk_lock_();
    *hmod = f->module;
    fk_unlock_();
    /* a function from no module (a CUkernel of a library, or registered and
     * launched directly): the real driver says it has none */
    return *hmod ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

FK_EXPORT CUresult cuLibraryLoadData(CUlibrary *library, const void *code, CUjit_option *jitOptions,
                                     void **jitOptionsValues, unsigned int numJitOptions,
                                     CUlibraryOption *libraryOptions, void **libraryOptionValues,
                                     unsigned int numLibraryOptions)
{
    FK_ENTER(cuLibraryLoadData);
    if (!library || !code)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult w = fk_quiet_wait();
    if (w != CUDA_SUCCESS)
        return w;
    return new_handle((void **)library, sizeof(struct CUlib_st), MOD_MAGIC);
}

FK_EXPORT CUresult cuLibraryUnload(CUlibrary library)
{
    FK_ENTER(cuLibraryUnload);
    if (!library || library->magic != MOD_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    library->magic = 0;
    free(library);
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuLibraryGetKernel(CUkernel *pKernel, CUlibrary library, const char *name)
{
    FK_ENTER(cuLibraryGetKernel);
    if (!pKernel || !name)
        return CUDA_ERROR_INVALID_VALUE;
    if (!library || library->magic != MOD_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    struct CUfunc_st *f = kernel_by_name(name);
    if (!f)
        return CUDA_ERROR_NOT_FOUND;
    *pKernel = (CUkernel)(void *)f;
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuKernelGetFunction(CUfunction *pFunc, CUkernel kernel)
{
    FK_ENTER(cuKernelGetFunction);
    if (!pFunc)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUfunc_st *f = func_of(kernel);
    if (!f)
        return CUDA_ERROR_INVALID_HANDLE;
    __atomic_store_n(&f->loaded, 1, __ATOMIC_RELEASE);
    *pFunc = f;
    return CUDA_SUCCESS;
}

static CUresult param_info(const void *h, size_t idx, size_t *off, size_t *size)
{
    struct CUfunc_st *f = func_of(h);
    if (!f)
        return CUDA_ERROR_INVALID_HANDLE;
    if (idx >= (size_t)f->nparams)
        return CUDA_ERROR_INVALID_VALUE;
    if (off)
        *off = f->offsets[idx];
    if (size)
        *size = f->sizes[idx];
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuFuncGetParamInfo(CUfunction func, size_t paramIndex, size_t *paramOffset,
                                      size_t *paramSize)
{
    FK_ENTER(cuFuncGetParamInfo);
    return param_info(func, paramIndex, paramOffset, paramSize);
}

FK_EXPORT CUresult cuKernelGetParamInfo(CUkernel kernel, size_t paramIndex, size_t *paramOffset,
                                        size_t *paramSize)
{
    FK_ENTER(cuKernelGetParamInfo);
    return param_info(kernel, paramIndex, paramOffset, paramSize);
}

FK_EXPORT CUresult cuFuncGetName(const char **name, CUfunction hfunc)
{
    FK_ENTER(cuFuncGetName);
    if (!name)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUfunc_st *f = func_of(hfunc);
    if (!f)
        return CUDA_ERROR_INVALID_HANDLE;
    *name = f->name;
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuKernelGetName(const char **name, CUkernel hfunc)
{
    FK_ENTER(cuKernelGetName);
    if (!name)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUfunc_st *f = func_of(hfunc);
    if (!f)
        return CUDA_ERROR_INVALID_HANDLE;
    *name = f->name;
    return CUDA_SUCCESS;
}

/* WOFAKE_LAZY: CUDA's lazy module loading, as on the H200: a kernel's
 * first use (its first launch, its attributes) loads its module, and the
 * load waits for the context's work holding the driver's quiet lock
 * (fk_quiet_wait); a kernel got through cuModuleGetFunction or
 * cuKernelGetFunction was loaded there */
static CUresult lazy_load(struct CUfunc_st *f)
{
    if (fk_lazy && !__atomic_load_n(&f->loaded, __ATOMIC_ACQUIRE)) {
        CUresult w = fk_quiet_wait();
        if (w != CUDA_SUCCESS)
            return w;
        __atomic_store_n(&f->loaded, 1, __ATOMIC_RELEASE);
    }
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuFuncGetAttribute(int *pi, CUfunction_attribute attrib, CUfunction hfunc)
{
    FK_ENTER(cuFuncGetAttribute);
    if (!pi)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUfunc_st *f = func_of(hfunc);
    if (!f)
        return CUDA_ERROR_INVALID_HANDLE;
    CUresult w = lazy_load(f);
    if (w != CUDA_SUCCESS)
        return w;
    switch (attrib) {
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *pi = 1024; break;
    case CU_FUNC_ATTRIBUTE_NUM_REGS: *pi = 32; break;
    case CU_FUNC_ATTRIBUTE_PTX_VERSION:
    case CU_FUNC_ATTRIBUTE_BINARY_VERSION: *pi = 90; break;
    default: *pi = 0; break;
    }
    return CUDA_SUCCESS;
}

/* --- launches ------------------------------------------------------------ */

static void note_launch(struct CUfunc_st *f, const uint32_t g[3], const uint32_t b[3],
                        unsigned shmem, CUstream s, int from_graph, int captured)
{
    uint64_t seq = atomic_fetch_add(&launch_seq, 1) + 1;
    atomic_fetch_add(captured ? &captured_total : &runs_total, 1);
    if (!captured)
        atomic_fetch_add(&f->runs, 1);
    fk_lock_();
    last_launch = (struct fakecuda_launch){ .func = f,
                                            .grid = { g[0], g[1], g[2] },
                                            .block = { b[0], b[1], b[2] },
                                            .shared_mem = shmem,
                                            .stream = s,
                                            .from_graph = from_graph,
                                            .captured = captured,
                                            .seq = seq };
    have_last = true;
    fk_unlock_();
}

static void run_kernel(struct CUfunc_st *f, void **params, const uint32_t g[3],
                       const uint32_t b[3])
{
    fk_dev_enter(); /* one memory operation of the device at once (fake-priv.h) */
    f->fn(params, g, b);
    fk_dev_leave();
}

static void run_packed(struct CUfunc_st *f, uint8_t *args, const uint32_t g[3], const uint32_t b[3])
{
    void *ptrs[MAX_PARAMS];
    for (int i = 0; i < f->nparams; i++)
        ptrs[i] = args + f->offsets[i];
    run_kernel(f, ptrs, g, b);
}

static CUresult launch(const void *fh, const uint32_t g[3], const uint32_t b[3], unsigned shmem,
                       CUstream s, bool pt, void **params, void **extra)
{
    struct CUfunc_st *f = func_of(fh);
    if (!f)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!g[0] || !g[1] || !g[2] || !b[0] || !b[1] || !b[2] || g[1] > 65535 || g[2] > 65535 ||
        (uint64_t)b[0] * b[1] * b[2] > 1024 || b[2] > 64)
        return CUDA_ERROR_INVALID_VALUE;
    if (shmem > 227 * 1024)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult w = lazy_load(f); /* WOFAKE_LAZY */
    if (w != CUDA_SUCCESS)
        return w;
    uint8_t *buf = NULL;
    size_t bufsize = 0;
    if (extra) {
        if (params)
            return CUDA_ERROR_INVALID_VALUE;
        for (size_t i = 0; extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
            if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER)
                buf = extra[i + 1];
            else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE && extra[i + 1])
                bufsize = *(size_t *)extra[i + 1];
            else
                return CUDA_ERROR_INVALID_VALUE;
        }
        if (f->nparams && (!buf || bufsize < f->argbytes))
            return CUDA_ERROR_INVALID_VALUE;
    } else if (!params && f->nparams) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    struct fk_capture *cap;
    CUresult r = fk_stream_begin_op(s, pt, &cap);
    if (r != CUDA_SUCCESS)
        return r;
    if (cap) {
        /* The driver copies parameter values at capture time. */
        struct fk_op op;
        r = kernel_op(&op, f, g, b, shmem, params, buf);
        op.k.packed = buf != NULL;
        if (r != CUDA_SUCCESS)
            return r;
        r = fk_capture_add(cap, &op);
        if (r == CUDA_SUCCESS)
            note_launch(f, g, b, shmem, s, 0, !fk_capture_deferred(cap));
        return r;
    }
    note_launch(f, g, b, shmem, s, 0, 0);
    if (buf)
        run_packed(f, buf, g, b);
    else
        run_kernel(f, params, g, b);
    return CUDA_SUCCESS;
}

#define DIMS                                                                                       \
    const uint32_t g[3] = { gridDimX, gridDimY, gridDimZ };                                        \
    const uint32_t b[3] = { blockDimX, blockDimY, blockDimZ }

FK_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                  unsigned int gridDimZ, unsigned int blockDimX,
                                  unsigned int blockDimY, unsigned int blockDimZ,
                                  unsigned int sharedMemBytes, CUstream hStream,
                                  void **kernelParams, void **extra)
{
    FK_ENTER(cuLaunchKernel);
    DIMS;
    return launch(f, g, b, sharedMemBytes, hStream, false, kernelParams, extra);
}

FK_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                       unsigned int gridDimZ, unsigned int blockDimX,
                                       unsigned int blockDimY, unsigned int blockDimZ,
                                       unsigned int sharedMemBytes, CUstream hStream,
                                       void **kernelParams, void **extra)
{
    FK_ENTER(cuLaunchKernel_ptsz);
    DIMS;
    return launch(f, g, b, sharedMemBytes, hStream, true, kernelParams, extra);
}

static CUresult launch_ex(const CUlaunchConfig *c, CUfunction f, void **params, void **extra,
                          bool pt)
{
    if (!c || (c->numAttrs && !c->attrs))
        return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < c->numAttrs; i++)
        if ((unsigned)c->attrs[i].id > 64) /* IGNORE (0) is valid and ignored */
            return CUDA_ERROR_INVALID_VALUE;
    const uint32_t g[3] = { c->gridDimX, c->gridDimY, c->gridDimZ };
    const uint32_t b[3] = { c->blockDimX, c->blockDimY, c->blockDimZ };
    return launch(f, g, b, c->sharedMemBytes, c->hStream, pt, params, extra);
}

FK_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f,
                                    void **kernelParams, void **extra)
{
    FK_ENTER(cuLaunchKernelEx);
    return launch_ex(config, f, kernelParams, extra, false);
}

FK_EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f,
                                         void **kernelParams, void **extra)
{
    FK_ENTER(cuLaunchKernelEx_ptsz);
    return launch_ex(config, f, kernelParams, extra, true);
}

/* --- graphs -------------------------------------------------------------- */

static CUresult instantiate(CUgraphExec *pe, CUgraph g)
{
    if (!pe)
        return CUDA_ERROR_INVALID_VALUE;
    if (!g || g->magic != GRAPH_MAGIC)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUgraphExec_st *e = calloc(1, sizeof(*e));
    if (!e)
        return CUDA_ERROR_OUT_OF_MEMORY;
    e->magic = EXEC_MAGIC;
    fk_lock_();
    e->ops = calloc(g->n ? g->n : 1, sizeof(*e->ops));
    CUresult r = e->ops ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
    for (size_t i = 0; i < g->n && r == CUDA_SUCCESS; i++) {
        r = op_copy(&e->ops[i], &g->ops[i]);
        if (r == CUDA_SUCCESS)
            e->n++;
    }
    fk_unlock_();
    if (r != CUDA_SUCCESS) {
        for (size_t i = 0; i < e->n; i++)
            op_free(&e->ops[i]);
        free(e->ops);
        free(e);
        return r;
    }
    *pe = e;
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph,
                                               unsigned long long flags)
{
    FK_ENTER(cuGraphInstantiateWithFlags);
    if (flags & ~(unsigned long long)(CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH |
                                      CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD |
                                      CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH |
                                      CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY))
        return CUDA_ERROR_INVALID_VALUE;
    return instantiate(phGraphExec, hGraph);
}

FK_EXPORT CUresult cuGraphInstantiate_v2(CUgraphExec *phGraphExec, CUgraph hGraph,
                                         CUgraphNode *phErrorNode, char *logBuffer,
                                         size_t bufferSize)
{
    FK_ENTER(cuGraphInstantiate_v2);
    if (phErrorNode)
        *phErrorNode = NULL;
    if (logBuffer && bufferSize)
        logBuffer[0] = '\0';
    return instantiate(phGraphExec, hGraph);
}

/* Runs a recorded op: a graph's node, or work a stream behind queued. */
void fk_exec_op(const struct fk_op *op)
{
    switch (op->type) {
    case FK_OP_KERNEL:
        run_packed(op->k.f, op->k.args, op->k.grid, op->k.block);
        break;
    case FK_OP_HOST:
        op->host.fn(op->host.ud);
        break;
    default:
        fk_op_run(op);
        break;
    }
}

static CUresult graph_launch(CUgraphExec e, CUstream s, bool pt)
{
    if (!e || e->magic != EXEC_MAGIC)
        return CUDA_ERROR_INVALID_VALUE;
    struct fk_capture *cap;
    CUresult r = fk_stream_begin_op(s, pt, &cap);
    if (r != CUDA_SUCCESS)
        return r;
    for (size_t i = 0; i < e->n; i++) {
        const struct fk_op *op = &e->ops[i];
        if (cap) {
            /* A graph launched into a capture becomes part of it. */
            struct fk_op c;
            r = op_copy(&c, op);
            if (r == CUDA_SUCCESS)
                r = fk_capture_add(cap, &c);
            if (r != CUDA_SUCCESS)
                return r;
            if (op->type == FK_OP_KERNEL)
                note_launch(op->k.f, op->k.grid, op->k.block, op->k.shmem, s, 1,
                            !fk_capture_deferred(cap));
            continue;
        }
        if (op->type == FK_OP_KERNEL)
            note_launch(op->k.f, op->k.grid, op->k.block, op->k.shmem, s, 1, 0);
        fk_exec_op(op);
    }
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream)
{
    FK_ENTER(cuGraphLaunch);
    return graph_launch(hGraphExec, hStream, false);
}

FK_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream)
{
    FK_ENTER(cuGraphLaunch_ptsz);
    return graph_launch(hGraphExec, hStream, true);
}

FK_EXPORT CUresult cuGraphExecDestroy(CUgraphExec hGraphExec)
{
    FK_ENTER(cuGraphExecDestroy);
    if (!hGraphExec || hGraphExec->magic != EXEC_MAGIC)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < hGraphExec->n; i++)
        op_free(&hGraphExec->ops[i]);
    free(hGraphExec->ops);
    hGraphExec->magic = 0;
    free(hGraphExec);
    return CUDA_SUCCESS;
}

/* A graph built by hand (cuGraphCreate, cuGraphAddKernelNode): its kernel
 * nodes run in the order they were added (a valid order for any
 * dependencies, which name earlier nodes); the node handles are opaque
 * tokens. Nothing an engine's hook sees: the shim cannot know its nodes. */
FK_EXPORT CUresult cuGraphCreate(CUgraph *phGraph, unsigned int flags)
{
    FK_ENTER(cuGraphCreate);
    if (!phGraph || flags)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUgraph_st *g = calloc(1, sizeof(*g));
    if (!g)
        return CUDA_ERROR_OUT_OF_MEMORY;
    g->magic = GRAPH_MAGIC;
    *phGraph = g;
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuGraphAddKernelNode_v2(CUgraphNode *phGraphNode, CUgraph hGraph,
                                           const CUgraphNode *dependencies, size_t numDependencies,
                                           const CUDA_KERNEL_NODE_PARAMS *p)
{
    FK_ENTER(cuGraphAddKernelNode_v2);
    if (!phGraphNode || !hGraph || hGraph->magic != GRAPH_MAGIC || !p ||
        (numDependencies && !dependencies))
        return CUDA_ERROR_INVALID_VALUE;
    struct CUfunc_st *f = p->func;
    if (!f || f->magic != FUNC_MAGIC)
        return p->kern ? CUDA_ERROR_NOT_SUPPORTED : CUDA_ERROR_INVALID_VALUE;
    if (p->extra)
        return CUDA_ERROR_NOT_SUPPORTED; /* packed parameters: not modelled here */
    if (!p->kernelParams && f->nparams)
        return CUDA_ERROR_INVALID_VALUE;
    const uint32_t g[3] = {p->gridDimX, p->gridDimY, p->gridDimZ};
    const uint32_t b[3] = {p->blockDimX, p->blockDimY, p->blockDimZ};
    struct fk_op op;
    CUresult r = kernel_op(&op, f, g, b, p->sharedMemBytes, p->kernelParams, NULL);
    if (r != CUDA_SUCCESS)
        return r;
    fk_lock_();
    r = graph_append_locked(hGraph, &op);
    struct fk_node *node = r == CUDA_SUCCESS ? node_locked(hGraph, hGraph->n - 1) : NULL;
    fk_unlock_();
    if (r != CUDA_SUCCESS) {
        free(op.k.args);
        return r;
    }
    if (!node)
        return CUDA_ERROR_OUT_OF_MEMORY; /* the node was added all the same */
    *phGraphNode = (CUgraphNode)node;
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuGraphDestroy(CUgraph hGraph)
{
    FK_ENTER(cuGraphDestroy);
    if (!hGraph || hGraph->magic != GRAPH_MAGIC)
        return CUDA_ERROR_INVALID_VALUE;
    graph_free(hGraph);
    return CUDA_SUCCESS;
}

/* --- graph nodes ----------------------------------------------------------
 * What the shim's graph replay reads of a graph (preload/graph-replay.c):
 * its nodes, their edges, types and parameters. A graph's nodes are its
 * ops in order, each with a handle of its own (struct fk_node, made on
 * first ask and freed with the graph); the edges are the chain from each
 * op to the next (the fake runs a graph in op order). An exec's ops are
 * its graph's at instantiation, replaced by cuGraphExecUpdate and changed
 * one by one by cuGraphExecKernelNodeSetParams. */


/* The handle of op i of g (made on first ask); NULL without memory. */
static struct fk_node *node_locked(struct CUgraph_st *g, size_t i)
{
    if (i >= g->n)
        return NULL;
    if (g->nodes_cap < g->cap) {
        struct fk_node **n = realloc(g->nodes, g->cap * sizeof(*n));
        if (!n)
            return NULL;
        memset(n + g->nodes_cap, 0, (g->cap - g->nodes_cap) * sizeof(*n));
        g->nodes = n;
        g->nodes_cap = g->cap;
    }
    if (!g->nodes[i]) {
        g->nodes[i] = calloc(1, sizeof(struct fk_node));
        if (g->nodes[i]) {
            g->nodes[i]->magic = NODE_MAGIC;
            g->nodes[i]->g = g;
            g->nodes[i]->idx = i;
        }
    }
    return g->nodes[i];
}

static const struct fk_op *node_op_locked(CUgraphNode h)
{
    const struct fk_node *n = (const struct fk_node *)h;

    if (!n || n->magic != NODE_MAGIC || !n->g || n->g->magic != GRAPH_MAGIC || n->idx >= n->g->n)
        return NULL;
    return &n->g->ops[n->idx];
}

/* Node h's op when it is of the given type: returned with the lock held
 * (the caller unlocks); NULL (unlocked) when out is NULL, or for another
 * node, or none. */
static const struct fk_op *node_op_typed(CUgraphNode h, int type, const void *out)
{
    const struct fk_op *op;

    if (!out)
        return NULL;
    fk_lock_();
    op = node_op_locked(h);
    if (op && op->type == type)
        return op;
    fk_unlock_();
    return NULL;
}

FK_EXPORT CUresult cuGraphGetNodes(CUgraph hGraph, CUgraphNode *nodes, size_t *numNodes)
{
    FK_ENTER(cuGraphGetNodes);
    if (!hGraph || hGraph->magic != GRAPH_MAGIC || !numNodes)
        return CUDA_ERROR_INVALID_VALUE;
    fk_lock_();
    CUresult r = CUDA_SUCCESS;
    if (nodes) {
        for (size_t i = 0; i < *numNodes; i++) {
            nodes[i] = i < hGraph->n ? (CUgraphNode)node_locked(hGraph, i) : NULL;
            if (i < hGraph->n && !nodes[i])
                r = CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    *numNodes = hGraph->n;
    fk_unlock_();
    return r;
}

FK_EXPORT CUresult cuGraphGetEdges_v2(CUgraph hGraph, CUgraphNode *from, CUgraphNode *to,
                                      CUgraphEdgeData *edgeData, size_t *numEdges)
{
    FK_ENTER(cuGraphGetEdges_v2);
    if (!hGraph || hGraph->magic != GRAPH_MAGIC || !numEdges || (!from) != (!to))
        return CUDA_ERROR_INVALID_VALUE;
    fk_lock_();
    size_t n = hGraph->n ? hGraph->n - 1 : 0;
    CUresult r = CUDA_SUCCESS;
    if (from) {
        for (size_t i = 0; i < *numEdges; i++) {
            from[i] = i < n ? (CUgraphNode)node_locked(hGraph, i) : NULL;
            to[i] = i < n ? (CUgraphNode)node_locked(hGraph, i + 1) : NULL;
            if (edgeData)
                memset(&edgeData[i], 0, sizeof(edgeData[i]));
            if (i < n && (!from[i] || !to[i]))
                r = CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    *numEdges = n;
    fk_unlock_();
    return r;
}

FK_EXPORT CUresult cuGraphNodeGetType(CUgraphNode hNode, CUgraphNodeType *type)
{
    FK_ENTER(cuGraphNodeGetType);
    if (!type)
        return CUDA_ERROR_INVALID_VALUE;
    fk_lock_();
    const struct fk_op *op = node_op_locked(hNode);
    CUresult r = op ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (op)
        *type = op->type == FK_OP_KERNEL  ? CU_GRAPH_NODE_TYPE_KERNEL
                : op->type == FK_OP_COPY  ? CU_GRAPH_NODE_TYPE_MEMCPY
                : op->type == FK_OP_SET   ? CU_GRAPH_NODE_TYPE_MEMSET
                : op->type == FK_OP_ALLOC ? CU_GRAPH_NODE_TYPE_MEM_ALLOC
                : op->type == FK_OP_FREE  ? CU_GRAPH_NODE_TYPE_MEM_FREE
                                          : CU_GRAPH_NODE_TYPE_HOST;
    fk_unlock_();
    return r;
}

FK_EXPORT CUresult cuGraphKernelNodeGetParams_v2(CUgraphNode hNode, CUDA_KERNEL_NODE_PARAMS *p)
{
    FK_ENTER(cuGraphKernelNodeGetParams_v2);
    const struct fk_op *op = node_op_typed(hNode, FK_OP_KERNEL, p);
    struct fk_node *n = (struct fk_node *)hNode;
    if (!op)
        return CUDA_ERROR_INVALID_VALUE;
    memset(p, 0, sizeof(*p));
    p->func = op->k.f;
    p->gridDimX = op->k.grid[0];
    p->gridDimY = op->k.grid[1];
    p->gridDimZ = op->k.grid[2];
    p->blockDimX = op->k.block[0];
    p->blockDimY = op->k.block[1];
    p->blockDimZ = op->k.block[2];
    p->sharedMemBytes = op->k.shmem;
    if (op->k.packed) {
        /* as the driver gives back a launch captured in the extra form */
        n->size = op->k.f->argbytes;
        n->extra[0] = CU_LAUNCH_PARAM_BUFFER_POINTER;
        n->extra[1] = op->k.args;
        n->extra[2] = CU_LAUNCH_PARAM_BUFFER_SIZE;
        n->extra[3] = &n->size;
        n->extra[4] = CU_LAUNCH_PARAM_END;
        p->extra = n->extra;
    } else {
        for (int i = 0; i < op->k.f->nparams; i++)
            n->params[i] = op->k.args + op->k.f->offsets[i];
        p->kernelParams = n->params;
    }
    fk_unlock_();
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuGraphKernelNodeGetAttribute(CUgraphNode hNode, CUkernelNodeAttrID attr,
                                                 CUkernelNodeAttrValue *value)
{
    FK_ENTER(cuGraphKernelNodeGetAttribute);
    const struct fk_op *op = node_op_typed(hNode, FK_OP_KERNEL, value);
    if (!op)
        return CUDA_ERROR_INVALID_VALUE;
    fk_unlock_();
    (void)attr;
    memset(value, 0, sizeof(*value)); /* nothing set: no cluster, not cooperative */
    return CUDA_SUCCESS;
}

/* A copy of the fake is one contiguous range: as a 1-D copy of unified
 * addresses (the real driver gives the memory types it was captured with). */
FK_EXPORT CUresult cuGraphMemcpyNodeGetParams(CUgraphNode hNode, CUDA_MEMCPY3D *p)
{
    FK_ENTER(cuGraphMemcpyNodeGetParams);
    const struct fk_op *op = node_op_typed(hNode, FK_OP_COPY, p);
    if (!op)
        return CUDA_ERROR_INVALID_VALUE;
    memset(p, 0, sizeof(*p));
    p->srcMemoryType = p->dstMemoryType = CU_MEMORYTYPE_UNIFIED;
    p->srcDevice = (CUdeviceptr)(uintptr_t)op->cp.src;
    p->dstDevice = (CUdeviceptr)(uintptr_t)op->cp.dst;
    p->WidthInBytes = op->cp.n;
    p->Height = p->Depth = 1;
    fk_unlock_();
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuGraphMemsetNodeGetParams(CUgraphNode hNode, CUDA_MEMSET_NODE_PARAMS *p)
{
    FK_ENTER(cuGraphMemsetNodeGetParams);
    const struct fk_op *op = node_op_typed(hNode, FK_OP_SET, p);
    if (!op)
        return CUDA_ERROR_INVALID_VALUE;
    memset(p, 0, sizeof(*p));
    p->dst = (CUdeviceptr)(uintptr_t)op->set.dst;
    p->value = op->set.val;
    p->elementSize = op->set.esz;
    p->width = op->set.n;
    p->height = 1;
    fk_unlock_();
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuGraphMemAllocNodeGetParams(CUgraphNode hNode, CUDA_MEM_ALLOC_NODE_PARAMS *p)
{
    FK_ENTER(cuGraphMemAllocNodeGetParams);
    const struct fk_op *op = node_op_typed(hNode, FK_OP_ALLOC, p);
    if (!op)
        return CUDA_ERROR_INVALID_VALUE;
    memset(p, 0, sizeof(*p));
    p->poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    p->poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p->poolProps.location.id = 0;
    p->bytesize = op->mem.size;
    p->dptr = op->mem.dptr;
    fk_unlock_();
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuGraphMemFreeNodeGetParams(CUgraphNode hNode, CUdeviceptr *dptr)
{
    FK_ENTER(cuGraphMemFreeNodeGetParams);
    const struct fk_op *op = node_op_typed(hNode, FK_OP_FREE, dptr);
    if (!op)
        return CUDA_ERROR_INVALID_VALUE;
    *dptr = op->mem.dptr;
    fk_unlock_();
    return CUDA_SUCCESS;
}

static void exec_ops_free(struct CUgraphExec_st *e)
{
    for (size_t i = 0; i < e->n; i++)
        op_free(&e->ops[i]);
    free(e->ops);
    e->ops = NULL;
    e->n = 0;
}

/* The exec takes g's ops when g has as many of the same types (the real
 * driver's topology rule, as the fake can tell it); else
 * CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE and the exec is unchanged. */
FK_EXPORT CUresult cuGraphExecUpdate_v2(CUgraphExec hGraphExec, CUgraph hGraph,
                                        CUgraphExecUpdateResultInfo *resultInfo)
{
    FK_ENTER(cuGraphExecUpdate_v2);
    if (!hGraphExec || hGraphExec->magic != EXEC_MAGIC || !hGraph || hGraph->magic != GRAPH_MAGIC)
        return CUDA_ERROR_INVALID_VALUE;
    if (resultInfo)
        memset(resultInfo, 0, sizeof(*resultInfo));
    fk_lock_();
    bool same = hGraph->n == hGraphExec->n;
    for (size_t i = 0; same && i < hGraph->n; i++)
        same = hGraph->ops[i].type == hGraphExec->ops[i].type;
    if (!same) {
        fk_unlock_();
        if (resultInfo)
            resultInfo->result = CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED;
        return CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
    }
    struct fk_op *ops = calloc(hGraph->n ? hGraph->n : 1, sizeof(*ops));
    size_t n = 0;
    CUresult r = ops ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
    for (; n < hGraph->n && r == CUDA_SUCCESS; n++)
        r = op_copy(&ops[n], &hGraph->ops[n]);
    if (r != CUDA_SUCCESS) {
        for (size_t i = 0; i + 1 < n; i++)
            op_free(&ops[i]);
        free(ops);
        fk_unlock_();
        return r;
    }
    exec_ops_free(hGraphExec);
    hGraphExec->ops = ops;
    hGraphExec->n = n;
    fk_unlock_();
    if (resultInfo)
        resultInfo->result = CU_GRAPH_EXEC_UPDATE_SUCCESS;
    return CUDA_SUCCESS;
}

/* Node hNode of the exec's graph gets new parameters in the exec only. */
FK_EXPORT CUresult cuGraphExecKernelNodeSetParams_v2(CUgraphExec hGraphExec, CUgraphNode hNode,
                                                     const CUDA_KERNEL_NODE_PARAMS *p)
{
    FK_ENTER(cuGraphExecKernelNodeSetParams_v2);
    if (!hGraphExec || hGraphExec->magic != EXEC_MAGIC || !p)
        return CUDA_ERROR_INVALID_VALUE;
    fk_lock_();
    const struct fk_node *n = (const struct fk_node *)hNode;
    struct fk_op *op = n && n->magic == NODE_MAGIC && n->idx < hGraphExec->n
                           ? &hGraphExec->ops[n->idx]
                           : NULL;
    CUresult r = op && op->type == FK_OP_KERNEL && p->func == op->k.f && p->kernelParams
                     ? CUDA_SUCCESS
                     : CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS) {
        for (int i = 0; i < op->k.f->nparams; i++)
            memcpy(op->k.args + op->k.f->offsets[i], p->kernelParams[i], op->k.f->sizes[i]);
        op->k.grid[0] = p->gridDimX;
        op->k.grid[1] = p->gridDimY;
        op->k.grid[2] = p->gridDimZ;
        op->k.block[0] = p->blockDimX;
        op->k.block[1] = p->blockDimY;
        op->k.block[2] = p->blockDimZ;
        op->k.shmem = p->sharedMemBytes;
    }
    fk_unlock_();
    return r;
}

/* --- fakecuda_* launch queries ------------------------------------------- */

FK_EXPORT uint64_t fakecuda_launches_run(void)
{
    return atomic_load(&runs_total);
}

FK_EXPORT uint64_t fakecuda_launches_captured(void)
{
    return atomic_load(&captured_total);
}

FK_EXPORT int fakecuda_last_launch(struct fakecuda_launch *out)
{
    fk_lock_();
    bool have = have_last;
    if (have && out)
        *out = last_launch;
    fk_unlock_();
    return have ? 0 : -ENOENT;
}

FK_EXPORT uint64_t fakecuda_dead_stream_uses(void)
{
    return dead_stream_uses;
}

FK_EXPORT int fakecuda_capturing(void)
{
    fk_lock_();
    int n = nactive;
    fk_unlock_();
    return n;
}

FK_EXPORT long fakecuda_graph_ops(CUgraph g)
{
    return g && g->magic == GRAPH_MAGIC ? (long)g->n : -EINVAL;
}

FK_EXPORT long fakecuda_graph_exec_ops(CUgraphExec e)
{
    return e && e->magic == EXEC_MAGIC ? (long)e->n : -EINVAL;
}

FK_EXPORT void fakecuda_reset(void)
{
    fakecuda_reset_counts();
    fk_mem_reset_stats();
    atomic_store(&launch_seq, 0);
    atomic_store(&runs_total, 0);
    atomic_store(&captured_total, 0);
    fk_lock_();
    have_last = false;
    fk_unlock_();
}
