/* tests/test-plan.c: the prefetch planner (uvm/plan.c) on event streams
 * built in memory: step detection, slice learning, budget, coalescing,
 * eviction choice, hot set, graphs, determinism. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "uvm/plan.h"

#define EXP (24 * WO_MiB) /* one expert's slice */
#define NEXP 16u

/* A small MoE: per layer one dense managed weight (id 10 + l) and one
 * stacked expert tensor (id 20 + l); each step every layer launches the
 * dense kernel, then `k` expert kernels. */
struct model {
    unsigned layers, k;
    uint64_t t;
    uint64_t rng;
};

static unsigned rnd(struct model *m, unsigned n)
{
    m->rng = m->rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (unsigned)((m->rng >> 33) % n);
}

static struct wo_event launch_ev(struct model *m, uint64_t func, uint32_t id, uint64_t off)
{
    struct wo_event ev;

    memset(&ev, 0, sizeof(ev));
    ev.type = WO_EV_LAUNCH;
    ev.t_ns = m->t;
    m->t += 10000;
    ev.stream = 7;
    ev.l.func = func;
    ev.nhits = 1;
    ev.l.hits[0].id = id;
    ev.l.hits[0].gen = 1;
    ev.l.hits[0].offset = off;
    ev.l.hits[0].hi = off + 1;
    return ev;
}

/* Skewed routing: expert e with weight ~ 1/(e+1)^2, top-k distinct. */
static void route(struct model *m, unsigned *sel)
{
    for (unsigned j = 0; j < m->k; j++) {
        unsigned e;
        bool dup;

        do {
            unsigned x = rnd(m, 1000);

            e = x < 500 ? 0 : x < 700 ? 1 : x < 800 ? 2 : x < 850 ? 3 : 4 + rnd(m, NEXP - 4);
            dup = false;
            for (unsigned i = 0; i < j; i++)
                dup |= sel[i] == e;
        } while (dup);
        sel[j] = e;
    }
}

static int feed_step(struct wo_plan *p, struct model *m)
{
    for (unsigned l = 0; l < m->layers; l++) {
        struct wo_event ev = launch_ev(m, 0x100, 10 + l, 0);
        unsigned sel[8];

        if (wo_plan_event(p, &ev) < 0)
            return -1;
        route(m, sel);
        for (unsigned j = 0; j < m->k; j++) {
            ev = launch_ev(m, 0x200, 20 + l, (uint64_t)sel[j] * EXP);
            if (wo_plan_event(p, &ev) < 0)
                return -1;
        }
    }
    return 0;
}

static void add_model(struct wo_plan *p, const struct model *m)
{
    for (unsigned l = 0; l < m->layers; l++) {
        assert_int_equal(wo_plan_range_add(p, 10 + l, 1, 32 * WO_MiB, 0, 0), 0);
        assert_int_equal(wo_plan_range_add(p, 20 + l, 1, NEXP * EXP, 0, 0), 0);
    }
}

static struct wo_plan *new_plan(uint64_t budget)
{
    struct wo_plan_cfg cfg;
    struct wo_plan *p = NULL;

    wo_plan_cfg_default(&cfg);
    cfg.budget = budget;
    assert_int_equal(wo_plan_new(&cfg, &p), 0);
    return p;
}

static void test_gcd_extent(void **state)
{
    (void)state;
    assert_int_equal(wo_plan_gcd(48, 36), 12);
    assert_int_equal(wo_plan_gcd(0, 5), 5);
    /* a pointer, no slice known: the rest of the range */
    assert_int_equal(wo_plan_extent_end(100, 0, 30, 31), 100);
    /* a slice: one slice from the pointer, or the span when longer */
    assert_int_equal(wo_plan_extent_end(100, 10, 30, 31), 40);
    assert_int_equal(wo_plan_extent_end(100, 10, 30, 55), 55);
    assert_int_equal(wo_plan_extent_end(100, 10, 95, 96), 100);
    assert_int_equal(wo_plan_extent_end(100, 10, 120, 121), 100);
    assert_int_equal(wo_plan_extent_end(UINT64_MAX, UINT64_MAX - 5, 10, 11), UINT64_MAX);
}

/* The one slice rule every learner calls: offset 0 teaches nothing, the
 * first non-zero offset is the slice, later ones shrink it to the gcd. */
static void test_slice_learn(void **state)
{
    (void)state;
    assert_int_equal(wo_plan_slice_learn(0, 0), 0);
    assert_int_equal(wo_plan_slice_learn(0, 96), 96);
    assert_int_equal(wo_plan_slice_learn(96, 0), 96);
    assert_int_equal(wo_plan_slice_learn(96, 64), 32);
    assert_int_equal(wo_plan_slice_learn(32, 96), 32);
}

