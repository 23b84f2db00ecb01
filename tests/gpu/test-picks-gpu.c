/* tests/gpu/test-picks-gpu.c: picked staging's kernels (wo_picks_mark,
 * wo_picks_copy in uvm/stream-copy.cu, enqueued by wo_picks_launch as
 * uvm/picks.c does) on the real GPU (suite 'gpu'), and on the fake driver in
 * CI.
 *
 * For expert tensors in pinned host memory of several shapes (rows of 17
 * bytes, unaligned, to 3 MiB; 8 to 384 experts; ids of 4 and 8 bytes with
 * repeats, -1 padding and ids past the last expert), a device buffer filled
 * with a sentinel gets the picked rows:
 *  - every picked row equals its source byte for byte, every other row
 *    still holds the sentinel;
 *  - the rows counter counts the distinct picks;
 *  - ids in rows a stride apart (llama.cpp's topk view of an argsort),
 *    the rest of each row valid experts never picked: never copied;
 *  - a second copy into the same buffer with other picks and the next
 *    generation, on the same marks, copies only its own picks (the first
 *    copy's marks are stale);
 *  - the third copy with hot experts (uvm/picks-hot.h): a map giving some
 *    experts a slot of a device cache that holds other bytes than the
 *    host's: a picked hot expert's row comes from its slot, every other
 *    picked row from host; the per-expert counts are 1 for each picked
 *    expert, 0 for the others; the hits counter counts the picked hot ones.
 * On the GPU it then times picked copies from a Qwen3-30B-A3B-shaped tensor
 * (128 experts of 6 MiB) at 8, 51 and 128 distinct picks, then at 51 with
 * 25-100% of them hot (from a device cache), each against cuMemcpyAsync of
 * the picked bytes that are not hot, and prints the rates (timing()).
 *
 * Usage: test-picks-gpu. Exit: 0 pass, 1 fail, 77 no GPU (skipped). */
#include <dlfcn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "uvm/internal.h"
#include "uvm/picks.h"
#include "uvm/uvm.h"
#include "gpu-test.h"
#include "wsum.h"

static CUresult (*memcpy_dtoh)(void *, CUdeviceptr, size_t);
static CUresult (*memcpy_htod)(CUdeviceptr, const void *, size_t);

#define SENTINEL 0xee

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t next(void)
{
    return xorshift(&rng);
}

struct shape {
    unsigned experts;
    size_t row;
    unsigned n_ids, width;
    /* rows of per_row ids, stride apart, the rest of each row other experts
     * (llama.cpp's ffn_moe_topk view of an argsort); 0: one contiguous array */
    unsigned per_row, stride;
};

/* The ids' buffer as the kernel sees it: contiguous, or each per_row ids
 * followed by stride - per_row decoys, valid experts none of the picks name
 * (a wrong stride would copy them). Returns its size in ids. */
static size_t lay_out(const struct shape *sh, const void *ids, const bool *picked, void *out)
{
    size_t n = sh->per_row ? (size_t)sh->n_ids / sh->per_row * sh->stride : sh->n_ids;
    unsigned decoy = 0;

    for (size_t k = 0; k < n; k++) {
        size_t r = sh->per_row ? k / sh->stride : 0, j = sh->per_row ? k % sh->stride : k;
        long long e;
        if (!sh->per_row || j < sh->per_row) {
            size_t at = sh->per_row ? r * sh->per_row + j : k;
            e = sh->width == 8 ? ((const long long *)ids)[at] : ((const int *)ids)[at];
        } else {
            while (decoy < sh->experts && picked[decoy])
                decoy++;
            e = decoy < sh->experts ? (long long)decoy : -1;
            decoy = decoy + 1 < sh->experts ? decoy + 1 : 0;
        }
        if (sh->width == 8)
            ((long long *)out)[k] = e;
        else
            ((int *)out)[k] = (int)e;
    }
    return n;
}

/* ids for one copy: random experts, some repeated, with -1 and past-the-end
 * values mixed in; picked[e] set for each valid one; returns the distinct
 * count */
static unsigned draw(const struct shape *sh, void *ids, bool *picked)
{
    unsigned distinct = 0;

    memset(picked, 0, sh->experts * sizeof(*picked));
    for (unsigned k = 0; k < sh->n_ids; k++) {
        long long e = (long long)(next() % (sh->experts / 3 + 1)) * 3 % sh->experts;
        if (k % 7 == 3)
            e = -1;
        else if (k % 11 == 5)
            e = sh->experts + (long long)(next() % 5);
        if (sh->width == 8)
            ((long long *)ids)[k] = e;
        else
            ((int *)ids)[k] = (int)e;
        if (e >= 0 && e < sh->experts && !picked[e]) {
            picked[e] = true;
            distinct++;
        }
    }
    return distinct;
}

