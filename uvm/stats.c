/* uvm/stats.c: the JSON snapshot (woffload_stats, WOFFLOAD_STATS at exit)
 * and the one-line placement summaries at seal and at exit.
 *
 * The JSON is built under wo_uvm.lock into a growing heap buffer, then
 * copied out with snprintf semantics; its shape is in docs/placement.md. */
#include "uvm/internal.h"
#include "uvm/place-int.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/counters.h"
#include "core/log.h"
#include "core/settings.h"
#include "uvm/picks-hot.h"
#include "uvm/picks-dma.h"
#include "uvm/picks.h"
#include "uvm/prefetch.h"
#include "uvm/stream-pin.h"
#include "uvm/stream.h"
#include "wo-config.h"

struct sbuf {
    char *p;
    size_t n, cap;
    bool oom;
    bool first; /* no member written yet in the object being filled */
};

static void sb_grow(struct sbuf *b, size_t need)
{
    size_t ncap;
    char *np;

    if (b->oom || b->n + need + 1 <= b->cap)
        return;
    ncap = b->cap ? b->cap : 4096;
    while (ncap < b->n + need + 1)
        ncap *= 2;
    np = realloc(b->p, ncap);
    if (!np) {
        b->oom = true;
        return;
    }
    b->p = np;
    b->cap = ncap;
}

static void WO_PRINTF(2, 3) sb_printf(struct sbuf *b, const char *fmt, ...)
{
    va_list ap;
    int n;

    va_start(ap, fmt);
    n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    sb_grow(b, (size_t)n);
    if (b->oom)
        return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->n, b->cap - b->n, fmt, ap);
    va_end(ap);
    b->n += (size_t)n;
}

/* Length of the valid UTF-8 sequence at c (lead byte >= 0x80), 0 if invalid. */
static size_t utf8_len(const unsigned char *c)
{
    size_t n;
    uint32_t cp;

    if (c[0] >= 0xc2 && c[0] <= 0xdf) {
        n = 2;
        cp = c[0] & 0x1fu;
    } else if (c[0] >= 0xe0 && c[0] <= 0xef) {
        n = 3;
        cp = c[0] & 0x0fu;
    } else if (c[0] >= 0xf0 && c[0] <= 0xf4) {
        n = 4;
        cp = c[0] & 0x07u;
    } else {
        return 0;
    }
    for (size_t i = 1; i < n; i++) {
        if ((c[i] & 0xc0) != 0x80)
            return 0;
        cp = cp << 6 | (c[i] & 0x3fu);
    }
    /* overlong forms, surrogates, beyond U+10FFFF */
    if ((n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) || (cp >= 0xd800 && cp <= 0xdfff) ||
        cp > 0x10ffff)
        return 0;
    return n;
}

/* A JSON string (quotes included), or null for NULL. */
static void sb_str(struct sbuf *b, const char *s)
{
    if (!s) {
        sb_printf(b, "null");
        return;
    }
    sb_grow(b, strlen(s) * 6 + 2);
    if (b->oom)
        return;
    b->p[b->n++] = '"';
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c >= 0x80) {
            /* Names are bytes: valid UTF-8 passes, anything else becomes
             * U+FFFD so the document stays valid JSON. */
            size_t n = utf8_len(c);
            if (n) {
                memcpy(b->p + b->n, c, n);
                b->n += n;
                c += n - 1;
            } else {
                memcpy(b->p + b->n, "\\ufffd", 6);
                b->n += 6;
            }
        } else if (*c == '"' || *c == '\\') {
            b->p[b->n++] = '\\';
            b->p[b->n++] = (char)*c;
        } else if (*c < 0x20 || *c == 0x7f) {
            b->n += (size_t)snprintf(b->p + b->n, 7, "\\u%04x", *c);
        } else {
            b->p[b->n++] = (char)*c;
        }
    }
    b->p[b->n++] = '"';
    b->p[b->n] = '\0';
}

/* {"name":..,"placement":..,"policy":..,"rule":.. of a live or released
 * name: what it got, what the policy asked (null before it was matched)
 * and by which rule (the default past the last). The caller closes it. */
static void name_head_json(struct sbuf *b, bool first, const char *s, bool unplaceable,
                           enum wo_placement place, long rule, enum wo_placement want,
                           const struct wo_policy *p)
{
    char label[256];

    sb_printf(b, "%s{\"name\":", first ? "" : ",");
    sb_str(b, s);
    sb_printf(b, ",\"placement\":");
    sb_str(b, unplaceable ? "unplaceable" : wo_placement_to_string(place));
    sb_printf(b, ",\"policy\":");
    sb_str(b, rule == -2 ? NULL : wo_placement_to_string(want));
    sb_printf(b, ",\"rule\":");
    sb_str(b, p && rule != -2
                  ? wo_policy_rule_label(p, rule < 0 ? wo_policy_nrules(p) : (size_t)rule, label,
                                         sizeof(label))
                  : NULL);
}

/* "kernels":[{"name":..,"launches":n},...] (uvm/picks-kern.h): the first
 * kernels seen, then "other_launches": those of any kernel past them. */
static void picks_kerns_json(struct sbuf *b, const char *key, const struct wo_picks_kerns *t)
{
    sb_printf(b, ",\"%s\":[", key);
    for (unsigned i = 0; t && i < WO_PICKS_KERNS && t->k[i].key; i++) {
        sb_printf(b, "%s{\"name\":", i ? "," : "");
        sb_str(b, t->k[i].name);
        sb_printf(b, ",\"launches\":%" PRIu64 "}", t->k[i].launches);
    }
    sb_printf(b, "],\"%s_other\":%" PRIu64, key, t ? t->other : 0);
}

