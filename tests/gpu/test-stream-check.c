/* tests/gpu/test-stream-check.c: the streaming slots' write checks
 * (uvm/stream-check.c, their kernels in uvm/stream-copy.cu) on the real GPU
 * (suite 'gpu'), and on the fake driver in CI.
 *
 * For slot sizes that exercise every path of the hash kernel (1 byte, odd
 * and even word counts, tails of 1-7 bytes, a few MiB, 64 MiB over many
 * blocks), a range in pinned host memory is staged into a device slot and
 * hashed as the executor does at the first staging; then:
 *  - the slot unchanged: the check must not flag it and must leave the range
 *    as it was;
 *  - one byte of the slot changed (first, middle, last; each bit value): the
 *    check must flag the range with the tag it was given, and the range must
 *    then equal the slot byte for byte (copied back);
 *  - the same bytes with two words swapped (a hash that only summed the
 *    words would miss it): flagged.
 * Every check waits for an event recorded after the staging copy (copied)
 * and for one never recorded (read_done: a slot no launch read).
 *
 * Usage: test-stream-check. Exit: 0 pass, 1 fail, 77 no GPU (skipped). */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "uvm/internal.h"
#include "uvm/stream-check.h"
#include "uvm/stream-copy-ptx.h"
#include "uvm/uvm.h"
#include "gpu-test.h"

static CUresult (*memcpy_dtoh)(void *, CUdeviceptr, size_t);




static uint64_t rng = 0x2545F4914F6CDD1Dull;
static unsigned char next_byte(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (unsigned char)(rng >> 24);
}

/* One check of the slot at dev against range id's first hash; whether it
 * flagged the range. */
static bool check(CUstream copy, CUevent copied, CUevent read_done, CUdeviceptr dev, size_t n,
                  uint32_t id, uint32_t tag, CUdeviceptr range)
{
    CK(wo_check_slot(0, dev, n, id, tag, range, copied, read_done, copy));
    CK(drv.cuStreamSynchronize(copy));
    wo_check_sync();
    EXPECT(wo_check_done(0), "size %zu: the check's event did not finish", n);
    wo_check_read(id + 1);
    return wo_check_take(id, tag);
}

int main(void)
{
    static const size_t sizes[] = {1,  7,  8,         9,         15,       16,       17,
                                   24, 40, 4096 + 5, 3u << 20, 64u << 20, 1u << 20};
    CUmodule mod;
    CUstream copy;
    CUevent copied, read_done;
    uint32_t id = 0, tag = 1;
    unsigned checks = 0;
    int rc;

    rc = gpu_open("test-stream-check");
    if (rc)
        return rc;
    *(void **)&memcpy_dtoh = dlsym(lib, "cuMemcpyDtoH_v2");
    if (!memcpy_dtoh)
        return 1;
    CK(drv.cuModuleLoadData(&mod, wo_stream_copy_ptx));
    if (!wo_check_start(&drv, mod, 1)) {
        printf("FAIL: wo_check_start\n");
        return 1;
    }
    CK(drv.cuStreamCreate(&copy, CU_STREAM_NON_BLOCKING));
    CK(drv.cuEventCreate(&copied, CU_EVENT_DISABLE_TIMING));
    CK(drv.cuEventCreate(&read_done, CU_EVENT_DISABLE_TIMING)); /* never recorded */

    for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
        size_t n = sizes[si];
        size_t at[] = {0, n / 2, n - 1};
        unsigned char *host = NULL, *want = malloc(n), *got = NULL;
        CUdeviceptr range = 0, slot = 0, got_dev = 0;

        CK(drv.cuMemHostAlloc((void **)&host, n, CU_MEMHOSTALLOC_DEVICEMAP));
        CK(drv.cuMemHostGetDevicePointer_v2(&range, host, 0));
        /* pinned: a write into the slot from pageable memory may still be
         * under way when cuMemcpyHtoD returns (the driver stages it), and
         * the check's stream would hash the slot before it landed */
        CK(drv.cuMemHostAlloc((void **)&got, n, CU_MEMHOSTALLOC_DEVICEMAP));
        CK(drv.cuMemHostGetDevicePointer_v2(&got_dev, got, 0));
        CK(drv.cuMemAlloc_v2(&slot, n));
        for (size_t i = 0; i < n; i++)
            host[i] = next_byte();
        for (unsigned k = 0; k < 3 + (n >= 16); k++) {
            /* stage: the range into the slot, its first hash, copied */
            CK(drv.cuMemcpyAsync(slot, range, n, copy));
            CK(wo_check_first(copy, slot, n, id));
            CK(drv.cuEventRecord(copied, copy));
            CK(drv.cuStreamSynchronize(copy));
            if (k == 0) {
                /* unchanged: no flag, the range as it was */
                memcpy(want, host, n);
                EXPECT(!check(copy, copied, read_done, slot, n, id, tag, range),
                       "size %zu: an unchanged slot was flagged", n);
                EXPECT(memcmp(host, want, n) == 0, "size %zu: an unchanged slot changed the range",
                       n);
                checks++;
                /* the next case: a new id and tag, a new first hash */
                id++;
                tag += 2;
                CK(drv.cuMemcpyAsync(slot, range, n, copy));
                CK(wo_check_first(copy, slot, n, id));
                CK(drv.cuEventRecord(copied, copy));
                CK(drv.cuStreamSynchronize(copy));
            }
            CK(memcpy_dtoh(got, slot, n));
            if (k < 3) {
                /* one byte, as a launch writing the slot would */
                got[at[k]] ^= (unsigned char)(1u << (k + si) % 8);
            } else {
                /* two words swapped: the same words, other places */
                unsigned char t[8];
                memcpy(t, got, 8);
                memcpy(got, got + 8, 8);
                memcpy(got + 8, t, 8);
                if (memcmp(got, host, n) == 0) /* equal words: make them differ */
                    got[0] ^= 1;
            }
            CK(drv.cuMemcpyAsync(slot, got_dev, n, copy));
            CK(drv.cuStreamSynchronize(copy));
            EXPECT(check(copy, copied, read_done, slot, n, id, tag, range),
                   "size %zu, change %u: a written slot was not flagged", n, k);
            EXPECT(memcmp(host, got, n) == 0,
                   "size %zu, change %u: the range is not the written slot", n, k);
            checks++;
            id++;
            tag += 2;
        }
        CK(drv.cuMemFree_v2(slot));
        CK(drv.cuMemFreeHost(host));
        CK(drv.cuMemFreeHost(got));
        free(want);
    }
    wo_check_stop();
    CK(drv.cuEventDestroy_v2(copied));
    CK(drv.cuEventDestroy_v2(read_done));
    CK(drv.cuStreamDestroy_v2(copy));
    CK(drv.cuModuleUnload(mod));
    printf("%s: %u checks over %zu slot sizes (1 B to 64 MiB), %d failed\n",
           failures ? "FAIL" : "ok", checks, sizeof(sizes) / sizeof(sizes[0]), failures);
    return failures ? 1 : 0;
}
