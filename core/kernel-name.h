/* core/kernel-name.h: a printable name for a launch key (struct wo_event's
 * l.func). A key is a driver CUfunction, or a runtime host stub tagged with
 * WO_LAUNCH_KEY_RUNTIME (cudaLaunchKernel's first argument): the same code
 * can reach the driver either way, and the tag keeps the two apart. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#define WO_LAUNCH_KEY_RUNTIME (UINT64_C(1) << 63)

/* driver_name: what cuFuncGetName said for a driver key (NULL when it could
 * not say, or for a runtime key). Returns driver_name, else the stub's
 * exported symbol, else its file+offset (nm or addr2line resolve it), else
 * "?stub 0x..." or "?function 0x...", written to buf. */
const char *wo_kernel_name(uint64_t key, const char *driver_name, char *buf, size_t len);
