/* tests/test-unload-preload.c: a function handle the driver gives to a new
 * function after its module was unloaded is not scanned with the dead
 * function's parameter layout (preload/launch.c, forget()).
 *
 * The shim caches each function's parameter sizes by handle. The real driver
 * may hand a freed CUfunction to a function of a module loaded later; the
 * fake driver does it on request (fakecuda_kernel_redefine). Here a 3-word
 * kernel is launched (its layout cached), its module unloaded, the handle
 * redefined as a 1-word kernel of a new module, and launched with a
 * kernelParams array of exactly one pointer that ends where a PROT_NONE
 * page begins: a scan with the stale layout (3 parameters) reads past it
 * and dies; with the unload hooked it reads the new layout and the kernel
 * runs. The same through a library (cuLibraryUnload: its kernels' module is
 * unknown to the cache, so every such entry goes stale).
 *
 * Needs LD_PRELOAD=the shim, LD_LIBRARY_PATH=the fake driver's directory
 * and WOFFLOAD_OBSERVE=1 (launches are scanned with no policy; meson sets
 * all three). */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cuda.h>

#include "fakecuda.h"

#include "preload-check.h"

static uint64_t got3, got1;

/* params: three device pointers */
static void body3(void **params, const uint32_t g[3], const uint32_t b[3])
{
    (void)g;
    (void)b;
    got3 += *(CUdeviceptr *)params[0] + *(CUdeviceptr *)params[2];
}

/* params: one device pointer */
static void body1(void **params, const uint32_t g[3], const uint32_t b[3])
{
    (void)g;
    (void)b;
    got1 += *(CUdeviceptr *)params[0];
}

static double counter(const char *js, const char *key)
{
    const char *p = strstr(js, key);
    return p ? strtod(p + strlen(key), NULL) : -1;
}

