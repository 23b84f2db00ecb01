// bench/stream-alias.cu: does a stream waiting on a flag (cuStreamWaitValue32)
// hold off the work of another stream of the same context?
//
// The case: picks-dma's copy thread serves the engine's stream, which waits on
// the device for a flag that the copy stream writes after its copies. If the
// driver puts the copy stream on the same hardware queue as the waiting
// engine stream (streams share CUDA_DEVICE_MAX_CONNECTIONS queues, assigned as
// they are made), the copies sit behind the wait, and the wait for them: a
// deadlock. For each count K of streams made between the engine's stream and
// the copy stream, this probe enqueues on the engine stream a wait for flag
// >= 1, then on the copy stream a 1 MiB copy and the flag's write, and says
// whether the flag rose within 1 s (it then writes the flag from the host, so
// that the stream goes on). Rows: default streams, a copy stream of the
// highest priority, and a copy stream in a context of its own (primary vs
// created), all under the CUDA_DEVICE_MAX_CONNECTIONS the environment gives.
//
//   nvcc -O2 -o stream-alias bench/stream-alias.cu -lcuda
//   CUDA_DEVICE_MAX_CONNECTIONS=8 ./stream-alias [KMAX=40]
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cuda-check.h"

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

enum mode { PLAIN, PRIORITY, OWN_CTX };

/* 1: the copy stream's flag rose within 1 s while the engine stream waited */
static int one(CUcontext ctx, enum mode m, int k, void *src, CUdeviceptr dst,
               volatile uint32_t *flag, CUdeviceptr flag_dev)
{
    CUstream eng, cp, extra[64];
    CUcontext own = NULL;
    int lo, hi, ok;
    double t0;

    CK(cuCtxSetCurrent(ctx));
    *flag = 0;
    CK(cuStreamCreate(&eng, CU_STREAM_NON_BLOCKING));
    for (int i = 0; i < k; i++)
        CK(cuStreamCreate(&extra[i], CU_STREAM_NON_BLOCKING));
    if (m == PRIORITY) {
        CK(cuCtxGetStreamPriorityRange(&lo, &hi));
        CK(cuStreamCreateWithPriority(&cp, CU_STREAM_NON_BLOCKING, hi));
    } else if (m == OWN_CTX) {
        CUdevice dev;
        CK(cuCtxGetDevice(&dev));
        CK(cuCtxCreate(&own, NULL, 0, dev));
        CK(cuStreamCreate(&cp, CU_STREAM_NON_BLOCKING));
    } else {
        CK(cuStreamCreate(&cp, CU_STREAM_NON_BLOCKING));
    }
    CK(cuCtxSetCurrent(ctx));
    CK(cuStreamWaitValue32(eng, flag_dev, 1, CU_STREAM_WAIT_VALUE_GEQ));
    if (own)
        CK(cuCtxSetCurrent(own));
    if (own)
        CK(cuMemcpyPeerAsync(dst, ctx, (CUdeviceptr)(uintptr_t)src, own, 1 << 20, cp));
    else
        CK(cuMemcpyAsync(dst, (CUdeviceptr)(uintptr_t)src, 1 << 20, cp));
    CK(cuStreamWriteValue32(cp, flag_dev, 1, 0));
    t0 = now();
    while (*flag < 1 && now() - t0 < 1.0)
        usleep(100);
    ok = *flag >= 1;
    *flag = 1; /* lets both go on */
    CK(cuStreamSynchronize(cp));
    if (own) {
        CK(cuStreamDestroy(cp));
        CK(cuCtxDestroy(own));
        CK(cuCtxSetCurrent(ctx));
    } else {
        CK(cuStreamDestroy(cp));
    }
    CK(cuStreamSynchronize(eng));
    CK(cuStreamDestroy(eng));
    for (int i = 0; i < k; i++)
        CK(cuStreamDestroy(extra[i]));
    return ok;
}

int main(int argc, char **argv)
{
    int kmax = argc > 1 ? atoi(argv[1]) : 40;
    const char *names[] = {"plain", "priority", "own-context"};
    CUdevice dev;
    CUcontext ctx;
    void *src, *fh;
    CUdeviceptr dst, fd;

    if (kmax > 63)
        kmax = 63;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    CK(cuMemHostAlloc(&src, 1 << 20, CU_MEMHOSTALLOC_PORTABLE));
    CK(cuMemAlloc(&dst, 1 << 20));
    CK(cuMemHostAlloc(&fh, 4096, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP));
    CK(cuMemHostGetDevicePointer(&fd, fh, 0));
    printf("CUDA_DEVICE_MAX_CONNECTIONS=%s\n",
           getenv("CUDA_DEVICE_MAX_CONNECTIONS") ? getenv("CUDA_DEVICE_MAX_CONNECTIONS") : "(unset)");
    for (int m = PLAIN; m <= OWN_CTX; m++) {
        int stuck = 0;
        printf("%-12s stuck at K =", names[m]);
        for (int k = 0; k <= kmax; k++)
            if (!one(ctx, (enum mode)m, k, src, dst, (volatile uint32_t *)fh, fd)) {
                printf(" %d", k);
                stuck++;
            }
        printf("%s  (%d of %d)\n", stuck ? "" : " none", stuck, kmax + 1);
        fflush(stdout);
    }
    return 0;
}
