/* uvm/stream-check.c: write checks of the streaming executor's slots (see
 * stream-check.h). One device buffer holds the hash each range was staged
 * with (by registry id), the hash each slot has now, and the scratch of the
 * two hash launches that may run at once (one on the copy stream, one on
 * the checker's); one page of mapped host memory per 1024 ids holds the
 * flags. */
#include "uvm/stream-check.h"

#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "uvm/internal.h"
#include "uvm/hotpath.h"

#define HASH_BLOCKS 256u
#define HASH_THREADS 256u
#define CHECK_BLOCKS 64u
#define CHECK_THREADS 256u

/* offsets in the device buffer */
#define OFF_WANT 0
#define OFF_GOT (OFF_WANT + 8 * (uint64_t)WO_STREAM_ENTRIES)
#define OFF_PART_COPY (OFF_GOT + 8 * (uint64_t)WO_STREAM_MAX_SLOTS)
#define OFF_PART_CHECK (OFF_PART_COPY + 8 * (uint64_t)HASH_BLOCKS)
#define OFF_COUNT_COPY (OFF_PART_CHECK + 8 * (uint64_t)HASH_BLOCKS)
#define OFF_COUNT_CHECK (OFF_COUNT_COPY + 8)
#define OFF_FLAGS (OFF_COUNT_CHECK + 8) /* when no mapped host memory is had */
#define BUF_BYTES (OFF_FLAGS + 4 * (uint64_t)WO_STREAM_ENTRIES)

static struct {
    const struct wo_driver *d;
    CUfunction hash, check, flag;
    CUstream s; /* the checker's stream */
    CUdeviceptr buf;
    unsigned *flags; /* by registry id: mapped host memory, or a copy of OFF_FLAGS */
    CUdeviceptr flags_dev;
    bool mapped;     /* flags is mapped host memory (else read back by cuMemcpy) */
    CUevent done[WO_STREAM_MAX_SLOTS];
    unsigned nslots;
    bool on;
} ck;

bool wo_check_start(const struct wo_driver *d, CUmodule mod, unsigned nslots)
{
    CUresult res = CUDA_ERROR_NOT_SUPPORTED;
    void *flags = NULL;

    memset(&ck, 0, sizeof(ck));
    ck.d = d;
    ck.nslots = nslots;
    if (mod && d->cuModuleGetFunction && d->cuMemHostAlloc && d->cuMemHostGetDevicePointer_v2 &&
        d->cuMemsetD8_v2 && d->cuEventQuery && d->cuLaunchKernel) {
        res = wo_quiet_module_function(d, &ck.hash, mod, "wo_stream_hash");
        if (res == CUDA_SUCCESS)
            res = wo_quiet_module_function(d, &ck.check, mod, "wo_stream_check");
        if (res == CUDA_SUCCESS)
            res = wo_quiet_module_function(d, &ck.flag, mod, "wo_stream_flag");
        if (res == CUDA_SUCCESS)
            res = d->cuStreamCreate(&ck.s, CU_STREAM_NON_BLOCKING);
        if (res == CUDA_SUCCESS)
            res = d->cuMemAlloc_v2(&ck.buf, BUF_BYTES);
        if (res == CUDA_SUCCESS)
            res = d->cuMemsetD8_v2(ck.buf, 0, BUF_BYTES);
        /* the flags in mapped host memory, else (pinning fails: the
         * memlock limit) in the buffer, read back when a check finished */
        if (res == CUDA_SUCCESS &&
            d->cuMemHostAlloc(&flags, 4 * (size_t)WO_STREAM_ENTRIES,
                              CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE) ==
                CUDA_SUCCESS) {
            memset(flags, 0, 4 * (size_t)WO_STREAM_ENTRIES);
            if (d->cuMemHostGetDevicePointer_v2(&ck.flags_dev, flags, 0) == CUDA_SUCCESS) {
                ck.flags = flags;
                ck.mapped = true;
            } else if (d->cuMemFreeHost) {
                d->cuMemFreeHost(flags);
            }
        }
        if (res == CUDA_SUCCESS && !ck.mapped) {
            ck.flags = calloc(WO_STREAM_ENTRIES, 4);
            ck.flags_dev = ck.buf + OFF_FLAGS;
            if (!ck.flags || !d->cuMemcpyAsync || !d->cuStreamSynchronize)
                res = CUDA_ERROR_OUT_OF_MEMORY;
        }
        for (unsigned i = 0; i < nslots && res == CUDA_SUCCESS; i++)
            res = d->cuEventCreate(&ck.done[i], CU_EVENT_DISABLE_TIMING);
    }
    if (res != CUDA_SUCCESS) {
        wo_warn("stream: no write checks of the staging slots (%s): nothing is streamed, "
                "every range is read in place",
                wo_cu_error_name(res));
        wo_check_stop();
        return false;
    }
    ck.on = true;
    return true;
}

static CUresult hash(CUstream s, CUdeviceptr dev, uint64_t n, uint64_t part, uint64_t count,
                     uint64_t out)
{
    CUdeviceptr p = ck.buf + part, c = ck.buf + count, o = ck.buf + out;
    unsigned long long bytes = n;
    void *args[] = {&dev, &bytes, &p, &c, &o};

    return ck.d->cuLaunchKernel(ck.hash, HASH_BLOCKS, 1, 1, HASH_THREADS, 1, 1, 0, s, args, NULL);
}