static void test_cfg_invalid(void **state)
{
    struct wo_plan_cfg cfg;
    struct wo_plan *p = NULL;

    (void)state;
    wo_plan_cfg_default(&cfg);
    cfg.piece = 8 * WO_MiB; /* below the 16 MiB floor */
    assert_int_equal(wo_plan_new(&cfg, &p), -EINVAL);
    wo_plan_cfg_default(&cfg);
    cfg.lookahead_ranges = 0;
    cfg.lookahead_bytes = 0;
    assert_int_equal(wo_plan_new(&cfg, &p), -EINVAL);
    assert_int_equal(wo_plan_new(NULL, &p), -EINVAL);
    p = new_plan(WO_GiB);
    assert_int_equal(wo_plan_range_add(p, 1, 1, 0, 0, 0), -EINVAL);
    wo_plan_free(p);
    wo_plan_free(NULL);
}

/* A step of 4 layers whose experts repeat the same keys (A B A B ...)
 * must not be taken for a period of 2. */
static void test_stepper_inner_repeat(void **state)
{
    struct wo_stepper s;
    unsigned got[4] = {0}, boundaries = 0;
    size_t first = 0;

    (void)state;
    wo_stepper_init(&s);
    for (unsigned step = 0; step < 40; step++) {
        for (unsigned l = 0; l < 4; l++) {
            for (unsigned k = 0; k < 4; k++) {
                unsigned r1 = wo_stepper_feed(&s, wo_stepper_key(0x10, 100 + l));
                unsigned r2 = wo_stepper_feed(&s, wo_stepper_key(0x20, 200 + l));

                assert_true(r1 <= 2 && r2 == 0);
                if (r1) {
                    /* boundaries fall on the first key of a step only */
                    assert_int_equal(l, 0);
                    assert_int_equal(k, 0);
                    got[r1]++;
                    if (!boundaries++)
                        first = step;
                }
            }
        }
    }
    /* the first boundary closes the two steps it was learned on, then one
     * per step: 32 keys a step, learned after P + 256 keys (the end of
     * step 8), so step 9 begins with the first boundary */
    assert_int_equal(got[2], 1);
    assert_int_equal(first, 9);
    assert_int_equal(got[1], 40 - 10);
    wo_stepper_done(&s);
}

/* transformers' eager experts backend, as recorded on the H100: per layer
 * the k = 4 picked experts each launch gate_up then down on the layer's
 * stacked tensors (the same two keys 4 times in a row), and now and then a
 * kernel whose arguments happen to point into a managed range adds a key at
 * no fixed place. No exact period exists; the gap rule takes a cluster of
 * one layer's key as the anchor, one cluster a step, and every boundary falls
 * on that cluster's first key. */
static void test_stepper_clusters_and_noise(void **state)
{
    struct wo_stepper s;
    unsigned boundaries = 0, first_layer = 99, first_step = 0;
    uint64_t x = 5;

    (void)state;
    wo_stepper_init(&s);
    for (unsigned step = 0; step < 60; step++) {
        for (unsigned l = 0; l < 16; l++) {
            for (unsigned k = 0; k < 4; k++) {
                unsigned r1 = wo_stepper_feed(&s, wo_stepper_key(0x10, 100 + l));
                unsigned r2 = wo_stepper_feed(&s, wo_stepper_key(0x20, 200 + l));

                assert_int_equal(r2, 0);
                if (r1) {
                    assert_int_equal(k, 0); /* a cluster's first key */
                    if (first_layer == 99) {
                        first_layer = l;
                        first_step = step;
                    }
                    assert_int_equal(l, first_layer); /* one phase */
                    boundaries++;
                }
            }
            x = x * 6364136223846793005ULL + 1;
            if ((x >> 62) == 0) /* 1 in 4 layers: no two steps alike */
                assert_int_equal(wo_stepper_feed(&s, wo_stepper_key(0x30, 99)), 0);
        }
    }
    /* the exact rule never sees two steps alike; the gap rule finds the
     * steps within a few (three regular gaps), then one per step */
    assert_true(first_step <= 5);
    assert_int_equal(boundaries, 60 - first_step);
    wo_stepper_done(&s);
}

/* A phase whose keys the next phase never launches (a prefill's per-expert
 * loop, then decode with other kernels): the stepper locks onto the first
 * phase's period, and when that anchor stays away for four of its steps (at
 * least WO_STEPPER_PATIENCE keys) it finds the new phase's steps. */
static void test_stepper_phase_change(void **state)
{
    struct wo_stepper s;
    unsigned first_phase = 0, second_phase = 0, where = 999;

    (void)state;
    wo_stepper_init(&s);
    /* phase 1: 40 iterations of 100 keys, a period the exact rule finds */
    for (unsigned it = 0; it < 40; it++)
        for (unsigned k = 0; k < 100; k++)
            first_phase += wo_stepper_feed(&s, wo_stepper_key(0x500 + k, 3)) > 0;
    /* phase 2: decode steps of 8 layers x (4 x 2 expert keys + 1), other keys;
     * every boundary at one place of the step, the first key of a cluster */
    for (unsigned step = 0; step < 80; step++) {
        unsigned i = 0;

        for (unsigned l = 0; l < 8; l++) {
            for (unsigned k = 0; k < 4; k++) {
                for (unsigned j = 0; j < 2; j++, i++) {
                    if (!wo_stepper_feed(&s, wo_stepper_key(0x10 + 0x10 * j, 100 * (j + 1) + l)))
                        continue;
                    assert_int_equal(k, 0);
                    if (where == 999)
                        where = i;
                    assert_int_equal(i, where);
                    second_phase++;
                }
            }
            if (wo_stepper_feed(&s, wo_stepper_key(0x30, 300 + l))) {
                if (where == 999)
                    where = i;
                assert_int_equal(i, where);
                second_phase++;
            }
            i++;
        }
    }
    assert_true(first_phase > 20);
    /* 72 keys a step: lost after >= 1024 keys, found again within ~25 steps */
    assert_true(second_phase > 40);
    wo_stepper_done(&s);
}

