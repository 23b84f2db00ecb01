/* core/kernel-name.c: see kernel-name.h. */
#include "core/kernel-name.h"

#include <dlfcn.h>
#include <stdio.h>

const char *wo_kernel_name(uint64_t key, const char *driver_name, char *buf, size_t len)
{
    if (driver_name && !(key & WO_LAUNCH_KEY_RUNTIME))
        return driver_name;
    if (key & WO_LAUNCH_KEY_RUNTIME) {
        Dl_info info;
        void *stub = (void *)(uintptr_t)(key & ~WO_LAUNCH_KEY_RUNTIME);

        if (dladdr(stub, &info) && info.dli_fname) {
            if (info.dli_sname && info.dli_saddr == stub)
                return info.dli_sname;
            snprintf(buf, len, "%s+0x%lx", info.dli_fname,
                     (unsigned long)((uintptr_t)stub - (uintptr_t)info.dli_fbase));
            return buf;
        }
    }
    snprintf(buf, len, "?%s 0x%llx", key & WO_LAUNCH_KEY_RUNTIME ? "stub" : "function",
             (unsigned long long)(key & ~WO_LAUNCH_KEY_RUNTIME));
    return buf;
}
