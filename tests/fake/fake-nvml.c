/* tests/fake/fake-nvml.c: libfakenvml.so, the few NVML calls the shim
 * makes (core/nvml.c), over the fake driver's memory: the calling process
 * is the one compute process of the fake device at PCI 0000:18:00.0 (the
 * fake's CU_DEVICE_ATTRIBUTE_PCI_BUS_ID for device 0), holding
 * fakecuda_process_bytes(). Tests name it with WOFFLOAD_NVML_LIB (a full
 * path: nothing loads it by default). WOFAKE_NVML_FAIL=init|device|
 * processes|absent|na makes that step fail as NVML can: nvmlInit_v2
 * returns an error, no device at the address, the process list an error,
 * the process not listed (another PID namespace), its figure not
 * available. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fakecuda.h"

#define EXPORT __attribute__((visibility("default")))

struct nvml_process {
    unsigned int pid;
    unsigned long long used;
    unsigned int gpu_instance, compute_instance;
};

EXPORT int nvmlInit_v2(void);
EXPORT const char *nvmlErrorString(int r);
EXPORT int nvmlDeviceGetHandleByPciBusId_v2(const char *bus, void **dev);
EXPORT int nvmlDeviceGetComputeRunningProcesses_v3(void *dev, unsigned int *n,
                                                   struct nvml_process *p);

static int fails(const char *step)
{
    const char *f = getenv("WOFAKE_NVML_FAIL");
    return f && strcmp(f, step) == 0;
}

EXPORT int nvmlInit_v2(void)
{
    return fails("init") ? 9 /* NVML_ERROR_DRIVER_NOT_LOADED */ : 0;
}

EXPORT const char *nvmlErrorString(int r)
{
    return r == 9     ? "Driver Not Loaded"
           : r == 6   ? "Not Found"
           : r == 999 ? "Unknown Error"
                      : "fake NVML error";
}

EXPORT int nvmlDeviceGetHandleByPciBusId_v2(const char *bus, void **dev)
{
    if (!bus || !dev)
        return 2; /* NVML_ERROR_INVALID_ARGUMENT */
    if (fails("device") || strcasecmp(bus, "00000000:18:00.0") != 0)
        return 6; /* NVML_ERROR_NOT_FOUND */
    *dev = (void *)0x18;
    return 0;
}

EXPORT int nvmlDeviceGetComputeRunningProcesses_v3(void *dev, unsigned int *n,
                                                   struct nvml_process *p)
{
    unsigned int k = 0;

    if (dev != (void *)0x18 || !n)
        return 2;
    if (fails("processes"))
        return 999;
    /* another process first: the shim must pick its own pid */
    if (*n < 2) {
        *n = 2;
        return 7; /* NVML_ERROR_INSUFFICIENT_SIZE */
    }
    p[k++] = (struct nvml_process){.pid = (unsigned)getpid() + 1, .used = 1ull << 30};
    if (!fails("absent"))
        p[k++] = (struct nvml_process){.pid = (unsigned)getpid(),
                                       .used = fails("na") ? ~0ull : fakecuda_process_bytes()};
    *n = k;
    return 0;
}
