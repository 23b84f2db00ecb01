/* tests/test-graph-replay.c: CUDA graph launches replayed kernel by kernel
 * (preload/graph-replay.c), end to end through the preloaded shim and the
 * fake driver.
 *
 * An engine-like child tags NR host ranges of 1 MiB ("experts") under
 * `prefetch: {mode: stream}` and runs every step as one CUDA graph, as
 * llama.cpp does: captured once, instantiated, launched each step. The
 * graph clears an output table (a memset node), reads each range READS
 * times with a checksum kernel (each sum into its own word; one launch
 * with its parameters packed, the `extra` form cuBLAS uses), and copies
 * the first sum aside (a copy node). Kernels are host functions in the
 * fake: a checksum tells whether the pointer it got was the range (in
 * place) or another address (a staging slot). After each launch the child
 * checks every word against the host data's sums.
 *
 * Modes (each a child process; the child checks its own stats):
 *  - replay: graph launches are replayed once the executor streams the
 *    ranges (the steps wait for that, within a deadline: the executor is a
 *    thread of its own): reads come from slots, every sum right. PHASE
 *    steps later, the exec is updated (cuGraphExecUpdate) from a second
 *    capture that reads the ranges in reverse order into other words: the
 *    replay follows it. PHASE steps after its first replay, one kernel
 *    node of the exec gets new parameters in place
 *    (cuGraphExecKernelNodeSetParams): the shim's copy is dropped,
 *    the graph runs whole and reads in place, and the changed node's read
 *    is the one that lands (a stale copy would write the old word).
 *  - auto: `prefetch: {mode: auto}`, each launch claimed read in place
 *    (woffload_read_in_place) for the first AUTO_FROM steps, as the ggml
 *    hook claims the steps that read a small share of the experts: the
 *    graphs run whole, and the executor learns the steps from their
 *    launches (uvm/stream.c, graph launches) and streams the claimed
 *    ranges for the other steps; once the claims stop, the launches are
 *    replayed and read from slots, as in replay.
 *  - off: WOFFLOAD_GRAPH_REPLAY=0: every graph launch runs whole, every
 *    read in place, sums right.
 *  - claimed: every range claimed read in place (woffload_read_in_place)
 *    around each launch, as the ggml hook claims a compute's: no replay,
 *    every read in place, sums right.
 *
 * Needs LD_PRELOAD=the shim and LD_LIBRARY_PATH=the fake driver's
 * directory (meson sets both). */
#include <dlfcn.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda.h>

#include "fakecuda.h"
#include "gpu/wsum.h"
#include "preload-check.h"

#define MiB ((size_t)1 << 20)
#define NR 8
#define READS 2
#define PHASE 40      /* steps of each phase after the first replay */
#define DEADLINE_S 60 /* for the executor to stream */
#define WORDS (NR * READS)
#define SCRATCH 70 /* allocation nodes in each graph */
#define CLAIMED_FROM 8
#define AUTO_FROM 16

static CUdeviceptr ranges[NR];
static uint64_t inplace_reads, slot_reads;
/* the graphs' own scratch allocations (one per capture), and the reads
 * written into one of them: a replay writes into its own allocation */
static CUdeviceptr gtmp[2];
static int ntmp;
static uint64_t gtmp_writes;

/* params: const unsigned char *p, uint64_t n, uint64_t *out */
static void checksum(void **params, const uint32_t g[3], const uint32_t b[3])
{
    CUdeviceptr p = *(CUdeviceptr *)params[0];
    uint64_t n = *(uint64_t *)params[1];
    uint64_t *out = (uint64_t *)(uintptr_t) * (CUdeviceptr *)params[2];
    bool weight = false;

    (void)g;
    (void)b;
    for (int i = 0; i < NR; i++)
        weight |= p >= ranges[i] && p < ranges[i] + MiB;
    __atomic_add_fetch(weight ? &inplace_reads : &slot_reads, 1, __ATOMIC_RELAXED);
    for (int t = 0; t < ntmp; t++)
        if ((CUdeviceptr)(uintptr_t)out >= gtmp[t] && (CUdeviceptr)(uintptr_t)out < gtmp[t] + 64)
            __atomic_add_fetch(&gtmp_writes, 1, __ATOMIC_RELAXED);
    *out = host_sum((const uint64_t *)(uintptr_t)p, n / 8);
}