static void one_shape(const struct shape *sh, CUfunction mark, CUfunction copy, CUstream st)
{
    size_t bytes = sh->experts * sh->row;
    unsigned char *host = NULL, *got = malloc(bytes);
    void *ids_host = malloc((size_t)sh->n_ids * sh->width);
    size_t n_laid = sh->per_row ? (size_t)sh->n_ids / sh->per_row * sh->stride : sh->n_ids;
    void *ids_laid = malloc(n_laid * sh->width);
    bool *picked = malloc(sh->experts * sizeof(bool));
    CUdeviceptr src = 0, dst = 0, ids = 0, marks = 0, rows = 0;
    CUdeviceptr where = 0, cache = 0, counts = 0, hits = 0;
    uint64_t counted = 0, want_rows = 0;
    /* hot experts: every third expert, in slots in order, at most 8 */
    unsigned nhot = 0, *map = malloc(sh->experts * 4), *cnt = malloc(sh->experts * 4);
    unsigned char *cached = malloc(8 * sh->row);

    CK(drv.cuMemHostAlloc((void **)&host, bytes, CU_MEMHOSTALLOC_DEVICEMAP));
    CK(drv.cuMemHostGetDevicePointer_v2(&src, host, 0));
    for (size_t i = 0; i < bytes; i++)
        host[i] = (unsigned char)next();
    CK(drv.cuMemAlloc_v2(&dst, bytes));
    CK(drv.cuMemAlloc_v2(&ids, n_laid * sh->width));
    CK(drv.cuMemAlloc_v2(&marks, sh->experts * 4));
    CK(drv.cuMemAlloc_v2(&rows, 8));
    CK(drv.cuMemsetD8_v2(marks, 0, sh->experts * 4));
    CK(drv.cuMemsetD8_v2(rows, 0, 8));
    for (unsigned e = 0; e < sh->experts; e++)
        map[e] = e % 3 == 1 && nhot < 8 ? nhot++ : 0xffffffffu;
    for (size_t i = 0; i < 8 * sh->row; i++)
        cached[i] = (unsigned char)next();
    CK(drv.cuMemAlloc_v2(&where, sh->experts * 4));
    CK(drv.cuMemAlloc_v2(&counts, sh->experts * 4));
    CK(drv.cuMemAlloc_v2(&hits, 8));
    CK(drv.cuMemAlloc_v2(&cache, 8 * sh->row));
    CK(memcpy_htod(where, map, sh->experts * 4));
    CK(memcpy_htod(cache, cached, 8 * sh->row));
    CK(drv.cuMemsetD8_v2(counts, 0, sh->experts * 4));
    CK(drv.cuMemsetD8_v2(hits, 0, 8));
    for (unsigned gen = 1; gen <= 3; gen++) {
        bool hot = gen == 3;
        uint64_t want_hits = 0, got_hits = 0;
        struct wo_picks_copy c = {.ids = ids,
                                  .n_ids = sh->n_ids,
                                  .per_row = sh->per_row,
                                  .stride = sh->stride,
                                  .width = sh->width,
                                  .n_experts = sh->experts,
                                  .marks = marks,
                                  .gen = gen,
                                  .dst = dst,
                                  .src = src,
                                  .row = sh->row,
                                  .rows = rows,
                                  .where = hot ? where : 0,
                                  .cache = hot ? cache : 0,
                                  .counts = hot ? counts : 0,
                                  .hits = hot ? hits : 0};
        unsigned bad = 0;

        want_rows += draw(sh, ids_host, picked);
        (void)lay_out(sh, ids_host, picked, ids_laid);
        CK(memcpy_htod(ids, ids_laid, n_laid * sh->width));
        CK(drv.cuMemsetD8_v2(dst, SENTINEL, bytes));
        CK(drv.cuCtxSynchronize ? drv.cuCtxSynchronize() : drv.cuStreamSynchronize(st));
        CK(wo_picks_launch(&drv, mark, copy, st, &c));
        CK(drv.cuStreamSynchronize(st));
        CK(memcpy_dtoh(got, dst, bytes));
        for (unsigned e = 0; e < sh->experts && bad < 4; e++) {
            const unsigned char *g = got + e * sh->row, *h = host + e * sh->row;
            size_t i = 0;
            if (hot && map[e] != 0xffffffffu)
                h = cached + map[e] * sh->row;
            want_hits += hot && picked[e] && map[e] != 0xffffffffu;
            if (picked[e]) {
                while (i < sh->row && g[i] == h[i])
                    i++;
            } else {
                while (i < sh->row && g[i] == SENTINEL)
                    i++;
            }
            if (i < sh->row) {
                bad++;
                EXPECT(false,
                       "%u experts, row %zu, %u-byte ids, gen %u: expert %u (%s) differs "
                       "at byte %zu",
                       sh->experts, sh->row, sh->width, gen, e, picked[e] ? "picked" : "not picked",
                       i);
            }
        }
        CK(memcpy_dtoh(&counted, rows, 8));
        EXPECT(counted == want_rows, "%u experts, row %zu, gen %u: rows counted %llu, want %llu",
               sh->experts, sh->row, gen, (unsigned long long)counted,
               (unsigned long long)want_rows);
        if (!hot)
            continue;
        CK(memcpy_dtoh(&got_hits, hits, 8));
        CK(memcpy_dtoh(cnt, counts, sh->experts * 4));
        EXPECT(got_hits == want_hits, "%u experts, row %zu: hits %llu, want %llu", sh->experts,
               sh->row, (unsigned long long)got_hits, (unsigned long long)want_hits);
        for (unsigned e = 0; e < sh->experts; e++)
            if (cnt[e] != (picked[e] ? 1u : 0u)) {
                EXPECT(false, "%u experts, row %zu: expert %u counted %u, want %u", sh->experts,
                       sh->row, e, cnt[e], picked[e] ? 1u : 0u);
                break;
            }
    }
    printf("ok: %u experts, rows of %zu bytes, %u ids of %u bytes: three copies, only the picked "
           "rows (the third with %u hot experts), %llu rows counted\n",
           sh->experts, sh->row, sh->n_ids, sh->width, nhot, (unsigned long long)counted);
    drv.cuMemFree_v2(dst);
    drv.cuMemFree_v2(ids);
    drv.cuMemFree_v2(marks);
    drv.cuMemFree_v2(rows);
    drv.cuMemFree_v2(where);
    drv.cuMemFree_v2(cache);
    drv.cuMemFree_v2(counts);
    drv.cuMemFree_v2(hits);
    drv.cuMemFreeHost(host);
    free(map);
    free(cnt);
    free(cached);
    free(got);
    free(ids_host);
    free(ids_laid);
    free(picked);
}

