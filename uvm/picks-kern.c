/* uvm/picks-kern.c: the kernels a picked tensor's launches were
 * (uvm/picks-kern.h). */
#include "uvm/picks-kern.h"

#include <cuda.h>
#include <stdio.h>

#include "core/kernel-name.h"
#include "uvm/uvm.h"

void wo_picks_kern_note(struct wo_picks_kerns *t, uint64_t key, const struct wo_driver *d)
{
    for (unsigned i = 0; i < WO_PICKS_KERNS; i++) {
        struct wo_picks_kern *k = &t->k[i];
        const char *drv = NULL;
        char buf[WO_PICKS_KERN_NAME];

        if (k->key == key) {
            k->launches++;
            return;
        }
        if (k->key)
            continue;
        if (!(key & WO_LAUNCH_KEY_RUNTIME) && d && d->cuFuncGetName &&
            d->cuFuncGetName(&drv, (CUfunction)(uintptr_t)key) != CUDA_SUCCESS)
            drv = NULL;
        snprintf(k->name, sizeof(k->name), "%s", wo_kernel_name(key, drv, buf, sizeof(buf)));
        k->key = key;
        k->launches = 1;
        return;
    }
    t->other++;
}
