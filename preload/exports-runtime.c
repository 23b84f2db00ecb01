/* preload/exports-runtime.c: the exported CUDA runtime entry points (for
 * engines that use the shared libcudart). Nothing but forwarding: each one
 * hands the real runtime function, its id and the caller to its logic. */
#include "preload/hook.h"

#define WO_RUNTIME_EXPORT(sym, pt, hook, RET, PARAMS, ARGS)                                        \
    WO_EXPORT RET sym PARAMS                                                                       \
    {                                                                                              \
        return hook((wo_pfn_##sym)wo_real_runtime(WO_RT_##sym), WO_RT_##sym,                       \
                    __builtin_return_address(0), WO_UNPACK ARGS);                                  \
    }
WO_RUNTIME_HOOKS(WO_RUNTIME_EXPORT)
