/* uvm/picks-hot.c: the hot experts of an expert tensor kept on the device
 * (uvm/picks-hot.h). */
#include "uvm/picks-hot.h"

#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/macro.h"
#include "core/settings.h"
#include "uvm/internal.h"
#include "uvm/picks-copy.h"
#include "uvm/picks-geom.h"

#define DECAY 0.75    /* a score's weight a choice later */
#define ENTER 1.25    /* an expert enters a full set when it scores this much more... */
#define ENTER_ADD 0.5 /* ... plus this, than the hot expert it replaces */
#define FILL_THREADS 256u
#define FILL_BLOCKS 64u

struct wo_picks_hot {
    CUdeviceptr dev; /* where u32[n], counts u32[n], then the cache (cap rows) */
    CUdeviceptr where, counts, cache;
    uint64_t bytes, row;
    unsigned n, cap, held;
    uint64_t home;         /* the stream whose copies read the cache; 0: the next one */
    uint32_t *counts_host; /* pinned: counts as last read back */
    uint32_t *prev;        /* counts at the last choice */
    float *score;
    int *slot_of;   /* expert -> slot, -1 not hot */
    int *expert_in; /* slot -> expert, -1 empty */
    uint64_t last_regs;
    bool zero;     /* the counts must be zeroed on home before any copy counts */
    bool clear;    /* the map must be cleared on home before the next copy */
    bool readback; /* a readback was enqueued (counts_host means something) */
    unsigned gap;  /* registrations to the next choice while slots are free (1..WO_HOT_EVERY) */
    uint64_t fills, choices;
};

static void forget(struct wo_picks_hot *h)
{
    for (unsigned e = 0; e < h->n; e++)
        h->slot_of[e] = -1;
    for (unsigned j = 0; j < h->cap; j++)
        h->expert_in[j] = -1;
    h->held = 0;
    h->gap = 1;
}

struct wo_picks_hot *wo_hot_new(const struct wo_driver *d, unsigned n_experts, uint64_t row,
                                unsigned cap, uint64_t home, uint64_t *bytes)
{
    struct wo_picks_hot *h;
    uint64_t map = wo_hot_map_bytes(n_experts);

    *bytes = 0;
    if (!n_experts || !cap || cap > n_experts || !row || !d->cuMemAlloc_v2 || !d->cuMemHostAlloc ||
        !d->cuMemsetD32Async || !d->cuMemcpyAsync)
        return NULL;
    h = calloc(1, sizeof(*h));
    if (!h)
        return NULL;
    h->n = n_experts;
    h->cap = cap;
    h->row = row;
    h->home = home;
    h->bytes = map + (uint64_t)cap * row;
    h->prev = calloc(n_experts, sizeof(*h->prev));
    h->score = calloc(n_experts, sizeof(*h->score));
    h->slot_of = calloc(n_experts, sizeof(*h->slot_of));
    h->expert_in = calloc(cap, sizeof(*h->expert_in));
    if (!h->prev || !h->score || !h->slot_of || !h->expert_in ||
        d->cuMemAlloc_v2(&h->dev, h->bytes) != CUDA_SUCCESS) {
        h->dev = 0;
        wo_hot_free(d, h);
        return NULL;
    }
    if (d->cuMemHostAlloc((void **)&h->counts_host, (size_t)n_experts * 4, 0) != CUDA_SUCCESS) {
        h->counts_host = NULL;
        wo_hot_free(d, h);
        return NULL;
    }
    memset(h->counts_host, 0, (size_t)n_experts * 4);
    h->where = h->dev;
    h->counts = h->dev + (CUdeviceptr)n_experts * 4;
    h->cache = h->dev + map;
    forget(h);
    h->zero = h->clear = true;
    h->gap = 1;
    *bytes = h->bytes;
    return h;
}

void wo_hot_free(const struct wo_driver *d, struct wo_picks_hot *h)
{
    if (!h)
        return;
    if (h->dev && d && d->cuMemFree_v2)
        wo_quiet_mem_free(d, h->dev);
    if (h->counts_host && d && d->cuMemFreeHost)
        wo_quiet_free_host(d, h->counts_host);
    free(h->prev);
    free(h->score);
    free(h->slot_of);
    free(h->expert_in);
    free(h);
}

/* One change on st: slot j's expert (if any) unpublished, the slot filled
 * with expert e's host row, e published. */
