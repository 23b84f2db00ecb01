/* preload/redirect.c: launch redirection (see redirect.h and uvm/hotpath.h).
 *
 * A launch whose scan found a pointer into a range the streaming executor
 * has staged into a device slot reads the slot instead: the hook pins the
 * slot (in-flight counter), re-reads the assignment (the executor
 * unpublishes before it waits for in-flight to fall, both seq_cst, so one
 * of them sees the other), claims the slot for its stream (one engine
 * stream per slot and assignment: read_done then covers every read), makes
 * the stream wait for the staging copy, launches with the pointer words
 * moved into the slot, and records read_done after it. Anything unexpected
 * reads in place, which is always correct: the host copy is the truth.
 *
 * WOFFLOAD_STREAM_CHECK=1 (wo_redirect_check) is the debugging aid for
 * the claim that a slot holds its range's bytes while a launch reads it. */
#include "preload/redirect.h"

#include <stdlib.h>
#include <string.h>

#include "core/kernel-name.h"
#include "core/log.h"
#include "core/settings.h"
#include "preload/hook.h"
#include "uvm/hotpath.h"

static void count(uint64_t *c)
{
    __atomic_add_fetch(c, 1, __ATOMIC_RELAXED);
}

static void release(unsigned slot)
{
    __atomic_sub_fetch(&wo_stream_tab.slot[slot].inflight, 1, __ATOMIC_RELEASE);
}

void wo_redirect_cancel(struct wo_redirect *rd)
{
    for (unsigned i = 0; i < rd->nslot; i++) {
        release(rd->slot[i]);
        count(&wo_stream_tab.n.inplace_other);
    }
    rd->n = rd->nslot = 0;
}

void wo_redirect_add(struct wo_redirect *rd, uint64_t from, uint64_t to, uint64_t dev,
                     uint64_t row)
{
    if (rd->n == WO_REDIRECT_MAX)
        return;
    rd->slot[rd->n] = UINT32_MAX;
    rd->from[rd->n] = from;
    rd->to[rd->n] = to;
    rd->dev[rd->n] = dev;
    rd->row[rd->n] = row;
    rd->n++;
}

/* The engine's context must be the slots': a launch on another device (or
 * context) cannot read them. One driver call, a thread-local read in it. */
static bool same_context(void)
{
    const struct wo_real *r = wo_real_driver_peek();
    CUresult (*get)(CUcontext *) = r ? (CUresult(*)(CUcontext *))r->cuCtxGetCurrent : NULL;
    CUcontext c = NULL;

    return get && get(&c) == CUDA_SUCCESS && c &&
           c == __atomic_load_n(&wo_stream_tab.ctx, __ATOMIC_ACQUIRE);
}

/* Pins the slot of entry e for this launch; false: read it in place. */
static bool pin(struct wo_redirect *rd, struct wo_stream_entry *e, const struct wo_ev_hit *h,
                uint64_t stream)
{
    uint64_t w = __atomic_load_n(&e->word, __ATOMIC_ACQUIRE), owner, expect = 0;
    unsigned slot = wo_stream_word_slot(w);
    struct wo_stream_slot *s;
    uint64_t base, lo, hi;

    if (w == 0 || slot >= WO_STREAM_MAX_SLOTS || wo_stream_word_gen(w) != h->gen) {
        count(&wo_stream_tab.n.inplace_no_slot);
        return false;
    }
    s = &wo_stream_tab.slot[slot];
    __atomic_add_fetch(&s->inflight, 1, __ATOMIC_SEQ_CST);
    /* a read after a departure fence: that fence no longer covers it */
    __atomic_add_fetch(&s->pins, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&e->word, __ATOMIC_SEQ_CST) != w) {
        release(slot);
        count(&wo_stream_tab.n.inplace_no_slot);
        return false;
    }
    /* stable while the word is: the executor changes them only unpublished */
    base = __atomic_load_n(&e->base, __ATOMIC_RELAXED);
    lo = __atomic_load_n(&e->lo, __ATOMIC_RELAXED);
    hi = __atomic_load_n(&e->hi, __ATOMIC_RELAXED);
    if (h->hi <= lo || h->offset >= hi) {
        /* the launch reads another part of the allocation: nothing to move */
        release(slot);
        return false;
    }
    if (wo_stream_blind_since(e)) {
        /* staged before a launch that may have written the range unseen
         * (uvm/hotpath.h, blind launches): read in place; the executor
         * stages it again after that launch */
        release(slot);
        count(&wo_stream_tab.n.inplace_no_slot);
        return false;
    }
    owner = stream + 1;
    if (!__atomic_compare_exchange_n(&s->owner, &expect, owner, false, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE) &&
        expect != owner) {
        release(slot);
        count(&wo_stream_tab.n.inplace_other);
        return false;
    }
    rd->slot[rd->n] = slot;
    rd->from[rd->n] = base + lo;
    rd->to[rd->n] = base + hi;
    rd->dev[rd->n] = __atomic_load_n(&s->dev, __ATOMIC_RELAXED);
    rd->row[rd->n] = 0;
    rd->n++;
    return true;
}