CUresult wo_check_first(CUstream copy, CUdeviceptr dev, uint64_t n, uint32_t id)
{
    if (!ck.on || id >= WO_STREAM_ENTRIES)
        return CUDA_ERROR_NOT_INITIALIZED;
    return hash(copy, dev, n, OFF_PART_COPY, OFF_COUNT_COPY, OFF_WANT + 8 * (uint64_t)id);
}

CUresult wo_check_slot(unsigned slot, CUdeviceptr dev, uint64_t n, uint32_t id, uint32_t tag,
                       CUdeviceptr dst, CUevent copied, CUevent read_done, CUstream copy)
{
    const struct wo_driver *d = ck.d;
    CUdeviceptr want = ck.buf + OFF_WANT + 8 * (uint64_t)id;
    CUdeviceptr got = ck.buf + OFF_GOT + 8 * (uint64_t)slot;
    CUdeviceptr flag = ck.flags_dev + 4 * (uint64_t)id;
    unsigned long long bytes = n;
    void *cargs[] = {&dev, &bytes, &want, &got, &dst};
    unsigned t = tag;
    void *fargs[] = {&want, &got, &flag, &t};
    CUresult res;

    if (!ck.on || id >= WO_STREAM_ENTRIES || slot >= ck.nslots)
        return CUDA_ERROR_NOT_INITIALIZED;
    /* after the copy that staged it (a slot no launch read has no
     * read_done to wait for) and every launch that read it */
    res = d->cuStreamWaitEvent(ck.s, copied, 0);
    if (res == CUDA_SUCCESS)
        res = d->cuStreamWaitEvent(ck.s, read_done, 0);
    if (res == CUDA_SUCCESS)
        res = hash(ck.s, dev, n, OFF_PART_CHECK, OFF_COUNT_CHECK, OFF_GOT + 8 * (uint64_t)slot);
    if (res == CUDA_SUCCESS)
        res = d->cuLaunchKernel(ck.check, CHECK_BLOCKS, 1, 1, CHECK_THREADS, 1, 1, 0, ck.s, cargs,
                                NULL);
    if (res == CUDA_SUCCESS)
        res = d->cuLaunchKernel(ck.flag, 1, 1, 1, 1, 1, 1, 0, ck.s, fargs, NULL);
    if (res == CUDA_SUCCESS)
        res = d->cuEventRecord(ck.done[slot], ck.s);
    if (res == CUDA_SUCCESS)
        res = d->cuStreamWaitEvent(copy, ck.done[slot], 0);
    return res;
}

bool wo_check_done(unsigned slot)
{
    return !ck.on || slot >= ck.nslots || ck.d->cuEventQuery(ck.done[slot]) != CUDA_ERROR_NOT_READY;
}

void wo_check_read(uint32_t n)
{
    /* on the checker's stream: the legacy stream would wait for the
     * engine's work */
    if (ck.on && !ck.mapped && n &&
        ck.d->cuMemcpyAsync((CUdeviceptr)(uintptr_t)ck.flags, ck.flags_dev,
                            4 * (size_t)(n < WO_STREAM_ENTRIES ? n : WO_STREAM_ENTRIES),
                            ck.s) == CUDA_SUCCESS)
        (void)ck.d->cuStreamSynchronize(ck.s);
}

bool wo_check_take(uint32_t id, uint32_t tag)
{
    return ck.on && id < WO_STREAM_ENTRIES && __atomic_load_n(&ck.flags[id], __ATOMIC_ACQUIRE) == tag;
}

void wo_check_sync(void)
{
    if (ck.on && ck.d->cuStreamSynchronize)
        ck.d->cuStreamSynchronize(ck.s);
}

void wo_check_stop(void)
{
    const struct wo_driver *d = ck.d;

    if (!d)
        return;
    if (ck.s && d->cuStreamSynchronize)
        d->cuStreamSynchronize(ck.s);
    for (unsigned i = 0; i < WO_STREAM_MAX_SLOTS; i++)
        if (ck.done[i] && d->cuEventDestroy_v2)
            d->cuEventDestroy_v2(ck.done[i]);
    if (ck.flags && ck.mapped && d->cuMemFreeHost)
        d->cuMemFreeHost(ck.flags);
    else
        free(ck.flags);
    if (ck.buf && d->cuMemFree_v2)
        d->cuMemFree_v2(ck.buf);
    if (ck.s && d->cuStreamDestroy_v2)
        d->cuStreamDestroy_v2(ck.s);
    memset(&ck, 0, sizeof(ck));
}

/* the parent's state in a forked child: its host memory (the flags read
 * back by copy) stays reachable for leak checkers, as stream.c keeps the
 * parent's executor; its device handles mean nothing here */
static __attribute__((used)) void *parents_flags;

void wo_check_atfork_child(void)
{
    if (!ck.mapped)
        parents_flags = ck.flags;
    memset(&ck, 0, sizeof(ck));
}