int main(void)
{
    void *cu = dlopen("libcuda.so.1", RTLD_NOW);
    CUresult (*p_cuInit)(unsigned), (*p_cuDeviceGet)(CUdevice *, int);
    CUresult (*p_cuCtxRetain)(CUcontext *, CUdevice), (*p_cuCtxSetCurrent)(CUcontext);
    CUresult (*p_cuMemAlloc)(CUdeviceptr *, size_t);
    CUresult (*p_cuModuleLoadData)(CUmodule *, const void *), (*p_cuModuleUnload)(CUmodule);
    CUresult (*p_cuModuleGetFunction)(CUfunction *, CUmodule, const char *);
    CUresult (*p_cuLibraryLoadData)(CUlibrary *, const void *, CUjit_option *, void **, unsigned,
                                    CUlibraryOption *, void **, unsigned);
    CUresult (*p_cuLibraryUnload)(CUlibrary);
    CUresult (*p_cuLibraryGetKernel)(CUkernel *, CUlibrary, const char *);
    CUresult (*p_cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                                 unsigned, unsigned, CUstream, void **, void **);
    CUfunction (*kernel)(const char *, int, const size_t *, fakecuda_kernel_fn);
    int (*redefine)(CUfunction, int, const size_t *, fakecuda_kernel_fn);
    long (*stats)(char *, size_t);
    static const size_t sz3[3] = {8, 8, 8}, sz1[1] = {8};
    static char js[1 << 16];
    long page = sysconf(_SC_PAGESIZE);
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr buf;
    CUmodule m1, m2;
    CUlibrary l1, l2;
    CUkernel kk;
    CUfunction k, f;
    unsigned char *guard;
    void **last; /* one kernelParams slot, right before an unreadable page */

    if (!getenv("LD_PRELOAD")) {
        fprintf(stderr, "run with LD_PRELOAD=libwoffload.so (meson test does)\n");
        return 77;
    }
    if (!cu)
        return 1;
    *(void **)&p_cuInit = need(cu, "cuInit");
    *(void **)&p_cuDeviceGet = need(cu, "cuDeviceGet");
    *(void **)&p_cuCtxRetain = need(cu, "cuDevicePrimaryCtxRetain");
    *(void **)&p_cuCtxSetCurrent = need(cu, "cuCtxSetCurrent");
    *(void **)&p_cuMemAlloc = need(cu, "cuMemAlloc_v2");
    *(void **)&p_cuModuleLoadData = need(cu, "cuModuleLoadData");
    *(void **)&p_cuModuleUnload = need(cu, "cuModuleUnload");
    *(void **)&p_cuModuleGetFunction = need(cu, "cuModuleGetFunction");
    *(void **)&p_cuLibraryLoadData = need(cu, "cuLibraryLoadData");
    *(void **)&p_cuLibraryUnload = need(cu, "cuLibraryUnload");
    *(void **)&p_cuLibraryGetKernel = need(cu, "cuLibraryGetKernel");
    *(void **)&p_cuLaunchKernel = need(cu, "cuLaunchKernel");
    *(void **)&kernel = need(cu, "fakecuda_kernel");
    *(void **)&redefine = need(cu, "fakecuda_kernel_redefine");
    *(void **)&stats = need(RTLD_DEFAULT, "woffload_stats");

    guard =
        mmap(NULL, (size_t)page * 2, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(guard != MAP_FAILED);
    if (guard == MAP_FAILED)
        return 1;
    CHECK(mprotect(guard + page, (size_t)page, PROT_NONE) == 0);
    last = (void **)(void *)(guard + page - sizeof(void *));

    CHECK(p_cuInit(0) == CUDA_SUCCESS);
    CHECK(p_cuDeviceGet(&dev, 0) == CUDA_SUCCESS);
    CHECK(p_cuCtxRetain(&ctx, dev) == CUDA_SUCCESS);
    CHECK(p_cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
    /* a tracked range for the scan to find */
    CHECK(p_cuMemAlloc(&buf, 1 << 20) == CUDA_SUCCESS);

    /* ---- a module: 3 words, unloaded, the handle reborn with 1 ---- */
    k = kernel("unload_k", 3, sz3, body3);
    CHECK(k != NULL);
    CHECK(p_cuModuleLoadData(&m1, "image 1") == CUDA_SUCCESS);
    CHECK(p_cuModuleGetFunction(&f, m1, "unload_k") == CUDA_SUCCESS && f == k);
    {
        void *p3[] = {&buf, &buf, &buf};
        CHECK(p_cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, p3, NULL) == CUDA_SUCCESS);
    }
    CHECK(got3 == 2 * buf);
    CHECK(p_cuModuleUnload(m1) == CUDA_SUCCESS);
    CHECK(redefine(k, 1, sz1, body1) == 0);
    CHECK(p_cuModuleLoadData(&m2, "image 2") == CUDA_SUCCESS);
    CHECK(p_cuModuleGetFunction(&f, m2, "unload_k") == CUDA_SUCCESS && f == k);
    *last = &buf;
    CHECK(p_cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, last, NULL) == CUDA_SUCCESS);
    CHECK(got1 == buf);

    /* ---- a library: its kernel's module is unknown to the cache ---- */
    k = kernel("unload_l", 3, sz3, body3);
    CHECK(k != NULL);
    CHECK(p_cuLibraryLoadData(&l1, "library 1", NULL, NULL, 0, NULL, NULL, 0) == CUDA_SUCCESS);
    CHECK(p_cuLibraryGetKernel(&kk, l1, "unload_l") == CUDA_SUCCESS);
    {
        void *p3[] = {&buf, &buf, &buf};
        CHECK(p_cuLaunchKernel((CUfunction)(void *)kk, 1, 1, 1, 1, 1, 1, 0, NULL, p3, NULL) ==
              CUDA_SUCCESS);
    }
    CHECK(got3 == 4 * buf);
    CHECK(p_cuLibraryUnload(l1) == CUDA_SUCCESS);
    CHECK(redefine(k, 1, sz1, body1) == 0);
    CHECK(p_cuLibraryLoadData(&l2, "library 2", NULL, NULL, 0, NULL, NULL, 0) == CUDA_SUCCESS);
    CHECK(p_cuLibraryGetKernel(&kk, l2, "unload_l") == CUDA_SUCCESS);
    CHECK(p_cuLaunchKernel((CUfunction)(void *)kk, 1, 1, 1, 1, 1, 1, 0, NULL, last, NULL) ==
          CUDA_SUCCESS);
    CHECK(got1 == 2 * buf);

    /* the cache filled the entry again after each unload, and said so */
    CHECK(stats(js, sizeof(js)) > 0);
    printf("layouts cached %.0f, forgotten %.0f, launches scanned %.0f\n",
           counter(js, "\"layouts_cached\":"), counter(js, "\"layouts_forgotten\":"),
           counter(js, "\"launch_scanned\":"));
    CHECK(counter(js, "\"launch_scanned\":") >= 4);
    CHECK(counter(js, "\"layouts_forgotten\":") >= 2);
    CHECK(counter(js, "\"layouts_cached\":") >= 4);
    CHECK(p_cuLibraryUnload(l2) == CUDA_SUCCESS);
    CHECK(p_cuModuleUnload(m2) == CUDA_SUCCESS);
    check_summary("test-unload-preload");
    return failures ? 1 : 0;
}
