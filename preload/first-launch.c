/* preload/first-launch.c: a kernel's first launch behind the copy engine's
 * gate under lazy module loading (preload/first-launch.h), and the other
 * first uses that load it: its attributes, its cache config, an occupancy
 * query, an explicit load, a kernel's function in a context. */
#include "preload/first-launch.h"

#include "core/counters.h"
#include "core/macro.h"
#include "preload/hook.h"
#include "uvm/uvm.h"

#define FIRST_SLOTS 16384u /* power of two */
#define FIRST_PROBES 64u
static uintptr_t first_seen[FIRST_SLOTS];

/* Whether this thread is the first to launch the function behind key (a
 * full table says yes: a launch gated in vain, never one missed). */
static bool first_sight(uintptr_t key)
{
    uint32_t h = (uint32_t)((key * UINT64_C(0x9E3779B97F4A7C15)) >> 40);

    for (uint32_t i = 0; i < FIRST_PROBES; i++) {
        uintptr_t *slot = &first_seen[(h + i) & (FIRST_SLOTS - 1)];
        uintptr_t k = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
        if (k == 0) {
            if (__atomic_compare_exchange_n(slot, &k, key, false, __ATOMIC_ACQ_REL,
                                            __ATOMIC_ACQUIRE))
                return true;
        }
        if (k == key)
            return false;
    }
    return true;
}

bool wo_first_launch_begin(uintptr_t key)
{
    if (WO_LIKELY(!wo_uvm_lazy_gate()) || !first_sight(key))
        return false;
    wo_count(WO_CTR_gated_first_launches, 1);
    wo_uvm_quiesce_begin();
    return true;
}

void wo_first_launch_end(bool gated)
{
    if (gated)
        wo_uvm_quiesce_end();
}

/* The driver's other first uses of a function or a library kernel: under
 * lazy loading each may load its module (cudaFuncSetAttribute before a
 * kernel's first launch, an occupancy query, cudaFuncGetAttributes), and
 * the load waits for the context's work as a first launch's does. The
 * first call for a handle goes behind the gate with the same first-sight
 * table, so a later first launch of that handle passes at once (its module
 * loaded already). Forwarded untouched. */
#define FIRST_USE(hook, sym, KEY, PARAMS, ARGS)                                                    \
    CUresult hook(wo_pfn_##sym real, int id, void *ra, WO_UNPACK PARAMS)                           \
    {                                                                                              \
        CUresult r;                                                                                \
        bool g;                                                                                    \
        (void)ra;                                                                                  \
        wo_count_call(id);                                                                         \
        if (WO_UNLIKELY(!real))                                                                    \
            return CUDA_ERROR_NOT_FOUND;                                                           \
        g = wo_first_launch_begin((uintptr_t)(KEY));                                               \
        r = real ARGS;                                                                             \
        wo_first_launch_end(g);                                                                    \
        return r;                                                                                  \
    }
FIRST_USE(wo_h_func_get_attribute, cuFuncGetAttribute, f,
          (int *pi, CUfunction_attribute a, CUfunction f), (pi, a, f))
FIRST_USE(wo_h_func_set_attribute, cuFuncSetAttribute, f,
          (CUfunction f, CUfunction_attribute a, int v), (f, a, v))
FIRST_USE(wo_h_func_set_cache_config, cuFuncSetCacheConfig, f, (CUfunction f, CUfunc_cache c),
          (f, c))
FIRST_USE(wo_h_func_load, cuFuncLoad, f, (CUfunction f), (f))
FIRST_USE(wo_h_kernel_get_attribute, cuKernelGetAttribute, k,
          (int *pi, CUfunction_attribute a, CUkernel k, CUdevice d), (pi, a, k, d))
FIRST_USE(wo_h_kernel_set_attribute, cuKernelSetAttribute, k,
          (CUfunction_attribute a, int v, CUkernel k, CUdevice d), (a, v, k, d))
FIRST_USE(wo_h_kernel_set_cache_config, cuKernelSetCacheConfig, k,
          (CUkernel k, CUfunc_cache c, CUdevice d), (k, c, d))
FIRST_USE(wo_h_kernel_get_function, cuKernelGetFunction, k, (CUfunction * pf, CUkernel k), (pf, k))
FIRST_USE(wo_h_occupancy_blocks, cuOccupancyMaxActiveBlocksPerMultiprocessor, f,
          (int *n, CUfunction f, int bs, size_t smem), (n, f, bs, smem))
FIRST_USE(wo_h_occupancy_blocks_flags, cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags, f,
          (int *n, CUfunction f, int bs, size_t smem, unsigned int fl), (n, f, bs, smem, fl))
FIRST_USE(wo_h_occupancy_size, cuOccupancyMaxPotentialBlockSize, f,
          (int *mg, int *bs, CUfunction f, CUoccupancyB2DSize fn, size_t smem, int lim),
          (mg, bs, f, fn, smem, lim))
FIRST_USE(wo_h_occupancy_size_flags, cuOccupancyMaxPotentialBlockSizeWithFlags, f,
          (int *mg, int *bs, CUfunction f, CUoccupancyB2DSize fn, size_t smem, int lim,
           unsigned int fl),
          (mg, bs, f, fn, smem, lim, fl))
#undef FIRST_USE
