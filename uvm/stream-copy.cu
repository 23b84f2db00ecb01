// uvm/stream-copy.cu: the staging copy the streaming executor (uvm/stream.c)
// runs on its copy stream when the source is managed memory advised to the
// host: the GPU reads the pages in place over PCIe (~50 GB/s) where
// cuMemcpyAsync from the same memory moves 7-9 GB/s
// (bench/results/stream-mechanisms-20261125-h100-kernel-copy.txt). The shim
// is built without nvcc: uvm/stream-copy-ptx.h holds this file's PTX,
// regenerated with
//   nvcc -ptx -arch=compute_75 -o /tmp/sc.ptx uvm/stream-copy.cu &&
//   python3 uvm/ptx2h.py /tmp/sc.ptx > uvm/stream-copy-ptx.h
#include <stdint.h>

extern "C" __global__ void wo_stream_copy(unsigned char *dst, const unsigned char *src,
                                          unsigned long long n)
{
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;

    if ((((uintptr_t)dst | (uintptr_t)src) & 15) == 0) {
        unsigned long long n16 = n / 16;
        uint4 *d = (uint4 *)dst;
        const uint4 *s = (const uint4 *)src;
        for (unsigned long long k = i; k < n16; k += step)
            d[k] = s[k];
        for (unsigned long long k = n16 * 16 + i; k < n; k += step)
            dst[k] = src[k];
    } else {
        for (unsigned long long k = i; k < n; k += step)
            dst[k] = src[k];
    }
}

// ---- write checks (uvm/stream-check.c) ------------------------------------
// A launch the shim points at a slot may write it: the engine's kernels are
// opaque, and some engines do write their weights (an RL trainer's weight
// sync, a repacking after load). The slot is then the only copy of what was
// written. So each slot's contents are hashed when a range is first staged
// (on the copy stream, before any launch may read it) and again before the
// slot is reused; when the two differ the slot is copied back into the range
// and the executor is told (a flag in mapped host memory), which then reads
// that range in place. A misprediction costs speed, never data.

#define WO_GOLDEN 0x9e3779b97f4a7c15ull

__device__ static unsigned long long wo_mix(unsigned long long x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

// *out = a hash of p[0..n) (p 16-byte aligned: a slot). Each block leaves
// its sum in part[blockIdx.x]; the last block to finish adds them (count
// returns to 0 for the next launch on the same scratch).
extern "C" __global__ void wo_stream_hash(const unsigned char *p, unsigned long long n,
                                          unsigned long long *part, unsigned int *count,
                                          unsigned long long *out)
{
    __shared__ unsigned long long warp_sum[32];
    __shared__ bool last;
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long nw = n / 8, h = 0;
    const unsigned long long *w = (const unsigned long long *)p;

    for (unsigned long long k = 2 * i; k + 1 < nw; k += 2 * step) {
        ulonglong2 v = *(const ulonglong2 *)(w + k);
        h += wo_mix(v.x + k * WO_GOLDEN) + wo_mix(v.y + (k + 1) * WO_GOLDEN);
    }
    if (i == 0) {
        unsigned long long t = 0;
        if (nw & 1)
            h += wo_mix(w[nw - 1] + (nw - 1) * WO_GOLDEN);
        for (unsigned long long k = nw * 8; k < n; k++)
            t |= (unsigned long long)p[k] << (8 * (k - nw * 8));
        h += wo_mix(t + nw * WO_GOLDEN) ^ n;
    }
    for (int o = 16; o > 0; o >>= 1)
        h += __shfl_down_sync(0xffffffffu, h, o);
    if ((threadIdx.x & 31) == 0)
        warp_sum[threadIdx.x >> 5] = h;
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned long long b = 0;
        for (unsigned k = 0; k < (blockDim.x + 31) / 32; k++)
            b += warp_sum[k];
        part[blockIdx.x] = b;
        __threadfence();
        last = atomicInc(count, gridDim.x - 1) == gridDim.x - 1;
    }
    __syncthreads();
    if (last && threadIdx.x == 0) {
        unsigned long long s = 0;
        for (unsigned k = 0; k < gridDim.x; k++)
            s += ((volatile unsigned long long *)part)[k];
        *out = s;
    }
}

// When the slot's hash now (*got) is not the one it was staged with
// (*want), copies the slot back into the range it holds.
extern "C" __global__ void wo_stream_check(const unsigned char *slot, unsigned long long n,
                                           const unsigned long long *want,
                                           const unsigned long long *got, unsigned char *dst)
{
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;

    if (*want == *got)
        return;
    if (((uintptr_t)dst & 15) == 0) {
        unsigned long long n16 = n / 16;
        for (unsigned long long k = i; k < n16; k += step)
            ((uint4 *)dst)[k] = ((const uint4 *)slot)[k];
        for (unsigned long long k = n16 * 16 + i; k < n; k += step)
            dst[k] = slot[k];
    } else {
        for (unsigned long long k = i; k < n; k += step)
            dst[k] = slot[k];
    }
}

