/* core/nvml.h: the device memory one process holds, from NVML
 * (libnvidia-ml, loaded with dlopen as the driver is: never linked). The
 * free memory the driver reports cannot tell this process's CUDA contexts
 * from another process's allocations; NVML's per-process figure can: it is
 * what nvidia-smi shows for the process (its contexts, modules and device
 * allocations; managed memory is not in it). No CUDA here: the device is
 * named by its PCI address. */
#pragma once

#include <stddef.h>
#include <stdint.h>

/* The device memory process `pid` holds on the device at PCI address
 * domain:bus:device (cuDeviceGetAttribute's CU_DEVICE_ATTRIBUTE_PCI_*_ID),
 * in *bytes. Returns 0, or -1 with why (for a log line: which library,
 * which call, what it returned) when NVML cannot say: not loadable
 * (WOFFLOAD_NVML_LIB), no such device, the process not listed, or the
 * figure not available (some containers). Thread-safe; the library is
 * loaded and initialised once and kept. */
/* The dlsym to resolve NVML's functions with: set once by preload/ (its
 * libc dlsym: the shim's own exported dlsym is the engine's), before the
 * first call. Unset, NVML is not used. */
void wo_nvml_set_dlsym(void *(*sym)(void *handle, const char *name));

/* Where WOFFLOAD_NVML_LIB names a library (not the default), loads it now
 * and warns, naming it, when it cannot be used: a user who named one finds
 * out at start, not at fit's choice. After wo_nvml_set_dlsym. */
void wo_nvml_check_setting(void);

/* Whether NVML is loaded and initialised (loading it first): 0, or -1
 * with why. The library's name in *lib either way. */
int wo_nvml_status(const char **lib, char *why, size_t whylen);

int wo_nvml_process_bytes(unsigned domain, unsigned bus, unsigned device, int pid, uint64_t *bytes,
                          char *why, size_t whylen);
