/* uvm/stream-learn.c: what the streaming executor learns from launches
 * (see stream-int.h): per range and step the bytes read and the distinct
 * bytes among them (read multiplicity), which ranges are streamed (by gain,
 * or by auto's step-time rule, stream-auto.h), the steps, which launch
 * functions read off-device ranges, and the per-name figures it publishes
 * for the stats. */
#include "uvm/stream-int.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/board.h"
#include "core/log.h"
#include "uvm/picks.h"
#include "uvm/plan-budget.h"

/* ---- learning ----------------------------------------------------------------- */

static uint64_t granule(const struct srange *r)
{
    uint64_t span = r->hi - r->lo;
    return (span + GRANULES - 1) / GRANULES;
}

static void account_hit(struct srange *r, uint32_t id, const struct wo_ev_hit *h)
{
    uint64_t span = r->hi - r->lo, rel, relhi, end, g = granule(r);

    /* another part of the allocation; a sub-span counts from its start the
     * hit that began before it (the hits of one launch in an allocation
     * are one: from its lowest pointer to its highest) */
    if (id >= WO_STREAM_IDS ? h->hi <= r->lo || h->offset >= r->hi
                            : h->offset < r->lo || h->offset >= r->hi)
        return;
    rel = h->offset > r->lo ? h->offset - r->lo : 0;
    relhi = h->hi > h->offset ? h->hi - r->lo : rel + 1;
    r->slice = wo_plan_slice_learn(r->slice, rel);
    end = wo_plan_extent_end(span, r->slice, rel, relhi);
    if (end <= rel)
        return;
    r->read += end - rel;
    for (uint64_t k = rel / g; k <= (end - 1) / g && k < GRANULES; k++)
        r->mask |= UINT64_C(1) << k;
    if (!r->touched) {
        r->touched = true;
        /* the order takes a copy of cur at the step's end: same capacity */
        if (wo_grow((void **)&wo_sx->cur, &wo_sx->cap_cur, wo_sx->ncur + 1, sizeof(*wo_sx->cur)) <
                0 ||
            wo_grow((void **)&wo_sx->order, &wo_sx->cap_order, wo_sx->ncur + 1,
                    sizeof(*wo_sx->order)) < 0)
            return;
        wo_sx->cur[wo_sx->ncur++] = id;
    }
}

/* Whether the engine ever claimed the span read in place for a step
 * (woffload_read_in_place): it says step by step which steps read it whole
 * enough to stage. */
static bool claimed_ever(uint32_t id)
{
    return (__atomic_load_n(&wo_stream_tab.e[id].inplace, __ATOMIC_ACQUIRE) &
            WO_STREAM_INPLACE_EVER) != 0;
}

/* Whether the executor can stream the range at all: its span is weights
 * only, no copy wrote it, it is not gathered, and it fits a slot (said
 * once when it does not). */
static bool streamable(struct srange *r)
{
    if (r->written || r->gathered || r->gapped)
        return false;
    /* its launches read only the picked experts (uvm/picks.h) */
    if (wo_picks_claims(r->rid, r->gen, r->lo, r->hi))
        return false;
    if (r->hi - r->lo > wo_sx->slot_size) {
        if (!r->big) {
            r->big = true;
            wo_info("stream: '%s' (%llu MiB) is larger than the staging slots (%llu MiB): read "
                    "in place",
                    r->name ? r->name : "(unnamed)", (unsigned long long)((r->hi - r->lo) >> 20),
                    (unsigned long long)(wo_sx->slot_size >> 20));
        }
        return false;
    }
    return true;
}

/* quiet: auto's step-time decision streams many ranges at once and says
 * so in one line (auto_decide) */
void wo_sx_select_range(struct srange *r, uint32_t id, bool quiet)
{
    /* fit gave the slots' room back to weights (plan-budget.h): in place */
    if (r->streamed || !streamable(r) || wo_budget_staging_closed())
        return;
    r->streamed = true;
    wo_sx->ever_streamed = true;
    __atomic_store_n(&wo_stream_tab.e[id].streamed, 1, __ATOMIC_RELEASE);
    if (!r->host)
        wo_budget_take(id, r->gen);
    if (quiet)
        return;
    if (r->msteps)
        wo_info("stream: '%s' (%s, %llu MiB) is streamed: read %.1fx its bytes a step",
                r->name ? r->name : "(unnamed)", r->host ? "host" : "managed",
                (unsigned long long)((r->hi - r->lo) >> 20), r->gain);
    else
        wo_debug("stream: '%s' (%s, %llu MiB) is streamed (prefetch.mode stream)",
                 r->name ? r->name : "(unnamed)", r->host ? "host" : "managed",
                 (unsigned long long)((r->hi - r->lo) >> 20));
}