/* The first forward pass is unlike the later ones (a prefill that touches
 * the same weights in the same order, plus one more), and its first key,
 * the anchor, recurs every step after: every candidate period then
 * mismatches in that first pass. The anchor never goes missing, so the
 * patience rule never starts over: a candidate's run must start again at a
 * mismatch, or no step is ever found (the gpu suite's managed MoE row: 0
 * steps in 210 forward passes). 13 ranges a step, the key by range only. */
static void test_stepper_irregular_first_pass(void **state)
{
    struct wo_stepper s;
    unsigned boundaries = 0, first = 0;

    (void)state;
    wo_stepper_init(&s);
    for (unsigned step = 0; step < 80; step++)
        for (unsigned l = 0; l < 13; l++) {
            if (step == 0 && l == 5)
                assert_int_equal(wo_stepper_feed(&s, wo_stepper_key(0, 77)), 0);
            if (wo_stepper_feed(&s, wo_stepper_key(0, 1 + 2 * l))) {
                assert_int_equal(l, 0); /* every boundary at the step's first range */
                if (!boundaries++)
                    first = step;
            }
        }
    /* a run of one period and WO_STEPPER_MIN_MATCH keys: ~21 steps in */
    assert_true(boundaries > 50);
    assert_true(first < 25);
    wo_stepper_done(&s);
}

/* A first phase with the anchor, then one of the same period without it:
 * a candidate's run in the second phase holds no anchor, so it is no step
 * (steps are counted in anchors: 0 of them a step wrapped the count), and
 * it does not hold off the patience rule, which starts over and finds the
 * second phase's steps, every boundary at one place of the period. */
static void test_stepper_anchor_gone_same_period(void **state)
{
    struct wo_stepper s;
    unsigned first = 0, second = 0, where = 999;

    (void)state;
    wo_stepper_init(&s);
    /* phase 1, 12 keys a period, too short for a step (the run needs 256) */
    for (unsigned it = 0; it < 12; it++)
        for (unsigned l = 0; l < 12; l++)
            first += wo_stepper_feed(&s, wo_stepper_key(0, 1 + l)) > 0;
    for (unsigned it = 0; it < 300; it++)
        for (unsigned l = 0; l < 12; l++)
            if (wo_stepper_feed(&s, wo_stepper_key(0, 100 + l))) {
                if (where == 999)
                    where = l;
                assert_int_equal(l, where);
                second++;
            }
    assert_int_equal(first, 0);
    /* lost after >= 1024 keys (~85 periods), found ~22 periods later */
    assert_true(second > 150);
    assert_true(s.per_step >= 1);
    wo_stepper_done(&s);
}

/* A prefill (keys that never repeat) before the decode steps: the stepper
 * gives up its first anchor and finds the decode period. */
static void test_stepper_after_prefill(void **state)
{
    struct wo_stepper s;
    unsigned boundaries = 0, phase = 99;

    (void)state;
    wo_stepper_init(&s);
    for (unsigned i = 0; i < 3000; i++)
        assert_int_equal(wo_stepper_feed(&s, wo_stepper_key(0x900 + i, 7)), 0);
    for (unsigned step = 0; step < 100; step++)
        for (unsigned l = 0; l < 8; l++) {
            unsigned r = wo_stepper_feed(&s, wo_stepper_key(0x10, 100 + l));

            assert_int_equal(wo_stepper_feed(&s, wo_stepper_key(0x20, 200 + l)), 0);
            /* wherever the new anchor fell, steps start at one phase */
            if (r && phase == 99)
                phase = l;
            if (r)
                assert_int_equal(l, phase);
            boundaries += r > 0;
        }
    /* 16 keys a step: re-anchored after the prefill, found within ~40 steps */
    assert_true(boundaries > 50);
    wo_stepper_done(&s);
}

static void test_stepper_no_period(void **state)
{
    struct wo_stepper s;
    uint64_t x = 1;

    (void)state;
    wo_stepper_init(&s);
    for (unsigned i = 0; i < 5000; i++) {
        x = x * 6364136223846793005ULL + 1;
        assert_int_equal(wo_stepper_feed(&s, wo_stepper_key(x >> 40, (uint32_t)(x >> 20) & 7)), 0);
    }
    wo_stepper_done(&s);
}

