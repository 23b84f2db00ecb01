/* tests/test-replay.c: the device model file and the replay core
 * (uvm/devmodel.c, tools/replay-*.c) on a synthetic MoE decode trace: the
 * lower bound never exceeds the clairvoyant schedule nor the prediction,
 * more budget never predicts slower, no prefetcher is slower than the
 * prefetcher, placements cost what the model says. */
#include <setjmp.h>
#include <stdarg.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "gen-trace.h"
#include "uvm/devmodel.h"
#include "tools/replay.h"

static void test_model_roundtrip(void **state)
{
    struct wo_devmodel a, b;
    char *buf = NULL, err[256];
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);

    (void)state;
    wo_devmodel_default(&a);
    a.zc_gbs = 47.25;
    a.pf_gbs[1] = 31;
    snprintf(a.name, sizeof(a.name), "test # not a comment");
    assert_int_equal(wo_devmodel_write(f, &a), 0);
    fclose(f);
    memset(&b, 0, sizeof(b));
    assert_int_equal(wo_devmodel_parse(buf, len, "x", &b, err, sizeof(err)), 0);
    assert_string_equal(b.name, a.name);
    assert_true(b.zc_gbs == a.zc_gbs && b.pf_gbs[1] == 31 && b.device_bytes == a.device_bytes);
    assert_true(b.collapse_gbs == a.collapse_gbs && b.sync_us == a.sync_us);
    assert_true(b.host_zc_slow == a.host_zc_slow && b.host_dma_slow == a.host_dma_slow);
    free(buf);
}

static void test_model_errors(void **state)
{
    static const struct {
        const char *text, *want;
    } bad[] = {
        {"hbm_gbs = 2000\nzc_gbs = fast\n", "x:2: zc_gbs wants a positive number"},
        {"\n\nnope = 1\n", "x:3: unknown key \"nope\""},
        {"zc_gbs = 50\nzc_gbs = 40\n", "x:2: \"zc_gbs\" given twice"},
        {"zc_gbs 50\n", "x:1: expected `key = value`"},
        {"zc_gbs = 0\n", "x:1: zc_gbs wants a positive number"},
        {"launch_us = -1\n", "x:1: launch_us wants a non-negative number"},
        {"host_zc_slowdown = 0.5\n", "x:1: host_zc_slowdown wants a factor from 1 to 100"},
    };
    struct wo_devmodel m;
    char err[256];

    (void)state;
    for (size_t i = 0; i < WO_ARRAY_SIZE(bad); i++) {
        wo_devmodel_default(&m);
        assert_int_equal(wo_devmodel_parse(bad[i].text, strlen(bad[i].text), "x", &m, err, sizeof(err)),
                         -EINVAL);
        if (strncmp(err, bad[i].want, strlen(bad[i].want)) != 0)
            fail_msg("got \"%s\", want \"%s...\"", err, bad[i].want);
    }
    /* comments, blanks and partial files keep the defaults for the rest */
    wo_devmodel_default(&m);
    assert_int_equal(wo_devmodel_parse("# c\n\n  zc_gbs = 40 # why\n", 24, "x", &m, err, sizeof(err)), 0);
    assert_true(m.zc_gbs == 40 && m.hbm_gbs == 2500);
    assert_int_equal(wo_devmodel_load("/nonexistent/model", &m, err, sizeof(err)), -ENOENT);
}

static void test_pf_curve(void **state)
{
    struct wo_devmodel m;
    double prev = 0;

    (void)state;
    wo_devmodel_default(&m);
    assert_true(wo_devmodel_pf_bps(&m, 2 * WO_MiB) == 14e9);
    assert_true(wo_devmodel_pf_bps(&m, 16 * WO_MiB) == 33e9);
    assert_true(wo_devmodel_pf_bps(&m, 4 * WO_GiB) == 47e9);
    for (uint64_t b = WO_MiB; b <= 2 * WO_GiB; b *= 2) {
        double v = wo_devmodel_pf_bps(&m, b);

        assert_true(v >= prev);
        prev = v;
    }
}

