/* uvm/picks-copy.h: one picked copy by the kernels, the piece picked
 * staging (uvm/picks.h) and its copy-engine side (uvm/picks-dma.h) share;
 * wo_picks_launch is in uvm/picks-copy.c. */
#pragma once

#include <cuda.h>

struct wo_driver;

/* One picked copy (the kernels' arguments, uvm/stream-copy.cu): the ids
 * (n_ids of width bytes) mark their experts in marks (u32 [n_experts]) with
 * gen, then each marked row [e * row, (e + 1) * row) of src goes to dst and
 * *rows (u64) counts it. */
struct wo_picks_copy {
    CUdeviceptr ids;
    unsigned long long n_ids;
    /* the ids in rows of per_row, a row starting stride ids after the last
     * (0: one contiguous array of n_ids) */
    unsigned long long per_row, stride;
    unsigned width, n_experts;
    CUdeviceptr marks;
    unsigned gen; /* never 0; greater than any gen marks holds */
    CUdeviceptr dst, src;
    unsigned long long row;
    CUdeviceptr rows; /* 0: not counted */
    /* the hot experts (uvm/picks-hot.h): where u32[n_experts] (a row's slot
     * in cache, WO_HOT_NOWHERE: from src; 0: every row from src), cache,
     * counts u32[n_experts] (copies that moved each expert; 0: not
     * counted), hits (rows taken from cache; 0: not counted) */
    CUdeviceptr where, cache, counts, hits;
};
/* Enqueues the mark and the copy on st with functions mark and copy
 * (wo_picks_mark, wo_picks_copy of the shim's module). picks.c's executor,
 * picks-dma.c's fallback and tests/gpu/test-picks-gpu.c use it. */
CUresult wo_picks_launch(const struct wo_driver *d, CUfunction mark, CUfunction copy,
                         CUstream st, const struct wo_picks_copy *c);

#define WO_PICKS_SPANS 1024u   /* expert tensors with picks, at most */
#define WO_PICKS_EXPERTS 1024u /* experts a tensor may have */
#define WO_PICKS_STREAMS 8u    /* engine streams with buffers */
#define WO_PICKS_BUFS 2u       /* buffers a stream, at most (WOFFLOAD_PICKS_BUFFERS) */