/* One member of "picks":{"names":{...}}: a tensor's picked staging. */
static void picks_name_json(void *ud, const struct wo_picks_figs *f)
{
    struct sbuf *b = ud;

    sb_printf(b, "%s", b->first ? "" : ",");
    b->first = false;
    sb_str(b, f->name ? f->name : "(unnamed)");
    /* copied_per_registration: a layer registers once a forward step, so
     * the bytes moved a step; linked_per_registration: of them, those that
     * crossed the link (not from its hot experts); resident_fraction: of
     * its launches, those that read it wholly resident; hot_*: its hot
     * experts on the device (WOFFLOAD_PICKS_HOT); engine_*: of the rows
     * over the link, those the copy engine moved (WOFFLOAD_PICKS_ENGINE) */
    sb_printf(
        b,
        ":{\"experts\":%u,\"bytes\":%" PRIu64 ",\"registrations\":%" PRIu64 ",\"staged\":%" PRIu64
        ",\"reused\":%" PRIu64 ",\"rows\":%" PRIu64 ",\"bytes_copied\":%" PRIu64
        ",\"picked_fraction\":%.4f,\"resident\":%" PRIu64 ",\"copied_per_registration\":%" PRIu64
        ",\"linked_per_registration\":%" PRIu64
        ",\"resident_fraction\":%.4f,\"hot_slots\":%u,\"hot_experts\":%u,\"hot_rows\":%" PRIu64
        ",\"hot_rate\":%.4f,\"hot_fills\":%" PRIu64 ",\"hot_bytes\":%" PRIu64
        ",\"engine_rows\":%" PRIu64 ",\"engine_rate\":%.4f",
        f->k.n_experts, f->k.bytes, f->k.regs, f->k.staged, f->k.reused, f->k.rows,
        wo_trace_pick_copied(&f->k), wo_trace_pick_picked(&f->k), f->k.resident,
        wo_trace_pick_per_reg(&f->k), wo_trace_pick_linked_per_reg(&f->k),
        wo_trace_pick_resident(&f->k), f->hot_slots, f->k.hot, f->k.hot_rows,
        wo_trace_pick_hot_rate(&f->k), f->hot_fills, f->hot_bytes, f->k.engine_rows,
        wo_trace_pick_engine_rate(&f->k));
    /* the kernels whose launches it served: its layer's one or two (a
     * third is a word that looked like an address, uvm/picks-kern.h) */
    picks_kerns_json(b, "kernels", f->kerns);
    sb_printf(b, "}");
}

/* One member of "prefetch":{"names":{...}}: the planner's figures for it. */
static void prefetch_name_json(void *ud, const char *name, const struct wo_plan_stats *st)
{
    struct sbuf *b = ud;

    sb_printf(b, "%s", b->first ? "" : ",");
    b->first = false;
    sb_str(b, name);
    sb_printf(b,
              ":{\"hits\":%" PRIu64 ",\"misses\":%" PRIu64 ",\"hit_bytes\":%" PRIu64
              ",\"miss_bytes\":%" PRIu64 ",\"prefetched\":%" PRIu64 ",\"evicted\":%" PRIu64
              ",\"prefetches\":%" PRIu64 ",\"evictions\":%" PRIu64 ",\"stall_ms\":%.3f}",
              st->hits, st->misses, st->hit_bytes, st->miss_bytes, st->prefetched, st->evicted,
              st->prefetches, st->evictions, st->stall_s * 1e3);
}

static const char *bool_s(bool v)
{
    return v ? "true" : "false";
}

/* One member of "stream":{"names":{...}}: read multiplicity and staging. */
static void stream_name_json(void *ud, const char *name, const struct wo_stream_name_stats *st)
{
    struct sbuf *b = ud;

    sb_printf(b, "%s", b->first ? "" : ",");
    b->first = false;
    sb_str(b, name);
    sb_printf(b,
              ":{\"read_multiplicity\":%.3f,\"read_bytes_per_step\":%.0f,\"bytes\":%.0f"
              ",\"staged_bytes_per_step\":%.0f,\"steps\":%" PRIu64
              ",\"placement\":\"%s\",\"streamed\":%s,\"written\":%s}",
              st->multiplicity, st->read_per_step, st->range_bytes, st->staged_per_step,
              st->steps, st->host ? "host" : "managed", bool_s(st->streamed),
              bool_s(st->written));
}

static void json_settings(struct sbuf *b)
{
    const struct wo_settings *s = wo_settings();

    sb_printf(b, "\"settings\":{\"log\":");
    sb_str(b, wo_log_level_to_string(s->log_level));
    sb_printf(b, ",\"log_file\":");
    sb_str(b, s->log_file);
    sb_printf(b, ",\"policy\":");
    sb_str(b, s->policy);
    sb_printf(b, ",\"trace\":");
    sb_str(b, s->trace);
    sb_printf(b, ",\"stats\":");
    sb_str(b, s->stats);
    sb_printf(b, ",\"stats_every\":%" PRIu32, s->stats_every);
    sb_printf(b, ",\"cuda_lib\":");
    sb_str(b, s->cuda_lib);
    sb_printf(b,
              ",\"disable\":%s,\"prefetch\":%s,\"summary\":%s,\"ring_events\":%" PRIu32
              ",\"scan_words\":%" PRIu32 "}",
              bool_s(s->disable), bool_s(s->prefetch), bool_s(s->summary), s->ring_events,
              s->scan_words);
}

static void json_place(struct sbuf *b, const char *key, const struct wo_place_count *c,
                       uint64_t untagged)
{
    sb_printf(b, "\"%s\":{\"bytes\":%" PRIu64 ",\"tensors\":%" PRIu64 ",\"untagged_bytes\":%" PRIu64 "}",
              key, c->bytes, c->tensors, untagged);
}

