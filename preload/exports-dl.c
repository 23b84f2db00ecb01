/* preload/exports-dl.c: the exported dlsym and dlvsym. cuBLAS, cuBLASLt and
 * NCCL reach the driver only through them (their static CUDA runtimes
 * dlopen libcuda.so.1). Nothing but forwarding, with the caller's address:
 * RTLD_NEXT must be resolved relative to the caller (resolve.c). */
#include <dlfcn.h>

#include "preload/hook.h"

WO_EXPORT void *dlsym(void *restrict handle, const char *restrict name)
{
    return wo_h_dlsym(handle, name, __builtin_return_address(0));
}

WO_EXPORT void *dlvsym(void *restrict handle, const char *restrict name,
                       const char *restrict version)
{
    return wo_h_dlvsym(handle, name, version, __builtin_return_address(0));
}
