/* tests/gen-trace.h: a synthetic MoE-like decode trace written through the
 * real trace writer (core/trace.h). For unit tests of the trace tools and of
 * replay only: it is shaped like a transformers MoE decode (per-layer
 * attention, a router, top-k experts read as slices of stacked expert
 * tensors) but no GPU produced it and its timings mean nothing. Real traces
 * from the lent GPU live under tests/traces/. */
#pragma once

#include "core/trace.h"

struct wo_gen_opts {
    unsigned layers;     /* decoder layers */
    unsigned experts;    /* experts per layer */
    unsigned topk;       /* experts each token uses per layer */
    unsigned steps;      /* decode steps */
    uint64_t expert_mib; /* bytes of one expert's slice of each stacked tensor, MiB */
    double skew;         /* 0: uniform routing; larger: a few experts take most tokens */
    unsigned tokens;     /* tokens a step routes (continuous batching: several requests in one
                          * step); each picked expert is launched once a step (the grouped path
                          * reads each expert once, whatever the tokens); 0 or 1: batch 1 */
    uint64_t seed;
    bool grouped;     /* one launch a layer per expert tensor, handed its base pointer (a
                       * grouped experts kernel: which experts it reads is not visible) */
    unsigned step_us; /* extra host work a step, spread over the layers' attention launches
                       * (a step of many tokens computes longer; 0: none) */
    unsigned repeat;  /* each picked expert's launches issued this many times a step (a kernel
                       * per token reading the same slice: read multiplicity; 0 or 1: once) */
    bool one_buffer;  /* every weight a tensor inside one allocation (llama.cpp's model buffer),
                       * placed tag by tag at seal: the same launches and bytes as without */
};

#define WO_GEN_DEFAULTS                                                                            \
    {                                                                                              \
        .layers = 4, .experts = 8, .topk = 2, .steps = 16, .expert_mib = 4, .skew = 1.0,           \
        .tokens = 1, .seed = 1                                                                     \
    }

/* Launches per decode step with these options (what a step period detector
 * must find; with tokens > 1 the count varies with routing: this is the
 * count at one token). */
unsigned wo_gen_launches_per_step(const struct wo_gen_opts *o);

/* Writes the whole trace (load, seal, decode steps) into t; does not close
 * it. Returns 0 or the writer's -errno. */
int wo_gen_moe_trace(struct wo_trace *t, const struct wo_gen_opts *o);
/* Writes one event of every type (and a kernel, tag and rule record). */
int wo_gen_every_type(struct wo_trace *t);
