/* uvm/picks-summary.c: picked staging's lines in the exit summary
 * (uvm/picks.h: wo_picks_summary), from its report and the copy engine's
 * figures (uvm/picks-dma.h). */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/log.h"
#include "core/macro.h"
#include "uvm/picks-dma.h"
#include "uvm/picks.h"

/* The per-tensor figures of the exit summary's spread line: the bytes moved
 * a registration (a layer's step), the share of experts a copy moved, the
 * share of launches that found the tensor resident. */
struct spread {
    struct tfig {
        const char *name;
        uint64_t per_reg;
        double picked, resident;
        double hot; /* of its rows, those from its hot experts; < 0: no hot set */
    } *v;
    unsigned n, cap;
};

static void spread_add(void *ud, const struct wo_picks_figs *f)
{
    struct spread *sp = ud;

    if (!f->k.regs || sp->n == sp->cap)
        return;
    sp->v[sp->n++] =
        (struct tfig){f->name, wo_trace_pick_per_reg(&f->k), wo_trace_pick_picked(&f->k),
                      wo_trace_pick_resident(&f->k),
                      f->hot_slots || f->k.hot_rows ? wo_trace_pick_hot_rate(&f->k) : -1};
}

static int by_per_reg(const void *a, const void *b)
{
    uint64_t x = ((const struct tfig *)a)->per_reg, y = ((const struct tfig *)b)->per_reg;
    return x < y ? -1 : x > y;
}

/* "; kernels: A (n), B (m)" of t, in buf. */
static const char *kerns_said(const struct wo_picks_kerns *t, char *buf, size_t len)
{
    size_t at = 0;

    buf[0] = 0;
    for (unsigned i = 0; i < WO_PICKS_KERNS && t->k[i].key && at < len; i++)
        at += (size_t)snprintf(buf + at, len - at, "%s%s (%" PRIu64 ")", i ? ", " : "; kernels: ",
                               t->k[i].name, t->k[i].launches);
    return buf;
}

/* The exit summary: the totals, then one line over the tensors with
 * picks (a layer's gate/up and down each one): the bytes a step moved,
 * least, median and most, with the names of the extremes, and the ranges
 * of the picked and resident shares; with hot experts, a line of their
 * share of the rows, in all and by tensor. The stats' picks.names has every
 * tensor's figures. One pass over the spans for both. */