struct acts {
    uint64_t prefetched, evicted, nprefetch, nevict, steps;
    uint64_t max_resident;
    bool evict_after_prefetch; /* within one drain: an eviction after a prefetch */
    unsigned collapse, copyback;
    uint64_t small_pieces; /* prefetches below the 16 MiB floor */
};

static void drain(struct wo_plan *p, struct acts *a)
{
    struct wo_plan_action x;
    bool seen_prefetch = false;

    while (wo_plan_pop(p, &x) == 1) {
        switch (x.type) {
        case WO_PLAN_PREFETCH:
            seen_prefetch = true;
            a->prefetched += x.bytes;
            a->nprefetch++;
            if (x.bytes < 16 * WO_MiB)
                a->small_pieces++;
            break;
        case WO_PLAN_EVICT:
            if (seen_prefetch)
                a->evict_after_prefetch = true;
            a->evicted += x.bytes;
            a->nevict++;
            if (x.how == WO_PLAN_COLLAPSE)
                a->collapse++;
            else if (x.how == WO_PLAN_COPY_BACK)
                a->copyback++;
            break;
        case WO_PLAN_STEP:
            a->steps++;
            break;
        default:
            fail_msg("unknown action %u", x.type);
        }
    }
    a->max_resident = WO_MAX(a->max_resident, wo_plan_resident_bytes(p));
}

static void run(struct wo_plan *p, struct model *m, unsigned steps, struct acts *a)
{
    for (unsigned s = 0; s < steps; s++) {
        for (unsigned l = 0; l < m->layers; l++) {
            struct wo_event ev = launch_ev(m, 0x100, 10 + l, 0);
            unsigned sel[8];

            assert_int_equal(wo_plan_event(p, &ev), 0);
            drain(p, a);
            route(m, sel);
            for (unsigned j = 0; j < m->k; j++) {
                ev = launch_ev(m, 0x200, 20 + l, (uint64_t)sel[j] * EXP);
                assert_int_equal(wo_plan_event(p, &ev), 0);
                drain(p, a);
            }
        }
    }
}

static void test_budget_and_hot_set(void **state)
{
    struct model m = {.layers = 4, .k = 2, .rng = 42};
    uint64_t budget = 4 * 32 * WO_MiB + 4 * 4 * EXP; /* dense + 4 experts a layer */
    struct wo_plan *p = new_plan(budget);
    struct acts a = {0};
    struct wo_plan_stats st;
    uint64_t hits = 0, misses = 0;

    (void)state;
    add_model(p, &m);
    run(p, &m, 60, &a);
    /* steady state: count from here */
    for (unsigned l = 0; l < m.layers; l++) {
        wo_plan_range_stats(p, 20 + l, 1, &st);
        hits -= st.hits;
        misses -= st.misses;
    }
    run(p, &m, 60, &a);
    assert_true(a.max_resident <= budget);
    assert_true(a.steps > 90); /* 12 keys a step: learned after ~23 steps */
    assert_false(a.evict_after_prefetch);
    /* read-only weights are dropped by collapsing, never copied back */
    assert_int_equal(a.copyback, 0);
    /* the dense weights are used every step: resident */
    for (unsigned l = 0; l < m.layers; l++)
        assert_true(wo_plan_is_resident(p, 10 + l, 1, 0, 32 * WO_MiB));
    /* the four busiest experts (86% of the routing) are resident; the slice
     * was learned from the offsets */
    for (unsigned l = 0; l < m.layers; l++) {
        for (unsigned e = 0; e < 4; e++)
            assert_true(wo_plan_is_resident(p, 20 + l, 1, e * EXP, EXP));
        wo_plan_range_stats(p, 20 + l, 1, &st);
        hits += st.hits;
        misses += st.misses;
    }
    /* the four resident experts take ~80% of the accesses at k = 2 */
    if (!(hits > 3 * misses))
        fail_msg("hits %llu misses %llu", (unsigned long long)hits, (unsigned long long)misses);
    wo_plan_free(p);
}

/* The cost rule (uvm/cost.h) at device-facts.md's rates: a piece read
 * fewer than ~5 times a step does not pay for a cycle (load, then drop by collapse), one
 * kept resident pays within a few steps, and a resident piece's score is
 * what it saves (its move is paid). */
