// bench/picked-copy.cu: can the copy engine move only the experts a step
// picked, from inside a CUDA graph, with no host sync?
//
// The case: a fine-grained MoE layer with its stacked expert tensor in pinned
// host memory (E experts of S bytes); the router's picks live in device
// memory. llama.cpp reads them on the host (a sync) and copies the picked
// experts on the copy engine (about 54 GB/s); a kernel reading them in place
// tops out at 49-51 GB/s (device-facts). Inside an engine's CUDA graph there
// is no host to read the picks. Conditional nodes (CUDA 12.4+) may hold memcpy
// nodes: a kernel reads the picks and sets one IF handle an expert
// (cudaGraphSetConditional), and each IF body copies its expert into a device
// slot. This probe measures, per layer of K picked experts:
//
//  in-place     the reader kernel reads the picked experts from host memory
//  kernel-copy  a copy kernel moves the picked experts into the slot (SMs
//               reading over PCIe), then the reader reads the slot
//  host-copy    the host knows the picks: one cudaMemcpyAsync a picked
//               expert, then the reader (llama.cpp's way, without its sync)
//  cond-copy    one graph: picks -> IF handles -> E IF nodes with a memcpy
//               node each -> the reader; the host never sees the picks
//  shim-copy    the shim's own picked copy (uvm/stream-copy.cu, included
//               here: wo_picks_mark, then wo_picks_copy on a grid of
//               row/128 KiB chunks, at most 32, by E experts, 256 threads,
//               launched as uvm/picks-dma.c does), then the reader
//               (a version with four loads in flight a thread, and one on
//               64 chunks, were no faster on the H200: 37.1-37.8 GB/s at
//               K = 8; bench/results/gpu-suite-20261203-bc36a37-h200.txt)
//
// Each row prints the step time, the picked bytes' rate, and whether the
// reader's sums matched the host's (a wrong byte fails the row). The bound is
// the picked bytes at the copy engine's 55 GB/s.
//
//   nvcc -O2 -arch=sm_90 -o picked-copy bench/picked-copy.cu -lcuda
//   ./picked-copy [LAYERS=8] [E=128] [S_MiB=3] [K=8,40,100] [ITERS=10]
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda-check.h"

#include "../uvm/stream-copy.cu"

static int LAYERS = 8, E = 128, ITERS = 10;

// The shim's launch of a picked copy (uvm/picks-dma.c: wo_picks_launch):
// the marks of the K picks, then the copy on chunks x E blocks.
static void shim_copy(uint64_t *slot, const uint64_t *src, unsigned long long row, int E,
                      const int *picks, int K, unsigned *marks, unsigned gen, cudaStream_t s)
{
    unsigned long long n = K, chunks = row / (128ull << 10);
    chunks = chunks < 1 ? 1 : chunks > 32 ? 32 : chunks;
    wo_picks_mark<<<(K + 255) / 256, 256, 0, s>>>(picks, n, n, n, 4, E, marks, gen);
    dim3 grid((unsigned)chunks, E);
    wo_picks_copy<<<grid, 256, 0, s>>>((unsigned char *)slot, (const unsigned char *)src, row,
                                       marks, gen, NULL, NULL, NULL, NULL, NULL);
}
static size_t S = 3u << 20;

__global__ void set_conds(const int *picks, int k, cudaGraphConditionalHandle *h)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < k)
        cudaGraphSetConditional(h[picks[i]], 1);
}

// one block a picked expert: the sum of its words into *out
__global__ void reader(const uint64_t *base, const int *picks, size_t words, unsigned long long *out)
{
    const uint64_t *p = base + (size_t)picks[blockIdx.x] * words;
    unsigned long long s = 0;
    for (size_t i = threadIdx.x; i < words; i += blockDim.x)
        s += p[i];
    atomicAdd(out, s);
}