static double num_after(const char *s, const char *key)
{
    const char *p = s ? strstr(s, key) : NULL;
    return p ? strtod(p + strlen(key), NULL) : -1;
}

static int child(const char *mode)
{
    void *cu = dlopen("libcuda.so.1", RTLD_NOW);
    CUresult (*p_cuInit)(unsigned), (*p_cuDeviceGet)(CUdevice *, int);
    CUresult (*p_cuCtxRetain)(CUcontext *, CUdevice), (*p_cuCtxSetCurrent)(CUcontext);
    CUresult (*p_cuMemAlloc)(CUdeviceptr *, size_t);
    CUresult (*p_cuMemcpyHtoD)(CUdeviceptr, const void *, size_t);
    CUresult (*p_cuMemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
    CUresult (*p_cuMemsetD32Async)(CUdeviceptr, unsigned, size_t, CUstream);
    CUresult (*p_cuMemAllocAsync)(CUdeviceptr *, size_t, CUstream);
    CUresult (*p_cuMemFreeAsync)(CUdeviceptr, CUstream);
    CUresult (*p_cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                                 unsigned, unsigned, CUstream, void **, void **);
    CUresult (*p_cuStreamCreate)(CUstream *, unsigned), (*p_cuStreamSync)(CUstream);
    CUresult (*p_cuBeginCapture)(CUstream, CUstreamCaptureMode);
    CUresult (*p_cuEndCapture)(CUstream, CUgraph *);
    CUresult (*p_cuInstantiate)(CUgraphExec *, CUgraph, unsigned long long);
    CUresult (*p_cuGraphLaunch)(CUgraphExec, CUstream);
    CUresult (*p_cuExecUpdate)(CUgraphExec, CUgraph, CUgraphExecUpdateResultInfo *);
    CUresult (*p_cuGetNodes)(CUgraph, CUgraphNode *, size_t *);
    CUresult (*p_cuExecKernelSet)(CUgraphExec, CUgraphNode, const CUDA_KERNEL_NODE_PARAMS *);
    CUfunction (*kernel)(const char *, int, const size_t *, fakecuda_kernel_fn);
    int (*tag)(const void *, size_t, const char *);
    int (*seal)(void);
    int (*claim)(const void *, size_t, int);
    long (*stats)(char *, size_t);
    static const size_t psz[3] = {8, 8, 8};
    static char js[1 << 17];
    bool autom = strcmp(mode, "auto") == 0;
    bool replay = strcmp(mode, "replay") == 0 || autom, claimed = strcmp(mode, "claimed") == 0;
    uint64_t expect[NR], want[WORDS + 1], wrong = 0;
    unsigned char *buf = malloc(MiB);
    CUdevice dev;
    CUcontext ctx;
    CUstream s;
    CUfunction k;
    CUdeviceptr out;
    CUgraph g1, g2;
    CUgraphExec ge;
    uint64_t n = MiB, slot_before_change = 0, inplace_before_change = 0;
    CUdeviceptr outw[WORDS + 1];
    void *params[WORDS][3], *tparams[3];
    uint64_t replays_at_change = 0, replays_at_update = 0, replays_claimed = 0, slot_claimed = 0;
    int steps = 0;

    if (!cu || !buf)
        return 1;
    *(void **)&p_cuInit = need(cu, "cuInit");
    *(void **)&p_cuDeviceGet = need(cu, "cuDeviceGet");
    *(void **)&p_cuCtxRetain = need(cu, "cuDevicePrimaryCtxRetain");
    *(void **)&p_cuCtxSetCurrent = need(cu, "cuCtxSetCurrent");
    *(void **)&p_cuMemAlloc = need(cu, "cuMemAlloc_v2");
    *(void **)&p_cuMemcpyHtoD = need(cu, "cuMemcpyHtoD_v2");
    *(void **)&p_cuMemcpyDtoDAsync = need(cu, "cuMemcpyDtoDAsync_v2");
    *(void **)&p_cuMemsetD32Async = need(cu, "cuMemsetD32Async");
    *(void **)&p_cuMemAllocAsync = need(cu, "cuMemAllocAsync");
    *(void **)&p_cuMemFreeAsync = need(cu, "cuMemFreeAsync");
    *(void **)&p_cuLaunchKernel = need(cu, "cuLaunchKernel");
    *(void **)&p_cuStreamCreate = need(cu, "cuStreamCreate");
    *(void **)&p_cuStreamSync = need(cu, "cuStreamSynchronize");
    *(void **)&p_cuBeginCapture = need(cu, "cuStreamBeginCapture_v2");
    *(void **)&p_cuEndCapture = need(cu, "cuStreamEndCapture");
    *(void **)&p_cuInstantiate = need(cu, "cuGraphInstantiateWithFlags");
    *(void **)&p_cuGraphLaunch = need(cu, "cuGraphLaunch");
    *(void **)&p_cuExecUpdate = need(cu, "cuGraphExecUpdate_v2");
    *(void **)&p_cuGetNodes = need(cu, "cuGraphGetNodes");
    *(void **)&p_cuExecKernelSet = need(cu, "cuGraphExecKernelNodeSetParams_v2");
    *(void **)&kernel = need(cu, "fakecuda_kernel");
    *(void **)&tag = need(RTLD_DEFAULT, "woffload_tag");
    *(void **)&seal = need(RTLD_DEFAULT, "woffload_seal");
    *(void **)&claim = need(RTLD_DEFAULT, "woffload_read_in_place");
    *(void **)&stats = need(RTLD_DEFAULT, "woffload_stats");

    CHECK(p_cuInit(0) == CUDA_SUCCESS);
    CHECK(p_cuDeviceGet(&dev, 0) == CUDA_SUCCESS);
    CHECK(p_cuCtxRetain(&ctx, dev) == CUDA_SUCCESS);
    CHECK(p_cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
    CHECK(p_cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    for (int i = 0; i < NR; i++) {
        char name[64];

        CHECK(p_cuMemAlloc(&ranges[i], 2 * MiB) == CUDA_SUCCESS);
        for (size_t j = 0; j < MiB; j++)
            buf[j] = (unsigned char)(j * 131 + (size_t)i * 7 + (j >> 12));
        CHECK(p_cuMemcpyHtoD(ranges[i], buf, MiB) == CUDA_SUCCESS);
        expect[i] = host_sum((const uint64_t *)buf, MiB / 8);
        snprintf(name, sizeof(name), "model.layers.%d.mlp.experts.gate_up_proj", i);
        CHECK(tag((void *)(uintptr_t)ranges[i], MiB, name) == 0);
    }
    CHECK(p_cuMemAlloc(&out, 4096) == CUDA_SUCCESS);
    CHECK(seal() == 0);
    k = kernel("checksum", 3, psz, checksum);
    for (int w = 0; w <= WORDS; w++)
        outw[w] = out + 8 * (CUdeviceptr)w;

        /* the step's graph: clear the table, read range i into word w (order:
         * forward into words 0.., or reversed into the words after), copy word
         * 0 into the last word */
#define CAPTURE(gp, reversed)                                                                      \
    do {                                                                                           \
        CHECK(p_cuBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED) == CUDA_SUCCESS);                \
        CHECK(p_cuMemsetD32Async(out, 0, 2 * (WORDS + 1), s) == CUDA_SUCCESS);                     \
        for (int w = 0; w < WORDS; w++) {                                                          \
            int i = (reversed) ? NR - 1 - w % NR : w % NR;                                         \
            int at = (reversed) ? WORDS - 1 - w : w;                                               \
            params[w][0] = &ranges[i];                                                             \
            params[w][1] = &n;                                                                     \
            params[w][2] = &outw[at];                                                              \
            want[at] = expect[i];                                                                  \
            if (w == 1) { /* the packed form (cuBLAS launches so) */                               \
                uint64_t pk[3] = {ranges[i], n, outw[at]};                                         \
                size_t psize = sizeof(pk);                                                         \
                void *ex[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, pk, CU_LAUNCH_PARAM_BUFFER_SIZE,     \
                              &psize, CU_LAUNCH_PARAM_END};                                        \
                CHECK(p_cuLaunchKernel(k, 1, 1, 1, 1, 1, 1, 0, s, NULL, ex) == CUDA_SUCCESS);      \
            } else {                                                                               \
                CHECK(p_cuLaunchKernel(k, 1, 1, 1, 1, 1, 1, 0, s, params[w], NULL) ==              \
                      CUDA_SUCCESS);                                                               \
            }                                                                                      \
        }                                                                                          \
        /* scratch memory the graph allocates and frees (a memory allocation                       \
         * node), once per call as a library's workspace can be: SCRATCH of                        \
         * them, each at the address the last freed (the driver may reuse it),                     \
         * more than a graph's copy held before; range 0's sum through the last */                 \
        for (int j_ = 0; j_ < SCRATCH - 1; j_++) {                                                 \
            CUdeviceptr sc_;                                                                       \
            CHECK(p_cuMemAllocAsync(&sc_, 64, s) == CUDA_SUCCESS);                                 \
            CHECK(p_cuMemsetD32Async(sc_, 0, 16, s) == CUDA_SUCCESS);                              \
            CHECK(p_cuMemFreeAsync(sc_, s) == CUDA_SUCCESS);                                       \
        }                                                                                          \
        CHECK(p_cuMemAllocAsync(&gtmp[ntmp], 64, s) == CUDA_SUCCESS);                              \
        tparams[0] = &ranges[0];                                                                   \
        tparams[1] = &n;                                                                           \
        tparams[2] = &gtmp[ntmp];                                                                  \
        CHECK(p_cuLaunchKernel(k, 1, 1, 1, 1, 1, 1, 0, s, tparams, NULL) == CUDA_SUCCESS);         \
        CHECK(p_cuMemcpyDtoDAsync(outw[WORDS], gtmp[ntmp], 8, s) == CUDA_SUCCESS);                 \
        CHECK(p_cuMemFreeAsync(gtmp[ntmp], s) == CUDA_SUCCESS);                                    \
        ntmp++;                                                                                    \
        want[WORDS] = expect[0];                                                                   \
        CHECK(p_cuEndCapture(s, (gp)) == CUDA_SUCCESS);                                            \
    } while (0)

        /* one step: the graph launched (claimed read in place around the
         * launch when `cl`), then every word checked */
#define STEP(cl)                                                                                   \
    do {                                                                                           \
        if (cl)                                                                                    \
            for (int r_ = 0; r_ < NR; r_++)                                                        \
                CHECK(claim((void *)(uintptr_t)ranges[r_], MiB, 1) >= 0);                          \
        CHECK(p_cuGraphLaunch(ge, s) == CUDA_SUCCESS);                                             \
        CHECK(p_cuStreamSync(s) == CUDA_SUCCESS);                                                  \
        if (cl)                                                                                    \
            for (int r_ = 0; r_ < NR; r_++)                                                        \
                CHECK(claim((void *)(uintptr_t)ranges[r_], MiB, 0) >= 0);                          \
        for (int w_ = 0; w_ <= WORDS; w_++)                                                        \
            if (((uint64_t *)(uintptr_t)out)[w_] != want[w_])                                      \
                wrong++;                                                                           \
        steps++;                                                                                   \
    } while (0)
        /* steps until the executor streams and a replay read from a slot
         * (cond), within a deadline: the executor is a thread of its own, and
         * a loaded machine (CI runs two suites at once on two cores) may keep
         * it off the CPU for many of the fake's steps, which take microseconds;
         * a GPU step takes milliseconds, modelled by a short sleep */
#define STEPS_UNTIL(cond)                                                                          \
    do {                                                                                           \
        struct timespec t0_, t_;                                                                   \
        clock_gettime(CLOCK_MONOTONIC, &t0_);                                                      \
        for (;;) {                                                                                 \
            STEP(false);                                                                           \
            CHECK(stats(js, sizeof(js)) > 0);                                                      \
            if (cond)                                                                              \
                break;                                                                             \
            clock_gettime(CLOCK_MONOTONIC, &t_);                                                   \
            if (t_.tv_sec - t0_.tv_sec > DEADLINE_S) {                                             \
                fprintf(stderr, "child %s: no %s in %d s (%d steps): %s\n", mode, #cond,           \
                        DEADLINE_S, steps, js);                                                    \
                CHECK(cond);                                                                       \
                break;                                                                             \
            }                                                                                      \
            usleep(200);                                                                           \
        }                                                                                          \
    } while (0)
#define REPLAYS() ((uint64_t)num_after(js, "\"graph_replays\":"))

    CAPTURE(&g1, false);
    CHECK(p_cuInstantiate(&ge, g1, 0) == CUDA_SUCCESS);
    if (autom) {
        /* claimed read in place, as the ggml hook claims the steps that
         * read a small share of the experts: the graphs run whole */
        for (int i = 0; i < AUTO_FROM; i++)
            STEP(true);
        CHECK(stats(js, sizeof(js)) > 0);
        replays_claimed = REPLAYS();
        slot_claimed = slot_reads;
    }
    if (claimed) {
        /* as the ggml hook claims a compute's layers (a span the executor
         * made after the claim is not claimed: the steps from CLAIMED_FROM
         * on are checked) */
        for (int i = 0; i < CLAIMED_FROM; i++)
            STEP(true);
        CHECK(stats(js, sizeof(js)) > 0);
        replays_claimed = REPLAYS();
        slot_claimed = slot_reads;
    }
    if (replay)
        STEPS_UNTIL(REPLAYS() > 0 && slot_reads > 0);
    for (int i = 0; i < PHASE; i++)
        STEP(claimed);
    {
        /* the engine's graph changes (llama.cpp: another batch size): a new
         * capture, and the exec updated from it */
        CUgraphExecUpdateResultInfo info;
        CAPTURE(&g2, true);
        CHECK(p_cuExecUpdate(ge, g2, &info) == CUDA_SUCCESS);
        /* and again from the same graph, as llama.cpp updates right after
         * it instantiates: nothing to read again */
        CHECK(p_cuExecUpdate(ge, g2, &info) == CUDA_SUCCESS);
        CHECK(stats(js, sizeof(js)) > 0);
        replays_at_update = REPLAYS();
    }
    /* the update followed: replays of the new graph, every word right (a
     * stale copy would write the forward order's words) */
    if (replay)
        STEPS_UNTIL(REPLAYS() > replays_at_update);
    for (int i = 0; i < PHASE; i++)
        STEP(claimed);
    {
        /* one kernel node changed in the exec alone: the first kernel (node
         * 1, after the memset) reads range 5 into word 3 */
        CUgraphNode nodes[WORDS + 5 + 3 * (SCRATCH - 1)];
        size_t nn = sizeof(nodes) / sizeof(nodes[0]);
        CUDA_KERNEL_NODE_PARAMS kp;
        static void *np[3];
        static CUdeviceptr r5, w3;

        slot_before_change = slot_reads;
        inplace_before_change = inplace_reads;
        CHECK(stats(js, sizeof(js)) > 0);
        replays_at_change = REPLAYS();
        CHECK(p_cuGetNodes(g2, nodes, &nn) == CUDA_SUCCESS &&
              nn == sizeof(nodes) / sizeof(nodes[0]));
        r5 = ranges[5];
        w3 = outw[3];
        np[0] = &r5;
        np[1] = &n;
        np[2] = &w3;
        memset(&kp, 0, sizeof(kp));
        kp.func = k;
        kp.gridDimX = kp.gridDimY = kp.gridDimZ = 1;
        kp.blockDimX = kp.blockDimY = kp.blockDimZ = 1;
        kp.kernelParams = np;
        CHECK(p_cuExecKernelSet(ge, nodes[1], &kp) == CUDA_SUCCESS);
        /* node 1 wrote word WORDS - 1; now word 3, which node WORDS - 3
         * writes after it: word WORDS - 1 stays 0 */
        want[WORDS - 1] = 0;
    }
    for (int i = 0; i < PHASE; i++) {
        STEP(claimed);
        /* the changed node's own read: range 5 into word 3, then node
         * WORDS - 3 wrote word 3 again with its range (the reversed
         * order's) */
        CHECK(((uint64_t *)(uintptr_t)out)[WORDS - 1] == 0);
    }
    printf("child %s: %llu reads from slots, %llu in place, %llu wrong words\n", mode,
           (unsigned long long)slot_reads, (unsigned long long)inplace_reads,
           (unsigned long long)wrong);
    CHECK(wrong == 0);
    CHECK(stats(js, sizeof(js)) > 0);
    {
        double replays = num_after(js, "\"graph_replays\":");
        double snaps = num_after(js, "\"graph_snapshots\":");
        double changed = num_after(js, "\"graph_exec_changed\":");
        double unsup = num_after(js, "\"graph_snapshot_unsupported\":");
        double kernels = num_after(js, "\"graph_replay_kernels\":");

        printf("child %s: %.0f graph launches replayed (%.0f kernels), %.0f graphs read, %.0f "
               "unsupported, %.0f execs changed in place\n",
               mode, replays, kernels, snaps, unsup, changed);
        CHECK(unsup == 0);
        /* every launch run whole wrote the graph's own scratch; no replay
         * did (it allocated its own) */
        printf("child %s: %llu reads written into a graph's own allocation\n", mode,
               (unsigned long long)gtmp_writes);
        CHECK((double)gtmp_writes == steps - replays);
        if (replay) {
            /* read at the instantiation and at the first update (the
             * second, from the same capture, reads nothing) */
            CHECK(snaps == 2);
            CHECK(replays > replays_at_update && kernels == replays * (WORDS + 1));
            /* the engine thread's time in them was counted */
            CHECK(num_after(js, "\"graph_replay_ns\":") > 0);
            /* auto: nothing replayed while claimed; streamed from the
             * steps the graphs ran whole */
            if (autom) {
                CHECK(replays_claimed == 0 && slot_claimed == 0);
                CHECK(strstr(js, "\"streamed\":true") != NULL);
            }
            /* replayed until the change, never after */
            CHECK((double)replays_at_change == replays);
            CHECK(changed == 1);
            CHECK(slot_before_change > 0);
            /* after the change, the graph ran whole: every read in place */
            CHECK(slot_reads == slot_before_change);
            CHECK(inplace_reads - inplace_before_change == PHASE * (WORDS + 1));
        } else if (claimed) {
            /* claimed read in place: launched whole (the claims found the
             * streamed spans) */
            CHECK(replays == (double)replays_claimed && slot_reads == slot_claimed);
            CHECK(num_after(js, "\"inplace_claims\":") > 0);
        } else {
            CHECK(replays == 0 && slot_reads == 0);
            /* claimed: read all the same (a claim may end); off: never read */
            CHECK(snaps == (claimed ? 2 : 0));
        }
    }
    free(buf);
    check_summary(mode);
    return failures ? 1 : 0;
}

static void run(char **argv, const char *mode)
{
    char pol[] = "/tmp/test-graph-replay-policy-XXXXXX";
    char policy[512];
    int n = snprintf(policy, sizeof(policy),
                     "version: 1\n"
                     "device_budget: 16MiB\n"
                     "prefetch: {mode: %s, slots: 3, experimental: true}\n"
                     "rules:\n"
                     "  - {name: experts, match: [experts], place: host}\n",
                     strcmp(mode, "auto") == 0 ? "auto" : "stream");
    int fd = mkstemp(pol), status;
    pid_t pid;

    CHECK(fd >= 0 && write(fd, policy, (size_t)n) == n);
    close(fd);
    pid = fork();
    if (pid == 0) {
        setenv("WO_GRAPH_REPLAY_CHILD", mode, 1);
        setenv("WOFFLOAD_POLICY", pol, 1);
        if (strcmp(mode, "off") == 0)
            setenv("WOFFLOAD_GRAPH_REPLAY", "0", 1);
        execv("/proc/self/exe", argv);
        _exit(127);
    }
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    unlink(pol);
}

int main(int argc, char **argv)
{
    const char *mode = getenv("WO_GRAPH_REPLAY_CHILD");

    if (mode)
        return child(mode);
    if (want(argc, argv, "replay"))
        run(argv, "replay");
    if (want(argc, argv, "auto"))
        run(argv, "auto");
    if (want(argc, argv, "off"))
        run(argv, "off");
    if (want(argc, argv, "claimed"))
        run(argv, "claimed");
    check_summary("test-graph-replay");
    return failures ? 1 : 0;
}