/* GPU only: picked copies of a Qwen3-30B-A3B-shaped gate/up tensor (128
 * experts of 6 MiB) at 8, 51 and 128 distinct picks (batch 1, 8 and a
 * batch that picks them all), then at 51 with 25-100% of them hot
 * (uvm/picks-hot.h: their rows from a device cache), each against the copy
 * engine moving the picked bytes that are not hot: what picked copies cost
 * against the link, and what hot experts save. The fastest of 4 runs. */
static void timing(CUfunction mark, CUfunction copy, CUstream st)
{
    static const struct {
        unsigned distinct, hot_pct;
    } runs[] = {{8, 0}, {51, 0}, {128, 0}, {51, 25}, {51, 50}, {51, 75}, {51, 100}};
    const unsigned E = 128;
    const size_t row = 6u << 20;
    CUresult (*elapsed)(float *, CUevent, CUevent) =
        (CUresult(*)(float *, CUevent, CUevent))dlsym(lib, "cuEventElapsedTime");
    unsigned char *host = NULL;
    unsigned map[128];
    long long v[128];
    CUdeviceptr src = 0, dst = 0, ids = 0, marks = 0, where = 0, cache = 0;
    CUevent a, b;
    unsigned gen = 1;

    CK(drv.cuMemHostAlloc((void **)&host, E * row, CU_MEMHOSTALLOC_DEVICEMAP));
    CK(drv.cuMemHostGetDevicePointer_v2(&src, host, 0));
    memset(host, 1, E * row);
    CK(drv.cuMemAlloc_v2(&dst, E * row));
    CK(drv.cuMemAlloc_v2(&ids, E * 8));
    CK(drv.cuMemAlloc_v2(&marks, E * 4));
    CK(drv.cuMemAlloc_v2(&where, E * 4));
    CK(drv.cuMemAlloc_v2(&cache, 64 * row)); /* the hot rows: at most 51 */
    CK(drv.cuMemsetD8_v2(marks, 0, E * 4));
    CK(drv.cuEventCreate(&a, 0));
    CK(drv.cuEventCreate(&b, 0));
    for (size_t r = 0; r < sizeof(runs) / sizeof(runs[0]); r++) {
        unsigned d = runs[r].distinct, hot = d * runs[r].hot_pct / 100;
        double link = (double)(d - hot) * (double)row / 1e9;
        float kt = 0, ct = 0, ms;

        for (unsigned k = 0; k < d; k++)
            v[k] = (long long)((k * 37u) % E);
        CK(memcpy_htod(ids, v, d * 8));
        for (unsigned e = 0; e < E; e++)
            map[e] = 0xffffffffu;
        for (unsigned k = 0; k < hot; k++)
            map[v[k]] = k;
        CK(memcpy_htod(where, map, sizeof(map)));
        for (int rep = 0; rep < 4; rep++) {
            struct wo_picks_copy c = {.ids = ids,
                                      .n_ids = d,
                                      .width = 8,
                                      .n_experts = E,
                                      .marks = marks,
                                      .gen = ++gen,
                                      .dst = dst,
                                      .src = src,
                                      .row = row,
                                      .where = hot ? where : 0,
                                      .cache = hot ? cache : 0};
            CK(drv.cuEventRecord(a, st));
            CK(wo_picks_launch(&drv, mark, copy, st, &c));
            CK(drv.cuEventRecord(b, st));
            CK(drv.cuEventSynchronize(b));
            CK(elapsed(&ms, a, b));
            kt = rep ? (kt < ms ? kt : ms) : ms;
            if (d == hot)
                continue;
            CK(drv.cuEventRecord(a, st));
            CK(drv.cuMemcpyAsync(dst, src, (d - hot) * row, st));
            CK(drv.cuEventRecord(b, st));
            CK(drv.cuEventSynchronize(b));
            CK(elapsed(&ms, a, b));
            ct = rep ? (ct < ms ? ct : ms) : ms;
        }
        printf("timing: %3u of 128 experts of 6 MiB picked, %3u%% of them hot: picked copy %.3f "
               "ms (%.1f GB/s of the %.2f GB over the link), cuMemcpyAsync of those bytes %.3f ms "
               "(%.1f GB/s)\n",
               d, runs[r].hot_pct, kt, link / (kt / 1e3), link, ct,
               ct > 0 ? link / (ct / 1e3) : 0.0);
    }
    drv.cuMemFree_v2(dst);
    drv.cuMemFree_v2(ids);
    drv.cuMemFree_v2(marks);
    drv.cuMemFree_v2(where);
    drv.cuMemFree_v2(cache);
    drv.cuMemFreeHost(host);
}

