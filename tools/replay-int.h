/* tools/replay-int.h: what the replay's files share (tools/replay.h is
 * the interface). One pass of the replay is a struct sim: the trace read
 * into ranges, tags, names and steps (replay-read.c), the placements and
 * budget it assumes (replay-place.c), its simulation against the device
 * model (replay-sim.c) and the timeline it writes (replay-timeline.c), the
 * pacing pass above it (replay-pacing.c), the offline-optimal bound over
 * what it recorded (replay-bound.c), and the figures it reports
 * (replay-report.c). No file calls one that calls it back: read uses
 * place; the simulation uses both and the timeline; pacing and the bound
 * use the simulation's state; the report uses them all. */
#pragma once

#include <errno.h>
#include <stdlib.h>

#include "tools/replay.h"
#include "uvm/graph.h"

struct rtag {
    uint64_t offset, size;
    int name;
    uint32_t place; /* enum wo_placement: the tag's own (a mixed range's hits read by it) */
    uint64_t slice; /* a mixed range's: gcd of the hit offsets inside the tag, from its start */
    int32_t su;     /* a mixed range's: the tag's stream unit (sim.su), -1: none */
    /* this step's reads of the tag's bytes (replay-sim.c, multiplicity):
     * bytes launches read and the granules (64 over the tag) among them */
    double rd;
    uint64_t mask;
    /* picked staging (the trace's PICKS record for the tensor at this tag's
     * start): the bytes one launch's picked copy moves over the link, on
     * average (the copies' rows not from its hot experts over the launches
     * that copied or reused); < 0: none; those it copies from its hot
     * experts on the device; and of pick_copy, those the copy engine moves
     * before the launch (the copy kernel reads the rest in place) */
    double pick_copy, pick_hot, pick_engine;
};

struct rr {
    const struct wo_trace_range *tr;
    uint32_t place;    /* enum wo_placement, after seal: its largest tag's */
    /* its tags have more than one placement (llama.cpp's one model buffer):
     * each hit reads as its tag is placed (replay-sim.c, hit_place) */
    bool mixed;
    int prio;
    bool no_slices;
    bool written;
    uint64_t slice;    /* gcd of the non-zero hit offsets over the whole trace */
    uint64_t usize;    /* unit size of the bound */
    uint32_t ubase;    /* first unit of this range in the bound */
    double *ready;     /* managed: per PIECE (replay-sim.c), time the GPU copy is complete (INFINITY: none) */
    uint32_t npieces;
    struct rtag *tags;
    size_t ntags;
    /* the streaming executor (replay-sim.c, stream_read): a host range
     * under prefetch mode stream is copied once a step into a device slot */
    int32_t su;        /* its stream unit (sim.su), -1: none (a mixed range: its tags') */
};

/* What the streaming executor copies into a slot once a step: a host
 * range, or a host tag of a mixed range (the shim's sub-span). */
struct sunit {
    uint64_t size;
    uint64_t st_step;  /* the step its latest copy serves (UINT64_MAX: none) */
    uint64_t st_copy;  /* that copy's index (its slot: index % slots) */
    uint64_t st_seen;  /* the last step that read it (UINT64_MAX: none) */
    double st_ready;   /* when that copy is complete */
};

/* One access of a unit in the bound: its GPU time if resident / streamed
 * and its link time if streamed. */
struct bacc {
    uint32_t unit, k;
    double gR, gS, lS;
};

struct busy {
    double a, b;
};

/* A piece of link traffic, for the host's slowdown under it. */
struct traffic {
    double a, b;
    int dma; /* a copy engine's transfer (a prefetch), else the GPU's in-place reads */
};

struct sim {
    const struct wo_trace_data *d;
    const struct wo_replay_opts *o;
    const struct wo_devmodel *dm;
    struct rr *r;
    struct wo_replay_name *names;
    size_t nnames, capnames;
    struct wo_plan *plan;
    struct wo_graphs *graphs;