static void json_body(struct sbuf *b)
{
    const struct wo_policy *p = wo_uvm.policy;
    struct wo_place_counts pc;
    uint64_t bound_host, bound_device;
    char label[256];
    bool first = true;

    sb_printf(b, "{\"version\":");
    sb_str(b, WO_VERSION);
    sb_printf(b, ",\"pid\":%d,", (int)getpid());
    json_settings(b);

    sb_printf(b, ",\"policy\":{\"path\":");
    sb_str(b, wo_uvm.policy_path);
    sb_printf(b, ",\"loaded\":%s,\"error\":", bool_s(p != NULL));
    sb_str(b, wo_uvm.policy_error ? strerror(-wo_uvm.policy_error) : NULL);
    sb_printf(b, ",\"rules\":%zu,\"default\":", p ? wo_policy_nrules(p) : (size_t)0);
    sb_str(b, p ? wo_placement_to_string(wo_uvm.g->default_place) : NULL);
    sb_printf(b, ",\"placing\":%s}", bool_s(wo_uvm.placing));

    sb_printf(b, ",\"state\":{\"initialised\":%s,\"window_open\":%s,\"sealed\":%s}",
              bool_s(wo_uvm.state != 0), bool_s(wo_uvm.window_open), bool_s(wo_uvm.sealed));

    wo_place_counts(&pc);
    sb_printf(b, ",\"placements\":{");
    for (int i = WO_PLACE_DEVICE; i < WO_PLACE_MAX; i++) {
        json_place(b, wo_placement_to_string((enum wo_placement)i), &pc.by[i], pc.untagged[i]);
        sb_printf(b, ",");
    }
    json_place(b, "pending", &pc.pending, pc.pending.bytes);
    sb_printf(b, ",");
    json_place(b, "unplaceable", &pc.unplaceable, 0);
    sb_printf(b, "}");

    sb_printf(b, ",\"budgets\":{\"host_limit\":");
    if (!p || wo_uvm.host_budget.limit == UINT64_MAX)
        sb_printf(b, "null");
    else
        sb_printf(b, "%" PRIu64, wo_uvm.host_budget.limit);
    sb_printf(b,
              ",\"host_used\":%" PRIu64 ",\"host_spent\":%s,\"over_budget_tensors\":%" PRIu64
              ",\"over_budget_bytes\":%" PRIu64 ",\"device_budget\":%" PRIu64
              ",\"device_total\":%" PRIu64 "}",
              wo_uvm.host_budget.used, bool_s(wo_uvm.host_budget.spent), wo_uvm.over_budget_tags,
              wo_uvm.over_budget_bytes, wo_uvm.device_budget, wo_uvm.device_total);

    sb_printf(b,
              ",\"allocations\":{\"live\":%zu,\"served_managed\":%" PRIu64
              ",\"served_pinned\":%" PRIu64 ",\"pin_failures\":%" PRIu64
              ",\"pin_fallbacks\":%" PRIu64 ",\"placement_errors\":%" PRIu64
              ",\"unplaceable_tags\":%" PRIu64 ",\"misuse\":%" PRIu64 ",\"readonly\":%" PRIu64
              "}",
              wo_uvm.nallocs, wo_uvm.served_managed, wo_uvm.served_pinned, wo_uvm.pin_failures,
              wo_uvm.pin_fallbacks, wo_uvm.placement_errors, wo_uvm.unplaceable_tags,
              __atomic_load_n(&wo_uvm.misuse, __ATOMIC_RELAXED),
              __atomic_load_n(&wo_uvm.readonly_allocs, __ATOMIC_RELAXED));

    wo_place_bind_bytes(&bound_host, &bound_device);
    sb_printf(b,
              ",\"late_bind\":{\"enabled\":%s,\"fit_bind\":%s,\"ranges\":%" PRIu64
              ",\"fallbacks\":%" PRIu64
              ",\"host_bytes\":%" PRIu64 ",\"device_bytes\":%" PRIu64 ",\"moves\":%" PRIu64
              ",\"moved_bytes\":%" PRIu64 ",\"failures\":%" PRIu64 "}",
              wo_place_bind_enabled() ? "true" : "false", wo_place_bind_fit() ? "true" : "false",
              wo_uvm.bind.ranges, wo_uvm.bind.fallbacks,
              bound_host, bound_device, wo_uvm.bind.moves,
              wo_uvm.bind.moved_bytes, wo_uvm.bind.failures);
    {
        struct wo_picks_totals pt;
        struct wo_dma_figs df;
        uint64_t hot = wo_picks_hot_total();

        /* auto before the first set: 0 bytes yet, hot_experts_auto says it */
        sb_printf(b,
                  ",\"picks\":{\"enabled\":%s,\"hot_experts\":%" PRIu64
                  ",\"hot_experts_auto\":%s,\"names\":{",
                  wo_settings()->picks ? "true" : "false", hot == UINT64_MAX ? 0 : hot,
                  wo_picks_hot_auto() ? "true" : "false");
        b->first = true;
        wo_picks_report(&pt, picks_name_json, b);
        sb_printf(b,
                  "},\"tensors\":%" PRIu64 ",\"registrations\":%" PRIu64 ",\"staged\":%" PRIu64
                  ",\"reused\":%" PRIu64 ",\"rows\":%" PRIu64 ",\"bytes_copied\":%" PRIu64
                  ",\"whole_bytes\":%" PRIu64 ",\"captured\":%" PRIu64 ",\"failed\":%" PRIu64
                  ",\"unused\":%" PRIu64 ",\"writes\":%" PRIu64 ",\"resident\":%" PRIu64
                  ",\"buffer_bytes\":%" PRIu64 ",\"hot_bytes\":%" PRIu64 ",\"hot_rows\":%" PRIu64
                  ",\"hot_fills\":%" PRIu64 ",\"hot_given_back\":%" PRIu64
                  ",\"buffer_cap\":%" PRIu64 ",\"buffers_lent\":%" PRIu64
                  ",\"buffers_reclaimed\":%" PRIu64 ",\"kernel_copies\":%" PRIu64
                  ",\"timed_copies\":%" PRIu64 ",\"timed_ms\":%.3f,\"copy_span_s\":%.3f"
                  ",\"kernel_bytes\":%" PRIu64 ",\"off_row\":%" PRIu64 ",\"not_reader\":%" PRIu64
                  ",\"const_words\":%" PRIu64 ",\"checked\":%" PRIu64 ",\"check_mismatch\":%" PRIu64
                  ",\"early\":%" PRIu64 ",\"early_used\":%" PRIu64,
                  pt.spans, pt.c.regs, pt.c.staged, pt.c.reused, pt.rows, pt.bytes_copied,
                  pt.c.whole_bytes, pt.c.captured, pt.c.failed, pt.c.unused, pt.c.writes,
                  pt.c.resident, pt.buffer_bytes, pt.hot_bytes, pt.hot_rows, pt.hot_fills,
                  pt.hot_given_back, pt.buffer_cap, pt.buffers_lent, pt.buffers_reclaimed,
                  pt.kernel_copies, pt.timed_copies, pt.timed_ms, pt.copy_span_s, pt.kernel_bytes,
                  pt.c.off_row, pt.c.not_reader, pt.const_words, pt.c.checked, pt.c.check_mismatch,
                  pt.c.early, pt.c.early_used);
        picks_kerns_json(b, "off_row_kernels", &pt.c.off_kerns);
        picks_kerns_json(b, "not_reader_kernels", &pt.c.nr_kerns);
        /* the copies on the copy engine (uvm/picks-dma.h) */
        wo_dma_figs(&df);
        sb_printf(
            b,
            ",\"engine\":{\"from_percent\":%u,\"on\":%s,\"copies\":%" PRIu64 ",\"runs\":%" PRIu64
            ",\"bytes\":%" PRIu64 ",\"kernel_fallbacks\":%" PRIu64 ",\"host_flags\":%" PRIu64
            ",\"no_slot\":%" PRIu64 ",\"quiesced\":%" PRIu64 ",\"quiesce_timeouts\":%" PRIu64
            ",\"mirrors\":%" PRIu64 ",\"mirror_bytes\":%" PRIu64 ",\"mirrors_failed\":%" PRIu64
            ",\"mirrors_dropped\":%" PRIu64 ",\"waits_refused\":%" PRIu64 ",\"stalls\":%" PRIu64
            ",\"rescues\":%" PRIu64 ",\"probes\":%" PRIu64 ",\"shared_queues\":%" PRIu64
            ",\"copy_streams_replaced\":%" PRIu64 ",\"stall_report\":",
            wo_settings()->picks_engine, wo_uvm_picks_engine() ? "true" : "false", df.jobs, df.runs,
            df.bytes, df.kernel, df.host_flags, df.no_slot, df.quiesced, df.quiesce_timeouts,
            df.mirrors, df.mirror_bytes, df.mirror_failed, df.mirror_dropped, df.waits_refused,
            df.stalls, df.rescues, df.probes, df.shared_queues, df.copy_streams);
        sb_str(b, df.stall_report);
        sb_printf(b, "}}");
    }
    sb_printf(b,
              ",\"managed_cap\":{\"margin\":%" PRIu64 ",\"live\":%" PRIu64 ",\"peak\":%" PRIu64
              ",\"min_headroom\":",
              wo_uvm.cap.margin, wo_uvm.cap.live, wo_uvm.cap.peak);
    if (wo_uvm.cap.min_headroom == INT64_MAX)
        sb_printf(b, "null");
    else
        sb_printf(b, "%" PRId64, wo_uvm.cap.min_headroom);
    sb_printf(b,
              ",\"checks\":%" PRIu64 ",\"pinned\":%" PRIu64 ",\"pinned_bytes\":%" PRIu64
              ",\"pinned_largest\":%" PRIu64 ",\"passed\":%" PRIu64 ",\"passed_bytes\":%" PRIu64 ",\"failed\":%" PRIu64
              ",\"failed_bytes\":%" PRIu64 ",\"stuck_tags\":%" PRIu64 ",\"stuck_bytes\":%" PRIu64
              ",\"unknown_free\":%" PRIu64 ",\"seal_seconds\":%.3f,\"pin_seconds\":%.3f}",
              wo_uvm.cap.checks, wo_uvm.cap.pinned, wo_uvm.cap.pinned_bytes, wo_uvm.cap.pinned_largest,
              wo_uvm.cap.passed,
              wo_uvm.cap.passed_bytes, wo_uvm.cap.failed, wo_uvm.cap.failed_bytes,
              wo_uvm.cap.stuck_tags, wo_uvm.cap.stuck_bytes, wo_uvm.cap.unknown_free,
              (double)wo_uvm.seal_ns / 1e9, (double)wo_uvm.pin_ns / 1e9);
    sb_printf(b, ",\"load_copies\":{");
    for (unsigned k = 0; k < WO_LOAD_COPY_KINDS; k++)
        sb_printf(b, "%s\"%s\":{\"calls\":%" PRIu64 ",\"bytes\":%" PRIu64 ",\"seconds\":%.3f}",
                  k ? "," : "", wo_load_copy_kind_name(k),
                  __atomic_load_n(&wo_uvm.load_copies.calls[k], __ATOMIC_RELAXED),
                  __atomic_load_n(&wo_uvm.load_copies.bytes[k], __ATOMIC_RELAXED),
                  (double)__atomic_load_n(&wo_uvm.load_copies.ns[k], __ATOMIC_RELAXED) / 1e9);
    sb_printf(b, "}");

    {
        const struct wo_uvm_expect *x = &wo_uvm.expect;
        sb_printf(b,
                  ",\"expect\":{\"names\":%zu,\"bytes\":%" PRIu64 ",\"plan_host\":%" PRIu64
                  ",\"plan_host_bytes\":%" PRIu64 ",\"plan_device\":%" PRIu64
                  ",\"plan_device_bytes\":%" PRIu64 ",\"matched\":%" PRIu64
                  ",\"matched_bytes\":%" PRIu64 ",\"served_host\":%" PRIu64
                  ",\"served_host_bytes\":%" PRIu64 ",\"pin_failures\":%" PRIu64
                  ",\"unmatched\":%" PRIu64 ",\"released\":%" PRIu64 ",\"missed_tags\":%" PRIu64
                  ",\"missed_bytes\":%" PRIu64 ",\"swapped_tags\":%" PRIu64
                  ",\"swapped_bytes\":%" PRIu64,
                  x->n, x->bytes, x->plan_host, x->plan_host_bytes, x->plan_device,
                  x->plan_device_bytes, x->matched, x->matched_bytes, x->served_host,
                  x->served_host_bytes, x->pin_failures, x->unmatched, x->released,
                  x->missed_tags, x->missed_bytes, x->swapped_tags, x->swapped_bytes);
        struct wo_prepin_figs f;
        wo_place_prepin_figs(&f);
        sb_printf(b,
                  ",\"prepin\":{\"made\":%" PRIu64 ",\"made_bytes\":%" PRIu64
                  ",\"taken\":%" PRIu64 ",\"taken_bytes\":%" PRIu64 ",\"waits\":%" PRIu64
                  ",\"missed\":%" PRIu64 ",\"wasted\":%" PRIu64 ",\"wasted_bytes\":%" PRIu64
                  ",\"failed\":%" PRIu64 ",\"seconds\":%.3f}}",
                  f.made, f.made_bytes, f.taken, f.taken_bytes, f.waits, f.missed, f.wasted,
                  f.wasted_bytes, f.failed, (double)f.ns / 1e9);
    }
    if (p && wo_uvm.g->fit.enabled)
        sb_printf(b,
                  ",\"fit\":{\"budget\":%" PRIu64 ",\"device_bytes\":%" PRIu64
                  ",\"rest_bytes\":%" PRIu64 ",\"engine_bytes\":%" PRIu64
                  ",\"staging_bytes\":%" PRIu64 ",\"reserve_bytes\":%" PRIu64 ",\"names\":%zu"
                  ",\"lent_bytes\":%" PRIu64 ",\"returned_bytes\":%" PRIu64
                  ",\"yielded_bytes\":%" PRIu64 ",\"yields\":%" PRIu64 ",\"picks_bytes\":%" PRIu64
                  ",\"engine_after_bytes\":%" PRIu64 ",\"engine_peak_bytes\":%" PRIu64
                  ",\"untagged_bytes\":%" PRIu64 ",\"squeezed_bytes\":%" PRIu64
                  ",\"lent_squeezes\":%" PRIu64 ",\"context_bytes\":%" PRIu64
                  ",\"context_known\":%s}",
                  wo_uvm.fit.budget, wo_uvm.fit.device_bytes, wo_uvm.fit.rest_bytes,
                  wo_uvm.fit.engine_bytes, wo_uvm.fit.staging_bytes, wo_uvm.fit.reserve_bytes,
                  wo_uvm.fit.names, wo_uvm.fit.lent_bytes, wo_uvm.fit.returned_bytes,
                  wo_uvm.fit.yielded_bytes, wo_uvm.fit.yields, wo_uvm.fit.picks_bytes,
                  wo_uvm.fit.engine_after, wo_uvm.fit.engine_peak, wo_uvm.fit.untagged_bytes,
                  wo_uvm.fit.squeezed_bytes, wo_uvm.fit.lent_squeezes, wo_uvm.fit.context_bytes,
                  __atomic_load_n(&wo_uvm.fit.context_known, __ATOMIC_ACQUIRE) ? "true" : "false");

    sb_printf(b, ",\"rules\":[");
    if (p) {
        for (size_t i = 0; i < wo_uvm.nrule_counts; i++) {
            const struct wo_rule_counts *c = &wo_uvm.rule_counts[i];
            const struct wo_rule *r = wo_policy_rule(p, i);
            sb_printf(b, "%s{\"index\":%zu,\"label\":", i ? "," : "", i);
            sb_str(b, wo_policy_rule_label(p, i, label, sizeof(label)));
            sb_printf(b, ",\"placement\":");
            sb_str(b, wo_placement_to_string(r ? r->place : wo_uvm.g->default_place));
            sb_printf(b,
                      ",\"names\":%" PRIu64 ",\"bytes\":%" PRIu64
                      ",\"over_budget_names\":%" PRIu64 ",\"over_budget_bytes\":%" PRIu64 "}",
                      c->names, c->bytes, c->over_budget_names, c->over_budget_bytes);
        }
    }
    sb_printf(b, "]");

    sb_printf(b, ",\"names\":[");
    for (uint32_t i = 0; i < wo_uvm.names_cap; i++) {
        const struct wo_name *n = wo_uvm.names_by_id[i];
        if (!n || n->ntags == 0)
            continue;
        name_head_json(b, first, n->s, n->unplaceable, n->place, n->rule, n->want, p);
        first = false;
        sb_printf(b,
                  ",\"bytes\":%" PRIu64 ",\"tensors\":%" PRIu32 ",\"launches\":%" PRIu64
                  ",\"hits\":%" PRIu64 ",\"touched_bytes\":%" PRIu64
                  ",\"placeable\":%s,\"over_budget\":%s}",
                  n->bytes, n->ntags, n->launches, n->hits, n->touched, bool_s(!n->unplaceable),
                  bool_s(n->over_budget));
    }
    sb_printf(b, "]");

    /* the names whose last tag went (names.c): where they were, after the
     * engine freed them (a server frees its model before it exits) */
    sb_printf(b, ",\"released_names\":[");
    for (size_t i = 0; i < wo_uvm.nnames_gone; i++) {
        const struct wo_name_gone *g = &wo_uvm.names_gone[i];
        name_head_json(b, i == 0, g->s, g->unplaceable, g->place, g->rule, g->want, p);
        sb_printf(b,
                  ",\"peak_bytes\":%" PRIu64 ",\"peak_tensors\":%" PRIu32 ",\"lives\":%" PRIu32
                  ",\"launches\":%" PRIu64 ",\"hits\":%" PRIu64 ",\"touched_bytes\":%" PRIu64
                  ",\"over_budget\":%s}",
                  g->peak_bytes, g->peak_tags, g->lives, g->launches, g->hits, g->touched,
                  bool_s(g->over_budget));
    }
    sb_printf(b, "],\"released_names_dropped\":%" PRIu64, wo_uvm.names_gone_dropped);

    sb_printf(b,
              ",\"launches\":{\"seen\":%" PRIu64 ",\"hits\":%" PRIu64 ",\"stale_hits\":%" PRIu64
              ",\"untagged_hits\":%" PRIu64 ",\"unaligned_hits\":%" PRIu64
              ",\"events\":%" PRIu64 "}",
              wo_uvm.launches, wo_uvm.launch_hits, wo_uvm.hits_stale, wo_uvm.hits_untagged,
              wo_uvm.hits_unaligned, wo_uvm.events);
    {
        struct wo_event_books e;
        wo_event_books(&e);
        sb_printf(b,
                  ",\"ring\":{\"capacity\":%" PRIu64 ",\"pushed\":%" PRIu64 ",\"dropped\":%" PRIu64
                  ",\"dropped_watched\":%" PRIu64 ",\"dropped_unwatched\":%" PRIu64
                  ",\"dropped_other\":%" PRIu64 ",\"all_events\":%s,\"skipped_launches\":%" PRIu64
                  ",\"skipped_other\":%" PRIu64 ",\"backlog\":{\"now\":%" PRIu64
                  ",\"peak\":%" PRIu64 ",\"limit\":%" PRIu64 ",\"moved\":%" PRIu64
                  "},\"longest_call\":{\"ms\":%.3f,\"executor\":\"%s\",\"tick\":%s}}",
                  e.capacity, e.pushed, e.dropped, e.dropped_watched, e.dropped_unwatched,
                  e.dropped_other, bool_s(e.all), e.skipped_launches, e.skipped_other,
                  e.backlog.now, e.backlog.peak, e.backlog.limit, e.backlog.moved,
                  (double)e.longest_ns / 1e6, e.longest_in, bool_s(e.longest_tick));
    }

    {
        struct wo_prefetch_totals pt;
        wo_prefetch_totals(&pt);
        sb_printf(b,
                  ",\"prefetch\":{\"prefetches\":%" PRIu64 ",\"prefetch_bytes\":%" PRIu64
                  ",\"evictions\":%" PRIu64 ",\"evict_bytes\":%" PRIu64
                  ",\"collapses\":%" PRIu64 ",\"copy_backs\":%" PRIu64 ",\"deferred\":%" PRIu64
                  ",\"errors\":%" PRIu64 ",\"steps\":%" PRIu64 ",\"names\":{",
                  pt.prefetches, pt.prefetch_bytes, pt.evictions, pt.evict_bytes, pt.collapses,
                  pt.copy_backs, pt.deferred, pt.errors, pt.steps);
        b->first = true;
        wo_prefetch_foreach_name(prefetch_name_json, b);
        sb_printf(b, "}");
        {
            /* per step: moved bytes and the cost rule's prediction
             * (uvm/cost.h), the mean over all steps and the last one */
            struct wo_prefetch_steps f;
            double n;

            wo_prefetch_step_figures(&f);
            n = f.steps ? (double)f.steps : 1.0;
            sb_printf(b,
                      ",\"per_step\":{\"steps\":%" PRIu64 ",\"in_bytes\":%.0f,\"out_bytes\":%.0f"
                      ",\"inplace_ms\":%.3f,\"plan_ms\":%.3f,\"last\":{\"in_bytes\":%" PRIu64
                      ",\"out_bytes\":%" PRIu64 ",\"inplace_ms\":%.3f,\"plan_ms\":%.3f}}",
                      f.steps, (double)f.sum.in_bytes / n, (double)f.sum.out_bytes / n,
                      f.sum.inplace_s * 1e3 / n, f.sum.plan_s * 1e3 / n, f.last.in_bytes,
                      f.last.out_bytes, f.last.inplace_s * 1e3, f.last.plan_s * 1e3);
        }
        sb_printf(b, "}");
    }
    {
        struct wo_stream_counts sc;
        wo_stream_counts(&sc);
        sb_printf(
            b,
            ",\"stream\":{\"redirected\":%" PRIu64 ",\"inplace_no_slot\":%" PRIu64
            ",\"awaited\":%" PRIu64 ",\"await_ms\":%.3f,\"await_timeouts\":%" PRIu64
            ",\"inplace_captured\":%" PRIu64 ",\"inplace_other\":%" PRIu64
            ",\"invalidated\":%" PRIu64 ",\"staged\":%" PRIu64 ",\"staged_bytes\":%" PRIu64
            ",\"staged_by_kernel\":%" PRIu64 ",\"slot_waits\":%" PRIu64 ",\"steps\":%" PRIu64
            ",\"slot_bytes\":%" PRIu64 ",\"slot_resizes\":%" PRIu64 ",\"slot_makes\":%" PRIu64
            ",\"slot_frees\":%" PRIu64 ",\"auto_tries\":%" PRIu64 ",\"auto_kept\":%" PRIu64
            ",\"auto_backs\":%" PRIu64 ",\"auto_rechecks\":%" PRIu64 ",\"auto_deferred\":%" PRIu64
            ",\"not_reader\":%" PRIu64 ",\"checked\":%" PRIu64 ",\"check_mismatch\":%" PRIu64
            ",\"write_checks\":%" PRIu64 ",\"written_back\":%" PRIu64
            ",\"touched_inplace\":%" PRIu64 ",\"unpublished_inplace\":%" PRIu64
            ",\"fence_failed\":%" PRIu64 ",\"not_published\":%" PRIu64
            ",\"blind_launches\":%" PRIu64 ",\"blind_unfenced\":%" PRIu64 ",\"sub_spans\":%" PRIu64
            ",\"touch_overflow\":%" PRIu64 ",\"staging_steps\":%" PRIu64
            ",\"staging_step_ms\":%.3f,\"staging_gbs\":%.2f"
            ",\"pos_wakes\":%" PRIu64 ",\"reactions\":%" PRIu64
            ",\"reaction_ms\":%.4f,\"reaction_max_ms\":%.4f"
            ",\"departure_lag\":%u,\"fences_departed\":%" PRIu64 ",\"fences_at_reuse\":%" PRIu64
            ",\"slot_swaps\":%" PRIu64 ",\"copies_timed\":%" PRIu64
            ",\"copies_timed_bytes\":%" PRIu64 ",\"copies_busy_ms\":%.3f,\"copies_busy_gbs\":%.2f"
            ",\"inplace_claims\":%" PRIu64 ",\"inplace_claimed\":%" PRIu64
            ",\"claim_unselects\":%" PRIu64 ",\"claim_unselects_staged\":%" PRIu64 ",",
            sc.redirected, sc.inplace_no_slot, sc.awaited, (double)sc.await_ns / 1e6,
            sc.await_timeouts, sc.inplace_captured, sc.inplace_other, sc.invalidated, sc.staged,
            sc.staged_bytes, sc.staged_by_kernel, sc.slot_waits, sc.steps, sc.slot_bytes,
            sc.slot_resizes, sc.slot_makes, sc.slot_frees, sc.auto_tries, sc.auto_kept,
            sc.auto_backs, sc.auto_rechecks, sc.auto_deferred, sc.not_reader, sc.checked,
            sc.check_mismatch, sc.write_checks, sc.written_back, sc.touched_inplace,
            sc.unpublished_inplace, sc.fence_failed, sc.not_published, sc.blind_launches,
            sc.blind_unfenced, sc.sub_spans, sc.touch_overflow, sc.staging_steps,
            sc.staging_steps ? (double)sc.staging_step_ns / (double)sc.staging_steps / 1e6 : 0.0,
            sc.staging_step_ns ? (double)sc.staging_step_bytes / (double)sc.staging_step_ns : 0.0,
            sc.pos_wakes, sc.reactions,
            sc.reactions ? (double)sc.reaction_ns / (double)sc.reactions / 1e6 : 0.0,
            (double)sc.reaction_max_ns / 1e6, wo_stream_departure_lag(), sc.fences_departed,
            sc.fences_at_reuse, sc.slot_swaps, sc.copies_timed, sc.copies_timed_bytes,
            (double)sc.copies_busy_ns / 1e6,
            sc.copies_busy_ns ? (double)sc.copies_timed_bytes / (double)sc.copies_busy_ns : 0.0,
            sc.inplace_claims, sc.inplace_claimed, sc.claim_unselects, sc.claim_unselects_staged);
        {
            struct wo_pin_counts pinc;
            wo_pin_counts(&pinc);
            sb_printf(b,
                      "\"staged_pinned\":%" PRIu64 ",\"pinned_copies\":{\"held\":%" PRIu64
                      ",\"bytes\":%" PRIu64 ",\"made\":%" PRIu64 ",\"failed\":%" PRIu64
                      ",\"over_budget\":%" PRIu64 ",\"retired\":%" PRIu64 ",\"pin_ms\":%.1f},",
                      sc.staged_pinned, pinc.held, pinc.bytes, pinc.made, pinc.failed,
                      pinc.over_budget, pinc.retired, (double)pinc.pin_ns / 1e6);
        }
        sb_printf(b, "\"names\":{");
        b->first = true;
        wo_stream_foreach_name(stream_name_json, b);
        sb_printf(b, "}}");
    }
    {
        long need = wo_counters_json(NULL, 0);
        sb_printf(b, ",\"interpose\":");
        if (need > 0) {
            sb_grow(b, (size_t)need);
            if (!b->oom) {
                wo_counters_json(b->p + b->n, (size_t)need + 1);
                b->n += (size_t)need;
            }
        } else {
            sb_printf(b, "{}");
        }
    }
    sb_printf(b, "}");
}

