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

#include <stdbool.h>
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

/* Whether kernel key reads picked tensors, learnt from its launches: once
 * they have reached two registered tensors at an expert (this launch's,
 * span, counting) it is; before, it is not, and a launch whose words reach
 * an expert past the tensor's base reads in place (uvm/picks.c: one at the
 * base is staged all the same: where every engine hands the tensor, and
 * where a constant lands one time in 384 of those that land in a 768 MiB
 * tensor of 2 MiB-aligned experts, against one in three below).
 * A weight-reading kernel reaches layer after layer (a grouped GEMM, a
 * gather, llama.cpp's MUL_MAT_ID: from its second layer on); a word that
 * only looks like an address is a constant, the same value launch after
 * launch, inside one tensor at most. Such a word can fall on an expert:
 * a float's bits beside four bytes of padding that hold the top of a host
 * address (0x00007fXX3f800000: 1.0f) are 2 MiB-aligned, and an expert of
 * 6 MiB then starts there one time in three. Moved, the float would be the
 * buffer's address. true also when the table of kernels is full (as
 * before it). */
bool wo_picks_kern_reader(uint64_t key, unsigned span);
/* Forgets the kernels learnt (the spans' indices mean other tensors). */
void wo_picks_kern_forget(void);