static void test_cost_rule(void **state)
{
    struct wo_plan_cfg cfg;
    const struct wo_plan_costs *c = &cfg.costs;
    struct wo_cost_move m = {.bytes = 64 * WO_MiB,
                             .read_bytes = 64.0 * WO_MiB,
                             .steps = 1,
                             .how = WO_PLAN_COLLAPSE,
                             .calls = 1};
    double s;

    (void)state;
    wo_plan_cfg_default(&cfg);
    /* a cycle of a piece read once: ~3x an in-place read, it never pays */
    assert_true(wo_cost_gain_s(c, &m) < 0);
    /* nor read four times (load 1/43, collapse 1/28, remap 1/25 s/GB
     * against 1/50 in place); six times a step, it does */
    m.read_bytes = 4.0 * 64 * WO_MiB;
    assert_true(wo_cost_gain_s(c, &m) < 0);
    m.read_bytes = 6.0 * 64 * WO_MiB;
    assert_true(wo_cost_gain_s(c, &m) > 0);
    /* read once a step and kept for 8 steps: it pays */
    m.read_bytes = 64.0 * WO_MiB;
    m.steps = 8;
    assert_true(wo_cost_gain_s(c, &m) > 0);
    /* ... unless its load forces out a piece read as often */
    m.evict_bytes = 64 * WO_MiB;
    m.evict_how = WO_PLAN_COLLAPSE;
    m.evict_read_bytes = 64.0 * WO_MiB;
    assert_true(wo_cost_gain_s(c, &m) < 0);
    /* a resident piece (bytes 0): what keeping it saves, no move */
    m = (struct wo_cost_move){.read_bytes = 1e9, .steps = 1, .how = WO_PLAN_COLLAPSE};
    assert_float_equal(wo_cost_gain_s(c, &m), 1e9 * (c->zc_s_per_byte - c->hbm_s_per_byte), 1e-12);
    /* copy-back drops cost more than collapses (9.6 against ~14 GB/s) */
    assert_true(wo_cost_drop_s_per_byte(c, WO_PLAN_COPY_BACK) >
                wo_cost_drop_s_per_byte(c, WO_PLAN_COLLAPSE));
    assert_float_equal(wo_cost_drop_s_per_byte(c, WO_COST_STAYS), 0, 0);
    /* a step: reads plus moves, on top of each other */
    s = wo_cost_step_s(c, 0, 1e9, 0, 0, 0, 0);
    assert_float_equal(s, 1e9 * c->zc_s_per_byte, 1e-12);
    assert_true(wo_cost_step_s(c, 1e9, 0, 1000000000, 1, 1000000000, 0) > s);
}

/* Uniform routing over more experts than the budget holds, every expert
 * read each step as a whole stacked tensor (a grouped experts kernel):
 * the planner keeps a hot set and reads the rest in place; once settled
 * it moves nothing a step, its plan beats reading in place, and it never
 * reports churn. Before the cost rule it cycled the tensors it could not
 * hold through the GPU every step (issue 22). */
static void test_no_cycling_uniform(void **state)
{
    const unsigned layers = 8;
    uint64_t t = 1000, tsz = 64 * WO_MiB;
    struct wo_plan *p = new_plan(layers * tsz / 2);
    struct wo_plan_step last, sum;
    struct wo_plan_action a;
    uint64_t steps = 0, moved = 0, in_late = 0;

    (void)state;
    for (unsigned l = 0; l < layers; l++)
        assert_int_equal(wo_plan_range_add(p, 20 + l, 1, tsz, 0, 0), 0);
    for (unsigned s = 0; s < 200; s++) {
        for (unsigned l = 0; l < layers; l++) {
            struct model m = {.t = t};
            struct wo_event ev = launch_ev(&m, 0x300, 20 + l, 0);

            /* long steps (much compute between the expert kernels): the
             * link has room, which let the old planner cycle */
            t += 5000000;
            assert_int_equal(wo_plan_event(p, &ev), 0);
            while (wo_plan_pop(p, &a) == 1)
                if (a.type == WO_PLAN_PREFETCH && s >= 100)
                    in_late += a.bytes;
        }
    }
    wo_plan_step_stats(p, &last, &sum, &steps);
    assert_true(steps > 150);
    assert_int_equal(in_late, 0);
    assert_int_equal(last.in_bytes, 0);
    assert_int_equal(last.out_bytes, 0);
    /* half resident: the plan reads half in place */
    assert_true(last.plan_s < 0.6 * last.inplace_s);
    assert_true(last.hit_bytes > 0 && last.miss_bytes > 0);
    assert_int_equal(wo_plan_churn(p, &moved), 0);
    assert_int_equal(moved, 0);
    assert_true(sum.inplace_s >= last.inplace_s);
    wo_plan_free(p);
}

/* Ranges each read many times a step (read multiplicity: a kernel per
 * token handed the whole tensor), more of them than the budget holds, and
 * room on the link: cycling pays by the cost rule, and the planner then
 * moves more than the budget within WO_PLAN_CHURN_STEPS steps, which
 * wo_plan_churn reports (the shim warns once). */
static void test_churn_reported(void **state)
{
    const unsigned n = 8, reads = 12;
    uint64_t t = 1000, tsz = 64 * WO_MiB, moved = 0;
    struct wo_plan *p = new_plan(tsz);
    struct wo_plan_step last;
    struct wo_plan_action a;

    (void)state;
    for (unsigned r = 0; r < n; r++)
        assert_int_equal(wo_plan_range_add(p, 20 + r, 1, tsz, 0, 0), 0);
    for (unsigned s = 0; s < 120; s++) {
        for (unsigned r = 0; r < n; r++) {
            for (unsigned k = 0; k < reads; k++) {
                struct model m = {.t = t};
                struct wo_event ev = launch_ev(&m, 0x400 + k, 20 + r, 0);

                t += 10000000; /* long steps: the link has room for cycling */
                assert_int_equal(wo_plan_event(p, &ev), 0);
                while (wo_plan_pop(p, &a) == 1)
                    ;
            }
        }
    }
    wo_plan_step_stats(p, &last, NULL, NULL);
    assert_true(last.in_bytes > 0);
    assert_int_equal(wo_plan_churn(p, &moved), 1);
    assert_true(moved > tsz);
    wo_plan_free(p);
}

