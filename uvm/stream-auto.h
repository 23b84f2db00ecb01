/* uvm/stream-auto.h: how `prefetch.mode: auto` decides, by measured step
 * time, whether streaming the host ranges a step reads beats reading them
 * in place (docs/prefetch.md, "auto"). Pure: no CUDA, no clock, no ranges;
 * the executor (uvm/stream.c) feeds it step boundaries and does what it
 * answers.
 *
 * Why time and not the launch count: transformers' default experts backend
 * hands one kernel the whole stacked expert tensor and gathers each token's
 * experts inside, so a step's launches read such a range once by count
 * while the GPU pulls it over PCIe once per token (issue 18: b32 in place
 * 0.22x of the distinct-bytes bound, streamed 0.82x). What the launches
 * cannot show, the step's period does.
 *
 * Periods are those of boundaries that close one step: one that closes
 * several spans whatever came between (a stepper that found its period
 * again after an idle server, a prefill), and is not measured. A phase's
 * period is the median of its PROBE_STEPS steps, so one slow step (a
 * prefill joining the batch) does not decide; in hold, a step counts at
 * most twice (at least half) the period the decision was taken at.
 *
 * The rule:
 *  - watch: PROBE_STEPS steps read in place give the in-place period. When
 *    one staging copy a step of the candidates (their bytes at the link's
 *    rate, over the efficiency tries measured) takes less than TRY_RATIO
 *    of that period, streaming could win: try it. Otherwise it cannot (the
 *    copies alone would take longer than the step does now): hold in
 *    place. The efficiency is the copy time over the streamed period the
 *    last try measured (at most 1; 1 before any): a server whose streamed
 *    steps came out 1.6x the copies' time (compute and launches that the
 *    copies do not hide) is not tried again until its in-place step grows
 *    past that. Each watch that does not try gives it back a tenth, so a
 *    stale figure fades (over ~5 holds).
 *  - try: after SETTLE_STEPS (the slots fill), PROBE_STEPS streamed steps
 *    give the streamed period. Streaming stays when it is below KEEP_RATIO
 *    of the in-place one; else the ranges go back in place.
 *  - hold: in place, the hold keeps a window of its last PROBE_STEPS
 *    periods; once most of it says a copy of the candidates takes less
 *    than EARLY_RATIO of the step, streaming is tried at once: a batch
 *    that grew (Mixtral's b1 to b8: 74 to 550 ms a step in place, one
 *    copy 241 ms) switches within PROBE_STEPS steps, not after MIN_HOLD.
 *    Only a clear gain acts that early: right after the batch moved, the
 *    steps read in place are slower than they will be (the planner's hot
 *    set is learning the new batch's experts; Qwen3 managed at half the
 *    experts' bytes, b8: tried at 0.84 of such a step and kept streamed at
 *    255 ms, where in place settles at 220). A marginal one waits for the
 *    drift rule and a watch.
 *    Otherwise the decision stays until the period drifts by DRIFT from the one
 *    it was taken at (the batch changed), or, in place, for HOLD_STEPS
 *    (the batch may have grown below the drift), then watch again (a
 *    decision to stream is left first, so the in-place period is measured
 *    anew). A drift counts only after MIN_HOLD steps: a server's batch
 *    moves every step, and a decision taken every 20 steps would spend
 *    half the time measuring. Streamed steps that grew longer do not
 *    leave streaming (a bigger batch only reads more in place): the
 *    decision is taken again at the new period (regrown).
 *  - recheck: a decision to stream that took managed ranges (the planner
 *    could keep them on the device, where reading in place costs no link)
 *    is taken again in place after RECHECK_FIRST streamed steps, and then
 *    after twice as many each time it is confirmed (up to RECHECK_MAX):
 *    the ranges go back in place, RECHECK_SETTLE steps let the planner
 *    prefetch them again and settle, PROBE_STEPS give the in-place period,
 *    and it is set against the streamed period the ranges left at.
 *    Streaming stays only when that is below KEEP_RATIO of it (tried again
 *    at once, the interval doubled); else they stay in place. A recheck
 *    costs its steps in place: where those are far slower (RECHECK_SLOW
 *    settling steps over RECHECK_LOSS times the streamed one: more than
 *    any settling makes up; the unsettled b8 steps below were 1.2-1.3x the
 *    settled ones), streaming is tried again at once. A try is taken a few
 *    steps after the batch moved, while the planner's hot set is still
 *    learning the batch's experts: on the Qwen3 shape, managed at half the
 *    experts' bytes, such a try at b8 was a coin toss (251-285 ms in place
 *    against 257-280 streamed), and once kept nothing took it again: b32
 *    ran streamed at 88-98 tok/s against 111-131 in place, its streamed
 *    steps 1.26x b8's, under the drift, and held by `regrown`
 *    (docs/history/prefetch.md, "bimodal"). A settled in-place step there
 *    is 212-215 ms at b8 and 250-255 at b32. Such a decision is never held
 *    as regrown: it is rechecked at once. Host ranges are not rechecked:
 *    in place they cross the link every step (at the default experts
 *    backend once per token), and a recheck would cost PROBE_STEPS such
 *    steps for nothing.
 *  - backoff: a try that went back costs its SETTLE_STEPS + PROBE_STEPS
 *    streamed steps, and a server's batch moves between the in-place
 *    window a try is decided on and the streamed one it is judged by. On
 *    llama-server at --parallel 32 (bench/results/llamacpp-serve-20261207f-
 *    p32-split-full-h100) auto tried 22 times in 654 steps and went back
 *    21: a third of the steps were spent measuring. So each try that goes
 *    back after one that went back (FAILS_FREE of them in a row are
 *    free) keeps the next try, early or by a watch, BACKOFF_FIRST steps
 *    away, twice as far each time, up to BACKOFF_MAX; a try that is kept
 *    ends the run of failures. A backoff that held a try back counts in
 *    `deferred` (once). */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#define WO_AUTO_PROBE_STEPS 8