static struct wo_trace_data *make_trace(const struct wo_gen_opts *o)
{
    char path[] = "/tmp/test-replay-XXXXXX";
    int fd = mkstemp(path);
    struct wo_trace *t = NULL;
    struct wo_trace_data *d = NULL;

    assert_true(fd >= 0);
    assert_int_equal(wo_trace_open_fd(fd, path, &t), 0);
    assert_int_equal(wo_gen_moe_trace(t, o), 0);
    assert_int_equal(wo_trace_close(t, 0), 0);
    assert_int_equal(wo_trace_load(path, 0, 0, &d), 0);
    unlink(path);
    return d;
}

static void replay(const struct wo_trace_data *d, double frac, bool no_prefetch, bool all_device,
                   struct wo_replay_result *res)
{
    struct wo_devmodel m;
    struct wo_replay_opts o;
    char msg[256];

    wo_devmodel_default(&m);
    memset(&o, 0, sizeof(o));
    o.dm = &m;
    o.budget_frac = frac;
    o.no_prefetch = no_prefetch;
    o.all_device = all_device;
    o.warmup = UINT_MAX;
    if (wo_replay_run(d, &o, res, msg, sizeof(msg)) != 0)
        fail_msg("replay: %s", msg);
}

static void test_bound_properties(void **state)
{
    struct wo_gen_opts go = WO_GEN_DEFAULTS;
    struct wo_trace_data *d;
    struct wo_replay_result r[3], none, dev;
    const double fr[3] = {0.25, 0.5, 0.75};

    (void)state;
    go.layers = 4;
    go.experts = 16;
    go.topk = 2;
    go.steps = 48;
    go.expert_mib = 16;
    go.skew = 1.0;
    d = make_trace(&go);
    replay(d, 0.5, true, false, &none);
    replay(d, 0, false, true, &dev);
    assert_true(none.step_s > 0 && dev.step_s > 0);
    /* nothing managed on the device: every expert byte crosses PCIe */
    assert_true(none.zc_bytes_step > 0);
    assert_int_equal(none.prefetch_bytes_step, 0);
    assert_true(dev.zc_bytes_step == 0 && dev.managed_bytes == 0);
    for (int i = 0; i < 3; i++) {
        replay(d, fr[i], false, false, &r[i]);
        assert_true(r[i].bound_step_s > 0 && r[i].oracle_step_s > 0);
        /* a lower bound: below every schedule the model can run */
        assert_true(r[i].bound_step_s <= r[i].oracle_step_s * 1.0001);
        assert_true(r[i].bound_step_s <= r[i].step_s * 1.0001);
        /* never better than everything on the GPU */
        assert_true(r[i].oracle_step_s >= dev.step_s * 0.999);
        assert_true(r[i].step_s <= none.step_s * 1.0001);
        assert_true(r[i].max_resident <= r[i].budget);
        assert_int_equal(r[i].window_steps + r[i].warmup, r[i].steps - 2);
        if (i > 0) {
            assert_true(r[i].bound_step_s <= r[i - 1].bound_step_s * 1.0001);
            assert_true(r[i].oracle_step_s <= r[i - 1].oracle_step_s * 1.0001);
        }
    }
    for (int i = 0; i < 3; i++)
        wo_replay_result_free(&r[i]);
    wo_replay_result_free(&none);
    wo_replay_result_free(&dev);
    wo_trace_data_free(d);
}

/* The zero-copy side of the model: experts on host read only the touched
 * slices, at the model's zero-copy bandwidth. */
static void test_host_bytes(void **state)
{
    struct wo_gen_opts go = WO_GEN_DEFAULTS;
    struct wo_trace_data *d;
    struct wo_replay_result none;
    double want;

    (void)state;
    go.steps = 32;
    d = make_trace(&go);
    replay(d, 0.5, true, false, &none);
    /* per step: layers x topk x (gate_up + down) slices */
    want = (double)go.layers * go.topk * (go.expert_mib * WO_MiB * 3 / 2);
    assert_true(none.zc_bytes_step > want * 0.999 && none.zc_bytes_step < want * 1.001);
    wo_replay_result_free(&none);
    wo_trace_data_free(d);
}