/* Whole units move in coalesced calls: a slice smaller than the piece
 * floor goes alone, but adjacent ones are one call. */
static void test_coalescing(void **state)
{
    struct model m = {.layers = 2, .k = 4, .rng = 7};
    struct wo_plan *p = new_plan(64 * WO_GiB); /* everything fits */
    struct acts a = {0};

    (void)state;
    add_model(p, &m);
    run(p, &m, 60, &a);
    /* free room is filled: each range moves in a handful of calls, not one
     * per 2 MiB piece */
    assert_int_equal(a.evicted, 0);
    if (a.prefetched != 2 * (32 * WO_MiB + NEXP * EXP))
        fail_msg("prefetched %llu MiB in %llu calls", (unsigned long long)(a.prefetched >> 20),
                 (unsigned long long)a.nprefetch);
    assert_true(a.nprefetch <= 2 * (1 + NEXP));
    assert_int_equal(a.small_pieces, 0);
    wo_plan_free(p);
}

/* Small slices do not make small calls while there is room: a miss on a
 * 2 MiB slice prefetches a whole piece around it; without room, only what
 * fits. */
static void test_widen_small_slices(void **state)
{
    struct model m = {0};
    struct wo_plan_action x;
    struct wo_event ev;
    struct wo_plan *p;
    uint64_t got = 0;

    (void)state;
    p = new_plan(WO_GiB);
    assert_int_equal(wo_plan_range_add(p, 1, 1, 256 * WO_MiB, 0, 0), 0);
    ev = launch_ev(&m, 0x100, 1, 6 * WO_MiB); /* slice learned: 6 MiB */
    assert_int_equal(wo_plan_event(p, &ev), 0);
    ev = launch_ev(&m, 0x100, 1, 2 * WO_MiB); /* finer: 2 MiB */
    assert_int_equal(wo_plan_event(p, &ev), 0);
    {
        unsigned n = 0;

        while (wo_plan_pop(p, &x) == 1) {
            if (x.type != WO_PLAN_PREFETCH)
                continue;
            /* the first call grew to the piece; the second fills the hole
             * left before it ([0, 6) MiB), all there is */
            if (n++ == 0)
                assert_true(x.offset == 6 * WO_MiB && x.bytes >= 64 * WO_MiB);
            else
                assert_true(x.offset == 0 && x.bytes == 6 * WO_MiB);
            got += x.bytes;
        }
        assert_int_equal(n, 2);
    }
    assert_int_equal(got, wo_plan_resident_bytes(p));
    wo_plan_free(p);

    p = new_plan(4 * WO_MiB);
    assert_int_equal(wo_plan_range_add(p, 1, 1, 256 * WO_MiB, 0, 0), 0);
    ev = launch_ev(&m, 0x100, 1, 6 * WO_MiB);
    assert_int_equal(wo_plan_event(p, &ev), 0);
    ev = launch_ev(&m, 0x100, 1, 2 * WO_MiB);
    assert_int_equal(wo_plan_event(p, &ev), 0);
    while (wo_plan_pop(p, &x) == 1)
        ;
    assert_true(wo_plan_resident_bytes(p) <= 4 * WO_MiB);
    wo_plan_free(p);
}

/* Pops every action; counts the prefetches of ranges 0-3 by id. */
static void pop_prefetches(struct wo_plan *p, unsigned n[4])
{
    struct wo_plan_action x;

    while (wo_plan_pop(p, &x) == 1)
        if (x.type == WO_PLAN_PREFETCH && x.id < 4)
            n[x.id]++;
}

/* A word that cannot point at a weight (not 16-byte aligned: core/event.h)
 * is no read: it teaches no slice and moves nothing, alone or beside a real
 * pointer into another weight; an aligned one is read. */
static void test_unaligned_word_is_no_read(void **state)
{
    struct model m = {0};
    struct wo_event ev;
    struct wo_plan *p;
    unsigned n[4] = {0};

    (void)state;
    p = new_plan(WO_GiB);
    assert_int_equal(wo_plan_range_add(p, 1, 1, 256 * WO_MiB, 0, 0), 0);
    assert_int_equal(wo_plan_range_add(p, 2, 1, 32 * WO_MiB, 0, 0), 0);
    ev = launch_ev(&m, 0x100, 1, 0x1be2879); /* a constant that falls in range 1 */
    assert_int_equal(wo_plan_event(p, &ev), 0);
    ev = launch_ev(&m, 0x100, 2, 0);
    ev.nhits = 2;
    ev.l.hits[1] = (struct wo_ev_hit){1, 1, 0x1be2879, 0x1be287a};
    assert_int_equal(wo_plan_event(p, &ev), 0);
    pop_prefetches(p, n);
    assert_int_equal(n[1], 0);
    assert_true(n[2] > 0);
    assert_true(wo_plan_resident_bytes(p) > 0 && wo_plan_resident_bytes(p) <= 32 * WO_MiB);
    ev = launch_ev(&m, 0x100, 1, 0x1be2880); /* aligned: a pointer */
    assert_int_equal(wo_plan_event(p, &ev), 0);
    pop_prefetches(p, n);
    assert_true(n[1] > 0);
    wo_plan_free(p);
}