#define WO_AUTO_SETTLE_STEPS 2
#define WO_AUTO_HOLD_STEPS 512
#define WO_AUTO_MIN_HOLD 64
#define WO_AUTO_TRY_RATIO 0.95
#define WO_AUTO_EARLY_RATIO 0.75
#define WO_AUTO_KEEP_RATIO 0.97
#define WO_AUTO_DRIFT 0.30
#define WO_AUTO_RECHECK_FIRST 64
#define WO_AUTO_RECHECK_MAX 1024
#define WO_AUTO_RECHECK_SETTLE 16
#define WO_AUTO_RECHECK_LOSS 1.5
#define WO_AUTO_RECHECK_SLOW 3
#define WO_AUTO_FAILS_FREE 1
#define WO_AUTO_BACKOFF_FIRST 64
#define WO_AUTO_BACKOFF_MAX 2048

/* The rule's two comparisons, in any one unit of time (the replay weighs
 * its predicted steps by them too, tools/replay-report.c): streaming is
 * worth a try when one staging copy of the candidates takes less than
 * TRY_RATIO of the step read in place, and stays when the streamed step
 * is below KEEP_RATIO of it. */
bool wo_auto_try_pays(double copy, double inplace);
bool wo_auto_keep_pays(double streamed, double inplace);

enum wo_auto_phase { WO_AUTO_WATCH, WO_AUTO_TRY, WO_AUTO_HOLD };

/* What the executor must do after a step boundary. */
enum wo_auto_action {
    WO_AUTO_NONE,
    WO_AUTO_STREAM,   /* stream the candidates (from now on) */
    WO_AUTO_UNSTREAM, /* read them in place again */
};

struct wo_auto {
    enum wo_auto_phase phase;
    bool streaming;                  /* the candidates are streamed now */
    unsigned skip;                   /* boundaries to let pass before measuring */
    unsigned n;                      /* steps measured in this phase (in hold: seen) */
    double win[WO_AUTO_PROBE_STEPS]; /* their periods */
    double inplace_ns;               /* the last measured periods, a step */
    double stream_ns;
    double decided_ns; /* the period the decision in force was taken at */
    double ewma_ns;    /* the period since, smoothed */
    uint64_t last_t;   /* the previous boundary's time, 0 none */
    uint64_t held;     /* steps held */
    uint64_t tries, kept, backs;
    uint64_t regrown;   /* streamed steps grew longer: held at the new period */
    double eff;         /* copy time / streamed period, from the last try (1: none yet) */
    double try_copy_ns; /* the copy time the try in progress was decided on */
    /* recheck: the streamed set holds managed ranges (told by the executor,
     * wo_auto_streamed_managed); streamed steps held before the next
     * recheck; the watch in progress is one; the streamed period it left */
    bool managed;
    bool rechecking;
    uint64_t recheck_first; /* RECHECK_FIRST unless set (wo_auto_set_recheck); 0: never */
    uint64_t recheck_at;
    double left_ns;
    unsigned slow; /* settling steps of the recheck over RECHECK_LOSS x left_ns */
    uint64_t rechecks, recheck_backs; /* rechecks made; of them, those that stayed in place */
    /* backoff: one-step boundaries measured, tries that went back in a
     * row, the step before which none is taken, whether the backoff in
     * force held a try back yet, backoffs that held one */
    uint64_t steps;
    unsigned fails;
    uint64_t no_try_before;
    bool held_back;
    uint64_t deferred;
};

void wo_auto_init(struct wo_auto *a);
/* Streamed steps before the first recheck (WOFFLOAD_STREAM_RECHECK), 0:
 * never; the later ones double up to RECHECK_MAX (or first, if larger). */
void wo_auto_set_recheck(struct wo_auto *a, uint64_t first);

/* A step boundary at t_ns (CLOCK_MONOTONIC) closing k steps. cand_bytes:
 * the bytes one staging copy a step of the candidate ranges would move
 * (0: nothing to decide); link_gbs: the link's copy rate. */
enum wo_auto_action wo_auto_step(struct wo_auto *a, uint64_t t_ns, unsigned k, uint64_t cand_bytes,
                                 double link_gbs);

/* After WO_AUTO_STREAM: whether the ranges streamed include managed ones
 * (the recheck rule above applies then). */
void wo_auto_streamed_managed(struct wo_auto *a, bool managed);