/* The host's own work runs slower while the link carries the GPU's reads
 * of host memory (the model's host_zc_slowdown): a what-if that streams
 * experts over PCIe charges the host more, one with nothing on the link
 * charges nothing. */
static void test_link_slows_host(void **state)
{
    struct wo_gen_opts go = WO_GEN_DEFAULTS;
    struct wo_trace_data *d;
    struct wo_devmodel m[2];
    struct wo_replay_opts o;
    struct wo_replay_result r[2][2];
    char msg[256];

    (void)state;
    go.steps = 32;
    d = make_trace(&go);
    for (int k = 0; k < 2; k++) {
        wo_devmodel_default(&m[k]);
        if (k == 0)
            m[k].host_zc_slow = m[k].host_dma_slow = 1;
        else
            m[k].host_zc_slow = 3;
        for (int dev = 0; dev < 2; dev++) {
            memset(&o, 0, sizeof(o));
            o.dm = &m[k];
            o.no_prefetch = !dev;
            o.all_device = dev;
            o.warmup = UINT_MAX;
            if (wo_replay_run(d, &o, &r[k][dev], msg, sizeof(msg)) != 0)
                fail_msg("replay: %s", msg);
        }
    }
    assert_true(r[0][0].zc_bytes_step > 0);
    assert_true(r[1][0].cpu_step_s > r[0][0].cpu_step_s * 1.001);
    assert_true(r[1][0].step_s >= r[0][0].step_s * 0.9999);
    assert_true(r[1][1].cpu_step_s == r[0][1].cpu_step_s && r[1][1].step_s == r[0][1].step_s);
    for (int k = 0; k < 2; k++)
        for (int dev = 0; dev < 2; dev++)
            wo_replay_result_free(&r[k][dev]);
    wo_trace_data_free(d);
}

/* Read multiplicity, as the executor measures it: each picked expert's
 * slice launched three times a step reads 3x its distinct bytes, once a
 * step 1x (slices aligned to the 64 granules of the stacked tensor:
 * exactly); names no launch reads report none. */
static void test_multiplicity(void **state)
{
    struct wo_gen_opts go = WO_GEN_DEFAULTS;
    struct wo_replay_result r[2];

    (void)state;
    go.steps = 24;
    for (int k = 0; k < 2; k++) {
        struct wo_trace_data *d;
        unsigned experts = 0;

        go.repeat = k ? 3 : 1;
        d = make_trace(&go);
        replay(d, 0.5, true, false, &r[k]);
        for (size_t i = 0; i < r[k].nnames; i++) {
            const struct wo_replay_name *n = &r[k].names[i];

            if (!strstr(n->name, "experts") || n->mult_distinct <= 0)
                continue;
            experts++;
            assert_true(fabs(n->mult_read / n->mult_distinct - go.repeat) < 1e-9);
        }
        assert_true(experts >= go.layers); /* every layer's expert tensors were read */
        wo_replay_result_free(&r[k]);
        wo_trace_data_free(d);
    }
}

/* Picked staging's model (the trace's PICKS figures): a launch on an expert
 * tensor with picks reads a device buffer, and the copy of its picked rows
 * crosses the link; here every launch copies half the tensor's rows, so a
 * step moves half a tensor per launch on it, whatever slice it reads; with
 * three quarters of the rows from hot experts, a quarter of that crosses. */
