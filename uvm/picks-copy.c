/* uvm/picks-copy.c: one picked copy by the kernels (uvm/picks-copy.h). */
#include "uvm/picks-copy.h"

#include "core/macro.h"
#include "uvm/internal.h"

#define MARK_THREADS 256u
#define COPY_THREADS 256u
#define CHUNK_MIN (128ull << 10) /* a copy block's share of a row, at least */
#define CHUNKS_MAX 32u

/* The kernels' picked copy (uvm/picks-copy.h). */
CUresult wo_picks_launch(const struct wo_driver *d, CUfunction mark, CUfunction copy, CUstream st,
                         const struct wo_picks_copy *c)
{
    CUdeviceptr ids = c->ids, marks = c->marks, dst = c->dst, src = c->src, rows = c->rows;
    CUdeviceptr where = c->where, cache = c->cache, counts = c->counts, hits = c->hits;
    unsigned long long n = c->n_ids, row = c->row;
    unsigned long long per_row = c->per_row ? c->per_row : n, stride = c->per_row ? c->stride : n;
    unsigned width = c->width, ne = c->n_experts, gen = c->gen, mblocks, chunks;
    void *margs[] = {&ids, &n, &per_row, &stride, &width, &ne, &marks, &gen};
    void *cargs[] = {&dst, &src, &row, &marks, &gen, &rows, &where, &cache, &counts, &hits};
    CUresult res;

    if (!n || !ne || !row)
        return CUDA_ERROR_INVALID_VALUE;
    mblocks = (unsigned)WO_MIN((n + MARK_THREADS - 1) / MARK_THREADS, 64ull);
    chunks = (unsigned)WO_MAX(1ull, WO_MIN(row / CHUNK_MIN, (unsigned long long)CHUNKS_MAX));
    res = d->cuLaunchKernel(mark, mblocks, 1, 1, MARK_THREADS, 1, 1, 0, st, margs, NULL);
    if (res == CUDA_SUCCESS)
        res = d->cuLaunchKernel(copy, chunks, ne, 1, COPY_THREADS, 1, 1, 0, st, cargs, NULL);
    return res;
}
