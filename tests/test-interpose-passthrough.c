/* tests/test-interpose-passthrough.c: the shim does nothing harmful where it
 * has nothing to do.
 *  (no argument)   a process that never touches CUDA: the shim loads, the
 *                  driver library is never loaded, dlsym of ordinary names
 *                  is unaffected, nothing is counted;
 *  disabled        WOFFLOAD_DISABLE=1: the driver is reached as without the
 *                  shim (the real functions come back from dlsym and
 *                  cuGetProcAddress), and calls through the shim's own
 *                  exports still work but are not observed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <cudaTypedefs.h>
#include <link.h>
#include <unistd.h>

#include "interpose-common.h"

static int found_libcuda(struct dl_phdr_info *info, size_t size, void *ud)
{
    (void)size;
    (void)ud;
    return info->dlpi_name && strstr(info->dlpi_name, "libcuda") != NULL;
}

static void never_touching_cuda_loads_nothing(void **state)
{
    void *p;
    (void)state;

    assert_ptr_equal(dlsym(RTLD_DEFAULT, "getpid"), (void *)getpid);
    p = malloc(1 << 20);
    assert_non_null(p);
    free(p);
    assert_int_equal(dl_iterate_phdr(found_libcuda, NULL), 0);
    assert_int_equal(wo_counter("alloc_calls"), 0);
    assert_int_equal(wo_counter("launch_calls"), 0);
    assert_int_equal(wo_counter("dlsym_substituted"), 0);
    /* Reading the stats did not load the driver either. */
    assert_int_equal(dl_iterate_phdr(found_libcuda, NULL), 0);
}

static void disabled_passes_everything_through(void **state)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    PFN_cuGetProcAddress_v12000 gpa, inner = NULL;
    PFN_cuMemAlloc_v3020 alloc_export;
    void *p = NULL;
    (void)state;

    assert_non_null(lib);
    gpa = (PFN_cuGetProcAddress_v12000)dlsym(lib, "cuGetProcAddress_v2");
    assert_true(wo_addr_in((void *)gpa, "libcuda"));
    /* Through the shim's export (as a program linked with -lcuda calls it). */
    gpa = (PFN_cuGetProcAddress_v12000)dlsym(RTLD_DEFAULT, "cuGetProcAddress_v2");
    assert_true(wo_addr_in((void *)gpa, "libwoffload"));
    /* The resolver hands out what the driver gives, never a wrapper slot.
     * (The fake driver names its own functions through its GOT, so those
     * are the shim's exports here, which pass straight through.) */
    assert_int_equal(gpa("cuGetProcAddress", (void **)&inner, 13000, 0, NULL), CUDA_SUCCESS);
    assert_ptr_equal((void *)inner, dlsym(RTLD_DEFAULT, "cuGetProcAddress_v2"));
    assert_int_equal(inner("cuMemAlloc", &p, 13000, 0, NULL), CUDA_SUCCESS);
    assert_ptr_equal(p, dlsym(RTLD_DEFAULT, "cuMemAlloc_v2"));
    {
        PFN_cuInit_v2000 init = NULL;
        PFN_cuDeviceGet_v2000 device_get = NULL;
        PFN_cuDevicePrimaryCtxRetain_v7000 retain = NULL;
        PFN_cuCtxSetCurrent_v4000 set = NULL;
        CUdevice dev;
        CUcontext ctx;
        CUdeviceptr ptr = 0;
        inner("cuInit", (void **)&init, 13000, 0, NULL);
        inner("cuDeviceGet", (void **)&device_get, 13000, 0, NULL);
        inner("cuDevicePrimaryCtxRetain", (void **)&retain, 13000, 0, NULL);
        inner("cuCtxSetCurrent", (void **)&set, 13000, 0, NULL);
        assert_int_equal(init(0), CUDA_SUCCESS);
        assert_int_equal(device_get(&dev, 0), CUDA_SUCCESS);
        assert_int_equal(retain(&ctx, dev), CUDA_SUCCESS);
        assert_int_equal(set(ctx), CUDA_SUCCESS);
        alloc_export = (PFN_cuMemAlloc_v3020)dlsym(RTLD_DEFAULT, "cuMemAlloc_v2");
        assert_true(wo_addr_in((void *)alloc_export, "libwoffload"));
        assert_int_equal(alloc_export(&ptr, 4096), CUDA_SUCCESS);
        assert_true(ptr != 0);
    }
    assert_int_equal(wo_counter("alloc_calls"), 0);
    assert_int_equal(wo_counter("proc_substituted"), 0);
    assert_int_equal(wo_counter("dlsym_substituted"), 0);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest plain[] = {
        cmocka_unit_test(never_touching_cuda_loads_nothing),
    };
    const struct CMUnitTest disabled[] = {
        cmocka_unit_test(disabled_passes_everything_through),
    };
    if (!dlsym(RTLD_DEFAULT, "woffload_stats")) {
        fprintf(stderr, "libwoffload.so is not preloaded\n");
        return 1;
    }
    if (argc > 1 && strcmp(argv[1], "disabled") == 0)
        return cmocka_run_group_tests(disabled, NULL, NULL);
    return cmocka_run_group_tests(plain, NULL, NULL);
}