static void test_written_copy_back(void **state)
{
    struct model m = {.layers = 2, .k = 2, .rng = 3};
    uint64_t budget = 2 * 32 * WO_MiB + 2 * 3 * EXP;
    struct wo_plan *p = new_plan(budget);
    struct acts a = {0};

    (void)state;
    add_model(p, &m);
    assert_int_equal(wo_plan_range_how(p, 20, 1), WO_PLAN_COLLAPSE);
    wo_plan_range_written(p, 20, 1);
    wo_plan_range_written(p, 21, 1);
    assert_int_equal(wo_plan_range_how(p, 20, 1), WO_PLAN_COPY_BACK);
    assert_int_equal(wo_plan_range_how(p, 10, 1), WO_PLAN_COLLAPSE);
    assert_int_equal(wo_plan_range_how(p, 99, 1), WO_PLAN_HOW_NONE);
    run(p, &m, 80, &a);
    assert_true(a.max_resident <= budget);
    assert_true(a.nevict > 0);
    assert_true(a.copyback > 0);
    wo_plan_free(p);
}

static void actions_of(unsigned seed, struct wo_plan_action *out, size_t *n, size_t cap)
{
    struct model m = {.layers = 3, .k = 2, .rng = seed};
    struct wo_plan *p = new_plan(3 * 32 * WO_MiB + 3 * 2 * EXP);
    struct wo_plan_action x;

    add_model(p, &m);
    *n = 0;
    for (unsigned s = 0; s < 60; s++) {
        assert_int_equal(feed_step(p, &m), 0);
        while (wo_plan_pop(p, &x) == 1)
            if (*n < cap)
                out[(*n)++] = x;
    }
    wo_plan_free(p);
}

static void test_deterministic(void **state)
{
    static struct wo_plan_action a[4096], b[4096];
    size_t na, nb;

    (void)state;
    actions_of(11, a, &na, 4096);
    actions_of(11, b, &nb, 4096);
    assert_true(na > 10);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, na * sizeof(a[0]));
}

/* Launches recorded into a capture do not run; the graph launch replays
 * them (the planner counts their accesses then). */
static void test_graph_replay(void **state)
{
    struct model m = {.layers = 1, .k = 1};
    struct wo_plan *p = new_plan(WO_GiB);
    struct wo_plan_stats st;
    struct wo_event ev;

    (void)state;
    assert_int_equal(wo_plan_range_add(p, 10, 1, 32 * WO_MiB, 0, 0), 0);
    memset(&ev, 0, sizeof(ev));
    ev.type = WO_EV_CAPTURE_BEGIN;
    ev.stream = 7;
    ev.g.handle = 5; /* capture id */
    assert_int_equal(wo_plan_event(p, &ev), 0);
    ev = launch_ev(&m, 0x100, 10, 0);
    ev.capture = 5;
    assert_int_equal(wo_plan_event(p, &ev), 0);
    ev = launch_ev(&m, 0x100, 10, 0);
    ev.capture = 5;
    assert_int_equal(wo_plan_event(p, &ev), 0);
    wo_plan_range_stats(p, 10, 1, &st);
    assert_int_equal(st.hits + st.misses, 0);
    memset(&ev, 0, sizeof(ev));
    ev.type = WO_EV_CAPTURE_END;
    ev.stream = 7;
    ev.g.handle = 0xabc; /* graph */
    ev.g.aux = 5;
    assert_int_equal(wo_plan_event(p, &ev), 0);
    ev.type = WO_EV_GRAPH_INSTANTIATE;
    ev.g.handle = 0xe1; /* exec */
    ev.g.aux = 0xabc;
    assert_int_equal(wo_plan_event(p, &ev), 0);
    ev.type = WO_EV_GRAPH_LAUNCH;
    ev.g.handle = 0xe1;
    for (int i = 0; i < 3; i++)
        assert_int_equal(wo_plan_event(p, &ev), 0);
    wo_plan_range_stats(p, 10, 1, &st);
    assert_int_equal(st.hits + st.misses, 6);
    /* the first access missed and loaded it (free room): later ones hit */
    assert_int_equal(st.misses, 1);
    /* an unknown exec replays nothing */
    ev.g.handle = 0xe2;
    assert_int_equal(wo_plan_event(p, &ev), 0);
    wo_plan_range_stats(p, 10, 1, &st);
    assert_int_equal(st.hits + st.misses, 6);
    wo_plan_free(p);
}