/* One span e (sid) that hit h can read: where the engine is, and its slot
 * pinned for the launch when one is published. False: the launch must not
 * be redirected at all (another context). */
static bool redirect_span(struct wo_redirect *rd, struct wo_stream_entry *e, uint32_t sid,
                          const struct wo_ev_hit *h, uint64_t stream, bool captured,
                          bool *ctx_checked)
{
    uint64_t at;
    bool dup = false;

    /* a hit outside the streamed span (an activation the engine's
     * allocator put in the allocation's tail), or a word that cannot
     * point at a weight, is neither the engine's position nor a read
     * to move (the span is fixed while streamed) */
    if (!wo_stream_hit_in_span(e, h, true))
        return true;
    /* where the engine is: the executor stages the ranges after it */
    wo_stream_publish_pos(sid, stream, captured, wo_hook_evfns);
    if (captured) {
        /* a graph replays its launches later, without this hook: its
         * nodes read in place (correct, slower) */
        count(&wo_stream_tab.n.inplace_captured);
        return true;
    }
    if (!__atomic_load_n(&e->word, __ATOMIC_RELAXED) && !wo_stream_await(e, h->gen)) {
        /* not staged (yet), or claimed read in place (woffload_read_in_place) */
        count(wo_stream_inplace_now(e) ? &wo_stream_tab.n.inplace_claimed
                                       : &wo_stream_tab.n.inplace_no_slot);
        return true;
    }
    if (rd->n == WO_REDIRECT_MAX / 2) {
        count(&wo_stream_tab.n.inplace_other);
        return true;
    }
    if (!*ctx_checked) {
        if (!same_context()) {
            count(&wo_stream_tab.n.inplace_other);
            return false;
        }
        *ctx_checked = true;
    }
    at = __atomic_load_n(&e->base, __ATOMIC_RELAXED) + __atomic_load_n(&e->lo, __ATOMIC_RELAXED);
    for (unsigned k = 0; k < rd->n; k++)
        dup |= rd->from[k] <= at && at < rd->to[k];
    if (!dup)
        pin(rd, e, h, stream);
    return true;
}

unsigned wo_redirect_begin(struct wo_redirect *rd, const struct wo_ev_hit *hits, unsigned nhits,
                           uint64_t stream, bool captured)
{
    bool ctx_checked = false;

    rd->n = rd->nslot = 0;
    if (!__atomic_load_n(&wo_stream_tab.active, __ATOMIC_ACQUIRE))
        return 0;
    for (unsigned i = 0; i < nhits && i < WO_EV_MAX_HITS; i++) {
        struct wo_stream_entry *e;
        uint32_t it = 0, sid;

        /* each span of the allocation the hit can read: its one span, or
         * the sub-spans of a buffer of many tensors (uvm/hotpath.h) */
        while ((e = wo_stream_span_next(&hits[i], &it, &sid)))
            if (!redirect_span(rd, e, sid, &hits[i], stream, captured, &ctx_checked)) {
                wo_redirect_cancel(rd);
                return 0;
            }
    }
    rd->nslot = rd->n;
    return rd->n;
}

