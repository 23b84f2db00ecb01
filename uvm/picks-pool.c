/* uvm/picks-pool.c: the picked copies' device buffers, one pool shared by
 * the engine's streams (uvm/picks-pool.h). */
#include "uvm/picks-pool.h"

#include <string.h>

#include "core/macro.h"
#include "uvm/internal.h"
#include "uvm/picks-dma.h"
#include "uvm/uvm.h"

static struct {
    struct wo_pool_strm st[WO_PICKS_STREAMS];
    uint64_t tick;
    uint64_t bytes;   /* the buffers' device bytes */
    uint64_t largest; /* the largest need seen */
    unsigned nb;      /* entries a stream, as last asked */
    CUevent ev;       /* lending's, recorded and waited on at once */
    bool no_event;    /* none could be made: nothing is lent */
    uint64_t lent, reclaimed;
} pool;

static __thread struct wo_pool_strm *issuing_t;
static __thread uint64_t thread_no; /* this thread's number, 0 before it needs one */
static uint64_t threads;            /* numbers given (atomic) */

static uint64_t self_no(void)
{
    if (!thread_no)
        thread_no = __atomic_add_fetch(&threads, 1, __ATOMIC_RELAXED);
    return thread_no;
}

struct wo_pool_strm *wo_pool_stream(uint64_t stream)
{
    struct wo_pool_strm *free_one = NULL;
    bool pt = stream == (uint64_t)(uintptr_t)CU_STREAM_PER_THREAD;
    uint64_t self = pt ? self_no() : 0;

    for (unsigned k = 0; k < WO_PICKS_STREAMS; k++) {
        if (pool.st[k].used && pool.st[k].stream == stream &&
            (!pt || pool.st[k].thread == self))
            return &pool.st[k];
        if (!pool.st[k].used && !free_one)
            free_one = &pool.st[k];
    }
    if (free_one) {
        free_one->used = true;
        free_one->stream = stream;
        free_one->thread = self;
    }
    return free_one;
}

unsigned wo_pool_index(const struct wo_pool_strm *t)
{
    return (unsigned)(t - pool.st);
}

/* Another stream's buffer that t may have: the least recently used, of at
 * least need bytes when big (else any). A stream's between a staging and
 * its launch call is not (an event recorded now would not cover that
 * launch), nor a per-thread default stream's unless pt_ok (to be freed
 * after a wait for the whole context): that handle names the calling
 * thread's stream, so an event recorded on it here would too. */
static bool per_thread(const struct wo_pool_strm *o)
{
    return o->used && o->stream == (uint64_t)(uintptr_t)CU_STREAM_PER_THREAD;
}

static struct wo_pool_buf *other(const struct wo_pool_strm *t, uint64_t need, bool big,
                                 bool pt_ok, struct wo_pool_strm **owner)
{
    struct wo_pool_buf *best = NULL;

    for (unsigned k = 0; k < WO_PICKS_STREAMS; k++) {
        struct wo_pool_strm *o = &pool.st[k];
        if (o == t ||
            (o->used && (__atomic_load_n(&o->issuing, __ATOMIC_SEQ_CST) ||
                         (per_thread(o) && !pt_ok))))
            continue;
        for (unsigned j = 0; j < WO_PICKS_BUFS; j++) {
            struct wo_pool_buf *x = &o->b[j];
            if (x->dev && (!big || x->size >= need) && (!best || x->tick < best->tick)) {
                best = x;
                *owner = o;
            }
        }
    }
    return best;
}

/* x's early copy (wo_pool_buf.later) waited for: on o's stream (a use
 * enqueued there next comes after it), or on the host (host, for a free:
 * the copy thread may not have issued it yet when the streams are done). */
static bool settle(const struct wo_driver *d, const struct wo_pool_strm *o, struct wo_pool_buf *x,
                   bool host)
{
    if (!x->later)
        return true;
    if (!(host ? wo_dma_done(wo_pool_index(o), x->later)
               : wo_dma_wait(d, wo_pool_index(o), (CUstream)(uintptr_t)o->stream, x->later)))
        return false;
    x->later = 0;
    return true;
}

/* x (of stream o) freed once o's stream is done with it (a host wait: o's
 * launches may still read it; a stream gone was waited for; another
 * thread's per-thread stream, the whole context). */
static bool drop(const struct wo_driver *d, const struct wo_pool_strm *o, struct wo_pool_buf *x,
                 int64_t *delta)
{
    if (!settle(d, o, x, true))
        return false;
    /* another thread's per-thread stream cannot be named here: the
     * context's work done covers it (a thread gone keeps its entry) */
    if (per_thread(o) && o->thread != self_no()) {
        if (!d->cuCtxSynchronize || d->cuCtxSynchronize() != CUDA_SUCCESS)
            return false;
    } else if (o->used &&
               d->cuStreamSynchronize((CUstream)(uintptr_t)o->stream) != CUDA_SUCCESS) {
        return false;
    }
    wo_quiet_mem_free(d, x->dev);
    pool.bytes -= x->size;
    *delta -= (int64_t)x->size;
    x->dev = 0;
    x->size = 0;
    x->span = -1;
    return true;
}

