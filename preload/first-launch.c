/* preload/first-launch.c: a kernel's first launch behind the copy engine's
 * gate under lazy module loading (preload/first-launch.h). */
#include "preload/first-launch.h"

#include "core/counters.h"
#include "core/macro.h"
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