/* The parameter slots (function, word) in which a picked move found a
 * word at an expert past a tensor's base, and whether they have held
 * another value since (wo_redirect_add). Open addressing, no lock (engine
 * threads; a fork may come at any time): an entry is claimed by its key,
 * then filled, then published; one not yet published counts as constant.
 * Full, a new slot counts as constant (the word keeps its value: read in
 * place, correct). */
#define SLOTS 4096u

struct pslot {
    uint64_t key; /* 0: free; claimed by compare-and-swap */
    uint32_t w;
    uint32_t ready; /* w and v written */
    uint64_t v;     /* the first value seen */
    uint32_t varied;
};
static struct pslot pslots[SLOTS];

static bool slot_varied(uint64_t key, uint32_t w, uint64_t v)
{
    unsigned h = (unsigned)(((key ^ ((uint64_t)w << 48)) * UINT64_C(0x9e3779b97f4a7c15)) >> 52);

    for (unsigned k = 0; k < SLOTS; k++) {
        struct pslot *s = &pslots[(h + k) % SLOTS];
        uint64_t have = __atomic_load_n(&s->key, __ATOMIC_ACQUIRE), none = 0;

        if (have == key) {
            if (!__atomic_load_n(&s->ready, __ATOMIC_ACQUIRE))
                return false; /* being filled: its word is not known yet */
            if (s->w != w)
                continue;
            if (s->v != v)
                __atomic_store_n(&s->varied, 1, __ATOMIC_RELAXED);
            return __atomic_load_n(&s->varied, __ATOMIC_RELAXED) != 0;
        }
        if (have)
            continue;
        if (!__atomic_compare_exchange_n(&s->key, &none, key, false, __ATOMIC_ACQ_REL,
                                         __ATOMIC_ACQUIRE)) {
            if (none != key)
                continue; /* another key took it: probe on */
            return false; /* the same key, being filled */
        }
        s->w = w;
        s->v = v;
        __atomic_store_n(&s->ready, 1, __ATOMIC_RELEASE);
        return false;
    }
    return false;
}

/* The move word v (word w of the launch's parameters) takes (its index),
 * or -1: it points into a moved range, aligned as a weight pointer is
 * (another word that happens to fall in the range keeps its value,
 * core/event.h), and for a picked buffer at an expert, past the base only
 * from a slot that has held another value (wo_redirect_add). said: count a
 * word so left (once per word: the second pass asks again). */
static int move_of(const struct wo_redirect *rd, uint64_t v, uint32_t w, bool said)
{
    if (!wo_ptr_aligned(v))
        return -1;
    for (unsigned k = 0; k < rd->n; k++) {
        uint64_t off = v - rd->from[k];
        if (v < rd->from[k] || v >= rd->to[k])
            continue;
        if (!rd->row[k] || off == 0)
            return (int)k;
        if (off % rd->row[k])
            return -1;
        if (slot_varied(rd->key, w, v))
            return (int)k;
        if (said)
            __atomic_add_fetch(&wo_picks_const_words, 1, __ATOMIC_RELAXED);
        return -1;
    }
    return -1;
}

/* Moves one 8-byte word (word w) into its slot or buffer when it has a move. */
static bool move_word(const struct wo_redirect *rd, unsigned char *p, uint32_t w)
{
    uint64_t v;
    int k;

    memcpy(&v, p, sizeof(v));
    if ((k = move_of(rd, v, w, false)) < 0)
        return false;
    v = rd->dev[k] + (v - rd->from[k]);
    memcpy(p, &v, sizeof(v));
    return true;
}

static bool points_in(const struct wo_redirect *rd, const unsigned char *p, uint32_t w)
{
    uint64_t v;

    memcpy(&v, p, sizeof(v));
    return move_of(rd, v, w, true) >= 0;
}

void **wo_redirect_params(const struct wo_redirect *rd, void **params, const uint16_t *sizes,
                          int nparams, uint32_t max_words, const uint64_t *notptr,
                          struct wo_redirect_buf *b)
{
    size_t used = 0;
    uint32_t words = 0;