static void test_picks(void **state)
{
    struct wo_gen_opts go = WO_GEN_DEFAULTS;
    struct wo_replay_result plain, pk;
    struct wo_trace_data *d;
    double want = 0;
    size_t n = 0;

    (void)state;
    go.steps = 32;
    d = make_trace(&go);
    replay(d, 0.5, true, false, &plain);
    assert_int_equal(plain.pick_bytes_step, 0);
    d->picks = calloc(d->ntags, sizeof(*d->picks));
    assert_non_null(d->picks);
    for (size_t i = 0; i < d->ntags; i++) {
        const struct wo_trace_tag *t = &d->tags[i];
        struct wo_trace_pick *p = &d->picks[n];
        uint64_t launches = 0;

        if (!strstr(t->name, "mlp.experts."))
            continue;
        for (size_t e = 0; e < d->nevents; e++) {
            const struct wo_event *ev = &d->events[e].ev;

            for (unsigned h = 0; ev->type == WO_EV_LAUNCH && h < ev->nhits; h++)
                launches += ev->l.hits[h].id == t->id && ev->l.hits[h].gen == t->gen &&
                            ev->l.hits[h].offset >= t->offset &&
                            ev->l.hits[h].offset < t->offset + t->size;
        }
        assert_true(launches > 0);
        *p = (struct wo_trace_pick){.id = t->id, .gen = t->gen, .offset = t->offset,
                                    .bytes = t->size, .n_experts = go.experts,
                                    .regs = go.steps, .staged = launches,
                                    .rows = launches * go.experts / 2};
        want += (double)wo_trace_pick_copied(p) / go.steps;
        n++;
    }
    assert_int_equal(n, 2 * go.layers);
    d->npicks = n;
    replay(d, 0.5, true, false, &pk);
    assert_true(pk.pick_bytes_step > want * 0.99 && pk.pick_bytes_step < want * 1.01);
    /* the experts' reads are the picked copies now, nothing else is off
     * the device; and half a tensor a launch is more than the one slice
     * each launch read in place */
    assert_true(fabs(pk.zc_bytes_step - pk.pick_bytes_step) < 1e-6 * want);
    assert_true(pk.zc_bytes_step > plain.zc_bytes_step);
    assert_true(pk.step_s > plain.step_s);
    /* the copy engine (WOFFLOAD_PICKS_ENGINE) moves every picked row: the
     * same bytes over the link, none read in place, at the copy engine's
     * rate before each launch, not beside it; and a quarter of them: the
     * rest read in place by the copy kernel */
    {
        struct wo_replay_result eng, part;
        double zc_s = 1.0 / 50e9, h2d_s = 1.0 / 55e9; /* the built-in model's */

        for (size_t i = 0; i < n; i++)
            d->picks[i].engine_rows = d->picks[i].rows;
        replay(d, 0.5, true, false, &eng);
        for (size_t i = 0; i < n; i++)
            d->picks[i].engine_rows = d->picks[i].rows / 4;
        replay(d, 0.5, true, false, &part);
        for (size_t i = 0; i < n; i++)
            d->picks[i].engine_rows = 0;
        print_message(
            "picked: kernels %.3f ms a step, copy engine %.3f ms, a quarter by it %.3f ms\n",
            pk.step_s * 1e3, eng.step_s * 1e3, part.step_s * 1e3);
        assert_true(eng.pick_bytes_step > want * 0.99 && eng.pick_bytes_step < want * 1.01);
        assert_true(fabs(eng.pick_engine_bytes_step - eng.pick_bytes_step) < 1e-6 * want);
        assert_true(eng.zc_bytes_step < 1e-6 * want);
        assert_true(eng.pcie_bytes_step >= eng.pick_bytes_step);
        /* the link's time moves from the zero-copy rate to the copy
         * engine's; each launch waits for its copy */
        assert_true(eng.step_s > pk.step_s * h2d_s / zc_s * 0.95);
        assert_true(eng.step_s >= want * h2d_s);
        assert_true(part.pick_engine_bytes_step > want / 4 * 0.98 &&
                    part.pick_engine_bytes_step < want / 4 * 1.02);
        assert_true(fabs(part.zc_bytes_step -
                         (part.pick_bytes_step - part.pick_engine_bytes_step)) < 1e-6 * want);
        wo_replay_result_free(&eng);
        wo_replay_result_free(&part);
    }
    /* hot experts: three quarters of the rows copied from the device, a
     * quarter over the link (the link's bytes a quarter, the step shorter) */
    {
        struct wo_replay_result hot;

        for (size_t i = 0; i < n; i++) {
            d->picks[i].hot = go.experts / 2;
            d->picks[i].hot_rows = d->picks[i].rows * 3 / 4;
        }
        replay(d, 0.5, true, false, &hot);
        assert_true(hot.pick_bytes_step > want / 4 * 0.99 && hot.pick_bytes_step < want / 4 * 1.01);
        assert_true(fabs(hot.zc_bytes_step - hot.pick_bytes_step) < 1e-6 * want);
        assert_true(hot.step_s < pk.step_s);
        wo_replay_result_free(&hot);
    }
    /* the hot sets made after the first quarter of the steps: the last
     * record's cumulative rows take in those steps, all of their rows over
     * the link (a quarter of the steps at the whole half, three quarters at
     * a quarter of it: 7/16 of the half on average); the base, the first
     * record with the last hot sets, leaves them out, and the replay sees
     * the steady quarter again */
    {
        struct wo_replay_result steady, avg;

        d->picks_base = calloc(n, sizeof(*d->picks_base));
        assert_non_null(d->picks_base);
        for (size_t i = 0; i < n; i++) {
            struct wo_trace_pick *p = &d->picks[i], *b = &d->picks_base[i];
            uint64_t first = p->staged / 4; /* launches before the hot set */

            *b = *p;
            b->regs = go.steps / 4;
            b->staged = first;
            b->rows = first * go.experts / 2;
            b->hot_rows = 0;
            p->hot_rows = (p->rows - b->rows) * 3 / 4;
        }
        replay(d, 0.5, true, false, &steady);
        assert_true(steady.pick_bytes_step > want / 4 * 0.98 &&
                    steady.pick_bytes_step < want / 4 * 1.02);
        free(d->picks_base);
        d->picks_base = NULL; /* a loader without it: the run's average */
        replay(d, 0.5, true, false, &avg);
        assert_true(avg.pick_bytes_step > want * 7 / 16 * 0.98 &&
                    avg.pick_bytes_step < want * 7 / 16 * 1.02);
        wo_replay_result_free(&steady);
        wo_replay_result_free(&avg);
    }
    wo_replay_result_free(&plain);
    wo_replay_result_free(&pk);
    wo_trace_data_free(d);
}