/* x (of stream o) goes to b of t: t's stream waits for what o's stream
 * queued so far (a free entry's stream is gone: its work was waited for).
 * b's own smaller buffer, if any, goes to x the same way the other
 * direction: o's stream waits for what t's queued so far, so o's later
 * copies into it come after t's reads (transformers' gate_up and down
 * tensors, 768 and 384 MiB on the 128-expert shape, trade places so with no
 * host wait). To a free entry it cannot (the next stream that takes the
 * entry would not wait): freed once t's stream is done with it. */
static bool lend(const struct wo_driver *d, struct wo_pool_strm *o, struct wo_pool_buf *x,
                 struct wo_pool_strm *t, struct wo_pool_buf *b, int64_t *delta)
{
    CUdeviceptr mine = b->dev;
    uint64_t mine_size = b->size;

    /* an unused entry's early copy was waited for when its stream went */
    if ((o->used && !settle(d, o, x, false)) || !settle(d, t, b, false))
        return false;
    if (o->used) {
        if (pool.no_event || !d->cuEventCreate || !d->cuEventRecord || !d->cuStreamWaitEvent)
            return false;
        if (!pool.ev && d->cuEventCreate(&pool.ev, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) {
            pool.ev = NULL;
            pool.no_event = true;
            return false;
        }
    } else if (b->dev) {
        if (!drop(d, t, b, delta))
            return false;
        mine = 0;
        mine_size = 0;
    }
    b->span = -1;
    if (o->used &&
        (d->cuEventRecord(pool.ev, (CUstream)(uintptr_t)o->stream) != CUDA_SUCCESS ||
         d->cuStreamWaitEvent((CUstream)(uintptr_t)t->stream, pool.ev, 0) != CUDA_SUCCESS ||
         (mine &&
          (d->cuEventRecord(pool.ev, (CUstream)(uintptr_t)t->stream) != CUDA_SUCCESS ||
           d->cuStreamWaitEvent((CUstream)(uintptr_t)o->stream, pool.ev, 0) != CUDA_SUCCESS))))
        return false;
    b->dev = x->dev;
    b->size = x->size;
    x->dev = mine;
    x->size = mine_size;
    x->span = -1;
    pool.lent++;
    return true;
}

/* t's least recently used entry of the first nb not in taken, -1 none. */
static int lru(const struct wo_pool_strm *t, unsigned nb, unsigned taken)
{
    int b = -1;

    for (unsigned k = 0; k < nb; k++)
        if (!(taken & 1u << k) && (b < 0 || t->b[k].tick < t->b[b].tick))
            b = (int)k;
    return b;
}

/* The least recently used of t's nb entries not in taken that holds need
 * bytes; -1 none. */
static int fitting(const struct wo_pool_strm *t, unsigned nb, unsigned taken, uint64_t need)
{
    int b = -1;

    for (unsigned k = 0; k < nb; k++)
        if (!(taken & 1u << k) && t->b[k].dev && t->b[k].size >= need &&
            (b < 0 || t->b[k].tick < t->b[b].tick))
            b = (int)k;
    return b;
}

struct wo_pool_buf *wo_pool_buffer(const struct wo_driver *d, struct wo_pool_strm *t, int span,
                                   uint32_t seq, uint64_t need, unsigned nb, unsigned taken,
                                   bool *fresh, int64_t *delta, CUresult *alloc)
{
    struct wo_pool_buf *b, *x;
    struct wo_pool_strm *o = NULL;

    *fresh = false;
    *delta = 0;
    *alloc = CUDA_SUCCESS;
    pool.nb = nb;
    pool.largest = WO_MAX(pool.largest, need);
    for (unsigned k = 0; k < nb; k++)
        if (t->b[k].span == span && t->b[k].seq == seq && t->b[k].dev)
            return settle(d, t, &t->b[k], false) ? &t->b[k] : NULL;
    int l = lru(t, nb, taken);
    if (l < 0 || !settle(d, t, b = &t->b[l], false))
        return NULL;
    *fresh = true;
    if (b->size >= need)
        return b;
    /* another of its own that holds the bytes already, the least recently
     * used of those, before b grows or the pool lends: growing frees b and
     * allocates (a host wait mid-step), and takes the pool to twice the
     * larger tensor (a 768 MiB gate_up given the 384 MiB buffer of a down
     * while the 768 MiB one was free, some tensors read in place). An empty
     * entry is made while the pool has room: the stream's second buffer is
     * what early copies fill while a launch reads the first. */
    bool full = pool.bytes - b->size + need > nb * pool.largest;
    if ((b->dev || full) && (l = fitting(t, nb, taken, need)) >= 0)
        return settle(d, t, &t->b[l], false) ? &t->b[l] : NULL;
    /* a lend or an allocation would land in a capture's graph */
    if (__atomic_load_n(&wo_captures_live, __ATOMIC_SEQ_CST))
        return NULL;
    if (full) {
        /* the pool full, none of its own large enough: a lend */
        if ((x = other(t, need, true, false, &o)))
            return lend(d, o, x, t, b, delta) ? b : NULL;
        /* none large enough, or only per-thread streams' (a thread that
         * ended keeps its entry): those make room */
        while (pool.bytes - b->size + need > nb * pool.largest &&
               (x = other(t, need, false, true, &o)))
            if (drop(d, o, x, delta))
                pool.reclaimed++; /* a host wait: rare (sizes, per-thread streams) */
            else
                return NULL;
        if (pool.bytes - b->size + need > nb * pool.largest)
            return NULL;
    }
    /* launches of this stream may still read it: this stream only ever
     * reads it, so its work done is the buffer free */
    if (b->dev && !drop(d, t, b, delta))
        return NULL;
    *alloc = d->cuMemAlloc_v2(&b->dev, need);
    if (*alloc != CUDA_SUCCESS) {
        b->dev = 0;
        return NULL;
    }
    b->size = need;
    b->span = -1;
    pool.bytes += need;
    *delta += (int64_t)need;
    return b;
}

bool wo_pool_room(const struct wo_pool_strm *t, uint64_t need, unsigned nb, unsigned taken)
{
    int k = lru(t, nb, taken);

    return k >= 0 && t->b[k].dev && fitting(t, nb, taken, need) >= 0;
}

void wo_pool_forget_span(int span)
{
    for (unsigned k = 0; k < WO_PICKS_STREAMS; k++)
        for (unsigned b = 0; b < WO_PICKS_BUFS; b++)
            if (pool.st[k].b[b].span == span)
                pool.st[k].b[b].span = -1;
}

void wo_pool_forget_all(void)
{
    for (unsigned k = 0; k < WO_PICKS_STREAMS; k++)
        for (unsigned b = 0; b < WO_PICKS_BUFS; b++)
            pool.st[k].b[b].span = -1;
}

bool wo_pool_stream_gone(const struct wo_driver *d, uint64_t stream)
{
    bool was = false;

    for (unsigned k = 0; k < WO_PICKS_STREAMS; k++) {
        struct wo_pool_strm *t = &pool.st[k];
        bool held = false;

        if (!t->used || t->stream != stream)
            continue;
        for (unsigned b = 0; b < WO_PICKS_BUFS; b++) {
            held |= t->b[b].dev != 0;
            t->b[b].span = -1;
            if (d)
                (void)settle(d, t, &t->b[b], true);
            t->b[b].later = 0;
        }
        if (held && d && d->cuStreamSynchronize)
            (void)d->cuStreamSynchronize((CUstream)(uintptr_t)stream);
        t->used = false;
        t->stream = 0;
        was = true;
    }
    return was;
}

void wo_pool_sync_all(const struct wo_driver *d)
{
    bool whole = false;

    for (unsigned k = 0; k < WO_PICKS_STREAMS; k++) {
        if (!pool.st[k].used)
            continue;
        for (unsigned b = 0; b < WO_PICKS_BUFS; b++)
            (void)settle(d, &pool.st[k], &pool.st[k].b[b], true);
        /* another thread's per-thread stream cannot be named from here */
        if (pool.st[k].stream == (uint64_t)(uintptr_t)CU_STREAM_PER_THREAD &&
            pool.st[k].thread != self_no())
            whole = true;
        else
            (void)d->cuStreamSynchronize((CUstream)(uintptr_t)pool.st[k].stream);
    }
    if (whole && d->cuCtxSynchronize)
        (void)d->cuCtxSynchronize();
}

void wo_pool_issuing(struct wo_pool_strm *t)
{
    __atomic_add_fetch(&t->issuing, 1, __ATOMIC_SEQ_CST);
    issuing_t = t;
}

void wo_pool_issued(void)
{
    if (!issuing_t)
        return;
    __atomic_sub_fetch(&issuing_t->issuing, 1, __ATOMIC_SEQ_CST);
    issuing_t = NULL;
}

void wo_pool_figs(struct wo_pool_figs *f)
{
    f->bytes = pool.bytes;
    f->cap = (uint64_t)WO_MAX(pool.nb, 1u) * pool.largest;
    f->lent = pool.lent;
    f->reclaimed = pool.reclaimed;
}

void wo_pool_free(const struct wo_driver *d)
{
    for (unsigned k = 0; k < WO_PICKS_STREAMS; k++)
        for (unsigned b = 0; b < WO_PICKS_BUFS; b++)
            if (pool.st[k].b[b].dev && d->cuMemFree_v2 &&
                settle(d, &pool.st[k], &pool.st[k].b[b], true))
                d->cuMemFree_v2(pool.st[k].b[b].dev);
    if (pool.ev && d->cuEventDestroy_v2)
        d->cuEventDestroy_v2(pool.ev);
    pool.ev = NULL;
}

void wo_pool_reset(void)
{
    memset(&pool, 0, sizeof(pool));
    issuing_t = NULL;
}
