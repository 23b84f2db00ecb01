/* tests/test-interpose-client.c: runs a client program of the fake driver
 * under the shim (tests/fake/client-static: boots like a static cudart;
 * client-runtime(-ptsz): the same work through the runtime API of the fake
 * libcudart.so.13, which calls the driver through our resolved wrappers),
 * with WOFFLOAD_STATS pointing at a temporary file, and checks that the
 * shim's counters equal what the client says it did: every allocation, copy
 * and launch observed, every launch attributed to its buffers (one through a
 * by-value struct), the capture recorded, every graph launch tied to it.
 *
 * usage: test-interpose-client CLIENT [ARGS...]   (env: LD_PRELOAD, the
 * fake driver on LD_LIBRARY_PATH; both are passed on to the client) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <sys/wait.h>
#include <unistd.h>

#include "interpose-common.h"

static char **client_argv;
static int per_thread;
static int runtime; /* the client uses the runtime API (client-runtime*) */
static char out[1 << 16];
static char *stats;

/* "count NAME N" from the client's output, -1 when missing. */
static long long client_count(const char *name)
{
    char pat[96];
    const char *p;

    snprintf(pat, sizeof(pat), "count %s ", name);
    p = strstr(out, pat);
    return p ? strtoll(p + strlen(pat), NULL, 10) : -1;
}

static long long shim(const char *name)
{
    return wo_json_num(stats, "interpose", name);
}

static long long shim_calls(const char *sym)
{
    const char *p = stats ? strstr(stats, "\"interpose\":{") : NULL;
    long long v = p ? wo_json_num(p, "calls", sym) : -1;
    return v < 0 ? 0 : v;
}

static int run_client(void **state)
{
    char path[] = "/tmp/woffload-client-stats-XXXXXX";
    int fd = mkstemp(path), pipefd[2], status = 0;
    size_t n = 0;
    ssize_t r;
    pid_t pid;
    FILE *f;
    long len;
    (void)state;

    if (fd < 0 || pipe(pipefd) < 0)
        return -1;
    close(fd);
    pid = fork();
    if (pid == 0) {
        setenv("WOFFLOAD_STATS", path, 1);
        dup2(pipefd[1], 1);
        close(pipefd[0]);
        close(pipefd[1]);
        execv(client_argv[0], client_argv);
        _exit(127);
    }
    close(pipefd[1]);
    while (n + 1 < sizeof(out) && (r = read(pipefd[0], out + n, sizeof(out) - 1 - n)) > 0)
        n += (size_t)r;
    out[n] = '\0';
    close(pipefd[0]);
    waitpid(pid, &status, 0);
    fputs(out, stderr);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "client failed (status %d)\n", status);
        return -1;
    }
    f = fopen(path, "r");
    unlink(path);
    if (!f)
        return -1;
    fseek(f, 0, SEEK_END);
    len = ftell(f);
    rewind(f);
    stats = calloc(1, (size_t)len + 1);
    if (!stats || fread(stats, 1, (size_t)len, f) != (size_t)len) {
        fclose(f);
        return -1;
    }
    fclose(f);
    return strstr(stats, "\"interpose\":{") ? 0 : -1;
}

static void allocations_and_frees_observed(void **state)
{
    /* The runtime client counts its two pinned host allocations
     * (cudaMallocHost, cudaHostAlloc) too: host memory, not tracked. */
    long long host = runtime ? 2 : 0;
    (void)state;
    assert_true(client_count("allocs") > 0);
    assert_int_equal(shim("alloc_calls"), client_count("allocs") - host);
    assert_int_equal(shim("free_calls"), client_count("frees") - host);
    if (client_count("vmm_maps") >= 0) {
        assert_int_equal(shim("vmm_map"), client_count("vmm_maps"));
        assert_int_equal(shim("vmm_unmap"), client_count("vmm_maps"));
    }
}