void wo_picks_summary(void)
{
    static struct tfig v[WO_PICKS_SPANS]; /* at exit, once */
    struct spread sp = {v, 0, WO_PICKS_SPANS};
    struct wo_picks_totals t;
    struct wo_dma_figs df;
    double pmin = 1, pmax = 0, rmin = 1, rmax = 0;
    char kn[WO_PICKS_KERNS * (WO_PICKS_KERN_NAME + 32)];

    wo_picks_report(&t, spread_add, &sp);
    if (t.c.off_row)
        wo_log_write(WO_LOG_OFF,
                     "picks: %" PRIu64 " launches passed a word inside a registered expert tensor "
                     "but at none of its experts (a constant or stack bytes that look like an "
                     "address): not staged, the word left as it was%s",
                     t.c.off_row, kerns_said(&t.c.off_kerns, kn, sizeof(kn)));
    if (t.c.not_reader)
        wo_log_write(WO_LOG_OFF,
                     "picks: %" PRIu64 " launches of kernels not (yet) seen reading two registered "
                     "expert tensors read in place (a weight-reading kernel is one from its second "
                     "layer on)%s",
                     t.c.not_reader, kerns_said(&t.c.nr_kerns, kn, sizeof(kn)));
    if (t.const_words)
        wo_log_write(WO_LOG_OFF,
                     "picks: %" PRIu64 " words at an expert inside a registered tensor were left as "
                     "they were: their parameter slot never held another value (a constant that "
                     "looks like an address; a weight pointer moves from layer to layer)",
                     t.const_words);
    if (!t.c.staged && !t.c.reused)
        return;
    wo_log_write(
        WO_LOG_OFF,
        "picks: %" PRIu64 " expert tensors, %" PRIu64 " picked copies (%" PRIu64
        " launches reused one; %" PRIu64 " copied early, %" PRIu64
        " of them read) moved %.2f GB, %.0f%% of the %.2f GB whole tensors would "
        "have (rows read back last), %" PRIu64 " MiB of buffers (at most %" PRIu64 " MiB, %" PRIu64
        " lent between streams); read in place: %" PRIu64 " captured, %" PRIu64 " for a failure",
        t.spans, t.c.staged, t.c.reused, t.c.early, t.c.early_used, (double)t.bytes_copied / 1e9,
        t.c.whole_bytes ? 100.0 * (double)t.bytes_copied / (double)t.c.whole_bytes : 0.0,
        (double)t.c.whole_bytes / 1e9, t.buffer_bytes >> 20, t.buffer_cap >> 20, t.buffers_lent,
        t.c.captured, t.c.failed);
    if (t.timed_copies && t.kernel_copies) {
        /* the timed copies' mean over every kernel copy: the device time
         * they took, in the engine's stream order (their share of the run
         * only over a run long enough to say: half a second) */
        double each = t.timed_ms / (double)t.timed_copies / 1e3;
        double all = each * (double)t.kernel_copies;
        char share[160] = "";
        if (t.copy_span_s >= 0.5)
            snprintf(share, sizeof(share),
                     ", %.0f%% of the %.2f s from the first to the last (the rest is the engine's "
                     "own work, which they never overlap)",
                     100.0 * all / t.copy_span_s, t.copy_span_s);
        wo_log_write(WO_LOG_OFF,
                     "picks: %" PRIu64 " of %" PRIu64 " copies by the kernels timed on the device, "
                     "%.3f ms each: the copies took about %.3f s%s, at %.1f GB/s",
                     t.timed_copies, t.kernel_copies, each * 1e3, all, share,
                     all > 0 ? (double)t.kernel_bytes / all / 1e9 : 0.0);
    }
    wo_dma_figs(&df);
    if (df.jobs || df.kernel || df.mirrors || df.mirror_failed || df.mirror_dropped || df.probes)
        wo_log_write(
            WO_LOG_OFF,
            "picks: on the copy engine: %" PRIu64 " copies in %" PRIu64
            " runs moved %.2f GB; %" PRIu64 " copied by the kernels for a failure, %" PRIu64
            " launches left to the kernels without a slot, %" PRIu64
            " while a free drained the queue (%" PRIu64 " frees went on past its "
            "wait); %" PRIu64 " pinned mirrors (%.2f GB of host memory), %" PRIu64
            " not made, %" PRIu64 " dropped for a free; %" PRIu64
            " engine streams probed for a work queue shared with the copy stream, %" PRIu64
            " sharing one (the kernels copied theirs), %" PRIu64 " copy streams replaced",
            df.jobs, df.runs, (double)df.bytes / 1e9, df.kernel, df.no_slot, df.quiesced,
            df.quiesce_timeouts, df.mirrors, (double)df.mirror_bytes / 1e9, df.mirror_failed,
            df.mirror_dropped, df.probes, df.shared_queues, df.copy_streams);
    if (t.hot_bytes || t.hot_rows || t.hot_given_back) {
        double hmin = 1, hmax = 0;
        unsigned with = 0;
        char gb[96] = "";

        for (unsigned i = 0; i < sp.n; i++)
            if (sp.v[i].hot >= 0) {
                hmin = WO_MIN(hmin, sp.v[i].hot);
                hmax = WO_MAX(hmax, sp.v[i].hot);
                with++;
            }
        if (t.hot_given_back)
            snprintf(gb, sizeof(gb),
                     "; %.1f MiB given back when the engine ran out of device memory",
                     (double)t.hot_given_back / (1 << 20));
        wo_log_write(WO_LOG_OFF,
                     "picks: hot experts: %.1f MiB on the device; %.0f%% of the rows copied came "
                     "from them, not over the link (%u tensors, %.0f-%.0f%% each); %" PRIu64
                     " rows copied into them%s",
                     (double)t.hot_bytes / (1 << 20),
                     t.rows ? 100.0 * (double)t.hot_rows / (double)t.rows : 0.0, with,
                     with ? 100 * hmin : 0.0, with ? 100 * hmax : 0.0, t.hot_fills, gb);
    }
    if (sp.n < 2)
        return;
    qsort(sp.v, sp.n, sizeof(*sp.v), by_per_reg);
    for (unsigned i = 0; i < sp.n; i++) {
        pmin = WO_MIN(pmin, sp.v[i].picked);
        pmax = WO_MAX(pmax, sp.v[i].picked);
        rmin = WO_MIN(rmin, sp.v[i].resident);
        rmax = WO_MAX(rmax, sp.v[i].resident);
    }
    wo_log_write(WO_LOG_OFF,
                 "picks: by tensor, moved a step: least %.1f MB (%s), median %.1f MB, most "
                 "%.1f MB (%s); experts picked a copy %.0f-%.0f%%; launches on resident "
                 "tensors %.0f-%.0f%%",
                 (double)sp.v[0].per_reg / 1e6, sp.v[0].name ? sp.v[0].name : "(unnamed)",
                 (double)sp.v[sp.n / 2].per_reg / 1e6, (double)sp.v[sp.n - 1].per_reg / 1e6,
                 sp.v[sp.n - 1].name ? sp.v[sp.n - 1].name : "(unnamed)", 100 * pmin, 100 * pmax,
                 100 * rmin, 100 * rmax);
}
