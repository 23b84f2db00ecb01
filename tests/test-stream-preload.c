/* tests/test-stream-preload.c: the streaming executor end to end through
 * the preloaded shim and the fake driver (issue 18, launch redirection).
 *
 * An engine-like child tags NR host ranges of 1 MiB ("experts") and, every
 * step, launches a kernel that reads each range READS times through its
 * base pointer (kernels are host functions in the fake: the checksum is
 * computed from whatever pointer the launch handed them). The parent runs
 * the child under three policies and reads the stats file its exit wrote:
 *
 *  - mode stream: every checksum equals the host data's (bit-identical
 *    reads), launches were redirected to device slots (the kernel saw
 *    pointers outside the range), the bytes staged per step are about the
 *    distinct bytes (NR MiB), not READS times them; a copy into a range
 *    after seal drops its slot, and the next step reads the new data (a
 *    2-D copy too, by where its rows land, not its base); a
 *    launch into a capture is not redirected and its graph still reads the
 *    right data; the read multiplicity per name is ~READS;
 *  - mode auto: the same ranges are streamed once measured (read 4x a step);
 *  - mode auto, each range read once a step (auto-time): no gain to stream
 *    for, so only the step-time rule can: it tries, and since a read from
 *    a slot is made slower there, puts them back in place, every read
 *    bit-identical through the switch;
 *  - mode hot-set: nothing is redirected, and one warning names a range
 *    read 2x or more a step in place with the fix.
 *
 * Pinned copies (uvm/stream-pin.c) ride along: `stream` asks for them
 * (most staging copies then come from them; the written range's copy is
 * retired), `auto` caps them at three ranges, the others run the default
 * (none), `stream-nopin` asks while every pin fails (one warning, all
 * staged by the copy kernel, nothing lost), `stream-exit` exits while the
 * worker has slow pins queued (the exit does not wait for them), and
 * `stream-capture` holds a global-mode capture while pins are queued (it
 * ends valid: the worker's driver calls wait for it), and `stream-relaxed`
 * captures on the engine's stream in relaxed mode, as llama.cpp does, while
 * the executor fences that stream (every capture ends valid).
 *
 * Every weight is the first MiB of a 2 MiB allocation, as PyTorch's caching
 * allocator leaves them: the untagged tail is where the engine puts
 * activations after seal. Each layer, a kernel writes such an activation
 * in a tail chosen at random: it must write host memory (never a slot),
 * and its launches must not hide the step from the executor. One more
 * allocation has an untagged gap between its two tags: it is never
 * streamed, however often it is read; one whose tags are apart by less
 * than an alignment (512 bytes) is. In mode stream, two more hold a
 * device-placed tag between their host tags, as llama.cpp's model buffer
 * does: one is split into a sub-span per host tag, each streamed; the
 * other also holds bytes no tag names, and is read in place.
 *
 * Each layer also hands a kernel a word that is not a pointer but whose
 * value falls (unaligned) inside the weight just staged: the kernel must
 * get it unchanged (core/event.h, wo_hit_pointer_like).
 *
 * Needs LD_PRELOAD=the shim and LD_LIBRARY_PATH=the fake driver's
 * directory (meson sets both). */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cuda.h>

#include "fakecuda.h"
#include "gpu/wsum.h"

#define MiB ((size_t)1 << 20)
#define NR 20
#define READS 4
#define STEPS 40

#include "preload-check.h"

/* ---- the child: an engine ---------------------------------------------------- */

static CUdeviceptr ranges[NR], gapped, padded, split96, split97;
static uint64_t redirected_reads; /* launches whose pointer was not the range's */
static uint64_t stray_writes;     /* activation writes outside every tail */
static uint64_t rewritten_words;  /* non-pointer words the kernel got changed */
static unsigned slot_read_us;     /* auto-time: a read from a slot takes this much longer */
static unsigned inplace_read_us;  /* auto-managed: a weight read in place takes this much longer */

/* params: const unsigned char *p, uint64_t n, uint64_t *out: host_sum
 * (gpu/wsum.h) of the n bytes (a multiple of 8), word by word (a byte-wise
 * hash here was 85% of this test's CPU, more under a sanitizer) */
static void checksum(void **params, const uint32_t g[3], const uint32_t b[3])
{
    CUdeviceptr p = *(CUdeviceptr *)params[0];
    uint64_t n = *(uint64_t *)params[1];
    uint64_t *out = (uint64_t *)(uintptr_t) * (CUdeviceptr *)params[2];
    bool ours = false, weight = false;

    (void)g;
    (void)b;
    for (int i = 0; i < NR; i++)
        weight |= p >= ranges[i] && p < ranges[i] + MiB;
    ours = weight || p == gapped || p == padded || (p >= split96 && p < split96 + MiB) ||
           (p >= split97 && p < split97 + MiB);
    if (!ours) {
        __atomic_add_fetch(&redirected_reads, 1, __ATOMIC_RELAXED);
        if (slot_read_us)
            usleep(slot_read_us);
    } else if (weight && inplace_read_us) {
        usleep(inplace_read_us);
    }
    *out = host_sum((const uint64_t *)(uintptr_t)p, n / 8);
}

/* params: uint64_t value, uint64_t *out: hands back the word it was given
 * (a kernel parameter that is not a pointer, whose value happens to fall in
 * a streamed weight: it must reach the kernel as it was passed) */
static void echo(void **params, const uint32_t g[3], const uint32_t b[3])
{
    (void)g;
    (void)b;
    *(uint64_t *)(uintptr_t) * (CUdeviceptr *)params[1] = *(uint64_t *)params[0];
}

/* params: a weight pointer (unused), uint64_t value, uint64_t *out: writes
 * value to out (a launch that reads a streamed weight and also carries a
 * word that is no pointer slot) */
static void pair(void **params, const uint32_t g[3], const uint32_t b[3])
{
    (void)g;
    (void)b;
    *(uint64_t *)(uintptr_t) * (CUdeviceptr *)params[2] = *(uint64_t *)params[1];
}

/* params: unsigned char *dst, const unsigned char *src, uint64_t n: a
 * kernel that writes a weight (an RL trainer's weight sync, a repacking):
 * dst gets src's bytes. Counts the writes that reached a slot. */
static uint64_t slot_writes;
static bool slot_primed; /* (4): a read of range 6 came from its slot just before the write */
static void overwrite(void **params, const uint32_t g[3], const uint32_t b[3])
{
    CUdeviceptr d = *(CUdeviceptr *)params[0], src = *(CUdeviceptr *)params[1];
    bool weight = false;

    (void)g;
    (void)b;
    for (int i = 0; i < NR; i++)
        weight |= d >= ranges[i] && d < ranges[i] + MiB;
    if (!weight)
        __atomic_add_fetch(&slot_writes, 1, __ATOMIC_RELAXED);
    memmove((void *)(uintptr_t)d, (const void *)(uintptr_t)src, *(uint64_t *)params[2]);
}

/* params: unsigned char *p, uint64_t n, uint64_t seed: a kernel of its own
 * that writes one weight in place, its only one (so it is no reader and
 * never redirected: launch.c): p[j] = a pattern of seed */
static uint64_t inplace_writes;
static void poke(void **params, const uint32_t g[3], const uint32_t b[3])
{
    unsigned char *p = (unsigned char *)(uintptr_t) * (CUdeviceptr *)params[0];
    uint64_t n = *(uint64_t *)params[1], seed = *(uint64_t *)params[2];
    bool weight = false;

    (void)g;
    (void)b;
    for (int i = 0; i < NR; i++)
        weight |=
            (CUdeviceptr)(uintptr_t)p >= ranges[i] && (CUdeviceptr)(uintptr_t)p < ranges[i] + MiB;
    if (weight)
        __atomic_add_fetch(&inplace_writes, 1, __ATOMIC_RELAXED);
    for (uint64_t j = 0; j < n; j++)
        p[j] = (unsigned char)(j * 7 + seed);
}

/* params: unsigned char **table, uint64_t n, uint64_t seed: writes a
 * pattern of seed into the n bytes at the address table[0] holds (a
 * collective writing a buffer its work descriptor names) */
static uint64_t blind_writes;
static void broadcast(void **params, const uint32_t g[3], const uint32_t b[3])
{
    CUdeviceptr t = *(CUdeviceptr *)params[0];
    unsigned char *p = *(unsigned char **)(uintptr_t)t;
    uint64_t n = *(uint64_t *)params[1], seed = *(uint64_t *)params[2];

    (void)g;
    (void)b;
    __atomic_add_fetch(&blind_writes, 1, __ATOMIC_RELAXED);
    for (uint64_t j = 0; j < n; j++)
        p[j] = (unsigned char)(j * 7 + seed);
}

/* params: uint64_t *where, uint64_t value: an activation written after seal */
static void scribble(void **params, const uint32_t g[3], const uint32_t b[3])
{
    CUdeviceptr p = *(CUdeviceptr *)params[0];
    bool tail = false;

    (void)g;
    (void)b;
    for (int i = 0; i < NR; i++)
        tail |= p >= ranges[i] + MiB && p + 8 <= ranges[i] + 2 * MiB;
    if (!tail)
        __atomic_add_fetch(&stray_writes, 1, __ATOMIC_RELAXED);
    *(uint64_t *)(uintptr_t)p = *(uint64_t *)params[1];
}