char *wo_stats_json(size_t *len)
{
    struct sbuf b = {0};

    pthread_mutex_lock(&wo_uvm.lock);
    json_body(&b);
    pthread_mutex_unlock(&wo_uvm.lock);
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    *len = b.n;
    return b.p;
}

long wo_api_stats(char *buf, size_t len)
{
    size_t n = 0;
    char *s;

    if (!buf && len > 0) {
        wo_warn("woffload_stats: NULL buffer with length %zu (-EINVAL)", len);
        __atomic_add_fetch(&wo_uvm.misuse, 1, __ATOMIC_RELAXED);
        return -EINVAL;
    }
    s = wo_stats_json(&n);
    if (!s)
        return -ENOMEM;
    if (len > 0) {
        size_t k = WO_MIN(n, len - 1);
        memcpy(buf, s, k);
        buf[k] = '\0';
    }
    free(s);
    return (long)n;
}

static int write_all(int fd, const char *s, size_t n)
{
    size_t off = 0;

    while (off < n) {
        ssize_t w = write(fd, s + off, n - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return w < 0 ? -errno : -EIO;
        off += (size_t)w;
    }
    return 0;
}

/* The file is replaced whole: written beside it under a name of this
 * process's, then renamed over it, so that a reader (serve.py
 * --stats-file, while WOFFLOAD_STATS_EVERY refreshes it) never sees half
 * of one. Where that cannot be done (a path that is not a regular file,
 * such as /dev/stdout or a FIFO; a directory this process cannot create
 * in), it is written in place. */
int wo_stats_write_file(const char *path)
{
    size_t n = 0;
    char *s = wo_stats_json(&n);
    char tmp[4096];
    struct stat st;
    int fd = -1, r;
    bool replace;

    if (!s)
        return -ENOMEM;
    s[n] = '\n';
    n++;
    replace = !(stat(path, &st) == 0 && !S_ISREG(st.st_mode)) &&
              snprintf(tmp, sizeof(tmp), "%s.%ld.tmp", path, (long)getpid()) < (int)sizeof(tmp);
    if (replace)
        fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        replace = false;
        fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    }
    if (fd < 0) {
        r = -errno;
        wo_error("cannot write the stats to %s (WOFFLOAD_STATS): %s", path, strerror(errno));
        free(s);
        return r;
    }
    r = write_all(fd, s, n);
    if (close(fd) < 0 && r == 0)
        r = -errno;
    if (r == 0 && replace && rename(tmp, path) < 0)
        r = -errno;
    if (r < 0) {
        wo_error("writing the stats to %s (WOFFLOAD_STATS): %s", path, strerror(-r));
        if (replace)
            (void)unlink(tmp);
    }
    free(s);
    return r;
}