__global__ void copier(uint64_t *dst, const uint64_t *src, const int *picks, size_t words)
{
    size_t off = (size_t)picks[blockIdx.x] * words;
    for (size_t i = threadIdx.x; i < words; i += blockDim.x)
        dst[off + i] = src[off + i];
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    int ks[8] = {8, 40, 100}, nk = 3;
    if (argc > 1) LAYERS = atoi(argv[1]);
    if (argc > 2) E = atoi(argv[2]);
    if (argc > 3) S = (size_t)atoi(argv[3]) << 20;
    if (argc > 4) {
        nk = 0;
        for (char *t = strtok(argv[4], ","); t && nk < 8; t = strtok(NULL, ","))
            ks[nk++] = atoi(t);
    }
    if (argc > 5) ITERS = atoi(argv[5]);
    size_t words = S / 8, layer = (size_t)E * S;
    uint64_t **host = (uint64_t **)calloc(LAYERS, sizeof(*host));
    uint64_t **hdev = (uint64_t **)calloc(LAYERS, sizeof(*hdev)); // host[l] as the device sees it
    unsigned long long *esum = (unsigned long long *)calloc((size_t)LAYERS * E, sizeof(*esum));
    uint64_t *slot;
    int *dpicks, *hpicks;
    unsigned *marks, gen = 0;
    unsigned long long *dout, hout[64];
    cudaStream_t s;

    CR(cudaSetDevice(0));
    CR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (int l = 0; l < LAYERS; l++) {
        CR(cudaHostAlloc((void **)&host[l], layer, cudaHostAllocMapped));
        CR(cudaHostGetDevicePointer((void **)&hdev[l], host[l], 0));
        for (size_t i = 0; i < layer / 8; i++)
            host[l][i] = (i * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)l << 56);
        for (int e = 0; e < E; e++)
            for (size_t i = 0; i < words; i++)
                esum[(size_t)l * E + e] += host[l][(size_t)e * words + i];
    }
    CR(cudaMalloc((void **)&slot, layer));
    CR(cudaMalloc((void **)&dpicks, sizeof(int) * LAYERS * E));
    CR(cudaMalloc((void **)&dout, sizeof(unsigned long long) * LAYERS));
    CR(cudaMalloc((void **)&marks, sizeof(unsigned) * E));
    CR(cudaMemset(marks, 0, sizeof(unsigned) * E));
    CR(cudaHostAlloc((void **)&hpicks, sizeof(int) * LAYERS * E, 0));
    printf("picked-copy: %d layers of %d experts x %zu MiB, pinned host; %d iterations a row\n", LAYERS,
           E, S >> 20, ITERS);
    printf("%-12s %5s %10s %10s %8s %8s  %s\n", "row", "K", "step ms", "GB/s", "bound ms", "x bound",
           "sums");
    for (int ki = 0; ki < nk; ki++) {
        int K = ks[ki] < E ? ks[ki] : E;
        double bound_ms = (double)LAYERS * K * S / 55e9 * 1e3;
        // the conditional graph for this K: a layer's IF handles, nodes and reader
        cudaGraph_t g;
        cudaGraphExec_t ge;
        cudaGraphConditionalHandle *hh, *dh;
        CR(cudaGraphCreate(&g, 0));
        hh = (cudaGraphConditionalHandle *)calloc((size_t)LAYERS * E, sizeof(*hh));
        CR(cudaMalloc((void **)&dh, sizeof(*dh) * LAYERS * E));
        cudaGraphNode_t prev = NULL;
        for (int l = 0; l < LAYERS; l++) {
            for (int e = 0; e < E; e++)
                CR(cudaGraphConditionalHandleCreate(&hh[(size_t)l * E + e], g, 0, cudaGraphCondAssignDefault));
        }
        CR(cudaMemcpy(dh, hh, sizeof(*dh) * LAYERS * E, cudaMemcpyHostToDevice));
        for (int l = 0; l < LAYERS; l++) {
            cudaGraphNode_t setn, rd, *ifs = (cudaGraphNode_t *)calloc(E, sizeof(*ifs));
            const int *pk = dpicks + l * E;
            cudaGraphConditionalHandle *hl = dh + (size_t)l * E;
            void *sa[] = {(void *)&pk, (void *)&K, (void *)&hl};
            cudaKernelNodeParams kp = {};
            kp.func = (void *)set_conds;
            kp.gridDim = dim3((K + 127) / 128);
            kp.blockDim = dim3(128);
            kp.kernelParams = sa;
            CR(cudaGraphAddKernelNode(&setn, g, prev ? &prev : NULL, prev ? 1 : 0, &kp));
            for (int e = 0; e < E; e++) {
                cudaGraphNodeParams np = {};
                cudaGraphNode_t cp;
                np.type = cudaGraphNodeTypeConditional;
                np.conditional.handle = hh[(size_t)l * E + e];
                np.conditional.type = cudaGraphCondTypeIf;
                np.conditional.size = 1;
                CR(cudaGraphAddNode(&ifs[e], g, &setn, NULL, 1, &np));
                CR(cudaGraphAddMemcpyNode1D(&cp, np.conditional.phGraph_out[0], NULL, 0,
                                            slot + (size_t)e * words, host[l] + (size_t)e * words, S,
                                            cudaMemcpyHostToDevice));
            }
            const uint64_t *sb = slot;
            unsigned long long *o = dout + l;
            void *ra[] = {(void *)&sb, (void *)&pk, (void *)&words, (void *)&o};
            kp.func = (void *)reader;
            kp.gridDim = dim3(K);
            kp.blockDim = dim3(512);
            kp.kernelParams = ra;
            CR(cudaGraphAddKernelNode(&rd, g, ifs, E, &kp));
            prev = rd;
            free(ifs);
        }
        CR(cudaGraphInstantiate(&ge, g, 0));

        for (int row = 0; row < 5; row++) {
            static const char *names[] = {"in-place", "kernel-copy", "host-copy", "cond-copy",
                                          "shim-copy"};
            double t = 0;
            int bad = 0;
            srand(1234 + K);
            for (int it = 0; it < ITERS + 1; it++) { // the first one warms up
                unsigned long long want[64] = {0};
                for (int l = 0; l < LAYERS; l++) { // K distinct picks a layer
                    int *p = hpicks + l * E;
                    for (int e = 0; e < E; e++)
                        p[e] = e;
                    for (int k = 0; k < K; k++) {
                        int j = k + rand() % (E - k), x = p[k];
                        p[k] = p[j];
                        p[j] = x;
                        want[l] += esum[(size_t)l * E + p[k]];
                    }
                }
                CR(cudaMemcpyAsync(dpicks, hpicks, sizeof(int) * LAYERS * E, cudaMemcpyHostToDevice, s));
                CR(cudaMemsetAsync(dout, 0, sizeof(unsigned long long) * LAYERS, s));
                CR(cudaMemsetAsync(slot, 0, layer, s)); // a stale slot must not pass
                CR(cudaStreamSynchronize(s));
                double t0 = now_s();
                if (row == 3) {
                    CR(cudaGraphLaunch(ge, s));
                } else {
                    for (int l = 0; l < LAYERS; l++) {
                        const uint64_t *src = slot;
                        if (row == 0)
                            src = hdev[l];
                        else if (row == 1)
                            copier<<<K, 512, 0, s>>>(slot, hdev[l], dpicks + l * E, words);
                        else if (row == 4)
                            shim_copy(slot, hdev[l], S, E, dpicks + l * E, K, marks, ++gen, s);
                        else
                            for (int k = 0; k < K; k++) {
                                int e = hpicks[l * E + k];
                                CR(cudaMemcpyAsync(slot + (size_t)e * words, host[l] + (size_t)e * words, S,
                                                   cudaMemcpyHostToDevice, s));
                            }
                        reader<<<K, 512, 0, s>>>(src, dpicks + l * E, words, dout + l);
                    }
                }
                CR(cudaStreamSynchronize(s));
                if (it)
                    t += now_s() - t0;
                CR(cudaMemcpy(hout, dout, sizeof(unsigned long long) * LAYERS, cudaMemcpyDeviceToHost));
                for (int l = 0; l < LAYERS; l++)
                    bad += hout[l] != want[l];
            }
            double ms = t / ITERS * 1e3;
            printf("%-12s %5d %10.3f %10.2f %8.3f %8.2f  %s\n", names[row], K, ms,
                   (double)LAYERS * K * S / (ms * 1e-3) / 1e9, bound_ms, bound_ms / ms,
                   bad ? "WRONG" : "ok");
        }
        CR(cudaGraphExecDestroy(ge));
        CR(cudaGraphDestroy(g));
        CR(cudaFree(dh));
        free(hh);
    }
    return 0;
}