static bool put(const struct wo_driver *d, struct wo_picks_hot *h, CUstream st, uint64_t src,
                CUfunction fill, unsigned j, unsigned e)
{
    CUdeviceptr dst = h->cache + (CUdeviceptr)j * h->row, from = src + (CUdeviceptr)e * h->row;
    unsigned long long n = h->row;
    void *args[] = {&dst, &from, &n};
    unsigned blocks = (unsigned)WO_MAX(1ull, WO_MIN(n / (64ull << 10), (uint64_t)FILL_BLOCKS));
    int old = h->expert_in[j];

    if (old >= 0) {
        if (d->cuMemsetD32Async(h->where + (CUdeviceptr)old * 4, WO_HOT_NOWHERE, 1, st) !=
            CUDA_SUCCESS)
            return false;
        h->slot_of[old] = -1;
        h->expert_in[j] = -1;
        h->held--;
    }
    if (d->cuLaunchKernel(fill, blocks, 1, 1, FILL_THREADS, 1, 1, 0, st, args, NULL) !=
            CUDA_SUCCESS ||
        d->cuMemsetD32Async(h->where + (CUdeviceptr)e * 4, j, 1, st) != CUDA_SUCCESS)
        return false;
    h->slot_of[e] = (int)j;
    h->expert_in[j] = (int)e;
    h->held++;
    h->fills++;
    return true;
}

/* The best expert not hot (-1: none scores above zero). */
static int best_cold(const struct wo_picks_hot *h)
{
    int b = -1;

    for (unsigned e = 0; e < h->n; e++)
        if (h->slot_of[e] < 0 && h->score[e] > 0 && (b < 0 || h->score[e] > h->score[b]))
            b = (int)e;
    return b;
}

/* The slot of the hot expert that scores least (-1: none hot). */
static int worst_hot(const struct wo_picks_hot *h)
{
    int w = -1;

    for (unsigned j = 0; j < h->cap; j++)
        if (h->expert_in[j] >= 0 &&
            (w < 0 || h->score[h->expert_in[j]] < h->score[h->expert_in[w]]))
            w = (int)j;
    return w;
}

static bool choose(struct wo_picks_hot *h, const struct wo_driver *d, CUstream st, uint64_t src,
                   CUfunction fill)
{
    unsigned swaps = 0, fills = 0;
    unsigned most = (unsigned)WO_MAX((uint64_t)WO_HOT_FILLS_MIN, WO_HOT_FILL_BYTES / h->row);

    for (unsigned e = 0; e < h->n; e++) {
        uint32_t c = __atomic_load_n(&h->counts_host[e], __ATOMIC_RELAXED);
        /* counts only grow: one below the last was zeroed since (a new set) */
        uint32_t add = c >= h->prev[e] ? c - h->prev[e] : c;
        h->score[e] = (float)(h->score[e] * DECAY + (double)add);
        h->prev[e] = c;
    }
    h->choices++;
    /* free slots first, a few at a time: each costs one row over the link
     * on the engine's stream, right before its launch (and a search) */
    for (unsigned j = 0; j < h->cap && fills < most; j++) {
        int c;
        if (h->expert_in[j] >= 0)
            continue;
        if ((c = best_cold(h)) < 0)
            break;
        if (!put(d, h, st, src, fill, j, (unsigned)c))
            return false;
        fills++;
    }
    /* the next choice: at the next registration after fills, twice as far
     * after a choice that found none (a router that picks fewer experts
     * than the slots would otherwise cost a choice and a readback every
     * registration), every WO_HOT_EVERY once full */
    h->gap = fills ? 1u : WO_MIN(h->gap * 2u, WO_HOT_EVERY);
    /* then a few swaps, each only for a clearly better expert */
    while (swaps < WO_HOT_SWAPS) {
        int c = best_cold(h), w = worst_hot(h);
        if (c < 0 || w < 0 || h->score[c] <= h->score[h->expert_in[w]] * ENTER + ENTER_ADD)
            break;
        if (!put(d, h, st, src, fill, (unsigned)w, (unsigned)c))
            return false;
        swaps++;
    }
    return true;
}

bool wo_hot_prepare(const struct wo_driver *d, struct wo_picks_hot *h, uint64_t st, uint64_t src,
                    uint64_t regs, CUfunction fill)
{
    CUstream s = (CUstream)(uintptr_t)st;

    if (!h->home)
        h->home = st;
    if (h->home != st)
        return true;
    if (h->zero) {
        if (d->cuMemsetD32Async(h->counts, 0, h->n, s) != CUDA_SUCCESS)
            return false;
        h->zero = false;
    }
    if (h->clear) {
        if (d->cuMemsetD32Async(h->where, WO_HOT_NOWHERE, h->n, s) != CUDA_SUCCESS)
            return false;
        forget(h);
        h->clear = false;
        h->last_regs = regs; /* the counts since then choose the next set */
    }
    /* while slots are free, h->gap registrations apart (choose), every
     * WO_HOT_EVERY once full */
    if (regs - h->last_regs < (h->held < h->cap ? h->gap : WO_HOT_EVERY))
        return true;
    h->last_regs = regs;
    if (h->readback && !choose(h, d, s, src, fill))
        return false;
    /* the next choice's counts, read back on the home stream: after the
     * zeroing and the copies before, in stream order (on a stream of its
     * own the read could come before the zeroing: garbage counts); a few
     * hundred bytes every WO_HOT_EVERY registrations */
    h->readback = d->cuMemcpyAsync((CUdeviceptr)(uintptr_t)h->counts_host, h->counts,
                                   (size_t)h->n * 4, s) == CUDA_SUCCESS;
    return true;
}