static void test_remove_range(void **state)
{
    struct model m = {.layers = 2, .k = 2, .rng = 5};
    struct wo_plan *p = new_plan(2 * 32 * WO_MiB + 2 * 2 * EXP);
    struct wo_plan_action x;
    uint64_t before;

    (void)state;
    add_model(p, &m);
    for (unsigned s = 0; s < 30; s++)
        assert_int_equal(feed_step(p, &m), 0);
    while (wo_plan_pop(p, &x) == 1)
        ;
    before = wo_plan_resident_bytes(p);
    assert_true(wo_plan_is_resident(p, 10, 1, 0, 32 * WO_MiB));
    wo_plan_range_remove(p, 10, 1);
    assert_int_equal(wo_plan_resident_bytes(p), before - 32 * WO_MiB);
    assert_false(wo_plan_is_resident(p, 10, 1, 0, 1));
    for (unsigned s = 0; s < 10; s++)
        assert_int_equal(feed_step(p, &m), 0);
    while (wo_plan_pop(p, &x) == 1)
        assert_true(x.type == WO_PLAN_STEP || x.id != 10);
    wo_plan_free(p);
}

/* Random events (unknown ids, offsets past the end, stray captures and
 * graph launches, ranges added and removed): no crash, the budget holds,
 * every action names a live range inside its bounds. */
static void test_random_events(void **state)
{
    struct model m = {.rng = 99};
    struct wo_plan *p = new_plan(96 * WO_MiB);
    uint64_t sizes[8] = {0};

    (void)state;
    for (unsigned it = 0; it < 20000; it++) {
        unsigned op = rnd(&m, 100);
        uint32_t id = rnd(&m, 8);
        struct wo_event ev;
        struct wo_plan_action x;

        if (op < 3) {
            sizes[id] = (uint64_t)(1 + rnd(&m, 64)) * WO_MiB + rnd(&m, 4096);
            assert_int_equal(wo_plan_range_add(p, id, 1, sizes[id], rnd(&m, 4), (int)rnd(&m, 100)), 0);
        } else if (op < 5) {
            wo_plan_range_remove(p, id, 1);
            sizes[id] = 0;
        } else if (op < 6) {
            wo_plan_range_written(p, id, 1);
        } else {
            memset(&ev, 0, sizeof(ev));
            ev.type = op < 90 ? WO_EV_LAUNCH : WO_EV_CAPTURE_BEGIN + rnd(&m, 4);
            ev.t_ns = m.t += rnd(&m, 20000);
            ev.stream = rnd(&m, 3);
            ev.capture = rnd(&m, 4) == 0 ? rnd(&m, 3) : 0;
            ev.g.handle = rnd(&m, 3);
            ev.l.func = rnd(&m, 4);
            ev.nhits = (uint16_t)rnd(&m, WO_EV_MAX_HITS + 3);
            for (unsigned h = 0; h < WO_EV_MAX_HITS; h++) {
                ev.l.hits[h].id = rnd(&m, 10);
                ev.l.hits[h].gen = 1 + (rnd(&m, 10) == 0);
                ev.l.hits[h].offset = (uint64_t)rnd(&m, 80) * WO_MiB;
                ev.l.hits[h].hi = ev.l.hits[h].offset + rnd(&m, 3) * WO_MiB;
            }
            if (ev.type == WO_EV_GRAPH_INSTANTIATE)
                ev.g.aux = rnd(&m, 3);
            assert_int_equal(wo_plan_event(p, &ev), 0);
        }
        while (wo_plan_pop(p, &x) == 1) {
            if (x.type == WO_PLAN_STEP)
                continue;
            assert_true(x.id < 8 && sizes[x.id] > 0);
            assert_true(x.bytes > 0 && x.offset + x.bytes <= sizes[x.id]);
        }
        assert_true(wo_plan_resident_bytes(p) <= 96 * WO_MiB);
    }
    wo_plan_free(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gcd_extent),
        cmocka_unit_test(test_slice_learn),
        cmocka_unit_test(test_cfg_invalid),
        cmocka_unit_test(test_stepper_inner_repeat),
        cmocka_unit_test(test_stepper_clusters_and_noise),
        cmocka_unit_test(test_stepper_phase_change),
        cmocka_unit_test(test_stepper_after_prefill),
        cmocka_unit_test(test_stepper_irregular_first_pass),
        cmocka_unit_test(test_stepper_anchor_gone_same_period),
        cmocka_unit_test(test_stepper_no_period),
        cmocka_unit_test(test_budget_and_hot_set),
        cmocka_unit_test(test_cost_rule),
        cmocka_unit_test(test_no_cycling_uniform),
        cmocka_unit_test(test_churn_reported),
        cmocka_unit_test(test_coalescing),
        cmocka_unit_test(test_widen_small_slices),
        cmocka_unit_test(test_unaligned_word_is_no_read),
        cmocka_unit_test(test_written_copy_back),
        cmocka_unit_test(test_deterministic),
        cmocka_unit_test(test_graph_replay),
        cmocka_unit_test(test_remove_range),
        cmocka_unit_test(test_random_events),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
