/* core/nvml.c: see nvml.h. NVML's few types are declared here (the CUDA
 * toolkit on the build machine has no nvml.h); their layout is NVML's ABI
 * since API version 11 (nvmlProcessInfo_v2_t, which the _v2 and _v3 calls
 * take). */
#include "core/nvml.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "core/log.h"
#include "core/settings.h"

typedef struct nvml_device *nvml_device_t;
struct nvml_process {
    unsigned int pid;
    unsigned long long used;
    unsigned int gpu_instance, compute_instance;
};
#define NVML_SUCCESS 0
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_VALUE_NOT_AVAILABLE (~0ULL)
#define NVML_MAX_PROCESSES 256
#define NVML_LIB_DEFAULT "libnvidia-ml.so.1" /* WOFFLOAD_NVML_LIB's default */

static struct {
    pthread_once_t once;
    const char *lib;
    char why[192];
    int (*init)(void);
    int (*by_bus)(const char *bus, nvml_device_t *d);
    int (*processes)(nvml_device_t d, unsigned int *n, struct nvml_process *p);
    const char *(*error)(int r);
} nv = {.once = PTHREAD_ONCE_INIT};

static void *(*lookup)(void *handle, const char *name);

void wo_nvml_set_dlsym(void *(*sym)(void *handle, const char *name))
{
    __atomic_store_n(&lookup, sym, __ATOMIC_RELEASE);
}

static const char *nvml_error(int r)
{
    const char *s = nv.error ? nv.error(r) : NULL;
    return s ? s : "an NVML error";
}

static void load(void)
{
    void *h;
    int r;

    void *(*sym)(void *, const char *) = __atomic_load_n(&lookup, __ATOMIC_ACQUIRE);

    nv.lib = wo_settings()->nvml_lib;
    if (!nv.lib)
        nv.lib = NVML_LIB_DEFAULT;
    if (!sym) {
        snprintf(nv.why, sizeof(nv.why), "%s not loaded: no dlsym handed in", nv.lib);
        return;
    }
    h = dlopen(nv.lib, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(nv.why, sizeof(nv.why), "%s not loaded: %s", nv.lib, e ? e : "?");
        return;
    }
    nv.init = (int (*)(void))sym(h, "nvmlInit_v2");
    nv.by_bus = (int (*)(const char *, nvml_device_t *))sym(h, "nvmlDeviceGetHandleByPciBusId_v2");
    nv.processes = (int (*)(nvml_device_t, unsigned int *, struct nvml_process *))sym(
        h, "nvmlDeviceGetComputeRunningProcesses_v3");
    if (!nv.processes)
        nv.processes = (int (*)(nvml_device_t, unsigned int *, struct nvml_process *))sym(
            h, "nvmlDeviceGetComputeRunningProcesses_v2");
    nv.error = (const char *(*)(int))sym(h, "nvmlErrorString");
    if (!nv.init || !nv.by_bus || !nv.processes) {
        snprintf(nv.why, sizeof(nv.why), "%s has no %s", nv.lib,
                 !nv.init     ? "nvmlInit_v2"
                 : !nv.by_bus ? "nvmlDeviceGetHandleByPciBusId_v2"
                              : "nvmlDeviceGetComputeRunningProcesses_v3 or _v2");
        nv.processes = NULL;
        return;
    }
    /* kept loaded and initialised: nvmlShutdown at exit could run after
     * the driver's own teardown, and the process ends it anyway */
    if ((r = nv.init()) != NVML_SUCCESS) {
        snprintf(nv.why, sizeof(nv.why), "%s: nvmlInit_v2 returned %d (%s)", nv.lib, r,
                 nvml_error(r));
        nv.processes = NULL;
    }
}

void wo_nvml_check_setting(void)
{
    const char *lib = wo_settings()->nvml_lib;

    if (!lib || strcmp(lib, NVML_LIB_DEFAULT) == 0)
        return;
    pthread_once(&nv.once, load);
    if (!nv.processes)
        wo_warn("WOFFLOAD_NVML_LIB: %s; fit cannot take the process's CUDA contexts out of its "
                "size (docs/policy.md, fit)",
                nv.why);
}

int wo_nvml_status(const char **lib, char *why, size_t whylen)
{
    pthread_once(&nv.once, load);
    *lib = nv.lib;
    if (nv.processes)
        return 0;
    snprintf(why, whylen, "%s", nv.why);
    return -1;
}

int wo_nvml_process_bytes(unsigned domain, unsigned bus, unsigned device, int pid, uint64_t *bytes,
                          char *why, size_t whylen)
{
    struct nvml_process p[NVML_MAX_PROCESSES];
    unsigned int n = NVML_MAX_PROCESSES;
    nvml_device_t d;
    char addr[32];
    uint64_t sum = 0;
    bool found = false;
    int r;

    pthread_once(&nv.once, load);
    if (!nv.processes) {
        snprintf(why, whylen, "%s", nv.why);
        return -1;
    }
    snprintf(addr, sizeof(addr), "%08x:%02x:%02x.0", domain, bus, device);
    if ((r = nv.by_bus(addr, &d)) != NVML_SUCCESS) {
        snprintf(why, whylen, "%s: no device at PCI %s (%s)", nv.lib, addr, nvml_error(r));
        return -1;
    }
    if ((r = nv.processes(d, &n, p)) != NVML_SUCCESS) {
        snprintf(why, whylen, "%s: the compute processes of %s: %s%s", nv.lib, addr, nvml_error(r),
                 r == NVML_ERROR_INSUFFICIENT_SIZE ? " (more than 256 processes)" : "");
        return -1;
    }
    /* a process with contexts in several instances (MIG) is listed once
     * for each */
    for (unsigned int i = 0; i < n && i < NVML_MAX_PROCESSES; i++) {
        if ((int)p[i].pid != pid)
            continue;
        if (p[i].used == NVML_VALUE_NOT_AVAILABLE) {
            snprintf(why, whylen, "%s: process %d's memory on %s is not available", nv.lib, pid,
                     addr);
            return -1;
        }
        sum += p[i].used;
        found = true;
    }
    if (!found) {
        snprintf(why, whylen, "%s: process %d is not among the %u on %s (another PID namespace?)",
                 nv.lib, pid, n, addr);
        return -1;
    }
    *bytes = sum;
    return 0;
}