void wo_hot_args(const struct wo_picks_hot *h, uint64_t st, CUdeviceptr *where, CUdeviceptr *cache,
                 CUdeviceptr *counts)
{
    bool home = h->home == st && !h->clear;

    *where = home ? h->where : 0;
    *cache = home ? h->cache : 0;
    *counts = h->zero ? 0 : h->counts;
}

/* The experts the map publishes to a copy on stream st (none off the home
 * stream), as wo_hot_args's where says on the device at that point. */
static void hot_bits(const struct wo_picks_hot *h, uint64_t st, uint64_t *bits)
{
    memset(bits, 0, WO_PICKS_EXPERTS / 8);
    if (h->home != st || h->clear)
        return;
    for (unsigned e = 0; e < h->n && e < WO_PICKS_EXPERTS; e++)
        if (h->slot_of[e] >= 0)
            bits[e / 64] |= 1ull << (e % 64);
}

bool wo_hot_launch(const struct wo_driver *d, const struct wo_picks_hot *h, uint64_t st,
                   CUfunction mark, CUfunction copy, struct wo_picks_copy *c, uint64_t *bits)
{
    struct wo_picks_copy hc = *c;

    hc.src = 0; /* only the rows from the cache (uvm/stream-copy.cu) */
    if (wo_picks_launch(d, mark, copy, (CUstream)(uintptr_t)st, &hc) != CUDA_SUCCESS)
        return false;
    hot_bits(h, st, bits);
    c->counts = 0; /* that copy counted every picked expert */
    c->cache = 0;  /* a copy of c by the kernels after it: the other rows only (no hits) */
    return true;
}

void wo_hot_invalidate(struct wo_picks_hot *h)
{
    h->clear = true;
}

void wo_hot_stream_gone(struct wo_picks_hot *h, uint64_t stream)
{
    if (h->home != stream)
        return;
    h->home = 0;
    h->clear = true;
}

uint64_t wo_hot_home(const struct wo_picks_hot *h)
{
    return h->home;
}

void wo_hot_figs(const struct wo_picks_hot *h, struct wo_hot_figs *f)
{
    memset(f, 0, sizeof(*f));
    if (!h)
        return;
    f->cap = h->cap;
    f->held = h->held;
    f->fills = h->fills;
    f->choices = h->choices;
    f->bytes = h->bytes;
}

/* --- the bytes for hot experts in all ------------------------------------ */

static uint64_t ceiling = UINT64_MAX;    /* the engine ran out of memory: the sets left */
static uint64_t auto_bytes = UINT64_MAX; /* auto: what it came to; UINT64_MAX before */

/* WOFFLOAD_PICKS_HOT when set, else the policy's prefetch.hot_experts. */
static uint64_t hot_asked(void)
{
    uint64_t mib = wo_settings()->picks_hot_mib;

    return mib ? mib << 20 : wo_uvm.g ? wo_uvm.g->prefetch.hot_experts : 0;
}

bool wo_picks_hot_auto(void)
{
    return hot_asked() == WO_HOT_EXPERTS_AUTO;
}

uint64_t wo_picks_hot_total(void)
{
    uint64_t want = hot_asked();

    if (want == WO_HOT_EXPERTS_AUTO)
        want = __atomic_load_n(&auto_bytes, __ATOMIC_RELAXED);
    return WO_MIN(want, __atomic_load_n(&ceiling, __ATOMIC_RELAXED));
}

/* What the engine holds by then (its KV cache, workspaces) is left out; an
 * engine that allocates more later takes it back from the sets
 * (wo_picks_give_back). */
void wo_hot_resolve_auto(const struct wo_driver *d)
{
    size_t free_b = 0, total_b = 0;
    uint64_t margin = (uint64_t)wo_settings()->managed_margin_mib << 20, got = 0;
    char b1[32], b2[32], b3[32];

    if (__atomic_load_n(&auto_bytes, __ATOMIC_RELAXED) != UINT64_MAX || !wo_picks_hot_auto())
        return;
    if (d->cuMemGetInfo_v2 && d->cuMemGetInfo_v2(&free_b, &total_b) == CUDA_SUCCESS &&
        free_b > margin)
        got = free_b - margin;
    __atomic_store_n(&auto_bytes, got, __ATOMIC_RELAXED);
    wo_info("picks: hot experts: auto: %s of device memory (%s free, less the %s margin)",
            wo_format_size(got, b1, sizeof(b1)), wo_format_size(free_b, b2, sizeof(b2)),
            wo_format_size(margin, b3, sizeof(b3)));
}

void wo_hot_set_ceiling(uint64_t bytes)
{
    __atomic_store_n(&ceiling, bytes, __ATOMIC_RELAXED);
}

void wo_hot_budget_reset(void)
{
    __atomic_store_n(&ceiling, UINT64_MAX, __ATOMIC_RELAXED);
    __atomic_store_n(&auto_bytes, UINT64_MAX, __ATOMIC_RELAXED);
}