static int child(const char *mode)
{
    void *cu = dlopen("libcuda.so.1", RTLD_NOW);
    CUresult (*p_cuInit)(unsigned), (*p_cuDeviceGet)(CUdevice *, int);
    CUresult (*p_cuCtxRetain)(CUcontext *, CUdevice), (*p_cuCtxSetCurrent)(CUcontext);
    CUresult (*p_cuCtxCreate)(CUcontext *, unsigned, CUdevice);
    CUresult (*p_cuMemAlloc)(CUdeviceptr *, size_t), (*p_cuMemFree)(CUdeviceptr);
    CUresult (*p_cuMemcpyHtoD)(CUdeviceptr, const void *, size_t);
    CUresult (*p_cuMemcpyDtoH)(void *, CUdeviceptr, size_t);
    CUresult (*p_cuMemcpy2D)(const CUDA_MEMCPY2D *);
    CUresult (*p_cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                                 unsigned, unsigned, CUstream, void **, void **);
    CUresult (*p_cuLaunchKernelEx)(const CUlaunchConfig *, CUfunction, void **, void **);
    CUresult (*p_cuStreamCreate)(CUstream *, unsigned);
    CUresult (*p_cuBeginCapture)(CUstream, CUstreamCaptureMode);
    CUresult (*p_cuEndCapture)(CUstream, CUgraph *);
    CUresult (*p_cuInstantiate)(CUgraphExec *, CUgraph, unsigned long long);
    CUresult (*p_cuGraphLaunch)(CUgraphExec, CUstream);
    CUresult (*p_cuGraphCreate)(CUgraph *, unsigned);
    CUresult (*p_cuBeginCaptureToGraph)(CUstream, CUgraph, const CUgraphNode *,
                                        const CUgraphEdgeData *, size_t, CUstreamCaptureMode);
    CUresult (*p_cuGraphDestroy)(CUgraph), (*p_cuGraphExecDestroy)(CUgraphExec);
    CUresult (*p_cuEventCreate)(CUevent *, unsigned), (*p_cuEventRecord)(CUevent, CUstream);
    CUresult (*p_cuStreamWaitEvent)(CUstream, CUevent, unsigned);
    CUresult (*p_cuEventDestroy)(CUevent);
    CUresult (*p_cuGraphAddKernelNode)(CUgraphNode *, CUgraph, const CUgraphNode *, size_t,
                                       const CUDA_KERNEL_NODE_PARAMS *);
    CUresult (*p_cuStreamSync)(CUstream);
    CUfunction (*kernel)(const char *, int, const size_t *, fakecuda_kernel_fn);
    int (*tag)(const void *, size_t, const char *);
    int (*seal)(void);
    long (*stats)(char *, size_t);
    static const size_t psz[3] = {8, 8, 8};
    uint64_t expect[NR], expect_gapped, expect_padded, lcg = 12345;
    /* the split allocations' host tags: 96's a and b, 97's a and c */
    uint64_t expect_split[4];
    CUdeviceptr split_at[4];
    const uint64_t split_n[4] = {MiB / 4, MiB / 4, MiB / 8, MiB / 4};
    bool stream_mode = strcmp(mode, "stream") == 0;
    /* auto-time: each range read once a step, so no gain: only auto's
     * step-time rule (uvm/stream-auto.c) can stream them, and it needs
     * steps to find the period, measure in place, then try */
    /* auto-managed: nothing read more than once a step (no pair launches,
     * no gapped or padded reads), so nothing is streamed for its gain and
     * the planner's hot set has the whole budget until auto's try */
    bool managed_mode = strncmp(mode, "auto-managed", 12) == 0;
    bool time_mode = strcmp(mode, "auto-time") == 0 || managed_mode;
    /* stream-nopin: stream with pinned copies asked for while pinning
     * fails (the fake driver fails every pinning call, as a memlock
     * limit would): fewer steps suffice */
    bool nopin_mode = strcmp(mode, "stream-nopin") == 0;
    /* stream-exit: the engine exits (no frees) while the pinned-copy worker
     * still has copies to make, each pin made slow (0.3 s): the exit must
     * not wait for them */
    bool exit_mode = strcmp(mode, "stream-exit") == 0;
    /* stream-capture: a global-mode capture while the worker has pins to
     * make (0.1 s each): no driver call of the shim's may reach the
     * driver while it is under way (it would invalidate the capture), and
     * the pins go on after it */
    bool cap_mode = strcmp(mode, "stream-capture") == 0;
    /* stream-relaxed: llama.cpp's captures: each layer, a relaxed-mode
     * capture after another on the engine's own stream (once into a graph
     * of the engine's own: cuStreamBeginCaptureToGraph; once joined from
     * another stream's capture through an event), while the
     * executor records its fence on that stream (every record made 3 ms
     * slow, so a capture begins between the executor's look at the stream
     * and its record): every capture must end valid */
    bool relaxed_mode = strcmp(mode, "stream-relaxed") == 0;
    int broken_captures = 0;
    /* stream-unfenced: the NCCL-named kernel of (3b) runs on a stream of
     * another context (its own communicator's, say), where the shim's
     * fence event, made in the engine's context, cannot be recorded (the
     * driver, and the fake, refuse an event and a stream of two contexts):
     * nothing is streamed from then on, and every read stays right */
    bool unfenced_mode = strcmp(mode, "stream-unfenced") == 0;
    /* stream-sized: the odd ranges are half a MiB (Qwen3's gate_up and
     * down tensors in turn): the slots, made before a step's order is
     * known, all of 1 MiB, are resized to 1, 1 and 0.5 MiB, and each range
     * takes the smallest slot it fits */
    /* auto-managed-sized-pair: the same with the 64 KiB ranges the even
     * ones, in a budget of 10 MiB (run()) */
    bool pair_mode = strcmp(mode, "auto-managed-sized-pair") == 0;
    bool sized_mode = strncmp(mode, "stream-sized", 12) == 0 ||
                      strcmp(mode, "auto-managed-sized") == 0 || pair_mode;
    /* auto-managed and auto-managed-sized(-pair): streaming pays (reads in
     * place made slower); auto-managed-back: it does not (reads from a
     * slot) */
    /* auto-managed-recheck: streaming pays at first (auto-managed), then
     * from RECHECK_SWAP on reads in place are fast and reads from a slot
     * slow: the recheck (WOFFLOAD_STREAM_RECHECK=12, run()) takes the
     * decision again and the ranges go back in place */
    bool recheck_mode = strcmp(mode, "auto-managed-recheck") == 0;
    bool managed_pays = strcmp(mode, "auto-managed") == 0 ||
                        strcmp(mode, "auto-managed-sized") == 0 || pair_mode || recheck_mode;
    /* auto-drift: host ranges read once a step (no pair launches, no
     * gapped or padded reads: nothing streamed for its gain), slower in
     * place than from a slot, and each step of the first DRIFT_STEP made 60 ms longer (a
     * batch that then shrinks): auto streams them, holds, the period
     * drifts, it measures in place again and streams them again, with the
     * slots it made once (uvm/stream.c, keep_slots) */
    bool drift_mode = strcmp(mode, "auto-drift") == 0;
#define DRIFT_STEP 100
    int reads = time_mode || drift_mode ? 1 : READS;
    int steps = drift_mode                                            ? DRIFT_STEP + 50
                : recheck_mode                                        ? 5 * STEPS / 2
                : time_mode                                           ? 3 * STEPS / 2
                : nopin_mode || exit_mode || cap_mode || relaxed_mode ? STEPS / 2
                                                                      : STEPS;
    /* auto-managed-sized: 64 KiB, so the slots' shrinking frees the room
     * of one 2 MiB allocation, which goes back to the planner */
#define RANGE_BYTES(i)                                                                             \
    (sized_mode && (((i) + pair_mode) & 1) ? managed_mode ? MiB / 16 : MiB / 2 : MiB)

    /* streamed steps come out slower (the fake's "device" is host memory):
     * auto must put the ranges back in place */
    slot_read_us = time_mode && !managed_pays ? 10000 : 0;
    /* ~200 ms a step: above any scheduling noise (TSan, two cores shared
     * with other tests; at 3 ms a read, ~60 ms a step, CI's TSan run once
     * measured the streamed steps faster and kept them). auto-managed:
     * managed ranges, read in place
     * slower than from a slot, so auto keeps streaming those the hot set
     * leaves out (the fake's GPU is host memory: a resident range is as
     * slow, which only makes streaming look better) */
    inplace_read_us = managed_pays ? 10000 : drift_mode ? 2000 : 0;
    CUdeviceptr out;
    CUdevice dev;
    CUcontext ctx;
    CUstream s;
    CUfunction k, kb, ks, ke, kst, kp, kw, kpk, knc, kpe;
    CUdeviceptr table = 0;
    unsigned char *buf = malloc(MiB);
    uint64_t wrong = 0;

    if (!cu || !buf)
        return 1;
    *(void **)&p_cuInit = need(cu, "cuInit");
    *(void **)&p_cuDeviceGet = need(cu, "cuDeviceGet");
    *(void **)&p_cuCtxRetain = need(cu, "cuDevicePrimaryCtxRetain");
    *(void **)&p_cuCtxSetCurrent = need(cu, "cuCtxSetCurrent");
    *(void **)&p_cuCtxCreate = need(cu, "cuCtxCreate_v2");
    *(void **)&p_cuMemAlloc = need(cu, "cuMemAlloc_v2");
    *(void **)&p_cuMemFree = need(cu, "cuMemFree_v2");
    *(void **)&p_cuMemcpyHtoD = need(cu, "cuMemcpyHtoD_v2");
    *(void **)&p_cuMemcpyDtoH = need(cu, "cuMemcpyDtoH_v2");
    *(void **)&p_cuMemcpy2D = need(cu, "cuMemcpy2D_v2");
    *(void **)&p_cuLaunchKernel = need(cu, "cuLaunchKernel");
    *(void **)&p_cuLaunchKernelEx = need(cu, "cuLaunchKernelEx");
    *(void **)&p_cuStreamCreate = need(cu, "cuStreamCreate");
    *(void **)&p_cuBeginCapture = need(cu, "cuStreamBeginCapture_v2");
    *(void **)&p_cuEndCapture = need(cu, "cuStreamEndCapture");
    *(void **)&p_cuInstantiate = need(cu, "cuGraphInstantiateWithFlags");
    *(void **)&p_cuGraphLaunch = need(cu, "cuGraphLaunch");
    *(void **)&p_cuGraphCreate = need(cu, "cuGraphCreate");
    *(void **)&p_cuBeginCaptureToGraph = need(cu, "cuStreamBeginCaptureToGraph");
    *(void **)&p_cuGraphDestroy = need(cu, "cuGraphDestroy");
    *(void **)&p_cuGraphExecDestroy = need(cu, "cuGraphExecDestroy");
    *(void **)&p_cuEventCreate = need(cu, "cuEventCreate");
    *(void **)&p_cuEventRecord = need(cu, "cuEventRecord");
    *(void **)&p_cuStreamWaitEvent = need(cu, "cuStreamWaitEvent");
    *(void **)&p_cuEventDestroy = need(cu, "cuEventDestroy_v2");
    *(void **)&p_cuGraphAddKernelNode = need(cu, "cuGraphAddKernelNode_v2");
    *(void **)&p_cuStreamSync = need(cu, "cuStreamSynchronize");
    *(void **)&kernel = need(cu, "fakecuda_kernel");
    *(void **)&tag = need(RTLD_DEFAULT, "woffload_tag");
    *(void **)&seal = need(RTLD_DEFAULT, "woffload_seal");
    *(void **)&stats = need(RTLD_DEFAULT, "woffload_stats");

    CHECK(p_cuInit(0) == CUDA_SUCCESS);
    CHECK(p_cuDeviceGet(&dev, 0) == CUDA_SUCCESS);
    CHECK(p_cuCtxRetain(&ctx, dev) == CUDA_SUCCESS);
    CHECK(p_cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
    CHECK(p_cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    /* the weights: loaded by copies before seal, as engines do */
    for (int i = 0; i < NR; i++) {
        char name[64];

        CHECK(p_cuMemAlloc(&ranges[i], 2 * MiB) == CUDA_SUCCESS);
        for (size_t j = 0; j < MiB; j++)
            buf[j] = (unsigned char)(j * 131 + (size_t)i * 7 + (j >> 12));
        CHECK(p_cuMemcpyHtoD(ranges[i], buf, MiB) == CUDA_SUCCESS);
        expect[i] = host_sum((const uint64_t *)buf, RANGE_BYTES(i) / 8);
        snprintf(name, sizeof(name), "model.layers.%d.mlp.experts.gate_up_proj", i);
        CHECK(tag((void *)(uintptr_t)ranges[i], RANGE_BYTES(i), name) == 0);
    }
    /* two tags with untagged bytes between them */
    CHECK(p_cuMemAlloc(&gapped, MiB) == CUDA_SUCCESS);
    for (size_t j = 0; j < MiB; j++)
        buf[j] = (unsigned char)(j * 29 + 3);
    CHECK(p_cuMemcpyHtoD(gapped, buf, MiB) == CUDA_SUCCESS);
    expect_gapped = host_sum((const uint64_t *)buf, MiB / 8);
    CHECK(tag((void *)(uintptr_t)gapped, MiB / 4, "model.layers.99.mlp.experts.up") == 0);
    CHECK(tag((void *)(uintptr_t)(gapped + 3 * MiB / 4), MiB / 4,
              "model.layers.99.mlp.experts.down") == 0);
    /* two tags 100 bytes apart: the first one's alignment, not a gap */
    CHECK(p_cuMemAlloc(&padded, MiB) == CUDA_SUCCESS);
    for (size_t j = 0; j < MiB; j++)
        buf[j] = (unsigned char)(j * 61 + 5);
    CHECK(p_cuMemcpyHtoD(padded, buf, MiB) == CUDA_SUCCESS);
    expect_padded = host_sum((const uint64_t *)buf, MiB / 8);
    CHECK(tag((void *)(uintptr_t)padded, MiB / 2 - 100, "model.layers.98.mlp.experts.up") == 0);
    CHECK(tag((void *)(uintptr_t)(padded + MiB / 2), MiB / 2, "model.layers.98.mlp.experts.down") ==
          0);
    /* llama.cpp's one model buffer: host tags with a device-placed tag
     * between them. 96: a, o (device), b: split, a sub-span per host tag,
     * each streamed. 97: a, o (device), b, 384 KiB no tag names, c: split,
     * then found to hold such bytes: every sub-span of it taken back, the
     * allocation read in place (docs/prefetch.md, What is streamed).
     * In mode stream only (the others count slots and pinned copies) */
    if (stream_mode) {
        CHECK(p_cuMemAlloc(&split96, MiB) == CUDA_SUCCESS);
        CHECK(p_cuMemAlloc(&split97, MiB) == CUDA_SUCCESS);
        for (size_t j = 0; j < MiB; j++)
            buf[j] = (unsigned char)(j * 43 + 9 + (j >> 14));
        CHECK(p_cuMemcpyHtoD(split96, buf, MiB) == CUDA_SUCCESS);
        CHECK(p_cuMemcpyHtoD(split97, buf, MiB) == CUDA_SUCCESS);
        split_at[0] = split96;
        split_at[1] = split96 + MiB / 2;
        split_at[2] = split97;
        split_at[3] = split97 + 3 * MiB / 4;
        for (int t = 0; t < 4; t++)
            expect_split[t] =
                host_sum((const uint64_t *)(buf + (split_at[t] - (t < 2 ? split96 : split97))),
                         split_n[t] / 8);
        CHECK(tag((void *)(uintptr_t)split96, MiB / 4, "model.layers.96.mlp.experts.a") == 0);
        CHECK(tag((void *)(uintptr_t)(split96 + MiB / 4), MiB / 4, "model.layers.96.attn.o") == 0);
        CHECK(tag((void *)(uintptr_t)(split96 + MiB / 2), MiB / 4,
                  "model.layers.96.mlp.experts.b") == 0);
        CHECK(tag((void *)(uintptr_t)split97, MiB / 8, "model.layers.97.mlp.experts.a") == 0);
        CHECK(tag((void *)(uintptr_t)(split97 + MiB / 8), MiB / 8, "model.layers.97.attn.o") == 0);
        CHECK(tag((void *)(uintptr_t)(split97 + MiB / 4), MiB / 8,
                  "model.layers.97.mlp.experts.b") == 0);
        CHECK(tag((void *)(uintptr_t)(split97 + 3 * MiB / 4), MiB / 4,
                  "model.layers.97.mlp.experts.c") == 0);
    }
    CHECK(p_cuMemAlloc(&out, 4096) == CUDA_SUCCESS); /* small: stays on the device */
    /* (3b)'s table, in every mode: beside `out` in one granule, it gives
     * the registry a shared granule array that only the registry's mmap'd
     * leaves point to; stream-exit exits with it live, and LeakSanitizer
     * must find it through the leaves (core/registry.c registers them as
     * root regions) */
    CHECK(p_cuMemAlloc(&table, 4096) == CUDA_SUCCESS);
    CHECK(seal() == 0);
    k = kernel("checksum", 3, psz, checksum);
    kb = kernel("checksum_b", 3, psz, checksum);
    ks = kernel("scribble", 2, psz, scribble);
    ke = kernel("echo", 2, psz, echo);
    kst = kernel("stale", 2, psz, echo);
    kp = kernel("pair", 3, psz, pair);
    kw = kernel("overwrite", 3, psz, overwrite);
    kpk = kernel("poke", 3, psz, poke);
    knc = kernel("ncclDevKernel_Broadcast_RING_LL", 3, psz, broadcast);
    kpe = kernel("peek", 3, psz, checksum);

/* A capture's graph g that reads a weight whose sum is want: instantiated,
 * launched on the engine's stream, a wrong sum counted; its exec destroyed
 * (the graph is the caller's). */
#define RUN_GRAPH(g, want)                                                                         \
    do {                                                                                           \
        CUgraphExec ge_;                                                                           \
        *(uint64_t *)(uintptr_t)out = 0;                                                           \
        CHECK(p_cuInstantiate(&ge_, (g), 0) == CUDA_SUCCESS);                                      \
        CHECK(p_cuGraphLaunch(ge_, s) == CUDA_SUCCESS);                                            \
        CHECK(p_cuStreamSync(s) == CUDA_SUCCESS);                                                  \
        if (*(uint64_t *)(uintptr_t)out != (want))                                                 \
            wrong++;                                                                               \
        CHECK(p_cuGraphExecDestroy(ge_) == CUDA_SUCCESS);                                          \
    } while (0)

/* Launches kern (it writes a word it was handed to out) and counts the
 * word v reaching it changed: a word that is no pointer must never be
 * redirected. */
#define LAUNCH_KEEPS(kern, params, v)                                                              \
    do {                                                                                           \
        CHECK(p_cuLaunchKernel(kern, 1, 1, 1, 1, 1, 1, 0, s, params, NULL) == CUDA_SUCCESS);       \
        CHECK(p_cuStreamSync(s) == CUDA_SUCCESS);                                                  \
        if (*(uint64_t *)(uintptr_t)out != (v))                                                    \
            rewritten_words++;                                                                     \
    } while (0)

    for (int step = 0; step < steps; step++) {
        /* each step reads the weights with one of two kernels, drawn at
         * random: an engine's kernels change with its batch (cuBLAS picks
         * by problem size; under continuous batching every step), and the
         * executor must still find the steps (it keys them by range) */
        CUfunction kk = ((uint64_t)step * 0x9E3779B97F4A7C15ull) >> 63 ? kb : k;

        /* auto-managed: one kernel, and below each layer's activation in
         * its own allocation's tail (the whole allocation is managed: the
         * planner keys on it), so the planner (keyed by function and
         * lowest range) finds the steps and its hot set */
        if (managed_mode)
            kk = k;
        if (drift_mode && step < DRIFT_STEP)
            usleep(60000);
#define RECHECK_SWAP 30
        if (recheck_mode && step == RECHECK_SWAP) {
            inplace_read_us = 0;
            slot_read_us = 10000;
        }

        if (sized_mode && !managed_mode && step == 3 * steps / 4) {
            /* stream-sized: copies write every half-MiB range: read in
             * place from now on, the 1 MiB ones alone streamed, so the
             * small slot grows back to 1 MiB */
            for (int i = 1; i < NR; i += 2) {
                for (size_t j = 0; j < MiB / 2; j++)
                    buf[j] = (unsigned char)(j * 3 + (size_t)i);
                CHECK(p_cuMemcpyHtoD(ranges[i], buf, MiB / 2) == CUDA_SUCCESS);
                expect[i] = host_sum((const uint64_t *)buf, MiB / 2 / 8);
            }
        }
        if (stream_mode && step == STEPS / 2) {
            /* (2) a copy writes range 3 after seal: its slot is dropped
             * before the write goes out; from now on it is read in place */
            for (size_t j = 0; j < MiB; j++)
                buf[j] = (unsigned char)(255 - j * 17);
            CHECK(p_cuMemcpyHtoD(ranges[3], buf, MiB) == CUDA_SUCCESS);
            expect[3] = host_sum((const uint64_t *)buf, MiB / 8);
        }
        if (stream_mode && step == STEPS / 2 + 1) {
            /* (2b) a 2-D copy writes range 5 (or 4, the higher of the
             * two), its base the other range and its one row Y = 1 a
             * pitch away: the write lands at base + Y * pitch + X, so the
             * target's slot is dropped, not the base's (the hook once
             * noted the base and width * height: the target's next reads
             * came from its stale slot) */
            int t = ranges[5] > ranges[4] ? 5 : 4;
            CUdeviceptr base = ranges[9 - t];
            for (size_t j = 0; j < MiB; j++)
                buf[j] = (unsigned char)(j * 29 + 7);
            CUDA_MEMCPY2D c2 = {.srcMemoryType = CU_MEMORYTYPE_HOST,
                                .srcHost = buf,
                                .srcPitch = MiB,
                                .dstMemoryType = CU_MEMORYTYPE_DEVICE,
                                .dstDevice = base,
                                .dstY = 1,
                                .dstPitch = (size_t)(ranges[t] - base),
                                .WidthInBytes = MiB,
                                .Height = 1};
            CHECK(p_cuMemcpy2D(&c2) == CUDA_SUCCESS);
            expect[t] = host_sum((const uint64_t *)buf, MiB / 8);
        }
        if (stream_mode && step == STEPS - 8) {
            /* (3) a launch into a capture is not redirected: the graph
             * replays it later, without the hook, and reads in place. Its
             * second node writes range 12 in place, unseen at replay: a
             * blind launch (uvm/stream.h), after which no slot staged
             * before it is read, and range 12 is staged from the range */
            CUgraph g;
            CUgraphExec ge;
            uint64_t n = MiB, seed = 91;
            void *params[] = {&ranges[7], &n, &out};
            void *wparams[] = {&ranges[12], &n, &seed};

            /* (3a) first a launch reads range 12 in place (a function
             * that reaches it alone: no reader, never redirected), so a
             * touch and the blind write come between two of its staging
             * copies, without a sync that would let the executor stage it
             * between them: which of the two wrote cannot be told, so the
             * range is hashed anew (its next check finds nothing written) */
            void *pparams[] = {&ranges[12], &n, &out};

            CHECK(p_cuLaunchKernel(kpe, 1, 1, 1, 1, 1, 1, 0, s, pparams, NULL) == CUDA_SUCCESS);
            CHECK(*(uint64_t *)(uintptr_t)out == expect[12]);
            *(uint64_t *)(uintptr_t)out = 0;
            CHECK(p_cuBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) == CUDA_SUCCESS);
            CHECK(p_cuLaunchKernel(k, 1, 1, 1, 1, 1, 1, 0, s, params, NULL) == CUDA_SUCCESS);
            CHECK(p_cuLaunchKernel(kpk, 1, 1, 1, 1, 1, 1, 0, s, wparams, NULL) == CUDA_SUCCESS);
            CHECK(p_cuEndCapture(s, &g) == CUDA_SUCCESS);
            CHECK(p_cuInstantiate(&ge, g, 0) == CUDA_SUCCESS);
            CHECK(p_cuGraphLaunch(ge, s) == CUDA_SUCCESS);
            CHECK(p_cuStreamSync(s) == CUDA_SUCCESS);
            CHECK(*(uint64_t *)(uintptr_t)out == expect[7]);
            for (size_t j = 0; j < MiB; j++)
                buf[j] = (unsigned char)(j * 7 + seed);
            expect[12] = host_sum((const uint64_t *)buf, MiB / 8);
        }
        if (stream_mode && step == STEPS - 6) {
            /* (3c) a graph built by hand (cuGraphCreate, a kernel node):
             * no capture went through the shim, so it knows none of its
             * nodes, and launching it is a blind launch. Its node writes
             * range 14 in place */
            CUgraph g;
            CUgraphExec ge;
            CUgraphNode node;
            CUDA_KERNEL_NODE_PARAMS np;
            uint64_t n = MiB, seed = 33;
            void *wparams[] = {&ranges[14], &n, &seed};

            memset(&np, 0, sizeof(np));
            np.func = kpk;
            np.gridDimX = np.gridDimY = np.gridDimZ = 1;
            np.blockDimX = np.blockDimY = np.blockDimZ = 1;
            np.kernelParams = wparams;
            CHECK(p_cuGraphCreate(&g, 0) == CUDA_SUCCESS);
            CHECK(p_cuGraphAddKernelNode(&node, g, NULL, 0, &np) == CUDA_SUCCESS);
            CHECK(p_cuInstantiate(&ge, g, 0) == CUDA_SUCCESS);
            CHECK(p_cuGraphLaunch(ge, s) == CUDA_SUCCESS);
            CHECK(p_cuStreamSync(s) == CUDA_SUCCESS);
            for (size_t j = 0; j < MiB; j++)
                buf[j] = (unsigned char)(j * 7 + seed);
            expect[14] = host_sum((const uint64_t *)buf, MiB / 8);
        }
        if ((stream_mode && step == STEPS - 4) || (unfenced_mode && step == STEPS / 2)) {
            /* (3b) a kernel named as NCCL's are writes range 10 through a
             * pointer it reads from a table in device memory: the scan
             * finds no pointer to it (an RL trainer broadcasting weights
             * into the engine). Its name makes it a blind launch. Launched
             * as NCCL launches, with cuLaunchKernelEx; in stream-unfenced
             * on a stream of a second context */
            uint64_t n = MiB, seed = 55;
            void *params[] = {&table, &n, &seed};
            CUlaunchConfig cfg;
            CUcontext other;
            CUstream ls = s;

            CHECK(p_cuMemcpyHtoD(table, &ranges[10], sizeof(ranges[10])) == CUDA_SUCCESS);
            if (unfenced_mode) {
                CHECK(p_cuCtxCreate(&other, 0, dev) == CUDA_SUCCESS);
                CHECK(p_cuCtxSetCurrent(other) == CUDA_SUCCESS);
                CHECK(p_cuStreamCreate(&ls, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
            }
            memset(&cfg, 0, sizeof(cfg));
            cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = 1;
            cfg.blockDimX = cfg.blockDimY = cfg.blockDimZ = 1;
            cfg.hStream = ls;
            CHECK(p_cuLaunchKernelEx(&cfg, knc, params, NULL) == CUDA_SUCCESS);
            CHECK(p_cuStreamSync(ls) == CUDA_SUCCESS);
            if (unfenced_mode)
                CHECK(p_cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
            for (size_t j = 0; j < MiB; j++)
                buf[j] = (unsigned char)(j * 7 + seed);
            expect[10] = host_sum((const uint64_t *)buf, MiB / 8);
        }
        if (cap_mode && step == STEPS / 2 - 2) {
            /* the pins are under way by now (staging started a few steps
             * ago): capture on a stream of our own, in global mode, and
             * hold it while the worker would want the driver */
            CUstream cs;
            CUgraph g = NULL;
            uint64_t v = 42;
            void *params[] = {&v, &out};

            CHECK(p_cuStreamCreate(&cs, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
            CHECK(p_cuBeginCapture(cs, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
            CHECK(p_cuLaunchKernel(ke, 1, 1, 1, 1, 1, 1, 0, cs, params, NULL) == CUDA_SUCCESS);
            usleep(200000);
            CHECK(p_cuEndCapture(cs, &g) == CUDA_SUCCESS && g != NULL);
        }
        for (int i = 0; i < NR; i++) {
            if (stream_mode && step == STEPS / 2 + 4 && i == 6) {
                /* (4) a launch writes range 6 (range 4's bytes into it),
                 * through the slot it is pointed at: the reads after it
                 * see the new bytes, the write check copies the slot back
                 * before it is reused (the engine's copy below, at the
                 * end, reads them), and range 6 is read in place from then
                 * on. The function reached two ranges: a reader */
                uint64_t n = MiB, before = redirected_reads;
                void *params[] = {&ranges[6], &ranges[4], &n};

                /* the executor may run behind the engine (TSan, a loaded
                 * machine): reads of range 6 first, until one came from
                 * its slot (bounded), so that the write finds the slot */
                for (int t = 0; t < 200 && redirected_reads == before; t++) {
                    void *rp[] = {&ranges[6], &n, &out};

                    CHECK(p_cuLaunchKernel(k, 1, 1, 1, 1, 1, 1, 0, s, rp, NULL) == CUDA_SUCCESS);
                    CHECK(p_cuStreamSync(s) == CUDA_SUCCESS);
                    if (*(uint64_t *)(uintptr_t)out != expect[6])
                        wrong++;
                    if (redirected_reads == before)
                        usleep(10000);
                }
                slot_primed = redirected_reads != before;
                CHECK(p_cuLaunchKernel(kw, 1, 1, 1, 1, 1, 1, 0, s, params, NULL) == CUDA_SUCCESS);
                CHECK(p_cuStreamSync(s) == CUDA_SUCCESS);
                expect[6] = expect[4];
            }
            if (stream_mode && step == STEPS / 2 + 6 && i == 8) {
                /* (4b) a launch of a function that touches range 8 alone
                 * (no reader: never redirected) writes it in place while
                 * its slot may be published: the assignment is taken back
                 * (wo_stream_touch_begin), the reads after it read the
                 * range, and the next staging copy's write check finds
                 * the range changed */
                uint64_t n = MiB, seed = 77;
                void *params[] = {&ranges[8], &n, &seed};

                CHECK(p_cuLaunchKernel(kpk, 1, 1, 1, 1, 1, 1, 0, s, params, NULL) == CUDA_SUCCESS);
                CHECK(p_cuStreamSync(s) == CUDA_SUCCESS);
                for (size_t j = 0; j < MiB; j++)
                    buf[j] = (unsigned char)(j * 7 + seed);
                expect[8] = host_sum((const uint64_t *)buf, MiB / 8);
            }
            for (int r = 0; r < reads; r++) {
                uint64_t n = RANGE_BYTES(i);
                void *params[] = {&ranges[i], &n, &out};

                CHECK(p_cuLaunchKernel(kk, 1, 1, 1, 1, 1, 1, 0, s, params, NULL) == CUDA_SUCCESS);
                CHECK(p_cuStreamSync(s) == CUDA_SUCCESS);
                if (*(uint64_t *)(uintptr_t)out != expect[i])
                    wrong++;
                if (relaxed_mode) {
                    /* a capture after each read: the executor's fences
                     * of the layer fall among them */
                    CUgraph g = NULL;
                    uint64_t v = 42;
                    void *cparams[] = {&v, &out};

                    CHECK(p_cuBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED) == CUDA_SUCCESS);
                    CHECK(p_cuLaunchKernel(ke, 1, 1, 1, 1, 1, 1, 0, s, cparams, NULL) ==
                          CUDA_SUCCESS);
                    usleep(1500);
                    if (p_cuEndCapture(s, &g) != CUDA_SUCCESS || !g)
                        broken_captures++;
                }
                if (relaxed_mode && step == steps / 2 && r == 0 && i == 3) {
                    /* once, into a graph of the engine's own (CUDA 12.3's
                     * cuStreamBeginCaptureToGraph), a launch that reads
                     * the weight just read: captured, so read in place
                     * when the graph runs, never redirected into a slot
                     * the executor reuses meanwhile */
                    CUgraph mine = NULL, g = NULL;

                    CHECK(p_cuGraphCreate(&mine, 0) == CUDA_SUCCESS);
                    CHECK(p_cuBeginCaptureToGraph(s, mine, NULL, NULL, 0,
                                                  CU_STREAM_CAPTURE_MODE_RELAXED) == CUDA_SUCCESS);
                    CHECK(p_cuLaunchKernel(kk, 1, 1, 1, 1, 1, 1, 0, s, params, NULL) ==
                          CUDA_SUCCESS);
                    usleep(1500);
                    if (p_cuEndCapture(s, &g) != CUDA_SUCCESS || g != mine)
                        broken_captures++;
                    else
                        RUN_GRAPH(g, expect[i]);
                    CHECK(p_cuGraphDestroy(mine) == CUDA_SUCCESS);
                }
                if (relaxed_mode && step == steps / 2 + 1 && r == 0 && i == 3) {
                    /* once, the engine's stream joins a capture begun on
                     * another (a fork: an event recorded there, waited on
                     * here), and reads the weight just read: the table
                     * knows only the other stream, the driver says this
                     * one captures too (wo_capture_joined), so it is read
                     * in place, never redirected inside the capture */
                    CUstream cs;
                    CUevent fork, join;
                    CUgraph g = NULL;

                    CHECK(p_cuStreamCreate(&cs, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
                    CHECK(p_cuEventCreate(&fork, 0) == CUDA_SUCCESS);
                    CHECK(p_cuEventCreate(&join, 0) == CUDA_SUCCESS);
                    CHECK(p_cuBeginCapture(cs, CU_STREAM_CAPTURE_MODE_RELAXED) == CUDA_SUCCESS);
                    CHECK(p_cuEventRecord(fork, cs) == CUDA_SUCCESS);
                    CHECK(p_cuStreamWaitEvent(s, fork, 0) == CUDA_SUCCESS);
                    CHECK(p_cuLaunchKernel(kk, 1, 1, 1, 1, 1, 1, 0, s, params, NULL) ==
                          CUDA_SUCCESS);
                    CHECK(p_cuEventRecord(join, s) == CUDA_SUCCESS);
                    CHECK(p_cuStreamWaitEvent(cs, join, 0) == CUDA_SUCCESS);
                    if (p_cuEndCapture(cs, &g) != CUDA_SUCCESS || !g) {
                        broken_captures++;
                    } else {
                        RUN_GRAPH(g, expect[i]);
                        CHECK(p_cuGraphDestroy(g) == CUDA_SUCCESS);
                    }
                    CHECK(p_cuEventDestroy(fork) == CUDA_SUCCESS);
                    CHECK(p_cuEventDestroy(join) == CUDA_SUCCESS);
                }
            }
            {
                /* an activation in a random allocation's tail, written by
                 * a kernel and read back by a copy */
                CUdeviceptr at;
                uint64_t v = lcg, back = 0;
                void *params[] = {&at, &v};

                lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
                at = ranges[(lcg >> 33) % NR] + MiB + ((lcg >> 13) % (MiB / 8)) * 8;
                if (managed_mode)
                    at = ranges[i] + MiB + 4096;
                CHECK(p_cuLaunchKernel(ks, 1, 1, 1, 1, 1, 1, 0, s, params, NULL) == CUDA_SUCCESS);
                CHECK(p_cuStreamSync(s) == CUDA_SUCCESS);
                CHECK(p_cuMemcpyDtoH(&back, at, 8) == CUDA_SUCCESS);
                if (back != v)
                    wrong++;
            }
            {
                /* a word that is not a pointer but falls inside the weight
                 * just read (staged now): unaligned, so never rewritten */
                uint64_t v = ranges[i] + 0x1879;
                void *params[] = {&v, &out};

                LAUNCH_KEEPS(ke, params, v);
            }
            {
                /* a kernel whose word holds, in every layer, an aligned
                 * address inside the last weight and never a small integer
                 * (what PyTorch's unfilled struct members held on the
                 * H200): no read. Counted as one, it puts the last range
                 * between every two keys (no step is found) and makes the
                 * engine's position jump there; it must also reach the
                 * kernel unchanged */
                uint64_t v = ranges[NR - 1] + 0x10000;
                void *params[] = {&v, &out};

                LAUNCH_KEEPS(kst, params, v);
            }
            for (int t = 0; t < 2 && (i == 1 || i == 2) && !managed_mode && !drift_mode; t++) {
                /* the second word held a small integer first, so it is no
                 * pointer slot: when the launch is redirected for the
                 * weight in its first word, the address by chance in the
                 * second must reach the kernel as it was passed (two
                 * ranges, so its function counts as a reader; not layer
                 * 5, whose multiplicity is checked below) */
                uint64_t v = t ? ranges[i] + 0x20000 : 7;
                void *params[] = {&ranges[i], &v, &out};

                LAUNCH_KEEPS(kp, params, v);
            }
            /* the GPU's time on this layer: the executor stages meanwhile.
             * The stream modes check what happens to a range while it is
             * staged (a write through its slot, a slot taken back): 2 ms,
             * a real layer's order, so the executor keeps ahead of the
             * engine also under ASan on a loaded machine (the byte-wise
             * checksum used to give it ~4 ms; at 0.3 ms ASan's staging fell
             * behind once and the write through a slot went in place).
             * stream-exit: 4 ms: with 0.3 ms its twenty steps ended before
             * any range was staged while every pin takes 0.3 s, and it
             * checks that the exit comes with reads redirected and pins
             * still queued. The others check step times and decisions:
             * 0.3 ms */
            usleep(exit_mode ? 4000 : strncmp(mode, "stream", 6) == 0 ? 2000 : 300);
        }
        for (int r = 0; r < 2 * READS && !managed_mode && !drift_mode; r++) {
            uint64_t n = MiB;
            void *params[] = {r < READS ? &gapped : &padded, &n, &out};

            CHECK(p_cuLaunchKernel(k, 1, 1, 1, 1, 1, 1, 0, s, params, NULL) == CUDA_SUCCESS);
            CHECK(p_cuStreamSync(s) == CUDA_SUCCESS);
            if (*(uint64_t *)(uintptr_t)out != (r < READS ? expect_gapped : expect_padded))
                wrong++;
        }
        for (int r = 0; r < 4 * READS && stream_mode; r++) {
            uint64_t n = split_n[r / READS];
            void *params[] = {&split_at[r / READS], &n, &out};

            CHECK(p_cuLaunchKernel(k, 1, 1, 1, 1, 1, 1, 0, s, params, NULL) == CUDA_SUCCESS);
            CHECK(p_cuStreamSync(s) == CUDA_SUCCESS);
            if (*(uint64_t *)(uintptr_t)out != expect_split[r / READS])
                wrong++;
        }
    }
    CHECK(wrong == 0);
    CHECK(broken_captures == 0);
    CHECK(stray_writes == 0);
    CHECK(rewritten_words == 0);
    printf("child %s: %llu of %d reads from a slot, %llu wrong, %llu non-pointer words changed\n",
           mode, (unsigned long long)redirected_reads, steps * NR * reads,
           (unsigned long long)wrong, (unsigned long long)rewritten_words);
    if (strcmp(mode, "hot-set") == 0)
        CHECK(redirected_reads == 0);
    else
        CHECK(redirected_reads > 0);
    if (exit_mode) {
        /* the moment the engine calls exit, for the parent (monotonic: the
         * same clock across processes) */
        const char *at = getenv("WO_STREAM_EXIT_TS");
        FILE *f = at ? fopen(at, "w") : NULL;
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        CHECK(f != NULL);
        if (f) {
            fprintf(f, "%lld\n", (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec);
            fclose(f);
        }
        free(buf);
        check_summary(mode);
        exit(failures ? 1 : 0);
    }
    if (stream_mode) {
        /* what the launch wrote into range 6 is in the range itself */
        CHECK(p_cuMemcpyDtoH(buf, ranges[6], MiB) == CUDA_SUCCESS);
        CHECK(host_sum((const uint64_t *)buf, MiB / 8) == expect[6]);
        /* in place only when the executor never staged range 6 in 2 s */
        CHECK(slot_primed ? slot_writes == 1 : slot_writes == 0);
        CHECK(inplace_writes == 3); /* (4b), the graph's node (3) and (3c)'s */
        CHECK(p_cuMemcpyDtoH(buf, ranges[8], MiB) == CUDA_SUCCESS);
        CHECK(host_sum((const uint64_t *)buf, MiB / 8) == expect[8]);
        /* and what the graph and the blind kernel wrote, in theirs */
        CHECK(p_cuMemcpyDtoH(buf, ranges[12], MiB) == CUDA_SUCCESS);
        CHECK(host_sum((const uint64_t *)buf, MiB / 8) == expect[12]);
        CHECK(p_cuMemcpyDtoH(buf, ranges[10], MiB) == CUDA_SUCCESS);
        CHECK(host_sum((const uint64_t *)buf, MiB / 8) == expect[10]);
        CHECK(p_cuMemcpyDtoH(buf, ranges[14], MiB) == CUDA_SUCCESS);
        CHECK(host_sum((const uint64_t *)buf, MiB / 8) == expect[14]);
        CHECK(blind_writes == 1);
        printf("child stream: the write reached a slot %llu time(s)\n",
               (unsigned long long)slot_writes);
    }
    {
        /* the figures while the model is loaded (per-name figures leave the
         * stats with their ranges): published at most every 100 ms */
        static char js[1 << 17];
        const char *snap = getenv("WO_STREAM_SNAP");
        long n;
        FILE *f;

        usleep(300000);
        n = stats(js, sizeof(js));
        f = snap ? fopen(snap, "w") : NULL;
        CHECK(n > 0 && f);
        if (f) {
            fwrite(js, 1, n > 0 ? (size_t)n : 0, f);
            fclose(f);
        }
    }
    if (stream_mode) {
        /* the engine's stream goes before its weights, as llama-server's
         * contexts go before its model: nothing of the shim's may use it
         * after (the fake counts uses of a destroyed stream; the real
         * driver crashed on them) */
        CUresult (*p_cuStreamDestroy)(CUstream);

        CUstream cs;

        *(void **)&p_cuStreamDestroy = need(cu, "cuStreamDestroy_v2");
        CHECK(p_cuStreamSync(s) == CUDA_SUCCESS);
        CHECK(p_cuStreamDestroy(s) == CUDA_SUCCESS);
        /* a stream destroyed while it captures: the capture ends with it
         * (the shim's threads keep out of the driver only while one is
         * under way, and the slots below go back only once they may
         * enter it) */
        CHECK(p_cuStreamCreate(&cs, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
        CHECK(p_cuBeginCapture(cs, CU_STREAM_CAPTURE_MODE_RELAXED) == CUDA_SUCCESS);
        CHECK(p_cuStreamDestroy(cs) == CUDA_SUCCESS);
    }
    /* the engine unloads: the executor gives its slots back */
    for (int i = 0; i < NR; i++)
        CHECK(p_cuMemFree(ranges[i]) == CUDA_SUCCESS);
    CHECK(p_cuMemFree(gapped) == CUDA_SUCCESS);
    CHECK(p_cuMemFree(padded) == CUDA_SUCCESS);
    if (stream_mode) {
        CHECK(p_cuMemFree(split96) == CUDA_SUCCESS);
        CHECK(p_cuMemFree(split97) == CUDA_SUCCESS);
    }
    CHECK(p_cuMemFree(out) == CUDA_SUCCESS);
    CHECK(p_cuMemFree(table) == CUDA_SUCCESS);
    if (strcmp(mode, "hot-set") != 0) {
        static char js[1 << 17];
        const char *at = NULL;

        /* the consumer gives them back within a tick or two; allow 10 s
         * (TSan on a loaded CI machine) */
        for (int i = 0; i < 400; i++) {
            at = stats(js, sizeof(js)) > 0 ? strstr(js, "\"slot_bytes\":0,") : NULL;
            if (at)
                break;
            usleep(25000);
        }
        CHECK(at != NULL);
    }
    if (stream_mode) {
        uint64_t (*dead_uses)(void);

        *(void **)&dead_uses = need(cu, "fakecuda_dead_stream_uses");
        printf("child stream: %llu driver calls with the destroyed stream\n",
               (unsigned long long)dead_uses());
        CHECK(dead_uses() == 0);
    }
    free(buf);
    check_summary(mode);
    return failures ? 1 : 0;
}

/* ---- the parent: runs the child, reads its stats ------------------------------ */

static double num_after(const char *s, const char *key)
{
    const char *p = s ? strstr(s, key) : NULL;
    return p ? strtod(p + strlen(key), NULL) : -1;
}

static long long reaped_ns; /* when run() last reaped its child (CLOCK_MONOTONIC) */
static char exit_ts[] = "/tmp/test-stream-exit-XXXXXX";

static void run(char **argv, const char *mode, char *stats, size_t len, char *log, size_t loglen)
{
    char pol[] = "/tmp/test-stream-policy-XXXXXX";
    char st[] = "/tmp/test-stream-stats-XXXXXX";
    char lg[] = "/tmp/test-stream-log-XXXXXX";
    char sn[] = "/tmp/test-stream-snap-XXXXXX";
    char policy[512];
    int fd, status, n;
    pid_t pid;
    FILE *f;

    bool managed = strncmp(mode, "auto-managed", 12) == 0;
    bool by_time = strcmp(mode, "auto-time") == 0 || strcmp(mode, "auto-drift") == 0;

    n = snprintf(policy, sizeof(policy),
                 "version: 1\n"
                 "device_budget: %s\n"
                 "prefetch: {mode: %s, slots: %d, experimental: true%s}\n"
                 "rules:\n"
                 "  - {name: experts, match: [experts], place: %s}\n",
                 strcmp(mode, "auto-managed-sized-pair") == 0 ? "10MiB"
                 : managed                                    ? "12MiB"
                                                              : "16MiB",
                 by_time || managed                ? "auto"
                 : strncmp(mode, "stream", 6) == 0 ? "stream"
                                                   : mode,
                 /* managed: the slots take the room of hot ranges; stream-lag1:
                  * two, the fewest */
                 managed                            ? 6
                 : strcmp(mode, "stream-lag1") == 0 ? 2
                                                    : 3,
                 /* pinned copies: the default (auto) for stream (and
                  * stream-nopin) and hot-set, a cap of three ranges for
                  * auto, off for auto-time and auto-managed */
                 strcmp(mode, "auto") == 0 ? ", pinned_copies: 3MiB"
                 : by_time || managed      ? ", pinned_copies: off"
                                           : "",
                 managed ? "managed" : "host");
    fd = mkstemp(pol);
    CHECK(fd >= 0 && write(fd, policy, (size_t)n) == n);
    close(fd);
    fd = mkstemp(st);
    close(fd);
    fd = mkstemp(lg);
    close(fd);
    fd = mkstemp(sn);
    close(fd);
    pid = fork();
    if (pid == 0) {
        setenv("WO_STREAM_CHILD", mode, 1);
        /* (3)'s graphs run whole, as graphs the shim cannot replay kernel
         * by kernel do: their launches read in place, blind (the replay:
         * test-graph-replay) */
        setenv("WOFFLOAD_GRAPH_REPLAY", "0", 1);
        setenv("WOFFLOAD_POLICY", pol, 1);
        setenv("WOFFLOAD_STATS", st, 1);
        setenv("WOFFLOAD_LOG_FILE", lg, 1);
        setenv("WOFFLOAD_LOG", "info", 1);
        setenv("WO_STREAM_SNAP", sn, 1);
        /* pins go through uvm/place-pin.c's wo_pin_host: a registered huge-page
         * mapping, or cuMemHostAlloc (below 2 MiB, as here, and when the
         * register fails): the faults are on both */
        /* the slot growing back to 1 MiB is refused: the engine's two
         * buffers are the first cuMemAllocs, the checker's and the three
         * slots the next four, the shrink to 512 KiB the seventh */
        if (strcmp(mode, "auto-managed-recheck") == 0)
            setenv("WOFFLOAD_STREAM_RECHECK", "12", 1);
        if (strcmp(mode, "stream-sized-refused") == 0)
            setenv("WOFAKE_FAIL", "cuMemAlloc_v2:8:2", 1);
        if (strcmp(mode, "stream-nopin") == 0) /* every pin fails: out of memory */
            setenv("WOFAKE_FAIL", "cuMemHostRegister_v2:*:2,cuMemHostAlloc:*:2", 1);
        if (strcmp(mode, "stream-capture") == 0) /* every pin takes 0.1 s */
            setenv("WOFAKE_DELAY", "cuMemHostRegister_v2:100000,cuMemHostAlloc:100000", 1);
        if (strcmp(mode, "stream-lag1") == 0) /* departure fences one range behind */
            setenv("WOFFLOAD_DEPARTURE_LAG", "1", 1);
        if (strcmp(mode, "stream-relaxed") == 0) /* every event record takes 3 ms */
            setenv("WOFAKE_DELAY", "cuEventRecord:3000", 1);
        if (strcmp(mode, "stream-exit") == 0) { /* every pin takes 0.3 s */
            setenv("WOFAKE_DELAY", "cuMemHostRegister_v2:300000,cuMemHostAlloc:300000", 1);
            setenv("WO_STREAM_EXIT_TS", exit_ts, 1);
        }
        execv("/proc/self/exe", argv);
        _exit(127);
    }
    CHECK(waitpid(pid, &status, 0) == pid);
    {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        reaped_ns = (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
    }
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    /* the snapshot the child took before it freed its ranges (the exit
     * stats in st must exist too) */
    f = fopen(st, "r");
    CHECK(f && fgetc(f) == '{');
    if (f)
        fclose(f);
    (void)slurp(sn, stats, len);
    (void)slurp(lg, log, loglen);
    unlink(pol);
    unlink(st);
    unlink(lg);
    unlink(sn);
}

/* Whether text is in the log, on one line only. */
static bool said_once(const char *log, const char *text)
{
    const char *at = strstr(log, text), *eol = at ? strchr(at, '\n') : NULL;
    return at && (!eol || !strstr(eol, text));
}

/* A stream-sized run: how many resizes, and the slots' bytes at the end. */
static void sized_run(char **argv, const char *mode, double resizes, double bytes, char *stats,
                      size_t len, char *log, size_t loglen)
{
    const char *s;

    run(argv, mode, stats, len, log, loglen);
    s = strstr(stats, "\"stream\":{");
    printf("%s: %.0f redirected, %.0f slots resized, %.0f slot bytes\n", mode,
           num_after(s, "\"redirected\":"), num_after(s, "\"slot_resizes\":"),
           num_after(s, "\"slot_bytes\":"));
    CHECK(num_after(s, "\"redirected\":") > STEPS / 2 * NR * READS / 8);
    CHECK(num_after(s, "\"slot_resizes\":") == resizes);
    CHECK(num_after(s, "\"slot_bytes\":") == bytes);
    CHECK(strstr(log, "stream: 3 device staging slots (1 MiB, 1 MiB, 1 MiB)") != NULL);
    CHECK(strstr(log, "stream: 3 device staging slots resized (1 MiB, 1 MiB, 512 KiB)") != NULL);
}

/* ---- the modes side by side ---------------------------------------------------
 * Most of a mode's time is the stand-in GPU's (a child sleeps 0.3-4 ms a
 * layer), so one mode after another left a core idle for about 45 s in each
 * CI configuration. The parent runs each mode wanted in a process of its own
 * (this program again, WO_STREAM_ONE set, the mode its one argument), up to
 * WO_STREAM_JOBS (default 3) at a time, and prints their outputs one after
 * another once all are done, each whole. Two run first, each by itself:
 * stream-exit checks how soon its process is gone after exit(), a time a
 * loaded machine stretches, and stream checks a write through a slot, which
 * needs the executor to stage ahead of the engine (under ASan with two
 * other processes busy on two cores, it fell behind in 1 of 3 runs beside
 * three other modes). */

/* the two that run by themselves, then the longest first (stream-relaxed:
 * ~11 s with gcc, auto's step-time modes ~7 s, the others 1-3 s) */
#define NALONE 2
static const char *const all_modes[] = {
    "stream-exit",
    "stream",
    "stream-relaxed",
    "auto-time",
    "auto-drift",
    "auto-managed-recheck",
    "auto-managed",
    "auto-managed-sized",
    "auto-managed-sized-pair",
    "auto-managed-back",
    "stream-sized",
    "stream-sized-refused",
    "stream-unfenced",
    "stream-capture",
    "stream-nopin",
    "stream-lag1",
    "auto",
    "hot-set",
};
#define NMODES (sizeof(all_modes) / sizeof(all_modes[0]))

/* want() for a mode main() runs: one all_modes lacks would never be
 * started side by side, so every child fails on it */
static bool is_mode(const char *name)
{
    for (size_t i = 0; i < NMODES; i++)
        if (strcmp(all_modes[i], name) == 0)
            return true;
    return false;
}

static bool want_mode(int argc, char **argv, const char *name)
{
    if (!is_mode(name)) {
        fprintf(stderr, "test-stream-preload: mode '%s' is not in all_modes: it never runs\n", name);
        failures++;
    }
    return want(argc, argv, name);
}

static bool passed(int status)
{
    return status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

static int side_by_side(int argc, char **argv)
{
    const char *e = getenv("WO_STREAM_JOBS");
    int jobs = e && atoi(e) > 0 ? atoi(e) : 3;
    char out[NMODES][40];
    pid_t pids[NMODES] = {0};
    int status[NMODES], order[NMODES], n = 0, next = 0, running = 0, bad = 0;
    struct timespec t0[NMODES], t1[NMODES];

    memset(t0, 0, sizeof(t0));
    memset(t1, 0, sizeof(t1));
    for (size_t i = 0; i < NMODES; i++)
        status[i] = -1;
    for (size_t i = 0; i < NMODES; i++)
        if (want(argc, argv, all_modes[i]))
            order[n++] = (int)i; /* all_modes' order */
    for (int a = 1; a < argc; a++)
        if (!is_mode(argv[a])) {
            fprintf(stderr, "test-stream-preload: no mode '%s'\n", argv[a]);
            return 2;
        }
    for (int k = 0; k < n; k++) {
        int fd;

        snprintf(out[order[k]], sizeof(out[0]), "/tmp/test-stream-out-XXXXXX");
        fd = mkstemp(out[order[k]]);
        CHECK(fd >= 0);
        close(fd);
    }
    fflush(stdout);
    while (next < n || running > 0) {
        /* the first NALONE modes by themselves: nothing beside them */
        bool alone = running > 0 && next > 0 && order[next - 1] < NALONE;
        if (next < n && running < jobs && !alone && (running == 0 || order[next] >= NALONE)) {
            int m = order[next++];
            pid_t pid;

            status[m] = -1;
            clock_gettime(CLOCK_MONOTONIC, &t0[m]);
            pid = fork();
            if (pid == 0) {
                char *args[] = {argv[0], (char *)all_modes[m], NULL};
                int fd = open(out[m], O_WRONLY | O_TRUNC);

                if (fd < 0 || dup2(fd, 1) < 0 || dup2(fd, 2) < 0)
                    _exit(127);
                close(fd);
                setenv("WO_STREAM_ONE", "1", 1);
                execv("/proc/self/exe", args);
                _exit(127);
            }
            CHECK(pid > 0);
            if (pid < 0) {
                status[m] = 0x7f00; /* exit status 127 */
                t1[m] = t0[m];
                continue;
            }
            pids[m] = pid;
            running++;
            continue;
        }
        {
            int st;
            pid_t pid = waitpid(-1, &st, 0);

            CHECK(pid > 0);
            if (pid <= 0)
                break;
            for (size_t i = 0; i < NMODES; i++)
                if (pids[i] == pid) {
                    status[i] = st;
                    clock_gettime(CLOCK_MONOTONIC, &t1[i]);
                    running--;
                }
        }
    }
    for (int k = 0; k < n; k++) {
        int m = order[k];
        static char text[1 << 20];
        bool ok = passed(status[m]);

        (void)slurp(out[m], text, sizeof(text));
        unlink(out[m]);
        printf("---- %s: %s in %.1f s%s\n", all_modes[m], ok ? "passed" : "FAILED",
               (double)(t1[m].tv_sec - t0[m].tv_sec) + (t1[m].tv_nsec - t0[m].tv_nsec) / 1e9,
               m < NALONE ? " (by itself)" : "");
        fputs(text, stdout);
        if (!ok) {
            if (status[m] != -1 && WIFSIGNALED(status[m]))
                printf("---- %s: killed by signal %d\n", all_modes[m], WTERMSIG(status[m]));
            bad++;
        }
    }
    fflush(stdout);
    if (bad || failures) {
        fprintf(stderr, "test-stream-preload: %d of %d modes failed:", bad, n);
        for (int k = 0; k < n; k++) {
            int m = order[k];
            if (!passed(status[m]))
                fprintf(stderr, " %s", all_modes[m]);
        }
        fprintf(stderr, " (each one's output is above)\n");
    }
    return bad || failures ? 1 : 0;
}

int main(int argc, char **argv)
{
    static char stats[1 << 17], log[1 << 17];
    const char *mode = getenv("WO_STREAM_CHILD"), *s, *e;
    double redirected, staged, steps, mult;

    if (mode)
        return child(mode);
    if (!getenv("LD_PRELOAD")) {
        fprintf(stderr, "run with LD_PRELOAD=libwoffload.so (meson test does)\n");
        return 77;
    }
    if (!getenv("WO_STREAM_ONE"))
        return side_by_side(argc, argv);

    /* ---- stream ---- */
    if (want_mode(argc, argv, "stream")) {
        run(argv, "stream", stats, sizeof(stats), log, sizeof(log));
        s = strstr(stats, "\"stream\":{");
        CHECK(s != NULL);
        redirected = num_after(s, "\"redirected\":");
        staged = num_after(s, "\"staged_bytes\":");
        steps = num_after(s, "\"steps\":");
        printf("stream: %.0f redirected, %.0f bytes staged in %.0f steps (%.2f MiB a step), "
               "%.0f captured, %.0f invalidated, %.0f in place with no slot, %.0f waited for "
               "their copy (%.2f ms, %.0f ran out)\n",
               redirected, staged, steps, steps > 0 ? staged / steps / MiB : 0,
               num_after(s, "\"inplace_captured\":"), num_after(s, "\"invalidated\":"),
               num_after(s, "\"inplace_no_slot\":"), num_after(s, "\"awaited\":"),
               num_after(s, "\"await_ms\":"), num_after(s, "\"await_timeouts\":"));
        /* about 2,100 of the 3,200 reads here; the rest find no slot ready
         * when the executor (TSan, a loaded machine) falls behind the child's
         * 0.3 ms a layer: a bound that holds there */
        CHECK(redirected > STEPS * NR * READS / 8);
        /* (1) once a step, not READS times: about the distinct bytes (NR MiB;
         * the written range is read in place after the copy) */
        CHECK(steps >= STEPS / 2);
        CHECK(staged / steps <= 1.25 * NR * MiB && staged / steps >= 0.3 * NR * MiB);
        CHECK(num_after(s, "\"inplace_captured\":") >= 1);
        /* the ranges are managed memory (window-served host placements): each
         * staged by the copy kernel (uvm/stream-copy.cu) until the worker made
         * its pinned copy (uvm/stream-pin.c), then from that by the copy
         * engine; the copy of the written range was retired */
        e = strstr(s, "\"pinned_copies\":{");
        printf("stream: %.0f staged, %.0f by the copy kernel, %.0f from pinned copies; %.0f copies "
               "made, %.0f retired\n",
               num_after(s, "\"staged\":"), num_after(s, "\"staged_by_kernel\":"),
               num_after(s, "\"staged_pinned\":"), num_after(e, "\"made\":"),
               num_after(e, "\"retired\":"));
        CHECK(num_after(s, "\"staged\":") > 0 &&
              num_after(s, "\"staged_by_kernel\":") + num_after(s, "\"staged_pinned\":") ==
                  num_after(s, "\"staged\":"));
        CHECK(num_after(s, "\"staged_pinned\":") > num_after(s, "\"staged\":") / 3);
        CHECK(num_after(e, "\"made\":") >= NR - 1 && num_after(e, "\"retired\":") >= 1);
        /* (3) the graph, (3c) the hand-built one and (3b) the NCCL-named kernel were blind
         * launches: every pinned copy retired after the first (they may be older than their
         * ranges), none made again, and the reads after each were right (the child checks) */
        printf("stream: %.0f blind launches\n", num_after(s, "\"blind_launches\":"));
        CHECK(num_after(s, "\"blind_launches\":") == 3);
        CHECK(num_after(s, "\"blind_unfenced\":") == 0);
        CHECK(num_after(e, "\"held\":") == 0 &&
              num_after(e, "\"retired\":") == num_after(e, "\"made\":"));
        CHECK(strstr(log, "pinned copies retired (docs/prefetch.md, Blind launches)") != NULL);
        {
            /* the steps that staged, timed between the launches' step
             * boundaries: each layer sleeps 2 ms here, so a step of NR
             * layers takes 40 ms or more; and the exit summary's line has
             * the stats' figures */
            double ss = num_after(s, "\"staging_steps\":"), ms = num_after(s, "\"staging_step_ms\":");

            printf("stream: %.0f steps that staged, %.2f ms each, %.3f GB/s\n", ss, ms,
                   num_after(s, "\"staging_gbs\":"));
            CHECK(ss >= 1 && ss <= steps);
            CHECK(ms >= 0.8 * NR * 2.0);
            CHECK(num_after(s, "\"staging_gbs\":") > 0);
            {
                /* "stream: N staging copies (": N as in the stats, which
                 * are written a moment before the summary (a copy may come
                 * between them) */
                const char *at = strstr(log, " staging copies ("), *b = at;
                double n;

                while (b && b > log && b[-1] >= '0' && b[-1] <= '9')
                    b--;
                n = at ? strtod(b, NULL) : -1;
                CHECK(at && b - log >= 8 && strncmp(b - 8, "stream: ", 8) == 0);
                CHECK(at && n >= num_after(s, "\"staged\":") && n <= num_after(s, "\"staged\":") + 8);
            }
            CHECK(strstr(log, " steps that staged took ") != NULL);
            CHECK(strstr(log, "% from pinned copies (copy engine), ") != NULL);
            /* the hooks moved the engine's position once a range and woke
             * the executor's thread; it took each up (how fast is the GPU
             * runs' figure, not a test's) */
            printf("stream: %.0f position wakes, %.0f reactions, %.3f ms each, at most %.3f ms\n",
                   num_after(s, "\"pos_wakes\":"), num_after(s, "\"reactions\":"),
                   num_after(s, "\"reaction_ms\":"), num_after(s, "\"reaction_max_ms\":"));
            CHECK(num_after(s, "\"pos_wakes\":") >= STEPS * NR / 2);
            CHECK(num_after(s, "\"reactions\":") >= STEPS * NR / 4 &&
                  num_after(s, "\"reactions\":") <= num_after(s, "\"pos_wakes\":"));
            CHECK(num_after(s, "\"reaction_max_ms\":") >= num_after(s, "\"reaction_ms\":"));
            CHECK(strstr(log, "the executor took the engine's position up ") != NULL);
            /* slots reused after their departure fence (the engine two
             * ranges past them), not at the stream's tail */
            printf("stream: slots reused after a departure fence %.0f, at the tail %.0f\n",
                   num_after(s, "\"fences_departed\":"), num_after(s, "\"fences_at_reuse\":"));
            CHECK(num_after(s, "\"fences_departed\":") > 0);
            CHECK(num_after(s, "\"departure_lag\":") == 2); /* the default */
        }
        CHECK(num_after(e, "\"failed\":") == 0 && num_after(e, "\"over_budget\":") == 0);
        CHECK(num_after(s, "\"invalidated\":") >= 0);
        /* (4) every slot was checked before reuse; the one range 6's write
         * reached was copied back (the child read the bytes back), and the
         * range is read in place since */
        printf("stream: %.0f slots checked for writes, %.0f written back\n",
               num_after(s, "\"write_checks\":"), num_after(s, "\"written_back\":"));
        CHECK(num_after(s, "\"write_checks\":") >= steps * (NR - 4));
        printf(
            "stream: %.0f assignments taken back by launches in place, %.0f fences not recorded\n",
            num_after(s, "\"unpublished_inplace\":"), num_after(s, "\"fence_failed\":"));
        /* the hooks make the fence when the slots have not yet */
        CHECK(num_after(s, "\"fence_failed\":") == 0);
        /* range 6 (its slot written), range 8 (written in place, found at its
         * next staging copy's check); not range 12 (3a) */
        CHECK(num_after(s, "\"written_back\":") == 2);
        CHECK(num_after(s, "\"unpublished_inplace\":") >= 1);
        CHECK(strstr(log, "a launch wrote 'model.layers.8.mlp.experts.gate_up_proj' while it was "
                          "streamed") != NULL);
        CHECK(strstr(log, "a launch wrote 'model.layers.6.mlp.experts.gate_up_proj' while it was "
                          "streamed") != NULL);
        e = strstr(s, "\"model.layers.6.mlp.experts.gate_up_proj\":{");
        CHECK(e && strstr(e, "\"streamed\":false") &&
              strstr(e, "\"streamed\":false") < strstr(e, "\"written\":true"));
        /* (5) read 4x a step: multiplicity ~4 per name */
        e = strstr(s, "\"model.layers.5.mlp.experts.gate_up_proj\":{");
        mult = num_after(e, "\"read_multiplicity\":");
        CHECK(mult > 3.5 && mult < 4.5);
        CHECK(e && strstr(e, "\"streamed\":true") && strstr(e, "\"placement\":\"host\""));
        /* (6) a range with untagged bytes between its tags is never streamed */
        e = strstr(s, "\"model.layers.99.mlp.experts.up\":{");
        CHECK(e && strncmp(strstr(e, "\"streamed\":") ?: "", "\"streamed\":false", 16) == 0);
        CHECK(strstr(log, "'model.layers.99.mlp.experts.up': bytes no off-device tag names lie "
                          "between its tags") != NULL);
        /* ... and one whose tags are apart by less than an alignment is */
        e = strstr(s, "\"model.layers.98.mlp.experts.up\":{");
        CHECK(e && strstr(e, "\"streamed\":true"));
        /* (6b) one with a device-placed tag between its host tags: a
         * sub-span per host tag, each streamed; one that also holds bytes
         * no tag names: read in place */
        CHECK(num_after(s, "\"sub_spans\":") == 4);
        CHECK(strstr(log, "'model.layers.96.mlp.experts.a': tensors placed on the device lie "
                          "between the allocation's off-device tags") != NULL);
        e = strstr(s, "\"model.layers.96.mlp.experts.a\":{");
        CHECK(e && strncmp(strstr(e, "\"streamed\":") ?: "", "\"streamed\":true", 15) == 0);
        e = strstr(s, "\"model.layers.96.mlp.experts.b\":{");
        CHECK(e && strncmp(strstr(e, "\"streamed\":") ?: "", "\"streamed\":true", 15) == 0);
        CHECK(strstr(log, "'model.layers.97.mlp.experts.c': bytes no tag names lie between its "
                          "allocation's tags: the allocation is read in place") != NULL);
        CHECK(strstr(s, "\"model.layers.97.mlp.experts.a\":{") == NULL);
        /* (2) the written range is no longer streamed */
        e = strstr(s, "\"model.layers.3.mlp.experts.gate_up_proj\":{");
        CHECK(e && strncmp(strstr(e, "\"streamed\":") ?: "", "\"streamed\":false", 16) == 0);
        CHECK(e && strncmp(strstr(e, "\"written\":") ?: "", "\"written\":true", 14) == 0);
        CHECK(strstr(log, "stream: ") && strstr(log, " redirected, "));
        CHECK(strstr(log, "pinned_copies: auto}, the default, copies each once") ==
              NULL); /* on here */
        if (failures)
            fprintf(stderr, "stats:\n%s\nlog:\n%s\n", stats, log);
    }

    /* ---- stream-sized: ranges of 1 and 0.5 MiB in turn: the slots are
     * resized from 3 x 1 MiB to 1, 1 and 0.5 MiB once a step's order is
     * known, and the small one back to 1 MiB once copies wrote every
     * half-MiB range (read in place since); every read bit-identical
     * through both (the child checks) ---- */
    if (want_mode(argc, argv, "stream-sized")) {
        sized_run(argv, "stream-sized", 2, 3 * MiB, stats, sizeof(stats), log, sizeof(log));
        {
            const char *r =
                strstr(log, "stream: 3 device staging slots resized (1 MiB, 1 MiB, 512 KiB)");
            CHECK(r && strstr(r, "stream: 3 device staging slots resized (1 MiB, 1 MiB, 1 MiB)"));
        }
    }

    /* ---- stream-sized-refused: as stream-sized, but cuMemAlloc refuses
     * the small slot's growing back: it keeps 512 KiB (its old memory
     * allocated again), is not asked again, and the 1 MiB ranges are
     * staged in the two others; every read bit-identical ---- */
    if (want_mode(argc, argv, "stream-sized-refused")) {
        sized_run(argv, "stream-sized-refused", 1, 2 * MiB + MiB / 2, stats, sizeof(stats), log,
                  sizeof(log));
        CHECK(said_once(log, "stream: staging slot 2: 1 MiB could not be allocated "
                             "(CUDA_ERROR_OUT_OF_MEMORY): it keeps 512 KiB\n")); /* asked once */
        CHECK(!strstr(log, "resized (1 MiB, 1 MiB, 1 MiB)"));
        if (failures)
            fprintf(stderr, "stats:\n%s\nlog:\n%s\n", stats, log);
    }

    /* ---- stream-unfenced: a blind launch on another context's stream,
     * halfway: its fence cannot be recorded, so the executor stops
     * streaming (one warning); every read right before and after (the
     * child checks), range 10's new bytes read in place ---- */
    if (want_mode(argc, argv, "stream-unfenced")) {
        run(argv, "stream-unfenced", stats, sizeof(stats), log, sizeof(log));
        s = strstr(stats, "\"stream\":{");
        printf("stream-unfenced: %.0f blind launches, %.0f not fenced, %.0f redirected\n",
               num_after(s, "\"blind_launches\":"), num_after(s, "\"blind_unfenced\":"),
               num_after(s, "\"redirected\":"));
        CHECK(num_after(s, "\"blind_launches\":") == 1);
        CHECK(num_after(s, "\"blind_unfenced\":") == 1);
        CHECK(said_once(log, "could not be fenced: nothing is streamed from now on"));
        CHECK(strstr(log, "; one could not be fenced, and streaming stopped") != NULL);
        e = strstr(s ?: "", "\"model.layers.5.mlp.experts.gate_up_proj\":{");
        CHECK(e && strncmp(strstr(e, "\"streamed\":") ?: "", "\"streamed\":false", 16) == 0);
        if (failures)
            fprintf(stderr, "stats:\n%s\nlog:\n%s\n", stats, log);
    }

    /* ---- stream, pinned copies asked for but every pin fails: one
     * warning, each range staged by the copy kernel instead, every read
     * bit-identical (the child checks), nothing held ---- */
    if (want_mode(argc, argv, "stream-nopin")) {
        run(argv, "stream-nopin", stats, sizeof(stats), log, sizeof(log));
        s = strstr(stats, "\"stream\":{");
        e = strstr(s ?: "", "\"pinned_copies\":{");
        printf(
            "stream-nopin: %.0f staged, %.0f by the kernel, %.0f from pinned copies; %.0f failed, "
            "%.0f made\n",
            num_after(s, "\"staged\":"), num_after(s, "\"staged_by_kernel\":"),
            num_after(s, "\"staged_pinned\":"), num_after(e, "\"failed\":"),
            num_after(e, "\"made\":"));
        CHECK(num_after(s, "\"staged\":") > 0 &&
              num_after(s, "\"staged_by_kernel\":") == num_after(s, "\"staged\":"));
        CHECK(num_after(e, "\"failed\":") >= 1 && num_after(e, "\"made\":") == 0 &&
              num_after(e, "\"held\":") == 0);
        {
            const char *w = strstr(log, "stream: pinning a copy of ");
            CHECK(w && strstr(w, "CUDA_ERROR_OUT_OF_MEMORY") &&
                  !strstr(w + 1, "stream: pinning a copy of ")); /* one warning */
        }
    }

    /* ---- stream-lag1: two slots, departure fences one range behind
     * (WOFFLOAD_DEPARTURE_LAG=1): the executor stages the range after the
     * engine's into the slot of the one it just left, against the fence
     * the hook recorded on leaving it; every read bit-identical (the child
     * checks), about the distinct bytes staged a step ---- */
    if (want_mode(argc, argv, "stream-lag1")) {
        run(argv, "stream-lag1", stats, sizeof(stats), log, sizeof(log));
        s = strstr(stats, "\"stream\":{");
        redirected = num_after(s, "\"redirected\":");
        staged = num_after(s, "\"staged_bytes\":");
        steps = num_after(s, "\"steps\":");
        printf("stream-lag1: %.0f redirected, %.2f MiB staged a step over %.0f steps; slots "
               "reused after a departure fence %.0f, at the tail %.0f; %.0f in place with no slot, "
               "%.0f waited for their copy\n",
               redirected, steps > 0 ? staged / steps / MiB : 0, steps,
               num_after(s, "\"fences_departed\":"), num_after(s, "\"fences_at_reuse\":"),
               num_after(s, "\"inplace_no_slot\":"), num_after(s, "\"awaited\":"));
        CHECK(redirected > STEPS * NR * READS / 8);
        CHECK(steps >= STEPS / 2 && staged / steps <= 1.25 * NR * MiB);
        /* the lag the run had (the stats say it), and slots reused after
         * their fences (also so at a lag of 2: not what tells the two apart) */
        CHECK(num_after(s, "\"departure_lag\":") == 1);
        CHECK(num_after(s, "\"fences_departed\":") > num_after(s, "\"fences_at_reuse\":"));
        /* staged ahead: the launches seldom wait for their copy (25-27 of
         * 27 steps of 20 ranges here; with a lag of 2, 493-500: two slots
         * then hold the engine's range and the one behind it, and each
         * range is copied only once the engine reaches it) */
        CHECK(num_after(s, "\"awaited\":") < steps * NR / 2);
        CHECK(strstr(log, "2 device staging slots") != NULL);
        if (failures)
            fprintf(stderr, "stats:\n%s\nlog:\n%s\n", stats, log);
    }

    /* ---- stream-exit: the engine exits while the worker has pins to
     * make (0.3 s each, about 20 queued): exit stops it after the one in
     * hand, the exit stats are written (run() checks), and the process
     * is gone well before the queue would have been ---- */
    if (want_mode(argc, argv, "stream-exit")) {
        {
            int fd = mkstemp(exit_ts);
            char b[64] = "";
            long long at;

            CHECK(fd >= 0);
            close(fd);
            run(argv, "stream-exit", stats, sizeof(stats), log, sizeof(log));
            (void)slurp(exit_ts, b, sizeof(b));
            at = strtoll(b, NULL, 10);
            printf("stream-exit: the process was gone %.2f s after exit()\n",
                   at > 0 ? (double)(reaped_ns - at) / 1e9 : -1.0);
            CHECK(at > 0 && reaped_ns - at < 3000000000LL); /* the queue: ~5 s */
            unlink(exit_ts);
        }
    }

    /* ---- stream-capture: a global-mode capture held for 0.2 s while pins
     * are queued ends valid (the child checks cuStreamEndCapture), every
     * read bit-identical, and the pins went on after it ---- */
    if (want_mode(argc, argv, "stream-capture")) {
        run(argv, "stream-capture", stats, sizeof(stats), log, sizeof(log));
        s = strstr(stats, "\"stream\":{");
        e = strstr(s ?: "", "\"pinned_copies\":{");
        printf("stream-capture: %.0f pinned copies made, %.0f failed, %.0f staged from them\n",
               num_after(e, "\"made\":"), num_after(e, "\"failed\":"),
               num_after(s, "\"staged_pinned\":"));
        CHECK(num_after(e, "\"made\":") >= 1 && num_after(e, "\"failed\":") == 0);
    }

    /* ---- stream-relaxed: relaxed-mode captures on the engine's stream
     * while the executor fences it: every capture ends valid and every read
     * is right (the child checks), and streaming went on (no failed write
     * check stopped it) ---- */
    if (want_mode(argc, argv, "stream-relaxed")) {
        run(argv, "stream-relaxed", stats, sizeof(stats), log, sizeof(log));
        s = strstr(stats, "\"stream\":{");
        printf("stream-relaxed: %.0f redirected; %.0f capture begins waited for the shim's "
               "driver calls, %.1f ms in all\n",
               num_after(s, "\"redirected\":"), num_after(stats, "\"capture_waits\":"),
               num_after(stats, "\"capture_wait_us\":") / 1e3);
        CHECK(num_after(s, "\"redirected\":") > 0);
        /* the launch captured into the engine's own graph, and the one on
         * the stream that joined a capture, were seen as captured (read in
         * place) */
        CHECK(num_after(s, "\"inplace_captured\":") >= 2);
        CHECK(num_after(stats, "\"launch_joined_capture\":") >= 1);
        /* the executor's records take 3 ms: some begin waited for one,
         * and the exit summary says so */
        CHECK(num_after(stats, "\"capture_waits\":") > 0);
        CHECK(said_once(log, "of them waited for a driver call of the shim's"));
        CHECK(!strstr(log, "nothing is streamed from now on"));
    }

    /* ---- auto: read 4x a step, so streamed once measured ---- */
    if (want_mode(argc, argv, "auto")) {
        run(argv, "auto", stats, sizeof(stats), log, sizeof(log));
        s = strstr(stats, "\"stream\":{");
        redirected = num_after(s, "\"redirected\":");
        printf("auto: %.0f redirected\n", redirected);
        CHECK(redirected > 0);
        e = strstr(s ?: "", "\"model.layers.5.mlp.experts.gate_up_proj\":{");
        CHECK(e && strstr(e, "\"streamed\":true"));
        /* pinned_copies: 3MiB: three ranges of 1 MiB get a pinned copy, the
         * rest stay staged by the copy kernel */
        e = strstr(s ?: "", "\"pinned_copies\":{");
        printf("auto: %.0f pinned copies made, %.0f over the cap; %.0f staged from them, %.0f by "
               "the kernel\n",
               num_after(e, "\"made\":"), num_after(e, "\"over_budget\":"),
               num_after(s, "\"staged_pinned\":"), num_after(s, "\"staged_by_kernel\":"));
        CHECK(num_after(e, "\"made\":") >= 1 && num_after(e, "\"made\":") <= 3);
        CHECK(num_after(e, "\"over_budget\":") >= 1);
        CHECK(num_after(s, "\"staged_pinned\":") > 0 && num_after(s, "\"staged_by_kernel\":") > 0);
    }

    /* ---- auto by step time: read once a step, so only the period can
     * stream them; a read from a slot is made slower (slot_read_us), so
     * auto tries and then puts them back in place (unselect_range), every
     * read bit-identical throughout (the child checks each checksum) ---- */
    if (want_mode(argc, argv, "auto-time")) {
        run(argv, "auto-time", stats, sizeof(stats), log, sizeof(log));
        s = strstr(stats, "\"stream\":{");
        printf(
            "auto-time: %.0f redirected, %.0f steps, %.0f tries, %.0f kept, %.0f back in place\n",
            num_after(s, "\"redirected\":"), num_after(s, "\"steps\":"),
            num_after(s, "\"auto_tries\":"), num_after(s, "\"auto_kept\":"),
            num_after(s, "\"auto_backs\":"));
        CHECK(num_after(s, "\"auto_tries\":") >= 1);
        CHECK(num_after(s, "\"auto_backs\":") >= 1);
        CHECK(num_after(s, "\"redirected\":") > 0);
        CHECK(strstr(log, "stream: auto: trying ") != NULL);
        /* pinned_copies: off; one line says what would help */
        CHECK(num_after(s, "\"staged_pinned\":") == 0 &&
              num_after(strstr(s ?: "", "\"pinned_copies\":{"), "\"made\":") == 0);
        CHECK(strstr(log, "prefetch: {pinned_copies: auto}, the default, copies each once") !=
              NULL);
    }

    /* ---- auto-drift: streamed (slower in place), held, the period
     * shrinks (the batch did): measured in place again and streamed again,
     * the slots made once and kept through the watch (keep_slots), every
     * read bit-identical (the child checks) ---- */
    if (want_mode(argc, argv, "auto-drift")) {
        run(argv, "auto-drift", stats, sizeof(stats), log, sizeof(log));
        s = strstr(stats, "\"stream\":{");
        printf("auto-drift: %.0f tries, %.0f kept, %.0f back in place; slots made %.0f times, "
               "given back %.0f\n",
               num_after(s, "\"auto_tries\":"), num_after(s, "\"auto_kept\":"),
               num_after(s, "\"auto_backs\":"), num_after(s, "\"slot_makes\":"),
               num_after(s, "\"slot_frees\":"));
        CHECK(num_after(s, "\"auto_tries\":") >= 2 && num_after(s, "\"auto_kept\":") >= 2);
        CHECK(num_after(s, "\"slot_makes\":") == 1);
    }

    /* ---- auto-managed: managed ranges in a budget that holds about
     * half of them, read once a step, slower in place than from a slot:
     * auto streams by step time those the hot set leaves out and the hot
     * ones the slots take the room of, and keeps them; the rest stay
     * with the planner ---- */
    if (want_mode(argc, argv, "auto-managed")) {
        run(argv, "auto-managed", stats, sizeof(stats), log, sizeof(log));
        s = strstr(stats, "\"stream\":{");
        printf("auto-managed: %.0f redirected, %.0f tries, %.0f kept, %.0f back in place\n",
               num_after(s, "\"redirected\":"), num_after(s, "\"auto_tries\":"),
               num_after(s, "\"auto_kept\":"), num_after(s, "\"auto_backs\":"));
        {
            unsigned streamed = 0, kept = 0;
            const char *t = strstr(log, "stream: auto: trying ");

            for (int i = 0; i < NR; i++) {
                char key[96];
                snprintf(key, sizeof(key), "\"model.layers.%d.mlp.experts.gate_up_proj\":{", i);
                e = strstr(s ?: "", key);
                if (e && strncmp(strstr(e, "\"streamed\":") ?: "", "\"streamed\":true", 15) == 0)
                    streamed++;
                else
                    kept++;
            }
            printf("auto-managed: %u ranges streamed, %u left to the planner; %.100s\n", streamed,
                   kept, t ? t : "(no try)");
            /* "(N managed, M of them hot ones the slots take the room of": the
             * budget holds 6 of the 2 MiB allocations (its hot set, a quarter
             * held back for cycling, about 4), 3 once the slots (6 MiB) are out */
            CHECK(t && strtoul(strchr(t + 21, '(') + 1, NULL, 10) >= 1);
            CHECK(t && strstr(t, " managed, ") &&
                  strtoul(strstr(t, " managed, ") + 10, NULL, 10) >= 1);
            /* kept: the try that stands at the end kept them (the ranges
             * streamed below). Under TSan one step-time comparison in
             * about three runs times a slower step with the slots than
             * without, puts them back and tries again (2 tries, 1 kept, 1
             * back: the CI failure of 25e5a72); that costs speed, never
             * data, and the second try decides */
            CHECK(num_after(s, "\"auto_kept\":") >= 1 &&
                  num_after(s, "\"auto_backs\":") < num_after(s, "\"auto_tries\":"));
            /* what the budget less the slots holds (6 MiB: 3 allocations)
             * stays with the planner */
            CHECK(streamed >= 14 && kept >= 2 && kept <= 4);
        }
    }

    /* ---- auto-managed-sized: the same with the odd ranges 64 KiB: the
     * slots, made once auto tried, are sized for them at once (3 x 1 MiB
     * and 3 x 64 KiB, not 6 x 1 MiB), and of the hot ranges streamed for
     * the slots' room, one (a 2 MiB allocation) goes back to the planner;
     * every read bit-identical (the child checks) ---- */
    if (want_mode(argc, argv, "auto-managed-sized")) {
        run(argv, "auto-managed-sized", stats, sizeof(stats), log, sizeof(log));
        s = strstr(stats, "\"stream\":{");
        {
            const char *t = strstr(log, "stream: auto: trying ");
            const char *b = strstr(log, "hot ranges back with the planner");
            printf("auto-managed-sized: %.0f tries, %.0f kept, %.0f slot bytes; %.100s; %.60s\n",
                   num_after(s, "\"auto_tries\":"), num_after(s, "\"auto_kept\":"),
                   num_after(s, "\"slot_bytes\":"), t ? t : "(no try)", b ? b - 24 : "(none back)");
            CHECK(strstr(log,
                         "stream: 6 device staging slots (1 MiB, 1 MiB, 1 MiB, 64 KiB, 64 KiB, "
                         "64 KiB)") != NULL);
            CHECK(t && strstr(t, " managed, ") &&
                  strtoul(strstr(t, " managed, ") + 10, NULL, 10) >= 1);
            CHECK(strstr(log, "stream: auto: 1 hot ranges back with the planner") != NULL);
            /* kept: the try that stands at the end kept them (the ranges
             * streamed below). Under TSan one step-time comparison in
             * about three runs times a slower step with the slots than
             * without, puts them back and tries again (2 tries, 1 kept, 1
             * back: the CI failure of 25e5a72); that costs speed, never
             * data, and the second try decides */
            CHECK(num_after(s, "\"auto_kept\":") >= 1 &&
                  num_after(s, "\"auto_backs\":") < num_after(s, "\"auto_tries\":"));
        }
    }

    /* ---- auto-managed-sized-pair: the 64 KiB ranges the even ones, a
     * 10 MiB budget: two ranges stay with the planner (4 MiB) beside the
     * first slots (6 x 1 MiB), three hot ones are streamed for that room,
     * and once the slots are sized (3 MiB + 192 KiB) the room holds one of
     * them again. The first of the three in the order is a 64 KiB range
     * between two 1 MiB ones: given back, it would leave four 1 MiB ranges
     * in a row of six, the slots would grow to 4 MiB + 128 KiB and, with
     * the planner's 6 MiB, pass the budget. readmit_room counts the slots
     * the ranges still streamed then need, so it gives back a 1 MiB one,
     * and the slots keep their size ---- */
    if (want_mode(argc, argv, "auto-managed-sized-pair")) {
        run(argv, "auto-managed-sized-pair", stats, sizeof(stats), log, sizeof(log));
        s = strstr(stats, "\"stream\":{");
        {
            unsigned planner = 0;

            for (int i = 0; i < NR; i++) {
                char key[96];
                snprintf(key, sizeof(key), "\"model.layers.%d.mlp.experts.gate_up_proj\":{", i);
                e = strstr(s ?: "", key);
                planner +=
                    e && strncmp(strstr(e, "\"streamed\":") ?: "", "\"streamed\":false", 16) == 0;
            }
            printf("auto-managed-sized-pair: %u ranges (2 MiB allocations) with the planner, %.0f "
                   "slot "
                   "bytes, budget 10 MiB\n",
                   planner, num_after(s, "\"slot_bytes\":"));
            CHECK(strstr(log,
                         "stream: 6 device staging slots (1 MiB, 1 MiB, 1 MiB, 64 KiB, 64 KiB, "
                         "64 KiB)") != NULL);
            CHECK(strstr(log, "stream: auto: 1 hot ranges back with the planner") != NULL);
            CHECK(strstr(log, "resized (1 MiB, 1 MiB, 1 MiB, 1 MiB") == NULL);
            CHECK(num_after(s, "\"slot_bytes\":") == 3 * MiB + 3 * MiB / 16);
            CHECK(planner >= 1 && planner * 2 * MiB + num_after(s, "\"slot_bytes\":") <= 10 * MiB);
        }
    }

    /* ---- auto-managed-recheck: streaming managed ranges pays at first and
     * is kept; then reads in place become fast and reads from a slot slow
     * (the batch changed what pays): the recheck, every 12 streamed steps,
     * puts them back in place, measures, and they stay there; every read
     * bit-identical (the child checks) ---- */
    if (want_mode(argc, argv, "auto-managed-recheck")) {
        run(argv, "auto-managed-recheck", stats, sizeof(stats), log, sizeof(log));
        s = strstr(stats, "\"stream\":{");
        printf("auto-managed-recheck: %.0f tries, %.0f kept, %.0f back in place, %.0f rechecked\n",
               num_after(s, "\"auto_tries\":"), num_after(s, "\"auto_kept\":"),
               num_after(s, "\"auto_backs\":"), num_after(s, "\"auto_rechecks\":"));
        CHECK(num_after(s, "\"auto_kept\":") >= 1);
        CHECK(num_after(s, "\"auto_rechecks\":") >= 1);
        CHECK(strstr(log, "back in place to take the decision again") != NULL);
        CHECK(strstr(log, "stream: auto: the ranges stay in place: a step takes ") != NULL);
    }

    /* ---- auto-managed-back: the same, a read from a slot made slower:
     * auto tries and hands the managed ranges back to the planner, which
     * prefetches them again ---- */
    if (want_mode(argc, argv, "auto-managed-back")) {
        run(argv, "auto-managed-back", stats, sizeof(stats), log, sizeof(log));
        s = strstr(stats, "\"stream\":{");
        printf("auto-managed-back: %.0f tries, %.0f back in place\n",
               num_after(s, "\"auto_tries\":"), num_after(s, "\"auto_backs\":"));
        CHECK(num_after(s, "\"auto_tries\":") >= 1 && num_after(s, "\"auto_backs\":") >= 1);
        {
            /* back with the planner: its per-name figures name them again */
            const char *pf = strstr(stats, "\"prefetch\":{"), *end = strstr(stats, "\"stream\":{");
            unsigned known = 0;

            for (int i = 0; pf && end && i < NR; i++) {
                char key[96];
                const char *at;
                snprintf(key, sizeof(key), "\"model.layers.%d.mlp.experts.gate_up_proj\":{", i);
                at = strstr(pf, key);
                known += at && at < end;
            }
            printf("auto-managed-back: %u of %d ranges back with the planner\n", known, NR);
            CHECK(known == NR);
        }
    }

    /* ---- hot-set: read in place, with one warning per range read 2x or more ---- */
    if (want_mode(argc, argv, "hot-set")) {
        run(argv, "hot-set", stats, sizeof(stats), log, sizeof(log));
        s = strstr(stats, "\"stream\":{");
        CHECK(num_after(s, "\"redirected\":") == 0);
        /* one line for the process, naming the first range and the fix */
        CHECK(strstr(log, "'model.layers.0.mlp.experts.gate_up_proj' (host) is read 4.0x a step in "
                          "place over PCIe (and 21 more host ranges); prefetch: {mode: auto} "
                          "would copy it once a step") != NULL);
        {
            const char *w = strstr(log, "in place over PCIe");
            CHECK(w && !strstr(w + 1, "in place over PCIe"));
        }
        if (failures)
            fprintf(stderr, "stats:\n%s\nlog:\n%s\n", stats, log);
        check_summary("test-stream-preload (a child's failure shows as the run() line: its own "
                      "summary is above)");
    }

    return failures ? 1 : 0;
}
