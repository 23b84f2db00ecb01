/* uvm/picks-kern.c: the kernels a picked tensor's launches were
 * (uvm/picks-kern.h). */
#include "uvm/picks-kern.h"

#include <cuda.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

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

#define READERS 1024u /* kernels learnt, open addressing */

struct reader {
    uint64_t key;   /* 0: empty */
    uint32_t first; /* the span its launches reached first, + 1 */
    bool many;      /* and another since: a reader */
};
static struct reader readers[READERS];

bool wo_picks_kern_reader(uint64_t key, unsigned span)
{
    unsigned h = (unsigned)((key * UINT64_C(0x9e3779b97f4a7c15)) >> 54) % READERS;

    for (unsigned k = 0; k < READERS; k++) {
        struct reader *r = &readers[(h + k) % READERS];
        if (r->key == key) {
            if (!r->many && r->first != span + 1)
                r->many = true;
            return r->many;
        }
        if (!r->key) {
            r->key = key;
            r->first = span + 1;
            return false;
        }
    }
    return true;
}

void wo_picks_kern_forget(void)
{
    memset(readers, 0, sizeof(readers));
}