    double hbm_s, zc_s, kernel_s, launch_s, sync_s;
    double host_scale;          /* opts' host_scale (1 when unset) */
    double cpu_t, cpu_work, gpu_free, uvm_free;
    double cpu_base; /* cpu_work without the link's slowdown (what bounds any schedule) */
    struct busy *lk; /* link bookings, sorted, disjoint, merged */
    size_t nlk, caplk;
    struct traffic *tp; /* the same bookings as pieces of one kind each, sorted */
    size_t ntp, captp;
    uint64_t prev_trace_t;
    int have_prev, after_sync, sealed;
    bool has_syncs;             /* the trace records syncs (else copies to the host stand for them) */
    double sync_wait;           /* how long the host waited at the last sync */
    size_t after_sync_ev;       /* index of that sync's event */
    const double *post_sync;    /* host work after each event that waits (pacing pass), or NULL */
    double *post_sync_out;      /* written by the pacing pass */
    size_t ev_index;            /* the event being replayed */

    /* steps */
    struct wo_stepper stepper;
    uint64_t nsteps_total; /* boundaries, from the pre-pass */
    uint64_t steps_total;  /* steps they close */
    uint64_t step;         /* boundaries seen in this pass */
    uint64_t wstart, wend; /* boundaries that open and close the window */
    int in_window;
    double *bt;            /* times of the window's step boundaries */
    double *rt;            /* the same boundaries' times in the recorded run */
    uint32_t *bl;          /* launches in the step each boundary closes */
    double (*bacc)[4];     /* zero-copy, prefetch + copy-back + copy bytes, stall s, host work at each boundary */
    size_t nbt, capbt, capr, capbl, capbacc;
    double w_t0, w_cpu0, w_end_t, w_end_cpu, w_lag, w_base0, w_end_base;
    uint64_t w_k;          /* launches in the window so far */
    uint32_t step_launches, cur_step_launches;

    /* window accumulators */
    double zc_b, pf_b, ev_b, cb_b, copy_b, stall_s;
    double hit_b, miss_b; /* managed bytes read from the GPU copy / in place */
    uint64_t pf_calls;

    /* bound */
    struct bacc *acc;
    size_t nacc, capacc;
    double fixed_cp, fixed_link;
    uint32_t nunits;

    /* the streaming executor's model (replay-sim.c): copies in a step's
     * order on the copy engine, each into one of `slots` slots, a slot
     * free once the reads of the range it held have ended */
    unsigned slots;           /* 0: nothing streamed */
    double copy_s;            /* seconds a byte on the copy engine */
    double ce_free;           /* when the copy engine is idle */
    double *slot_free;        /* by slot: the end of the last read of its range */
    uint64_t ncopies;         /* copies issued */
    struct sunit *su;         /* the stream units */
    size_t nsu, capsu;
    uint32_t *sorder, *corder; /* stream units (indices into su) in the order the last complete
                               * step / this step read them first */
    size_t nsorder, ncorder, capsorder, capcorder;
    size_t la_pos;            /* the next copy ahead: sorder[la_pos] for step la_step */
    uint64_t la_step;
    double stream_b;          /* window: bytes staged */
    double pick_b;            /* window: bytes picked staging copied over the link */
    double pick_engine_b;     /* window: of pick_b, the copy engine's (the rest in zc_b) */
    uint64_t launches;
    uint64_t max_resident;
    unsigned warmup;
    const uint8_t *oracle; /* units resident throughout (the clairvoyant schedule) */
    unsigned tl_n;
    int err;
};


/* ---- replay-read.c: the trace as the replay sees it ---------------------- */

/* The range of a registry id and generation, or NULL. */
struct rr *wo_replay_rr_of(struct sim *s, uint32_t id, uint32_t gen);
/* The name index of the tag at offset off of r (its first tag when none
 * covers it), -1 for a range without tags. */
int wo_replay_name_at(const struct rr *r, uint64_t off);
/* The tag holding off (the first tag when none does), NULL without tags. */
struct rtag *wo_replay_tag_at(const struct rr *r, uint64_t off);
/* The tag that holds byte off of r, or NULL. */
struct rtag *wo_replay_tag_in(const struct rr *r, uint64_t off);
/* Ranges, their tags and names, each range placed (replay-place.c).
 * 0 or -ENOMEM. */