/* the first decisions at info, later ones (a server's batch moves) at debug */
#define AUTO_SAY(loud, ...)                                                                        \
    do {                                                                                           \
        if (loud)                                                                                  \
            wo_info(__VA_ARGS__);                                                                  \
        else                                                                                       \
            wo_debug(__VA_ARGS__);                                                                 \
    } while (0)

/* Whether the range was read in a recent step and could be streamed. */
static bool auto_recent(struct srange *r)
{
    return r->live && !r->streamed && r->msteps && r->last_step + AUTO_RECENT >= wo_sx->steps &&
           streamable(r);
}

/* auto's candidates for the step-time decision: ranges a recent step read
 * in place, that the executor can stream and did not stream for their gain
 * (those stay streamed: they save bytes whatever the time says): host
 * ranges, and managed ranges the planner's hot set does not keep on the
 * GPU (transformers' default experts backend reads a stacked tensor once
 * a step by count, per token on the GPU: the gain rule never sees it). */
static bool auto_candidate(struct srange *r, uint32_t id)
{
    if (!r->live)
        return false;
    if (r->claimed_step && r->claimed_step - 1 + AUTO_CLAIMED > wo_sx->steps)
        return false;
    if (r->probed)
        return true;
    return auto_recent(r) && (r->host || wo_budget_hot_bytes(id, r->gen) < (r->hi - r->lo) / 2);
}

/* The slots come out of the planner's budget: the bytes of managed ranges
 * its hot set keeps (and that are not streamed) beyond what is left of it
 * once `reserved` is out. */
static uint64_t hot_over(uint64_t reserved)
{
    uint64_t budget = wo_uvm_device_budget(), hot = 0;

    budget -= WO_MIN(reserved, budget);
    for (uint32_t id = 0; id < wo_sx->nr; id++)
        if (wo_sx->r[id].live && !wo_sx->r[id].host && !wo_sx->r[id].streamed)
            hot += wo_budget_hot_bytes(id, wo_sx->r[id].gen);
    return hot > budget ? hot - budget : 0;
}

/* auto by step time (stream-auto.h): stream the candidates when a step's
 * period says it pays, and back when it does not. A hot managed range the
 * slots leave no room for is streamed with them, the last of the step
 * first (llama.cpp's --n-cpu-moe keeps the first layers on the GPU too):
 * the planner would drop it, and it would be read in place. */