int main(void)
{
    static const struct shape shapes[] = {
        {16, 17, 24, 8, 0, 0},     {128, 4096 + 8, 64, 4, 0, 0}, {384, 64u << 10, 16, 8, 0, 0},
        {8, 3u << 20, 8, 4, 0, 0}, {1024, 32, 4096, 8, 0, 0},
        /* llama.cpp's topk rows: 8 of 128 a token, 16 tokens, 128 apart;
         * 4 of 32, 3 tokens */
        {128, 4096 + 8, 128, 4, 8, 128}, {32, 1u << 16, 12, 4, 4, 32},
    };
    CUmodule mod;
    CUfunction mark, copy;
    CUstream st;
    bool fake;
    int rc;

    rc = gpu_open("test-picks-gpu");
    if (rc)
        return rc;
    *(void **)&memcpy_dtoh = dlsym(lib, "cuMemcpyDtoH_v2");
    *(void **)&memcpy_htod = dlsym(lib, "cuMemcpyHtoD_v2");
    if (!memcpy_dtoh || !memcpy_htod)
        return 1;
    fake = dlsym(lib, "fakecuda_kernel") != NULL;
    CK(drv.cuModuleLoadData(&mod, wo_copy_ptx()));
    CK(drv.cuModuleGetFunction(&mark, mod, "wo_picks_mark"));
    CK(drv.cuModuleGetFunction(&copy, mod, "wo_picks_copy"));
    CK(drv.cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
    for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++)
        one_shape(&shapes[i], mark, copy, st);
    if (!fake)
        timing(mark, copy, st);
    drv.cuStreamDestroy_v2(st);
    drv.cuModuleUnload(mod);
    printf("%s: %d failure(s)\n", failures ? "FAIL" : "PASS", failures);
    return failures ? 1 : 0;
}