/* The streaming executor's model (prefetch mode stream): each expert
 * tensor crosses once a step into a slot, however often launches read it,
 * on the copy engine (no zero-copy reads of experts), never faster than the
 * copy engine allows; slower by the copy kernel (pinned_copies off), no
 * faster with fewer slots (less ahead), and faster than the same experts
 * read in place (the copy engine's rate against zero-copy reads). With the
 * engine's host work a step about as long as the copies, the copies go
 * ahead of the launches during it: the step is well below the two in
 * series (copies made only when a launch needs them would take that). */
static void stream_run(const struct wo_trace_data *d, const char *yaml, double kernel_us,
                       struct wo_replay_result *res)
{
    struct wo_devmodel m;
    struct wo_replay_opts o;
    struct wo_policy *p = NULL;
    char msg[256];

    wo_devmodel_default(&m);
    if (kernel_us > 0)
        m.kernel_us = kernel_us;
    if (wo_policy_load_buffer(yaml, strlen(yaml), "stream.yaml", NULL, &p, NULL) != 0 || !p)
        fail_msg("policy: %s", yaml);
    memset(&o, 0, sizeof(o));
    o.dm = &m;
    o.policy = p;
    o.warmup = UINT_MAX;
    if (wo_replay_run(d, &o, res, msg, sizeof(msg)) != 0)
        fail_msg("replay: %s", msg);
    wo_policy_free(p);
}

#define KERNEL_US 200.0