static void auto_decide(uint64_t t_ns, unsigned k)
{
    uint64_t cand = 0, bytes = 0, kept = wo_sx->au.kept, slot_bytes, over;
    uint64_t recheck_backs = wo_sx->au.recheck_backs, deferred = wo_sx->au.deferred;
    unsigned n = 0, nm = 0, nroom = 0;
    bool loud = wo_sx->au.tries < 3;
    enum wo_auto_action act;

    if (!wo_sx->mode.by_auto || wo_sx->slots_failed)
        return;
    slot_bytes = wo_sx_slots_bytes();
    for (uint32_t id = 0; id < wo_sx->nr; id++)
        if (auto_candidate(&wo_sx->r[id], id))
            cand += wo_sx->r[id].hi - wo_sx->r[id].lo;
    if (cand && wo_sx->au.phase == WO_AUTO_WATCH)
        cand += hot_over(slot_bytes);
    act = wo_auto_step(&wo_sx->au, t_ns, k, cand, wo_sx->link_gbs);
    if (wo_sx->au.deferred != deferred)
        add(&wo_stream_tab.n.auto_deferred, 1);
    if (act == WO_AUTO_STREAM) {
        for (uint32_t id = 0; id < wo_sx->nr; id++) {
            struct srange *r = &wo_sx->r[id];
            if (!auto_candidate(r, id) || r->probed)
                continue;
            wo_sx_select_range(r, id, true);
            if (r->streamed) {
                r->probed = true;
                n++;
                nm += !r->host;
                bytes += r->hi - r->lo;
            }
        }
        over = hot_over(slot_bytes);
        for (uint32_t i = wo_sx->norder; over && i-- > 0;) {
            uint32_t id = wo_sx->order[i];
            struct srange *r = &wo_sx->r[id];
            uint64_t hot;

            if (id >= wo_sx->nr || r->host || !auto_recent(r) ||
                !(hot = wo_budget_hot_bytes(id, r->gen)))
                continue;
            wo_sx_select_range(r, id, true);
            if (r->streamed) {
                r->probed = true;
                r->room = true;
                n++;
                nm++;
                nroom++;
                bytes += r->hi - r->lo;
                over -= WO_MIN(hot, over);
            }
        }
        wo_auto_streamed_managed(&wo_sx->au, nm > 0);
        add(&wo_stream_tab.n.auto_tries, 1);
        AUTO_SAY(
            loud,
            "stream: auto: trying %u ranges (%u managed, %u of them hot ones the slots take the "
            "room of; %llu MiB) streamed: a step took %.1f ms read in place, one copy of them "
            "takes %.1f ms at %.0f GB/s",
            n, nm, nroom, (unsigned long long)(bytes >> 20), wo_sx->au.inplace_ns / 1e6,
            (double)bytes / wo_sx->link_gbs / 1e6, wo_sx->link_gbs);
    } else if (act == WO_AUTO_UNSTREAM) {
        for (uint32_t id = 0; id < wo_sx->nr; id++)
            if (wo_sx->r[id].live && wo_sx->r[id].probed) {
                wo_sx_unselect_range(&wo_sx->r[id], id);
                n++;
            }
        if (wo_sx->au.phase == WO_AUTO_HOLD) {
            add(&wo_stream_tab.n.auto_backs, 1);
            AUTO_SAY(loud,
                     "stream: auto: %u ranges back in place: a step took %.1f ms streamed, "
                     "%.1f ms in place",
                     n, wo_sx->au.stream_ns / 1e6, wo_sx->au.inplace_ns / 1e6);
            if (wo_sx->au.no_try_before > wo_sx->au.steps)
                AUTO_SAY(wo_sx->au.fails <= WO_AUTO_FAILS_FREE + 2,
                         "stream: auto: %u tries in a row went back: the next waits %llu steps",
                         wo_sx->au.fails,
                         (unsigned long long)(wo_sx->au.no_try_before - wo_sx->au.steps));
        } else if (wo_sx->au.rechecking) {
            add(&wo_stream_tab.n.auto_rechecks, 1);
            AUTO_SAY(wo_sx->au.rechecks <= 3,
                     "stream: auto: %u ranges back in place to take the decision again (managed "
                     "ones the planner may keep): a step takes %.1f ms streamed",
                     n, wo_sx->au.left_ns / 1e6);
        } else {
            wo_debug("stream: auto: the step's period moved (%.1f ms, streamed at %.1f ms): "
                     "measuring in place again (%u ranges)",
                     wo_sx->au.ewma_ns / 1e6, wo_sx->au.decided_ns / 1e6, n);
        }
    } else if (wo_sx->au.recheck_backs != recheck_backs) {
        add(&wo_stream_tab.n.auto_backs, 1);
        AUTO_SAY(wo_sx->au.recheck_backs <= 3,
                 "stream: auto: the ranges stay in place: a step takes %.1f ms in place, it took "
                 "%.1f ms streamed",
                 wo_sx->au.inplace_ns / 1e6, wo_sx->au.left_ns / 1e6);
    } else if (wo_sx->au.kept != kept) {
        add(&wo_stream_tab.n.auto_kept, 1);
        AUTO_SAY(loud,
                 "stream: auto: the ranges stay streamed: a step takes %.1f ms streamed, %.1f ms "
                 "in place",
                 wo_sx->au.stream_ns / 1e6, wo_sx->au.inplace_ns / 1e6);
    }
}

void wo_sx_publish_names(bool force);