    if (!params || nparams <= 0 || nparams > WO_REDIRECT_PARAMS)
        return NULL;
    for (int i = 0; i < nparams; i++) {
        const unsigned char *src = params[i];
        bool hit = false;
        uint32_t w0 = words;

        b->params[i] = params[i];
        if (sizes[i] < 8 || !src)
            continue;
        /* the same words the scan read (launch.c: scan_bytes) */
        for (size_t off = 0; off + 8 <= sizes[i] && words < max_words; off += 8, words++)
            hit |= !wo_notptr_word(notptr, words) && points_in(rd, src + off, words);
        if (!hit)
            continue;
        used = (used + 15) & ~(size_t)15;
        if (used + sizes[i] > sizeof(b->bytes))
            return NULL;
        memcpy(b->bytes + used, src, sizes[i]);
        words = w0;
        for (size_t off = 0; off + 8 <= sizes[i] && words < max_words; off += 8, words++)
            if (!wo_notptr_word(notptr, words))
                move_word(rd, b->bytes + used + off, words);
        b->params[i] = b->bytes + used;
        used += sizes[i];
    }
    return b->params;
}

void **wo_redirect_extra(const struct wo_redirect *rd, void **extra, struct wo_redirect_buf *b)
{
    const void *buf;
    size_t size;

    wo_launch_extra(extra, &buf, &size);
    if (!buf || size > sizeof(b->bytes))
        return NULL;
    memcpy(b->bytes, buf, size);
    for (size_t off = 0; off + 8 <= size; off += 8)
        move_word(rd, b->bytes + off, (uint32_t)(off / 8));
    b->extra_size = size;
    b->extra[0] = CU_LAUNCH_PARAM_BUFFER_POINTER;
    b->extra[1] = b->bytes;
    b->extra[2] = CU_LAUNCH_PARAM_BUFFER_SIZE;
    b->extra[3] = &b->extra_size;
    b->extra[4] = CU_LAUNCH_PARAM_END;
    return b->extra;
}

bool wo_redirect_wait(struct wo_redirect *rd, uint64_t stream)
{
    const struct wo_real *r = wo_real_driver_peek();
    CUresult (*wait)(CUstream, CUevent, unsigned) =
        r ? (CUresult(*)(CUstream, CUevent, unsigned))r->cuStreamWaitEvent : NULL;

    for (unsigned i = 0; i < rd->nslot; i++) {
        CUevent ev = wo_stream_tab.slot[rd->slot[i]].copied;
        if (!wait || wait((CUstream)(uintptr_t)stream, ev, 0) != CUDA_SUCCESS) {
            wo_redirect_cancel(rd);
            return false;
        }
    }
    return true;
}

void wo_redirect_end(struct wo_redirect *rd, uint64_t stream)
{
    const struct wo_real *r = wo_real_driver_peek();
    CUresult (*rec)(CUevent, CUstream) =
        r ? (CUresult(*)(CUevent, CUstream))r->cuEventRecord : NULL;

    for (unsigned i = 0; i < rd->nslot; i++) {
        struct wo_stream_slot *s = &wo_stream_tab.slot[rd->slot[i]];
        /* The executor waits for read_done before it reuses the slot. A
         * failed record (not expected on a stream that just took a launch)
         * keeps the slot pinned for good: never reused, never overwritten
         * under a kernel that may still read it. */
        if (!rec || rec(s->read_done, (CUstream)(uintptr_t)stream) != CUDA_SUCCESS) {
            wo_log_once(WO_LOG_WARN, "stream: cannot record a slot's read event: the slot is "
                                     "retired (its ranges are read in place)");
            continue;
        }
        release(rd->slot[i]);
    }
    if (rd->nslot)
        count(&wo_stream_tab.n.redirected);
    rd->n = rd->nslot = 0;
}

void wo_hook_evfns(struct wo_stream_evfns *fn)
{
    const struct wo_real *r = wo_real_driver_peek();

    fn->create = r ? (CUresult(*)(CUevent *, unsigned))r->cuEventCreate : NULL;
    fn->destroy = r ? (CUresult(*)(CUevent))r->cuEventDestroy_v2 : NULL;
    fn->record = r ? (CUresult(*)(CUevent, CUstream))r->cuEventRecord : NULL;
}

void wo_hook_blind_end(uint64_t stream)
{
    struct wo_stream_evfns fn;

    wo_hook_evfns(&fn);
    wo_stream_blind_end(stream, &fn);
}

