/* uvm/fit-split.h: fit's budget split, shared by the shim's seal and plan
 * and by woffload-policy gguf (fit-split.c). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/settings.h"
#include "policy/policy.h"

/* fit's budget split (wo_place_fit at seal, and place-expect.c's plan
 * before the bytes): the reserve for the engine's allocations after seal,
 * room for the streaming executor's slots (none for routed experts with
 * WOFFLOAD_PICKS on, unless lend_experts and their memory is lendable) and for the picked copies'
 * buffers, then the weights chosen within the rest (and within limit) and the slots' room lent to
 * managed weights; sets v[].out. g: the policy's globals (prefetch, hot
 * experts); fit->reserve as given (the caller resolves `reserve: auto`:
 * wo_fit_memo_reserve). */
struct wo_fit_split {
    uint64_t budget, reserve, staging, picks;
    uint64_t weights; /* budget less the reserve, the staging room and the picks' */
    uint64_t chosen;  /* of it, placed on the device */
    uint64_t lent;    /* the staging room lent */
};
void wo_place_fit_split(const struct wo_policy_globals *g, const struct wo_fit *fit,
                        struct wo_fit_item *v, const bool *lendable, bool lend_experts, size_t n,
                        uint64_t budget, uint64_t limit, struct wo_fit_split *sp);
/* Whether llama.cpp's expert tensors get picked copies under the settings
 * s and the policy's globals g (NULL: no policy), so that fit keeps room for their buffers:
 * WOFFLOAD_GGML_PICKS, hot experts, or the hook's band
 * (WOFFLOAD_GGML_PICKS_FROM) given, whose default under fit is 0. */
bool wo_place_fit_ggml_picks(const struct wo_settings *s, const struct wo_policy_globals *g);
