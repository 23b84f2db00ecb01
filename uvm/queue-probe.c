/* uvm/queue-probe.c: the dry run of uvm/queue-probe.h. */
#include "uvm/queue-probe.h"

#include <time.h>

#include "core/event.h"

CUresult wo_ids_to_host(const struct wo_driver *d, CUfunction fill, void *dst, CUdeviceptr src,
                        uint64_t n, CUstream st)
{
    unsigned long long bytes = n;
    void *to = dst;
    void *args[] = {&to, &src, &bytes};

    if (fill && d->cuLaunchKernel)
        return d->cuLaunchKernel(fill, 1, 1, 1, 256, 1, 1, 0, st, args, NULL);
    return d->cuMemcpyAsync((CUdeviceptr)(uintptr_t)dst, src, n, st);
}

bool wo_qprobe_init(const struct wo_driver *d, struct wo_qprobe *p)
{
    if (!d->cuMemHostAlloc || !d->cuMemHostGetDevicePointer_v2 || !d->cuMemAlloc_v2)
        return false;
    if (!p->words &&
        (d->cuMemHostAlloc((void **)&p->words, 2 * sizeof(uint32_t),
                           CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP) != CUDA_SUCCESS ||
         d->cuMemHostGetDevicePointer_v2(&p->words_dev, p->words, 0) != CUDA_SUCCESS))
        return false;
    if (!p->host && d->cuMemHostAlloc(&p->host, 64, CU_MEMHOSTALLOC_PORTABLE) != CUDA_SUCCESS)
        return false;
    if (!p->dev && d->cuMemAlloc_v2(&p->dev, 64) != CUDA_SUCCESS)
        return false;
    __atomic_store_n(&p->words[0], p->n, __ATOMIC_RELEASE);
    __atomic_store_n(&p->words[1], p->n, __ATOMIC_RELEASE);
    return true;
}

bool wo_qprobe_apart(const struct wo_driver *d, struct wo_qprobe *p, CUstream e, CUstream c,
                     CUfunction fill, uint64_t limit_ns)
{
    uint32_t n = ++p->n;
    bool met = false;

    /* e: a job's ids copy, then its wait */
    if (wo_ids_to_host(d, fill, p->host, p->dev, 4, e) != CUDA_SUCCESS ||
        d->cuStreamWaitValue32_v2(e, p->words_dev, n, CU_STREAM_WAIT_VALUE_GEQ) != CUDA_SUCCESS)
        return true;
    /* c: a job's expert copy, then its flag */
    if (d->cuMemcpyAsync(p->dev + 32, (CUdeviceptr)(uintptr_t)p->host + 32, 4, c) ==
            CUDA_SUCCESS &&
        d->cuStreamWriteValue32_v2(c, p->words_dev + sizeof(uint32_t), n, 0) == CUDA_SUCCESS)
        for (uint64_t t0 = wo_now_ns();
             !(met = (int32_t)(__atomic_load_n(&p->words[1], __ATOMIC_ACQUIRE) - n) >= 0) &&
             wo_now_ns() - t0 < limit_ns;) {
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
        }
    __atomic_store_n(&p->words[0], n, __ATOMIC_RELEASE); /* e goes on */
    return met;
}