/* ---- WOFFLOAD_STREAM_CHECK ------------------------------------------------ */

#define CHECK_CHUNK (256u << 10) /* bytes compared at a time */
#define CHECK_CHUNKS 32u         /* chunks compared per slot, spread over the range */
#define CHECK_SAY 16             /* mismatches told, then only counted */
#define CHECK_KERNELS 128        /* kernels named the first time they are redirected */

static uint64_t check_seen[CHECK_KERNELS];

static const char *kernel_name(uint64_t key, char *buf, size_t len)
{
    const struct wo_real *r = wo_real_driver_peek();
    CUresult (*get)(const char **, CUfunction) =
        r ? (CUresult(*)(const char **, CUfunction))r->cuFuncGetName : NULL;
    const char *name = NULL;

    if (!(key & WO_LAUNCH_KEY_RUNTIME) && get &&
        get(&name, (CUfunction)(uintptr_t)key) != CUDA_SUCCESS)
        name = NULL;
    return wo_kernel_name(key, name, buf, len);
}

/* Says once per kernel that it was redirected (the kernels that read the
 * slots, for the one reading the log). */
static void name_once(uint64_t key, const struct wo_redirect *rd)
{
    char buf[512];

    for (unsigned i = 0; i < CHECK_KERNELS; i++) {
        uint64_t k = __atomic_load_n(&check_seen[i], __ATOMIC_ACQUIRE), z = 0;
        if (k == key)
            return;
        if (k == 0 && __atomic_compare_exchange_n(&check_seen[i], &z, key, false, __ATOMIC_ACQ_REL,
                                                  __ATOMIC_ACQUIRE)) {
            wo_info("stream check: redirected kernel %s (%u slot%s)",
                    kernel_name(key, buf, sizeof(buf)), rd->n, rd->n == 1 ? "" : "s");
            return;
        }
        if (__atomic_load_n(&check_seen[i], __ATOMIC_ACQUIRE) == key)
            return;
    }
}

#define CHECK_EXPERTS 16             /* picked experts compared per buffer */
#define CHECK_IDS_BYTES (1u << 20)   /* ids read back at most */

typedef CUresult (*dtoh_fn)(void *, CUdeviceptr, size_t);

/* The experts the registration picks, as flags (NULL: the ids could not be
 * read back, or they are too many to read). */
static unsigned char *picked_experts(const struct wo_picks_reg *g, dtoh_fn dtoh)
{
    /* ids in rows (woffload_moe_picks_rows), or flat (per_row 0) */
    uint64_t pr = g->per_row ? g->per_row : g->n_ids, st = g->per_row ? g->stride : g->n_ids;
    uint64_t last = (g->n_ids - 1) / pr * st + (g->n_ids - 1) % pr;
    uint64_t bytes = (last + 1) * g->width;
    unsigned char *ids = bytes <= CHECK_IDS_BYTES ? malloc(bytes) : NULL;
    unsigned char *picked = ids ? calloc(g->n_experts, 1) : NULL;

    if (!picked || dtoh(ids, (CUdeviceptr)g->ids, bytes) != CUDA_SUCCESS) {
        free(ids);
        free(picked);
        return NULL;
    }
    for (uint64_t k = 0; k < g->n_ids; k++) {
        uint64_t at = k / pr * st + k % pr;
        int64_t e;
        if (g->width == 8) {
            memcpy(&e, ids + 8 * at, 8);
        } else {
            int32_t v;
            memcpy(&v, ids + 4 * at, 4);
            e = v;
        }
        if (e >= 0 && (uint64_t)e < g->n_experts)
            picked[e] = 1;
    }
    free(ids);
    return picked;
}

/* A picked buffer (move i): the rows of each expert the registration's ids
 * pick (the first CHECK_EXPERTS of them), at their start and end, in the
 * buffer against the tensor's. The rows it did not pick hold anything. */