// After wo_stream_check, in stream order (its copy is complete): tells the
// executor the range was written (*flag = tag; mapped host memory, or
// device memory it reads back).
extern "C" __global__ void wo_stream_flag(const unsigned long long *want,
                                          const unsigned long long *got, unsigned int *flag,
                                          unsigned int tag)
{
    if (*want != *got)
        *(volatile unsigned int *)flag = tag;
}

// ---- picked staging (uvm/picks.c) -------------------------------------------
// A mixture-of-experts layer reads only the experts its router picked. When
// the engine says where the picks are (woffload_moe_picks: the router's
// top-k ids, in device memory, written earlier on the same stream), the
// shim copies only those experts' rows of a host or managed expert tensor
// into a device buffer laid out as the tensor, on the engine's own stream
// right before the launch that reads them, and points the launch there.
// Stream order makes it exact: the ids are the ones that launch reads, and
// the rows it does not read are never looked at. Nothing waits on the host.

// marks[e] = gen for every id e in [0, n_experts) among the n ids (width:
// 4 or 8 bytes, signed; ids out of range, such as -1 padding, are skipped).
// The ids are rows of per_row, row r starting stride ids after row r - 1
// (per_row == stride: one contiguous array; llama.cpp's ffn_moe_topk is
// the first k columns of an argsort over all experts, a row a token).
extern "C" __global__ void wo_picks_mark(const void *ids, unsigned long long n,
                                         unsigned long long per_row, unsigned long long stride,
                                         unsigned width, unsigned n_experts, unsigned *marks,
                                         unsigned gen)
{
    unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;

    for (unsigned long long k = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; k < n;
         k += step) {
        unsigned long long at = per_row == stride ? k : k / per_row * stride + k % per_row;
        long long e = width == 8 ? ((const long long *)ids)[at] : ((const int *)ids)[at];
        if (e >= 0 && e < (long long)n_experts)
            marks[e] = gen;
    }
}

// Block (x, e): when expert e is marked with gen, chunk x (of gridDim.x) of
// its row [e*row, (e+1)*row) copied to dst from src, or, when where is
// given and where[e] names a slot of the resident experts (not
// WO_PICKS_NOWHERE), from that slot of cache (device memory: a copy at the
// device's bandwidth, not the link's). *rows (device memory, read back off
// the engine's streams for the stats) counts the rows copied, *hits those
// of them from cache, and counts[e] the copies that moved expert e (the
// executor keeps its most picked experts in cache); each may be NULL.
// A copy split in two (the copy engine moves the rows not in cache:
// uvm/picks-dma.h) leaves out a side: src NULL copies only the rows from
// cache, cache NULL (where given) only the others; *rows counts the rows
// copied, counts every marked expert (the caller gives it to one side).
#define WO_PICKS_NOWHERE 0xffffffffu
extern "C" __global__ void wo_picks_copy(unsigned char *dst, const unsigned char *src,
                                         unsigned long long row, const unsigned *marks,
                                         unsigned gen, unsigned long long *rows,
                                         const unsigned *where, const unsigned char *cache,
                                         unsigned *counts, unsigned long long *hits)
{
    unsigned long long e = blockIdx.y, chunk, lo, hi;
    unsigned slot;
    bool skip;

    if (marks[e] != gen)
        return;
    slot = where ? where[e] : WO_PICKS_NOWHERE;
    skip = slot != WO_PICKS_NOWHERE ? !cache : !src;
    chunk = (row + gridDim.x - 1) / gridDim.x;
    chunk = (chunk + 15) & ~15ull;
    lo = blockIdx.x * chunk;
    hi = lo + chunk < row ? lo + chunk : row;
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        if (rows && !skip)
            atomicAdd(rows, 1ull);
        if (counts)
            atomicAdd(&counts[e], 1u);
        if (hits && slot != WO_PICKS_NOWHERE && !skip)
            atomicAdd(hits, 1ull);
    }
    if (lo >= hi || skip)
        return;
    dst += e * row;
    src = slot != WO_PICKS_NOWHERE ? cache + slot * row : src + e * row;
    if ((((uintptr_t)dst | (uintptr_t)src | lo) & 15) == 0) {
        unsigned long long n16 = (hi - lo) / 16;
        uint4 *d = (uint4 *)(dst + lo);
        const uint4 *s = (const uint4 *)(src + lo);
        for (unsigned long long k = threadIdx.x; k < n16; k += blockDim.x)
            d[k] = s[k];
        for (unsigned long long k = lo + n16 * 16 + threadIdx.x; k < hi; k += blockDim.x)
            dst[k] = src[k];
    } else {
        for (unsigned long long k = lo + threadIdx.x; k < hi; k += blockDim.x)
            dst[k] = src[k];
    }
}