int wo_replay_setup_ranges(struct sim *s);
/* Under the recorded placements: the placement changes the trace recorded. */
void wo_replay_place_recorded(struct sim *s);
bool wo_replay_has_seal(const struct wo_trace_data *d);
/* Steps this launch ends (see wo_stepper_feed): > 0 at a boundary. */
unsigned wo_replay_is_boundary(struct sim *s, const struct wo_event *ev);
/* Pre-pass: slices (gcd of hit offsets) and the number of steps. */
int wo_replay_prepass(struct sim *s);

/* ---- replay-place.c: the placements and budget of the replayed run ------- */

/* The placement of a tag: all on the device, the recorded one, or the
 * policy's where the shim could have placed it; *prio and *no_slices from
 * the rule that matched. */
uint32_t wo_replay_place_of_tag(struct sim *s, const struct wo_trace_tag *t,
                                const struct wo_trace_range *tr, int *prio, bool *no_slices);
/* The device budget for managed ranges (opts, the policy, or the recorded
 * one), given the managed and device-placed bytes. */
uint64_t wo_replay_budget(const struct sim *s, uint64_t managed, uint64_t devbytes);

/* ---- replay-link.c: the PCIe link ---------------------------------------- */

/* Books d seconds of the link from t on, in the gaps earlier bookings left
 * (each piece kept as traffic of its kind, dma: a copy engine's transfer,
 * else kernels' in-place reads, for wo_replay_link_slowdown); returns when
 * they end. */
double wo_replay_link_use(struct sim *s, double t, double d, int dma);
/* How long gap seconds of the host's own work from the host clock on take
 * under the link's traffic. */
double wo_replay_link_slowdown(const struct sim *s, double gap);

/* ---- replay-timeline.c: the predicted timeline --------------------------- */

/* One slice (t1 >= t0) or instant (t1 < t0) on timeline row tid. */
void wo_replay_tl_event(struct sim *s, int tid, const char *name, double t0, double t1);
/* The timeline's opening and closing JSON, around a pass that writes one. */
void wo_replay_tl_open(const struct sim *s);
void wo_replay_tl_close(const struct sim *s);

/* ---- replay-pacing.c: the pacing pass (above the simulation) ------------- */

/* The host's own work after each wait, from the pacing pass when the replay
 * places differently from the recording (free it); NULL when it does not,
 * or when the pass failed (each replay then subtracts its own wait). */
double *wo_replay_pacing(const struct wo_trace_data *d, const struct wo_replay_opts *o);

/* ---- replay-sim.c: the simulation --------------------------------------- */

/* One pass of the simulation; oracle: NULL for the planner (or none with
 * no_prefetch), else the units resident throughout (the clairvoyant static
 * schedule); post_sync: the pacing pass's host work (or NULL), post_sync_out:
 * where the pacing pass writes it. Fills s (the caller frees it with
 * wo_replay_sim_free) and the budget and managed bytes. 0, -ENODATA or
 * -EINVAL (msg says why), -ENOMEM. */
int wo_replay_sim_once(const struct wo_trace_data *d, const struct wo_replay_opts *o,
                       const uint8_t *oracle, const double *post_sync, double *post_sync_out,
                       struct sim *s, uint64_t *ret_budget, uint64_t *ret_managed, char *msg,
                       size_t msglen);
void wo_replay_sim_free(struct sim *s);

/* ---- replay-bound.c: the offline-optimal bound --------------------------- */

/* A lower bound on the window's time under any schedule within budget
 * (sorts s->acc). 0 for an empty window or without memory. */
double wo_replay_bound(struct sim *s, uint64_t budget);
/* The clairvoyant static schedule: one byte per unit, 1 where resident
 * throughout (free it); NULL without memory. */
uint8_t *wo_replay_oracle_set(const struct sim *s, uint64_t budget);

/* replay-report.c, on top: wo_replay_run and the result (replay.h), and
 * the host speed of another machine (wo_replay_host_scale_for). */