static void check_picked(const struct wo_redirect *rd, unsigned i, uint64_t key, dtoh_fn dtoh,
                         unsigned char *a, unsigned char *b)
{
    static uint64_t told;
    struct wo_picks_reg g;
    unsigned char *picked;
    unsigned seen = 0;
    bool bad = false;

    if (!wo_picks_reg_of(rd->from[i], &g) || !(picked = picked_experts(&g, dtoh)))
        return;
    for (unsigned e = 0; e < g.n_experts && seen < CHECK_EXPERTS && !bad; e++) {
        uint64_t n = g.row < CHECK_CHUNK ? g.row : CHECK_CHUNK;
        if (!picked[e])
            continue;
        seen++;
        for (uint64_t off = 0; !bad; off = g.row - n) {
            uint64_t at = e * g.row + off, j = 0;
            char buf[512];
            if (dtoh(a, (CUdeviceptr)rd->dev[i] + at, n) != CUDA_SUCCESS ||
                dtoh(b, (CUdeviceptr)rd->from[i] + at, n) != CUDA_SUCCESS)
                break;
            if (memcmp(a, b, n) != 0) {
                bad = true;
                while (j < n && a[j] == b[j])
                    j++;
                if (__atomic_fetch_add(&told, 1, __ATOMIC_RELAXED) < CHECK_SAY)
                    wo_warn("picks check: kernel %s read the picked buffer of [0x%llx, 0x%llx): "
                            "expert %u's byte %llu is 0x%02x in the buffer, 0x%02x in the "
                            "tensor",
                            kernel_name(key, buf, sizeof(buf)), (unsigned long long)rd->from[i],
                            (unsigned long long)rd->to[i], e, (unsigned long long)(off + j),
                            a[j], b[j]);
            }
            if (off == g.row - n)
                break;
        }
    }
    free(picked);
    wo_picks_checked(bad);
}

void wo_redirect_check(const struct wo_redirect *rd, uint64_t stream, uint64_t key)
{
    static uint64_t told;
    const struct wo_real *r = wo_real_driver_peek();
    CUresult (*sync)(CUstream) = r ? (CUresult(*)(CUstream))r->cuStreamSynchronize : NULL;
    dtoh_fn dtoh = (dtoh_fn)wo_real_hook(WO_HOOK_cuMemcpyDtoH_v2);
    unsigned char *a, *b;

    if (!rd->n || !sync || !dtoh)
        return;
    name_once(key, rd);
    /* the launch is done and no staging copy can touch a pinned slot */
    if (sync((CUstream)(uintptr_t)stream) != CUDA_SUCCESS)
        return;
    a = malloc(CHECK_CHUNK);
    b = malloc(CHECK_CHUNK);
    for (unsigned i = 0; a && b && i < rd->nslot; i++) {
        uint64_t size = rd->to[i] - rd->from[i];
        uint64_t nchunks = (size + CHECK_CHUNK - 1) / CHECK_CHUNK;
        uint64_t stride = nchunks > CHECK_CHUNKS ? nchunks / CHECK_CHUNKS : 1;
        bool bad = false;

        for (uint64_t c = 0; c < nchunks && !bad; c += stride) {
            uint64_t off = c * CHECK_CHUNK, n = size - off < CHECK_CHUNK ? size - off : CHECK_CHUNK;
            if (dtoh(a, (CUdeviceptr)rd->dev[i] + off, n) != CUDA_SUCCESS ||
                dtoh(b, (CUdeviceptr)rd->from[i] + off, n) != CUDA_SUCCESS)
                break;
            if (memcmp(a, b, n) != 0) {
                uint64_t j = 0;
                char buf[512];

                while (j < n && a[j] == b[j])
                    j++;
                bad = true;
                count(&wo_stream_tab.n.check_mismatch);
                if (__atomic_fetch_add(&told, 1, __ATOMIC_RELAXED) < CHECK_SAY)
                    wo_warn("stream check: kernel %s read slot %u for [0x%llx, 0x%llx): byte %llu "
                            "is 0x%02x in the slot, 0x%02x in the host copy",
                            kernel_name(key, buf, sizeof(buf)), rd->slot[i],
                            (unsigned long long)rd->from[i], (unsigned long long)rd->to[i],
                            (unsigned long long)(off + j), a[j], b[j]);
            }
        }
        count(&wo_stream_tab.n.checked);
    }
    for (unsigned i = rd->nslot; a && b && i < rd->n; i++)
        check_picked(rd, i, key, dtoh, a, b);
    free(a);
    free(b);
}
