/* tests/test-uvm-preload.c: placement end to end through the preloaded shim
 * and the fake driver: the engine's own calls (p_cuMemAlloc reached through
 * dlsym, as cuBLAS does), names from the public API found with
 * dlsym(RTLD_DEFAULT), a kernel launch attributed to a name by the consumer
 * thread, and the WOFFLOAD_STATS file written at exit.
 *
 * The parent writes a policy, re-executes itself with WOFFLOAD_POLICY and
 * WOFFLOAD_STATS set (the shim reads its settings once, at start), waits,
 * and checks the stats file the child's exit left. Needs LD_PRELOAD=the shim
 * and LD_LIBRARY_PATH=the fake driver's directory (meson sets both). */
#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda.h>

#include "fakecuda.h"

#define MiB ((size_t)1 << 20)

#include "preload-check.h"

static uint64_t seen;

static void touch(void **params, const uint32_t g[3], const uint32_t b[3])
{
    (void)g;
    (void)b;
    seen += *(const unsigned char *)(uintptr_t) * (CUdeviceptr *)params[0];
}

static int child(void)
{
    void *cu = dlopen("libcuda.so.1", RTLD_NOW);
    CUresult (*p_cuInit)(unsigned), (*p_cuDeviceGet)(CUdevice *, int);
    CUresult (*p_cuCtxRetain)(CUcontext *, CUdevice), (*p_cuCtxSetCurrent)(CUcontext);
    CUresult (*p_cuMemAlloc)(CUdeviceptr *, size_t), (*p_cuMemFree)(CUdeviceptr);
    CUresult (*p_cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                               unsigned, unsigned, CUstream, void **, void **);
    CUresult (*p_cuCtxSynchronize)(void);
    int (*tag)(const void *, size_t, const char *), (*push)(const char *), (*pop)(void);
    int (*seal)(void);
    long (*stats)(char *, size_t);
    uint64_t (*live)(int);
    int (*state)(const void *, struct fakecuda_page_state *);
    CUfunction (*kernel)(const char *, int, const size_t *, fakecuda_kernel_fn);
    static const size_t psz[1] = {8};
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr big, small, pinned;
    uint64_t managed0, host0, device0;
    struct fakecuda_page_state ps;
    CUfunction k;
    char buf[16384];

    if (!cu) {
        fprintf(stderr, "no libcuda.so.1: %s\n", dlerror());
        return 1;
    }
    *(void **)&p_cuInit = need(cu, "cuInit");
    *(void **)&p_cuDeviceGet = need(cu, "cuDeviceGet");
    *(void **)&p_cuCtxRetain = need(cu, "cuDevicePrimaryCtxRetain");
    *(void **)&p_cuCtxSetCurrent = need(cu, "cuCtxSetCurrent");
    *(void **)&p_cuMemAlloc = need(cu, "cuMemAlloc_v2");
    *(void **)&p_cuMemFree = need(cu, "cuMemFree_v2");
    *(void **)&p_cuLaunchKernel = need(cu, "cuLaunchKernel");
    *(void **)&p_cuCtxSynchronize = need(cu, "cuCtxSynchronize");
    *(void **)&live = need(cu, "fakecuda_live_bytes");
    *(void **)&state = need(cu, "fakecuda_managed_state");
    *(void **)&kernel = need(cu, "fakecuda_kernel");
    *(void **)&tag = need(RTLD_DEFAULT, "woffload_tag");
    *(void **)&push = need(RTLD_DEFAULT, "woffload_tag_push");
    *(void **)&pop = need(RTLD_DEFAULT, "woffload_tag_pop");
    *(void **)&seal = need(RTLD_DEFAULT, "woffload_seal");
    *(void **)&stats = need(RTLD_DEFAULT, "woffload_stats");

    CHECK(p_cuInit(0) == CUDA_SUCCESS);
    CHECK(p_cuDeviceGet(&dev, 0) == CUDA_SUCCESS);
    CHECK(p_cuCtxRetain(&ctx, dev) == CUDA_SUCCESS);
    CHECK(p_cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
    managed0 = live(FAKECUDA_MANAGED);
    host0 = live(FAKECUDA_HOST) + live(FAKECUDA_REGISTERED);
    device0 = live(FAKECUDA_DEVICE);

    /* The window is open from the start: the big allocation is served
     * managed by uvm/, the small one passes through to device memory. */
    CHECK(p_cuMemAlloc(&big, 8 * MiB) == CUDA_SUCCESS);
    CHECK(live(FAKECUDA_MANAGED) == managed0 + 8 * MiB);
    CHECK(p_cuMemAlloc(&small, 64 * 1024) == CUDA_SUCCESS);
    CHECK(live(FAKECUDA_DEVICE) == device0 + 64 * 1024);

    CHECK(tag((void *)(uintptr_t)big, 4 * MiB, "model.layers.0.mlp.experts.w13_weight") == 0);
    CHECK(tag((void *)(uintptr_t)small, 4096, "model.norm.bias") == 0); /* observed only */
    CHECK(tag((void *)(uintptr_t)(big + 8 * MiB), 1, "nowhere") == -ENOENT);

    /* host + pin in a tag scope: pinned host memory. */
    CHECK(push("model.layers.1.mlp.experts.w2_weight") == 0);
    CHECK(p_cuMemAlloc(&pinned, 2 * MiB) == CUDA_SUCCESS);
    CHECK(pop() == 0);
    /* a huge-page mapping registered with the driver (uvm/place-pin.c, wo_pin_host) */
    CHECK(live(FAKECUDA_HOST) + live(FAKECUDA_REGISTERED) == host0 + 2 * MiB);

    CHECK(seal() == 0);
    CHECK(seal() == -EALREADY);
    CHECK(state((void *)(uintptr_t)big, &ps) == 0 && ps.preferred == CU_DEVICE_CPU);
    CHECK(state((void *)(uintptr_t)(big + 5 * MiB), &ps) == 0 && ps.preferred == 0);

    /* A launch whose parameter points into the experts tag. */
    k = kernel("touch", 1, psz, touch);
    {
        CUdeviceptr arg = big + 4096;
        void *params[] = {&arg};
        CHECK(p_cuLaunchKernel(k, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL) == CUDA_SUCCESS);
        CHECK(p_cuCtxSynchronize() == CUDA_SUCCESS);
    }
    for (int i = 0; i < 2000; i++) {
        long n = stats(buf, sizeof(buf));
        const char *e = strstr(buf, "{\"name\":\"model.layers.0.mlp.experts.w13_weight\"");
        CHECK(n > 0 && n < (long)sizeof(buf));
        if (e && strstr(e, "\"launches\":1,"))
            break;
        usleep(1000);
    }
    CHECK(strstr(strstr(buf, "{\"name\":\"model.layers.0.mlp.experts.w13_weight\"") ?: "",
                 "\"launches\":1,") != NULL);

    CHECK(p_cuMemFree(pinned) == CUDA_SUCCESS);
    CHECK(live(FAKECUDA_HOST) + live(FAKECUDA_REGISTERED) == host0);
    CHECK(p_cuMemFree(small) == CUDA_SUCCESS);
    /* big stays allocated: the exit summary and stats report it. */
    if (getenv("WO_UVM_PRELOAD_KILL")) {
        /* WOFFLOAD_STATS_EVERY=1: the file appears while this process runs,
         * whole; then SIGKILL, which no exit handler sees */
        const char *path = getenv("WOFFLOAD_STATS");
        bool seen_live = false;
        for (int i = 0; i < 500 && !seen_live && !failures; i++) {
            FILE *f = fopen(path, "r");
            size_t got = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
            if (f)
                fclose(f);
            buf[got] = '\0';
            seen_live = got > 0 && strstr(buf, "\"sealed\":true") != NULL;
            if (!seen_live)
                usleep(10000);
        }
        CHECK(seen_live);
        CHECK(buf[0] == '{' && buf[strlen(buf) - 1] == '\n');
        if (!failures)
            kill(getpid(), SIGKILL);
    }
    return failures ? 1 : 0;
}

int main(int argc, char **argv)
{
    static const char policy[] = "version: 1\n"
                                 "rules:\n"
                                 "  - {name: experts, match: [experts], place: host}\n"
                                 "  - {name: unused, match: [lm_head], place: host}\n";
    char pol[] = "/tmp/test-uvm-preload-policy-XXXXXX";
    char st[] = "/tmp/test-uvm-preload-stats-XXXXXX";
    char buf[65536];
    const char *e;
    size_t n;
    pid_t pid;
    int fd, status;

    (void)argc;
    if (getenv("WO_UVM_PRELOAD_CHILD"))
        return child();
    if (!getenv("LD_PRELOAD")) {
        fprintf(stderr, "run with LD_PRELOAD=libwoffload.so (meson test does)\n");
        return 77;
    }
    fd = mkstemp(pol);
    if (fd < 0 || write(fd, policy, sizeof(policy) - 1) != (ssize_t)(sizeof(policy) - 1))
        return 1;
    close(fd);
    fd = mkstemp(st);
    if (fd < 0)
        return 1;
    close(fd);
    pid = fork();
    if (pid == 0) {
        setenv("WO_UVM_PRELOAD_CHILD", "1", 1);
        setenv("WOFFLOAD_POLICY", pol, 1);
        setenv("WOFFLOAD_STATS", st, 1);
        execv("/proc/self/exe", argv);
        _exit(127);
    }
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);

    n = slurp(st, buf, sizeof(buf));
    CHECK(n > 0 && buf[0] == '{' && buf[n - 1] == '\n');
    e = strstr(buf, "{\"name\":\"model.layers.0.mlp.experts.w13_weight\"");
    CHECK(e && strstr(e, "\"placement\":\"host\""));
    {
        /* freed before exit: not live, its record among the released names */
        static const char gone[] = "{\"name\":\"model.norm.bias\",\"placement\":\"unplaceable\"";
        const char *rel = strstr(buf, "\"released_names\":[");

        e = strstr(buf, "{\"name\":\"model.norm.bias\"");
        CHECK(e && rel && e > rel && strncmp(e, gone, sizeof(gone) - 1) == 0);
    }
    CHECK(strstr(buf, "\"served_pinned\":1") != NULL);
    CHECK(strstr(buf, "\"served_managed\":1") != NULL);
    CHECK(strstr(buf, "\"unplaceable_tags\":1") != NULL);
    CHECK(strstr(buf, "\"interpose\":{") != NULL);
    CHECK(strstr(buf, "\"alloc_placed\":2") != NULL);
    CHECK(strstr(buf, "\"sealed\":true") != NULL);
    if (failures)
        fprintf(stderr, "stats file:\n%s\n", buf);

    /* WOFFLOAD_STATS_EVERY: the file is refreshed while the child runs, so
     * a child killed by SIGKILL (no exit handler) still leaves it, whole */
    CHECK(unlink(st) == 0);
    pid = fork();
    if (pid == 0) {
        setenv("WO_UVM_PRELOAD_CHILD", "1", 1);
        setenv("WO_UVM_PRELOAD_KILL", "1", 1);
        setenv("WOFFLOAD_POLICY", pol, 1);
        setenv("WOFFLOAD_STATS", st, 1);
        setenv("WOFFLOAD_STATS_EVERY", "1", 1);
        execv("/proc/self/exe", argv);
        _exit(127);
    }
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    n = slurp(st, buf, sizeof(buf));
    CHECK(n > 0 && buf[0] == '{' && buf[n - 1] == '\n');
    e = strstr(buf, "{\"name\":\"model.layers.0.mlp.experts.w13_weight\"");
    CHECK(e && strstr(e, "\"placement\":\"host\""));
    CHECK(strstr(buf, "\"stats_every\":1") != NULL);
    if (failures)
        fprintf(stderr, "stats file of the killed child:\n%s\n", buf);
    unlink(pol);
    unlink(st);
    return failures ? 1 : 0;
}