static void close_step(unsigned k, uint64_t t_ns)
{
    /* the first boundary closes the steps the period was learned on, and
     * everything read since the start with them: not a measurement */
    bool measure = wo_sx->steps > 0;
    const char *warn_name = NULL;
    double warn_mult = 0;
    unsigned warn_more = 0;
    uint64_t staged = 0; /* the bytes the step(s) staged */

    wo_sx->steps += k;
    add(&wo_stream_tab.n.steps, k);
    for (uint32_t id = 0; id < wo_sx->nr; id++) {
        struct srange *r = &wo_sx->r[id];
        uint64_t distinct;
        double mult, gain;

        if (!r->live)
            continue;
        r->steps_all += k;
        r->sum_staged += (double)r->staged;
        staged += r->staged;
        r->staged = 0;
        if (!r->touched || !measure) {
            r->read = 0;
            r->mask = 0;
            r->touched = false;
            continue;
        }
        /* per step: the bytes read over the distinct bytes among them */
        distinct = WO_MIN((uint64_t)__builtin_popcountll(r->mask) * granule(r), r->hi - r->lo);
        mult = distinct ? (double)r->read / (double)k / (double)distinct : 0;
        gain = (double)r->read / (double)k / (double)(r->hi - r->lo);
        r->msteps += k;
        r->last_step = wo_sx->steps;
        r->sum_mult += mult * k;
        r->sum_read += (double)r->read;
        /* a running mean while young, then recent steps weigh more */
        r->gain = r->msteps <= 4 ? r->gain + (gain - r->gain) * k / (double)r->msteps
                                 : 0.75 * r->gain + 0.25 * gain;
        /* auto: streamed for its gain, or because the engine says each
         * step whether it reads the range whole enough for a copy to pay
         * (woffload_read_in_place claims the others: the ggml hook's MoE
         * layers below a share of experts picked) */
        if (!wo_sx->slots_failed &&
            ((wo_sx->mode.by_auto &&
              ((r->msteps >= AUTO_STEPS && r->gain >= AUTO_GAIN) || claimed_ever(id))) ||
             wo_sx->mode.all)) {
            r->probed = false; /* streamed for its gain now: the step time cannot take it back */
            /* stream: also ranges that came after setup; a claimed one's
             * gain says nothing (said once, by the claims' first call) */
            wo_sx_select_range(r, id, wo_sx->mode.by_auto && claimed_ever(id));
        }
        /* the advice is a mode: under stream or auto a range read in place
         * was too large for a slot, gapped or written (said when found) */
        if (wo_sx->mode.measure_only && r->host && !r->streamed && !r->warned &&
            r->msteps >= AUTO_STEPS && r->sum_mult / (double)r->msteps >= WARN_MULT) {
            r->warned = true;
            if (!warn_name) {
                warn_name = r->name ? r->name : "(unnamed)";
                warn_mult = r->sum_mult / (double)r->msteps;
            } else {
                warn_more++;
            }
        }
        r->read = 0;
        r->mask = 0;
        r->touched = false;
    }
    if (warn_name && !wo_sx->warned) {
        /* one line for the process: the first range, and how many more */
        char more[64] = "";
        wo_sx->warned = true;
        if (warn_more)
            snprintf(more, sizeof(more), " (and %u more host ranges)", warn_more);
        wo_warn("stream: '%s' (host) is read %.1fx a step in place over PCIe%s; "
                "prefetch: {mode: auto} would copy it once a step into device slots "
                "(docs/prefetch.md, Streaming)",
                warn_name, warn_mult, more);
    }
    /* one step that staged, timed from the last boundary (k > 1: the
     * boundaries between were not seen, no period) */
    if (k == 1 && staged && wo_sx->close_ns && t_ns > wo_sx->close_ns) {
        add(&wo_stream_tab.n.staging_steps, 1);
        add(&wo_stream_tab.n.staging_step_ns, t_ns - wo_sx->close_ns);
        add(&wo_stream_tab.n.staging_step_bytes, staged);
    }
    wo_sx->close_ns = t_ns;
    /* this step's first touches are the next step's plan */
    for (uint32_t i = 0; i < wo_sx->norder; i++)
        if (wo_sx->order[i] < wo_sx->nr) {
            wo_sx->r[wo_sx->order[i]].ord = NONE;
            __atomic_store_n(&wo_stream_tab.e[wo_sx->order[i]].planned, 0, __ATOMIC_RELAXED);
        }
    memcpy(wo_sx->order, wo_sx->cur, wo_sx->ncur * sizeof(*wo_sx->cur));
    wo_sx->norder = wo_sx->ncur;
    wo_sx->ncur = 0;
    for (uint32_t i = 0; i < wo_sx->norder; i++) {
        wo_sx->r[wo_sx->order[i]].ord = i;
        __atomic_store_n(&wo_stream_tab.e[wo_sx->order[i]].planned, 1, __ATOMIC_RELAXED);
    }
    wo_sx->maxi = NONE;
    if (measure)
        auto_decide(t_ns, k);
    if (!wo_sx->slots_failed)
        wo_sx_want_sizes(); /* for what this step streamed, in its order (resize) */
    wo_sx_publish_names(false);
}

/* The consumer's copy of preload/launch.c's reads_weights(): whether
 * func's launches reached two off-device ranges or more (ids: this
 * launch's). Once ranges vary (lows_vary), a function that reached one
 * only reached it through a word that held an address by chance: a
 * libtorch kernel's unfilled struct members named the last layer's weight
 * in every layer on the Qwen3 shape (docs/prefetch.md, Streaming). */