static void copies_observed(void **state)
{
    (void)state;
    if (runtime) {
        assert_int_equal(shim("copy_calls"), client_count("copies"));
        return;
    }
    assert_int_equal(shim("copy_h2d"), client_count("h2d"));
    assert_int_equal(shim("copy_d2h"), client_count("d2h"));
    assert_int_equal(shim("copy_calls"), client_count("h2d") + client_count("d2h"));
}

static void launches_observed_and_attributed(void **state)
{
    long long launches = client_count("launches");
    long long ex = runtime ? 0 : client_count("launches_ex");
    (void)state;
    /* One launch is counted once, though the runtime forwards it to the
     * driver through our wrapper. */
    assert_int_equal(shim("launch_calls"), launches + ex);
    assert_int_equal(shim("launch_runtime"), runtime ? launches : 0);
    assert_int_equal(shim("launch_driver"), runtime ? 0 : launches);
    assert_int_equal(shim("launch_ex"), ex);
    /* Every launch reads tracked buffers, one through a by-value struct. */
    assert_int_equal(shim("launch_with_hits"), launches + ex);
    assert_int_equal(shim("launch_no_layout"), 0);
    if (runtime) {
        /* Calls include ones the runtime failed (the client makes one). */
        assert_true(shim_calls(per_thread ? "cudaLaunchKernel_ptsz" : "cudaLaunchKernel") >=
                    launches);
        assert_int_equal(shim_calls(per_thread ? "cudaLaunchKernel" : "cudaLaunchKernel_ptsz"), 0);
    } else if (per_thread) {
        assert_int_equal(shim_calls("cuLaunchKernel_ptsz"), launches);
        assert_int_equal(shim_calls("cuLaunchKernelEx_ptsz"), ex);
        assert_int_equal(shim_calls("cuLaunchKernel"), 0);
    } else {
        assert_int_equal(shim_calls("cuLaunchKernel"), launches);
        assert_int_equal(shim_calls("cuLaunchKernelEx"), ex);
        assert_int_equal(shim_calls("cuLaunchKernel_ptsz"), 0);
    }
}

static void capture_and_graph_launches_attributed(void **state)
{
    long long captured = client_count("captured_launches");
    long long replays = client_count("graph_launches");
    (void)state;
    assert_int_equal(shim("capture_begin"), 1);
    assert_int_equal(shim("capture_end"), 1);
    assert_int_equal(shim("launch_captured"), captured);
    assert_int_equal(shim("graph_instantiate"), 1);
    assert_int_equal(shim("graph_launch"), replays);
    assert_int_equal(shim("graph_launch_attributed"), replays);
    assert_int_equal(shim("graph_launch_kernels"), replays * captured);
    /* The captured kernel reads two buffers (in and out of its struct). */
    assert_int_equal(shim("graph_launch_hits"), replays * captured * 2);
}

static void resolvers_substituted(void **state)
{
    (void)state;
    /* cuGetProcAddress_v2 (and the static client's cuLaunchKernelEx) came
     * through dlsym. */
    assert_true(shim("dlsym_substituted") >= (runtime ? 1 : 2));
    /* Every hooked name the client resolved, at both flag values. */
    assert_true(shim("proc_substituted") >= 40);
    assert_int_equal(shim("proc_conflict"), 0);
    if (runtime)
        assert_true(shim("entry_point_calls") >= 9);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(allocations_and_frees_observed),
        cmocka_unit_test(copies_observed),
        cmocka_unit_test(launches_observed_and_attributed),
        cmocka_unit_test(capture_and_graph_launches_attributed),
        cmocka_unit_test(resolvers_substituted),
    };
    if (argc < 2) {
        fprintf(stderr, "usage: %s CLIENT [ARGS...]\n", argv[0]);
        return 2;
    }
    client_argv = argv + 1;
    for (int i = 2; i < argc; i++)
        per_thread |= strcmp(argv[i], "--per-thread") == 0;
    runtime = strstr(argv[1], "client-runtime") != NULL;
    per_thread |= strstr(argv[1], "-ptsz") != NULL;
    return cmocka_run_group_tests(tests, run_client, NULL);
}
