/* preload/exports-driver.c: the exported CUDA driver entry points. Nothing
 * but forwarding: each one hands the real function (the driver library's own
 * definition), its id and the caller to its logic function (real.h lists
 * them all, one line each). */
#include "preload/hook.h"

#define WO_DRIVER_EXPORT(sym, pt, hook, RET, PARAMS, ARGS)                                         \
    WO_EXPORT RET sym PARAMS                                                                       \
    {                                                                                              \
        return hook((wo_pfn_##sym)wo_real_hook(WO_HOOK_##sym), WO_HOOK_##sym,                      \
                    __builtin_return_address(0), WO_UNPACK ARGS);                                  \
    }
WO_DRIVER_HOOKS(WO_DRIVER_EXPORT)