static bool reader(uint64_t func, const uint32_t *ids, unsigned n)
{
    struct fnrec *f = NULL;
    uint64_t h = func * UINT64_C(0x9E3779B97F4A7C15);

    if (!wo_sx->fns && !(wo_sx->fns = calloc(FNS, sizeof(*wo_sx->fns))))
        return true;
    for (unsigned i = 0; i < 32 && !f; i++) {
        struct fnrec *c = &wo_sx->fns[((h >> 40) + i) & (FNS - 1)];
        if (c->func == func || !c->func)
            f = c;
    }
    if (!f)
        return true; /* table crowded: as before */
    f->func = func;
    for (unsigned i = 0; i < n && !f->many; i++) {
        if (!f->first)
            f->first = ids[i] + 1;
        else if (f->first != ids[i] + 1)
            f->many = true;
    }
    return f->many;
}

void wo_sx_on_launch(const struct wo_event *ev)
{
    uint32_t low = NONE, ids[WO_STREAM_TOUCH_MAX];
    unsigned n = 0;
    bool switched;
    unsigned k;

    if (ev->capture)
        return; /* replayed later by a graph, never redirected */
    for (unsigned i = 0; i < ev->nhits && i < WO_EV_MAX_HITS; i++) {
        const struct wo_ev_hit *h = &ev->l.hits[i];
        struct srange *r;
        uint32_t it = 0, sid;

        /* nor is a word that cannot point at a weight (core/event.h) */
        if (!wo_hit_pointer_like(h))
            continue;
        /* the allocation's span, or the sub-spans the hit overlaps */
        while ((r = wo_sx_span_next(h, &it, &sid)) && n < WO_STREAM_TOUCH_MAX) {
            /* a hit outside the span (an activation in the allocation's
             * tail) is not a weight read: it neither counts nor keys the
             * step (those move between steps, and the step would never be
             * found) */
            if (h->hi <= r->lo || h->offset >= r->hi)
                continue;
            if (!in(ids, n, sid))
                ids[n++] = sid;
        }
    }
    if (!n || (!reader(ev->l.func, ids, n) && wo_sx->keys.lows_vary))
        return;
    for (unsigned i = 0; i < ev->nhits && i < WO_EV_MAX_HITS; i++) {
        const struct wo_ev_hit *h = &ev->l.hits[i];
        struct srange *r;
        uint32_t it = 0, sid;

        while ((r = wo_sx_span_next(h, &it, &sid))) {
            if (!in(ids, n, sid))
                continue;
            account_hit(r, sid, h);
            low = WO_MIN(low, sid);
        }
    }
    /* the step's keys: plan.h (wo_stream_keys) says why by range */
    if (low == NONE)
        return;
    k = wo_stream_keys_feed(&wo_sx->keys, ev->l.func, low, &switched);
    /* from now on a launch counts only when its function reached two
     * ranges (reader(); reads_weights() in preload/launch.c) */
    if (switched)
        __atomic_store_n(&wo_stream_tab.readers, 1, __ATOMIC_RELAXED);
    if (k)
        close_step(k, ev->t_ns);
}

/* ---- per-name figures --------------------------------------------------------- */

static struct wo_board names_board = WO_BOARD_INIT(struct wo_stream_name_stats);

void wo_sx_publish_names(bool force)
{
    struct wo_board_draft d;

    if (!wo_sx || !wo_board_begin(&names_board, &d, wo_sx->nr, force))
        return;
    for (uint32_t i = 0; i < wo_sx->nr; i++) {
        const struct srange *r = &wo_sx->r[i];
        struct wo_stream_name_stats *st;

        if (!r->live || !r->msteps)
            continue;
        if (!(st = wo_board_add(&d, r->name)))
            break;
        st->multiplicity = r->sum_mult / (double)r->msteps;
        st->read_per_step = r->sum_read / (double)r->msteps;
        st->range_bytes = (double)(r->hi - r->lo);
        st->staged_per_step = r->steps_all ? r->sum_staged / (double)r->steps_all : 0;
        st->steps = r->msteps;
        st->host = r->host;
        st->streamed = r->streamed;
        st->written = r->written;
    }
    wo_board_publish(&names_board, &d, NULL, NULL);
}

struct foreach_name {
    void (*fn)(void *ud, const char *name, const struct wo_stream_name_stats *st);
    void *ud;
};

static void foreach_name(void *ud, const char *name, const void *st)
{
    struct foreach_name *f = ud;

    f->fn(f->ud, name, st);
}

void wo_stream_foreach_name(void (*fn)(void *ud, const char *name,
                                       const struct wo_stream_name_stats *st),
                            void *ud)
{
    struct foreach_name f = {fn, ud};

    wo_board_foreach(&names_board, foreach_name, &f);
}