void wo_event_books(struct wo_event_books *ret)
{
    struct wo_ring *r = __atomic_load_n(&wo_events, __ATOMIC_ACQUIRE);
    uint64_t dw = wo_counter_get(WO_CTR_events_dropped_watched);
    uint64_t du = wo_counter_get(WO_CTR_events_dropped_unwatched);

    memset(ret, 0, sizeof(*ret));
    ret->longest_in = "";
    ret->all = __atomic_load_n(&wo_events_all, __ATOMIC_RELAXED) != 0;
    if (!r)
        return;
    ret->capacity = wo_ring_capacity(r);
    ret->pushed = wo_ring_pushed(r);
    /* the ring's own count covers every producer (hooks, uvm/'s tag and
     * placement events); the launch split comes from the hooks' counters,
     * read a moment apart: clamp */
    ret->dropped = wo_ring_dropped(r);
    ret->dropped_watched = dw;
    ret->dropped_unwatched = du;
    ret->dropped_other = ret->dropped > dw + du ? ret->dropped - dw - du : 0;
    ret->skipped_launches = wo_counter_get(WO_CTR_launch_skipped);
    ret->skipped_other = wo_counter_get(WO_CTR_events_skipped);
    wo_consumer_backlog_stats(&ret->backlog);
    wo_consumer_longest(&ret->longest_ns, &ret->longest_in, &ret->longest_tick);
}