static void test_streaming(void **state)
{
    static const char *const pol[] = {
        /* 0: in place */
        "version: 1\nprefetch: {mode: hot-set}\n"
        "rules:\n  - {name: experts, match: experts, place: host}\n",
        /* 1: streamed from pinned copies (the default), four slots */
        "version: 1\nprefetch: {mode: stream}\n"
        "rules:\n  - {name: experts, match: experts, place: host}\n",
        /* 2: by the copy kernel */
        "version: 1\nprefetch: {mode: stream, pinned_copies: off}\n"
        "rules:\n  - {name: experts, match: experts, place: host}\n",
        /* 3: two slots */
        "version: 1\nprefetch: {mode: stream, slots: 2}\n"
        "rules:\n  - {name: experts, match: experts, place: host}\n",
    };
    struct wo_gen_opts go = WO_GEN_DEFAULTS;
    struct wo_replay_result r[4], dev, busy;
    struct wo_trace_data *d;
    struct wo_devmodel m;
    double experts, copies;

    (void)state;
    wo_devmodel_default(&m);
    go.steps = 32;
    go.grouped = true; /* launches handed the stacked tensors, as the default backend */
    go.expert_mib = 16;
    /* every layer's stacked expert tensors (as test_host_bytes counts them) */
    experts = (double)go.layers * go.experts * (go.expert_mib * WO_MiB * 3 / 2);
    copies = experts / (m.h2d_gbs * 1e9);
    d = make_trace(&go);
    /* GPU work a step about the copies' time (every kernel made longer):
     * the copies must go on while the kernels before their readers run */
    stream_run(d, "version: 1\n", KERNEL_US, &dev);
    stream_run(d, pol[1], KERNEL_US, &busy);
    assert_true(busy.step_s >= WO_MAX(copies, dev.step_s) * 0.999);
    assert_true(busy.step_s < (copies + dev.step_s) * 0.8); /* ahead of the launches */
    wo_replay_result_free(&busy);
    wo_replay_result_free(&dev);
    /* the model's own kernels: the copies bound the step */
    for (int k = 0; k < 4; k++)
        stream_run(d, pol[k], 0, &r[k]);
    assert_true(r[0].stream_bytes_step == 0 && r[0].zc_bytes_step > experts * 0.999);
    for (int k = 1; k < 4; k++) {
        assert_true(fabs(r[k].stream_bytes_step - experts) < experts * 1e-3);
        assert_true(r[k].zc_bytes_step < experts * 1e-3);
    }
    assert_true(r[1].step_s >= copies * 0.999);
    assert_true(r[2].step_s > r[1].step_s * 1.01);  /* 0.91x the rate */
    assert_true(r[3].step_s >= r[1].step_s * 0.999); /* fewer copies ahead */
    assert_true(r[1].step_s < r[0].step_s);         /* zero-copy reads are slower */
    for (int k = 0; k < 4; k++)
        wo_replay_result_free(&r[k]);
    wo_trace_data_free(d);
}

/* llama.cpp's layout: every weight a tensor of one model buffer, each
 * placed by its own rule (the shim places that buffer tag by tag). The same
 * decode with the same policy predicts the same step and the same PCIe
 * bytes as with a tensor per allocation: experts read over the link, or
 * staged each by itself (the shim's sub-spans), attention and the head
 * from the device (by the largest tag, the buffer was one placement: every
 * byte on the device, or every byte host). */
static void test_one_buffer(void **state)
{
    static const char *const pol[] = {
        "version: 1\nprefetch: {mode: hot-set}\n"
        "rules:\n  - {name: experts, match: experts, place: host}\n",
        /* the largest tensors (embedding, head) off the device, experts on */
        "version: 1\nprefetch: {mode: hot-set}\n"
        "rules:\n  - {name: big, match: [embed_tokens, lm_head], place: host}\n",
        "version: 1\n",
        /* experts staged every step: one sub-span a tensor in the buffer */
        "version: 1\nprefetch: {mode: stream}\n"
        "rules:\n  - {name: experts, match: experts, place: host}\n",
    };
    struct wo_gen_opts go = WO_GEN_DEFAULTS;
    struct wo_trace_data *d[2];
    struct wo_replay_result r[2];

    (void)state;
    go.steps = 24;
    for (int b = 0; b < 2; b++) {
        go.one_buffer = b == 1;
        d[b] = make_trace(&go);
    }
    for (size_t k = 0; k < sizeof(pol) / sizeof(pol[0]); k++) {
        for (int b = 0; b < 2; b++)
            stream_run(d[b], pol[k], 0, &r[b]);
        assert_true(fabs(r[1].zc_bytes_step - r[0].zc_bytes_step) <= r[0].zc_bytes_step * 1e-3);
        assert_true(fabs(r[1].step_s - r[0].step_s) <= r[0].step_s * 1e-3);
        if (k == 0) /* layers x topk x (gate_up + down) slices, as test_host_bytes */
            assert_true(r[1].zc_bytes_step >
                        (double)go.layers * go.topk * (go.expert_mib * WO_MiB * 3 / 2) * 0.999);
        if (k == 2)
            assert_true(r[1].zc_bytes_step == 0);
        /* every expert tensor staged once a step, nothing read in place */
        assert_true(fabs(r[1].stream_bytes_step - r[0].stream_bytes_step) <=
                    r[0].stream_bytes_step * 1e-3);
        if (k == 3)
            assert_true(r[1].stream_bytes_step >
                            (double)go.layers * go.experts * (go.expert_mib * WO_MiB * 3 / 2) * 0.999 &&
                        r[1].zc_bytes_step == 0);
        for (int b = 0; b < 2; b++)
            wo_replay_result_free(&r[b]);
    }
    for (int b = 0; b < 2; b++)
        wo_trace_data_free(d[b]);
}

