/* tests/gpu/gpu-test.h: what the gpu suite's C programs that drive the
 * real (or fake) driver through uvm/'s table share (test-stream-check.c,
 * test-picks-gpu.c): CK(), which stops the program on a driver error;
 * EXPECT(), which counts a failure and goes on; and gpu_open(), which loads
 * libcuda.so.1 into `drv` and makes the device's primary context current,
 * or says why the test is skipped. Every definition is static: one program
 * each. */
#pragma once

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include "uvm/uvm.h"

static struct wo_driver drv;
static void *lib;
static int failures;

#define CK(call)                                                                                   \
    do {                                                                                           \
        CUresult r_ = (call);                                                                      \
        if (r_ != CUDA_SUCCESS) {                                                                  \
            fprintf(stderr, "%s:%d: %s: %d\n", __FILE__, __LINE__, #call, (int)r_);                \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#define EXPECT(cond, ...)                                                                          \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            failures++;                                                                            \
            printf("FAIL: " __VA_ARGS__);                                                          \
            printf("\n");                                                                          \
        }                                                                                          \
    } while (0)

static void *gpu_lookup(void *ud, const char *name)
{
    (void)ud;
    return dlsym(lib, name);
}

/* 0 with drv filled and device 0's primary context current; 77 (skip: no
 * driver, no usable GPU) or 1 (a function missing), said on stdout/stderr. */
__attribute__((unused)) static int gpu_open(const char *who)
{
    CUdevice dev;
    CUcontext ctx;

    lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        printf("SKIP: no CUDA driver (%s)\n", dlerror());
        return 77;
    }
    if (wo_driver_fill(&drv, gpu_lookup, NULL) != 0 || !drv.cuModuleLoadData ||
        !drv.cuLaunchKernel) {
        fprintf(stderr, "%s: libcuda.so.1 lacks a function it needs\n", who);
        return 1;
    }
    if (drv.cuInit(0) != CUDA_SUCCESS) {
        printf("SKIP: cuInit failed: no usable GPU\n");
        return 77;
    }
    CK(drv.cuDeviceGet(&dev, 0));
    CK(drv.cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(drv.cuCtxSetCurrent(ctx));
    return 0;
}