/* Summaries follow WOFFLOAD_SUMMARY: shown at log level warn and above when
 * it is on, always at info and above. Under wo_uvm.lock or after shutdown. */
void wo_summary_log(const char *when)
{
    const struct wo_settings *s = wo_settings();
    int lvl = __atomic_load_n(&wo_log_level_current, __ATOMIC_RELAXED);
    struct wo_place_counts pc;
    char d[32], h[32], m[32], u[32], o[32];

    if (!(lvl >= WO_LOG_INFO || (s->summary && lvl >= WO_LOG_WARN)))
        return;
    wo_place_counts(&pc);
    wo_log_write(WO_LOG_OFF,
                 "%s: device %s in %" PRIu64 " tensors, host %s in %" PRIu64
                 " tensors, managed %s in %" PRIu64 " tensors; unplaceable tags %s in %" PRIu64
                 "; over the host budget (kept on device) %s in %" PRIu64 " tensors",
                 when, wo_format_size(pc.by[WO_PLACE_DEVICE].bytes, d, sizeof(d)),
                 pc.by[WO_PLACE_DEVICE].tensors, wo_format_size(pc.by[WO_PLACE_HOST].bytes, h, sizeof(h)),
                 pc.by[WO_PLACE_HOST].tensors,
                 wo_format_size(pc.by[WO_PLACE_MANAGED].bytes, m, sizeof(m)),
                 pc.by[WO_PLACE_MANAGED].tensors, wo_format_size(pc.unplaceable.bytes, u, sizeof(u)),
                 pc.unplaceable.tensors, wo_format_size(wo_uvm.over_budget_bytes, o, sizeof(o)),
                 wo_uvm.over_budget_tags);
    if (strcmp(when, "seal") == 0) {
        char lc[512];

        wo_log_write(WO_LOG_OFF, "seal took %.2f s", (double)wo_uvm.seal_ns / 1e9);
        wo_load_copies_line(lc, sizeof(lc));
        if (*lc)
            wo_log_write(WO_LOG_OFF,
                         "load: the engine's copies before seal (time inside the calls): %s; "
                         "pinning %.2f s of the loader's own",
                         lc, (double)wo_uvm.pin_ns / 1e9);
    }
    if (strcmp(when, "exit") == 0 && wo_events) {
        struct wo_event_books e;
        wo_event_books(&e);
        /* What the consumer (prefetcher, per-name books, trace) did not see:
         * a dropped watched launch is one the prefetcher never learnt from. */
        wo_log_write(e.dropped_watched ? WO_LOG_WARN : WO_LOG_OFF,
                     "events: %" PRIu64 " launches seen by the consumer; %" PRIu64
                     " launches that touch no named or served range were only counted%s; "
                     "dropped (ring of %" PRIu64 " full): %" PRIu64 " launches touching a "
                     "named or served range, %" PRIu64 " other launches, %" PRIu64
                     " other events; backlog peak %" PRIu64 " of %" PRIu64
                     "; longest executor call %.1f ms (%s%s)",
                     wo_uvm.launches, e.skipped_launches,
                     e.all ? " (none: every event is kept for the trace or WOFFLOAD_OBSERVE)" : "",
                     e.capacity, e.dropped_watched, e.dropped_unwatched, e.dropped_other,
                     e.backlog.peak, e.backlog.limit, (double)e.longest_ns / 1e6,
                     *e.longest_in ? e.longest_in : "none",
                     !*e.longest_in ? "" : e.longest_tick ? ", a tick" : ", an event");
        {
            /* what the capture handshake (uvm.h) cost the engine */
            uint64_t waits = wo_counter_get(WO_CTR_capture_waits);

            if (waits)
                wo_log_write(WO_LOG_OFF,
                             "captures: %" PRIu64 " begun, %" PRIu64
                             " of them waited for a driver call of the shim's (%.1f ms in all)",
                             wo_counter_get(WO_CTR_capture_begin), waits,
                             (double)wo_counter_get(WO_CTR_capture_wait_us) / 1e3);
        }
        wo_place_fit_summary();
        wo_stream_summary();
        wo_picks_summary();
    }
}