/* prefetch mode auto (the default): the replay weighs the executor's
 * step-time rule on its two predictions. Stacked tensors read whole by one
 * launch each (the default backend at a batch): one copy a step beats the
 * reads in place, so streamed, as under mode stream. Each launch handed its
 * own expert's slice, 2 of 8 picked (batch 1, eager): a copy of every
 * expert takes longer than the step read in place, so in place. */
static void test_auto(void **state)
{
    static const char *const pol[] = {
        "version: 1\nprefetch: {mode: auto}\n"
        "rules:\n  - {name: experts, match: experts, place: host}\n",
        "version: 1\nprefetch: {mode: stream}\n"
        "rules:\n  - {name: experts, match: experts, place: host}\n",
        "version: 1\nprefetch: {mode: hot-set}\n"
        "rules:\n  - {name: experts, match: experts, place: host}\n",
    };
    struct wo_gen_opts go = WO_GEN_DEFAULTS;
    struct wo_replay_result r[3];
    struct wo_trace_data *d;

    (void)state;
    go.steps = 32;
    go.grouped = true;
    go.expert_mib = 16;
    d = make_trace(&go);
    for (int k = 0; k < 3; k++)
        stream_run(d, pol[k], 0, &r[k]);
    assert_true(r[0].auto_weighed && r[0].auto_streamed);
    assert_true(fabs(r[0].step_s - r[1].step_s) < r[1].step_s * 1e-6);
    assert_true(r[0].stream_bytes_step > 0);
    assert_true(fabs(r[0].auto_other_step_s - r[2].decode_step_s) < r[2].decode_step_s * 1e-6);
    assert_false(r[1].auto_weighed || r[2].auto_weighed); /* a mode named: nothing weighed */
    for (int k = 0; k < 3; k++)
        wo_replay_result_free(&r[k]);
    wo_trace_data_free(d);

    go.grouped = false;
    d = make_trace(&go);
    for (int k = 0; k < 3; k++)
        stream_run(d, pol[k], 0, &r[k]);
    assert_true(r[1].decode_step_s > r[2].decode_step_s); /* streaming would be slower */
    assert_true(r[0].auto_weighed && !r[0].auto_streamed);
    assert_true(r[0].stream_bytes_step == 0);
    assert_true(fabs(r[0].step_s - r[2].step_s) < r[2].step_s * 1e-6);
    assert_true(fabs(r[0].auto_other_step_s - r[1].decode_step_s) < r[1].decode_step_s * 1e-6);
    for (int k = 0; k < 3; k++)
        wo_replay_result_free(&r[k]);
    wo_trace_data_free(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_multiplicity),
        cmocka_unit_test(test_picks),
        cmocka_unit_test(test_streaming),
        cmocka_unit_test(test_one_buffer),
        cmocka_unit_test(test_auto),
        cmocka_unit_test(test_model_roundtrip),
        cmocka_unit_test(test_model_errors),
        cmocka_unit_test(test_pf_curve),
        cmocka_unit_test(test_bound_properties),
        cmocka_unit_test(test_host_bytes),
        cmocka_unit_test(test_link_slows_host),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
