/* uvm/picks-kern.h: which kernels a picked tensor's launches were, by
 * launch key (core/kernel-name.h), for the stats and the exit summary.
 *
 * An expert tensor with picks is read by one or two kernels a layer (a
 * gather or a grouped GEMM, the eager loop's GEMM); a launch of any other
 * kernel that the scan finds inside it is a word that looks like an
 * address (core/event.h, uvm/picks.c: at_row). Naming the kernels makes
 * such a word visible in one run: on the H200 one gate_up tensor was
 * reached by about five launches a step more than its layer's own
 * (bench/results/picks-stray-20261202-ad6185f-h200). Every function here
 * runs under picks' lock. */
#pragma once

#include <stdint.h>

struct wo_driver;

#define WO_PICKS_KERNS 4
#define WO_PICKS_KERN_NAME 112

struct wo_picks_kern {
    uint64_t key;      /* 0: empty */
    uint64_t launches; /* staged or reused for it (or, off_row's, not staged) */
    char name[WO_PICKS_KERN_NAME]; /* resolved once, at its first launch */
};

struct wo_picks_kerns {
    struct wo_picks_kern k[WO_PICKS_KERNS];
    uint64_t other; /* launches of kernels past the first WO_PICKS_KERNS */
};

/* Counts a launch of key in t; a new key's name is asked of d (a driver
 * function's cuFuncGetName; a runtime stub's symbol) once. */
void wo_picks_kern_note(struct wo_picks_kerns *t, uint64_t key, const struct wo_driver *d);
