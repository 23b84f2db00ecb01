/* tests/test-fit.c: the automatic fit (policy/fit.c and the `fit:` key):
 * classes of real tensor names (Qwen3-MoE, Mixtral, Llama, GPT-2, llama.cpp
 * spellings), the budget arithmetic, the choice (fixed, unmovable, weights,
 * skip-and-fill, determinism, equal values spread) and the key's parsing and
 * dump. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "policy/policy.h"

#define MiB WO_MiB
#define GiB WO_GiB

static void classes_of_real_names(void **state)
{
    static const struct {
        const char *name;
        int cls;
    } t[] = {
        /* Qwen3-MoE (transformers) */
        {"model.embed_tokens.weight", 5},
        {"model.layers.0.input_layernorm.weight", 0},
        {"model.layers.0.post_attention_layernorm.weight", 0},
        {"model.layers.0.self_attn.q_proj.weight", 1},
        {"model.layers.0.self_attn.k_norm.weight", 0},
        {"model.layers.0.self_attn.o_proj.weight", 1},
        {"model.layers.0.mlp.gate.weight", 0},
        {"model.layers.0.mlp.experts.gate_up_proj", 4},
        {"model.layers.0.mlp.experts.down_proj", 4},
        {"model.layers.3.mlp.experts.17.gate_proj.weight", 4},
        {"model.norm.weight", 0},
        {"lm_head.weight", 3},
        {"model.rotary_emb.inv_freq", 0},
        /* Qwen2-MoE shared expert, DeepSeek shared experts */
        {"model.layers.0.mlp.shared_expert.gate_proj.weight", 2},
        {"model.layers.0.mlp.shared_expert_gate.weight", 0},
        {"model.layers.1.mlp.shared_experts.down_proj.weight", 2},
        /* Mixtral */
        {"model.layers.5.block_sparse_moe.gate.weight", 0},
        {"model.layers.5.block_sparse_moe.experts.3.w1.weight", 4},
        {"model.layers.5.self_attn.v_proj.weight", 1},
        /* Llama (dense) */
        {"model.layers.7.mlp.gate_proj.weight", 2},
        {"model.layers.7.mlp.down_proj.weight", 2},
        {"model.layers.7.self_attn.qkv_proj.weight", 1},
        /* GPT-2 */
        {"transformer.wte.weight", 5},
        {"transformer.h.0.ln_1.weight", 0},
        {"transformer.h.0.attn.c_attn.weight", 1},
        {"transformer.h.0.attn.c_attn.bias", 0},
        {"transformer.h.0.mlp.c_fc.weight", 2},
        {"transformer.ln_f.weight", 0},
        /* llama.cpp (GGUF) */
        /* in device memory, the tied output head (its input layer is in a
         * CPU buffer): read whole each step */
        {"token_embd.weight", 3},
        {"blk.3.attn_q.weight", 1},
        {"blk.3.attn_norm.weight", 0},
        {"blk.3.ffn_gate_inp.weight", 0},
        {"blk.3.ffn_up_exps.weight", 4},
        {"blk.3.ffn_down_shexp.weight", 2},
        {"blk.3.ffn_up.weight", 2},
        {"output.weight", 3},
        {"output_norm.weight", 0},
        /* unknown */
        {"something.else", 2},
        {"", 2},
    };
    (void)state;
    for (size_t i = 0; i < WO_ARRAY_SIZE(t); i++) {
        int c = wo_fit_class(t[i].name);
        if (c != t[i].cls)
            fail_msg("%s: class %d, expected %d", t[i].name, c, t[i].cls);
    }
    assert_int_equal(wo_fit_class(NULL), 2);
}

static void budget_arithmetic(void **state)
{
    struct wo_fit f = {.enabled = true,
                       .device = {.kind = WO_BUDGET_BYTES, .bytes = 20 * GiB},
                       .keep_free = 2 * GiB,
                       .rest = WO_PLACE_HOST};
    (void)state;
    /* device less the engine's own memory */
    assert_int_equal(wo_fit_budget(&f, 80 * GiB, 80 * GiB, 3 * GiB), 17 * GiB);
    /* capped by what is free less keep_free */
    assert_int_equal(wo_fit_budget(&f, 80 * GiB, 10 * GiB, 3 * GiB), 8 * GiB);
    /* never negative */
    assert_int_equal(wo_fit_budget(&f, 80 * GiB, 80 * GiB, 30 * GiB), 0);
    assert_int_equal(wo_fit_budget(&f, 80 * GiB, 1 * GiB, 0), 0);
    /* percent of the device total: 90% of 80 GiB = 72 GiB */
    f.device = (struct wo_budget){.kind = WO_BUDGET_PERCENT, .ppm = 900000};
    assert_int_equal(wo_fit_budget(&f, 80 * GiB, 80 * GiB, 2 * GiB), 70 * GiB);
    f.keep_free = 16 * GiB;
    assert_int_equal(wo_fit_budget(&f, 80 * GiB, 80 * GiB, 2 * GiB), 64 * GiB);
    f.device.ppm = 125000; /* 12.5% */
    assert_int_equal(wo_fit_budget(&f, 80 * GiB, 80 * GiB, 0), 10 * GiB);
    assert_int_equal(wo_fit_budget(NULL, 80 * GiB, 80 * GiB, 0), 0);
    /* the reserve for the engine's allocations after seal: all of it, but
     * never more than half a budget */
    f.reserve = WO_FIT_RESERVE_DEFAULT;
    assert_int_equal(wo_fit_reserve(&f, 10 * GiB), 256 * MiB);
    assert_int_equal(wo_fit_reserve(&f, 256 * MiB), 128 * MiB);
    assert_int_equal(wo_fit_reserve(&f, 0), 0);
    f.reserve = 0;
    assert_int_equal(wo_fit_reserve(&f, 10 * GiB), 0);
    assert_int_equal(wo_fit_reserve(NULL, 10 * GiB), 0);
}

static struct wo_fit_item item(const char *name, uint64_t size, double weight)
{
    return (struct wo_fit_item){.name = name, .size = size, .weight = weight, .movable = true};
}

/* Without a trace: the classes decide; what does not fit is skipped and a
 * smaller later one fills the gap. */
static void choose_by_class_skip_and_fill(void **state)
{
    struct wo_fit f = {.enabled = true, .rest = WO_PLACE_HOST};
    struct wo_fit_item v[] = {
        item("model.embed_tokens.weight", 500 * MiB, -1),
        item("model.layers.0.mlp.experts.gate_up_proj", 800 * MiB, -1),
        item("model.layers.0.self_attn.q_proj.weight", 32 * MiB, -1),
        item("model.layers.0.input_layernorm.weight", 1 * MiB, -1),
        item("model.layers.0.mlp.experts.down_proj", 400 * MiB, -1),
        item("lm_head.weight", 500 * MiB, -1),
    };
    uint64_t c;
    (void)state;
    /* 1 + 32 (classes 0, 1), lm_head 500 (class 3) -> 533; gate_up 800 does not
     * fit in 1000 and is skipped, the smaller down 400 fills in (933);
     * embeddings (class 5) no longer fit */
    c = wo_fit_choose(&f, v, WO_ARRAY_SIZE(v), 1000 * MiB);
    assert_int_equal(c, 933 * MiB);
    assert_int_equal(v[3].out, WO_PLACE_DEVICE);
    assert_int_equal(v[2].out, WO_PLACE_DEVICE);
    assert_int_equal(v[5].out, WO_PLACE_DEVICE);
    assert_int_equal(v[1].out, WO_PLACE_HOST);
    assert_int_equal(v[4].out, WO_PLACE_DEVICE);
    assert_int_equal(v[0].out, WO_PLACE_HOST);
    /* 1400: 533 + gate_up 800 = 1333, down (400) and embeddings skipped */
    c = wo_fit_choose(&f, v, WO_ARRAY_SIZE(v), 1400 * MiB);
    assert_int_equal(c, 1333 * MiB);
    assert_int_equal(v[1].out, WO_PLACE_DEVICE);
    assert_int_equal(v[4].out, WO_PLACE_HOST);
    assert_int_equal(v[0].out, WO_PLACE_HOST);
    /* 1000 with a larger lm_head: it is skipped and the first expert fills in */
    v[5].size = 980 * MiB;
    c = wo_fit_choose(&f, v, WO_ARRAY_SIZE(v), 1000 * MiB);
    assert_int_equal(v[5].out, WO_PLACE_HOST);
    assert_int_equal(v[1].out, WO_PLACE_DEVICE); /* 33 + 800 */
    assert_int_equal(v[4].out, WO_PLACE_HOST);   /* 833 + 400 > 1000 */
    assert_int_equal(c, 833 * MiB);
    /* the rest goes where fit says */
    f.rest = WO_PLACE_MANAGED;
    wo_fit_choose(&f, v, WO_ARRAY_SIZE(v), 0);
    for (size_t i = 0; i < WO_ARRAY_SIZE(v); i++)
        assert_int_equal(v[i].out, WO_PLACE_MANAGED);
}

/* With a trace: reads per step decide first, the class breaks ties; 5%
 * apart counts as a tie. */
static void choose_by_weight(void **state)
{
    struct wo_fit f = {.enabled = true, .rest = WO_PLACE_HOST};
    struct wo_fit_item v[] = {
        item("model.layers.0.self_attn.q_proj.weight", 100 * MiB, 1.0),
        item("model.layers.0.mlp.experts.down_proj", 100 * MiB, 11.0),  /* read 11x a step */
        item("model.layers.1.mlp.experts.down_proj", 100 * MiB, 1.01),  /* ties with attention */
        item("model.layers.2.mlp.experts.down_proj", 100 * MiB, 0),     /* never read */
        item("model.layers.3.mlp.experts.down_proj", 100 * MiB, -1),    /* unknown */
    };
    (void)state;
    assert_int_equal(wo_fit_choose(&f, v, 5, 200 * MiB), 200 * MiB);
    assert_int_equal(v[1].out, WO_PLACE_DEVICE);
    assert_int_equal(v[0].out, WO_PLACE_DEVICE); /* class 1 before class 4 at the same weight */
    assert_int_equal(v[2].out, WO_PLACE_HOST);
    assert_int_equal(wo_fit_choose(&f, v, 5, 400 * MiB), 400 * MiB);
    assert_int_equal(v[2].out, WO_PLACE_DEVICE);
    assert_int_equal(v[4].out, WO_PLACE_DEVICE); /* unknown before never read */
    assert_int_equal(v[3].out, WO_PLACE_HOST);
    /* a clearly higher weight wins over the class */
    v[2].weight = 1.2;
    assert_int_equal(wo_fit_choose(&f, v, 5, 200 * MiB), 200 * MiB);
    assert_int_equal(v[2].out, WO_PLACE_DEVICE);
    assert_int_equal(v[0].out, WO_PLACE_HOST);
}

static void choose_fixed_and_unmovable(void **state)
{
    struct wo_fit f = {.enabled = true, .rest = WO_PLACE_MANAGED};
    struct wo_fit_item v[] = {
        item("a.self_attn.q_proj.weight", 300 * MiB, -1),
        item("b.mlp.experts.w1", 300 * MiB, -1),
        item("c.input_layernorm.weight", 1 * MiB, -1),
        item("d.self_attn.k_proj.weight", 100 * MiB, -1),
        item("e.mlp.experts.w2", 200 * MiB, -1),
    };
    (void)state;
    v[1].fixed = WO_PLACE_DEVICE; /* an explicit rule: charged first */
    v[4].fixed = WO_PLACE_HOST;   /* an explicit rule: kept */
    v[2].movable = false;         /* already in pinned host memory */
    /* 300 (fixed) + 300 (q) = 600; k (100) does not fit in 650 */
    assert_int_equal(wo_fit_choose(&f, v, 5, 650 * MiB), 600 * MiB);
    assert_int_equal(v[1].out, WO_PLACE_DEVICE);
    assert_int_equal(v[0].out, WO_PLACE_DEVICE);
    assert_int_equal(v[3].out, WO_PLACE_MANAGED);
    assert_int_equal(v[4].out, WO_PLACE_HOST);
    assert_int_equal(v[2].out, WO_PLACE_HOST); /* never device, even first in class */
    /* fixed device bytes are charged even over the budget; nothing else fits */
    assert_int_equal(wo_fit_choose(&f, v, 5, 100 * MiB), 300 * MiB);
    assert_int_equal(v[1].out, WO_PLACE_DEVICE);
    assert_int_equal(v[0].out, WO_PLACE_MANAGED);
    assert_int_equal(v[3].out, WO_PLACE_MANAGED);
    /* unmovable with a fixed device rule cannot honour it */
    v[2].fixed = WO_PLACE_DEVICE;
    wo_fit_choose(&f, v, 5, 10 * GiB);
    assert_int_equal(v[2].out, WO_PLACE_HOST);
}

static void choose_is_deterministic(void **state)
{
    enum { N = 200 };
    struct wo_fit f = {.enabled = true, .rest = WO_PLACE_HOST};
    struct wo_fit_item a[N], b[N];
    static char names[N][64];
    uint64_t ca, cb;
    (void)state;
    for (int i = 0; i < N; i++) {
        static const char *const kinds[] = {"self_attn.q_proj.weight", "mlp.experts.down_proj",
                                            "input_layernorm.weight", "mlp.gate_proj.weight"};
        snprintf(names[i], sizeof(names[i]), "model.layers.%d.%s", i / 4, kinds[i % 4]);
        a[i] = item(names[i], (uint64_t)(1 + (i * 37) % 11) * MiB, (i % 3) ? 1.0 : -1);
    }
    memcpy(b, a, sizeof(a));
    ca = wo_fit_choose(&f, a, N, 300 * MiB);
    cb = wo_fit_choose(&f, b, N, 300 * MiB);
    assert_int_equal(ca, cb);
    assert_true(ca <= 300 * MiB);
    for (int i = 0; i < N; i++)
        assert_int_equal(a[i].out, b[i].out);
    /* equal items: spread through the given order (ranks 0, 2, then 1),
     * or in it with in_order */
    {
        struct wo_fit_item e[] = {item("x.mlp.w", 10, -1), item("y.mlp.w", 10, -1),
                                  item("z.mlp.w", 10, -1)};
        assert_int_equal(wo_fit_choose(&f, e, 3, 20), 20);
        assert_int_equal(e[0].out, WO_PLACE_DEVICE);
        assert_int_equal(e[1].out, WO_PLACE_HOST);
        assert_int_equal(e[2].out, WO_PLACE_DEVICE);
        f.in_order = true;
        assert_int_equal(wo_fit_choose(&f, e, 3, 20), 20);
        assert_int_equal(e[0].out, WO_PLACE_DEVICE);
        assert_int_equal(e[1].out, WO_PLACE_DEVICE);
        assert_int_equal(e[2].out, WO_PLACE_HOST);
        f.in_order = false;
    }
    assert_int_equal(wo_fit_choose(&f, NULL, 0, 20), 0);
}

/* Equal-value tensors are spread through the step: 16 layers of two
 * equal-size expert tensors (one class, one weight), a budget for half of
 * them. What goes off the device is no block at the end but spread through
 * the index order; a larger budget's device set contains a smaller one's;
 * with in_order (WOFFLOAD_FIT_SPREAD=0) the first half stays, as before. */
enum { SPREAD_LAYERS = 16, SPREAD_N = 2 * SPREAD_LAYERS };

static void spread_items(struct wo_fit_item *v, double weight)
{
    static char names[SPREAD_N][64];

    for (int i = 0; i < SPREAD_N; i++) {
        snprintf(names[i], sizeof(names[i]), "model.layers.%d.mlp.experts.%s", i / 2,
                 i % 2 ? "down_proj" : "gate_up_proj");
        v[i] = item(names[i], 100 * MiB, weight);
    }
}

/* The longest run of consecutive off-device items in index order. */
static int longest_off_run(const struct wo_fit_item *v, size_t n)
{
    int run = 0, longest = 0;

    for (size_t i = 0; i < n; i++) {
        run = v[i].out == WO_PLACE_DEVICE ? 0 : run + 1;
        longest = run > longest ? run : longest;
    }
    return longest;
}

static void choose_spreads_equal_values(void **state)
{
    static const double weights[] = {-1, 1.0}; /* by class only; by reads per step */
    struct wo_fit f = {.enabled = true, .rest = WO_PLACE_HOST};
    struct wo_fit_item v[SPREAD_N], prev[SPREAD_N];
    (void)state;

    for (size_t w = 0; w < WO_ARRAY_SIZE(weights); w++) {
        int off_low = 0, off_high = 0;

        spread_items(v, weights[w]);
        f.in_order = false;
        assert_int_equal(wo_fit_choose(&f, v, SPREAD_N, SPREAD_N / 2 * 100 * MiB),
                         SPREAD_N / 2 * 100 * MiB);
        for (int i = 0; i < SPREAD_N; i++) {
            bool off = v[i].out == WO_PLACE_HOST;
            off_low += off && i < SPREAD_N / 2;
            off_high += off && i >= SPREAD_N / 2;
        }
        /* half each side, never more than 2 off the device in a row */
        assert_int_equal(off_low, SPREAD_N / 4);
        assert_int_equal(off_high, SPREAD_N / 4);
        if (longest_off_run(v, SPREAD_N) > 2)
            fail_msg("weight %g: %d off the device in a row", weights[w],
                     longest_off_run(v, SPREAD_N));
        /* every budget from none to all: spread at each (no run of off-device
         * items longer than twice the even share), and a larger budget's
         * device set contains a smaller one's */
        for (int k = 0; k <= SPREAD_N; k++) {
            int dev = 0, cap;

            assert_int_equal(wo_fit_choose(&f, v, SPREAD_N, (uint64_t)k * 100 * MiB),
                             (uint64_t)k * 100 * MiB);
            for (int i = 0; i < SPREAD_N; i++) {
                dev += v[i].out == WO_PLACE_DEVICE;
                if (k && prev[i].out == WO_PLACE_DEVICE && v[i].out != WO_PLACE_DEVICE)
                    fail_msg("budget %d: item %d left the device it had at %d", k, i, k - 1);
            }
            assert_int_equal(dev, k);
            /* twice ceil((n - k) / k), the off-device items per device one */
            cap = k ? 2 * ((SPREAD_N - 1) / k) : SPREAD_N;
            if (longest_off_run(v, SPREAD_N) > (cap > 1 ? cap : 1))
                fail_msg("budget %d: %d off the device in a row", k, longest_off_run(v, SPREAD_N));
            memcpy(prev, v, sizeof(v));
        }
        /* in_order: the registration order, the first half on the device */
        f.in_order = true;
        assert_int_equal(wo_fit_choose(&f, v, SPREAD_N, SPREAD_N / 2 * 100 * MiB),
                         SPREAD_N / 2 * 100 * MiB);
        for (int i = 0; i < SPREAD_N; i++)
            assert_int_equal(v[i].out, i < SPREAD_N / 2 ? WO_PLACE_DEVICE : WO_PLACE_HOST);
    }
    /* only equal values are spread: a clearly hotter second half comes first */
    spread_items(v, 1.0);
    for (int i = SPREAD_N / 2; i < SPREAD_N; i++)
        v[i].weight = 2.0;
    f.in_order = false;
    wo_fit_choose(&f, v, SPREAD_N, SPREAD_N / 2 * 100 * MiB);
    for (int i = 0; i < SPREAD_N; i++)
        assert_int_equal(v[i].out, i < SPREAD_N / 2 ? WO_PLACE_HOST : WO_PLACE_DEVICE);
}

/* By layer (fit->by_layer, WOFFLOAD_FIT_LAYERS=1): 16 layers of three
 * equal expert tensors, as llama.cpp's GGUF names them. At every budget a
 * multiple of a layer's bytes what leaves the device is whole layers,
 * spread through the step (never two neighbours off while one layer in two
 * stays), and a larger budget's device set contains a smaller one's; by
 * tensor the same budget splits layers. */
enum { BYLAYER_LAYERS = 16, BYLAYER_N = 3 * BYLAYER_LAYERS };

static void choose_by_layer_takes_whole_layers(void **state)
{
    static const char *const kind[] = {"gate", "up", "down"};
    static char names[BYLAYER_N][48];
    struct wo_fit f = {.enabled = true, .rest = WO_PLACE_HOST, .by_layer = true};
    struct wo_fit_item v[BYLAYER_N];
    bool prev[BYLAYER_LAYERS] = {false};
    int split = 0;
    (void)state;

    for (int i = 0; i < BYLAYER_N; i++) {
        snprintf(names[i], sizeof(names[i]), "blk.%d.ffn_%s_exps.weight", i / 3, kind[i % 3]);
        v[i] = item(names[i], 384 * MiB, -1);
    }
    for (int k = 0; k <= BYLAYER_LAYERS; k++) {
        bool dev[BYLAYER_LAYERS];
        int ndev = 0;

        assert_int_equal(wo_fit_choose(&f, v, BYLAYER_N, (uint64_t)k * 3 * 384 * MiB),
                         (uint64_t)k * 3 * 384 * MiB);
        for (int l = 0; l < BYLAYER_LAYERS; l++) {
            enum wo_placement o = v[3 * l].out;
            assert_int_equal(v[3 * l + 1].out, o);
            assert_int_equal(v[3 * l + 2].out, o);
            dev[l] = o == WO_PLACE_DEVICE;
            ndev += dev[l];
            if (prev[l] && !dev[l])
                fail_msg("budget %d layers: layer %d left the device", k, l);
        }
        assert_int_equal(ndev, k);
        if (k == BYLAYER_LAYERS / 2)
            for (int l = 0; l + 1 < BYLAYER_LAYERS; l++)
                if (!dev[l] && !dev[l + 1])
                    fail_msg("half the layers: layers %d and %d both off the device", l, l + 1);
        memcpy(prev, dev, sizeof(prev));
    }
    /* by tensor, nine layers' bytes leave some layers split */
    f.by_layer = false;
    wo_fit_choose(&f, v, BYLAYER_N, 9ull * 3 * 384 * MiB);
    for (int l = 0; l < BYLAYER_LAYERS; l++)
        split += v[3 * l].out != v[3 * l + 1].out || v[3 * l].out != v[3 * l + 2].out;
    if (!split)
        fail_msg("by tensor: no layer split (the by-layer check above would prove nothing)");
    /* in_order wins over by_layer: the engine's order, the first four on the device */
    f.by_layer = true;
    f.in_order = true;
    wo_fit_choose(&f, v, BYLAYER_N, 4 * 384 * MiB);
    for (int i = 0; i < BYLAYER_N; i++)
        assert_int_equal(v[i].out, i < 4 ? WO_PLACE_DEVICE : WO_PLACE_HOST);
}

/* The picked copies' room: buffers of the largest routed-experts tensor
 * off the device; llama.cpp's (GGUF) ones only where the ggml hook
 * registers picks for them. */
static void picks_room(void **state)
{
    struct wo_fit_item v[] = {
        {"model.layers.0.mlp.experts.gate_up_proj", 96 * MiB, -1, WO_PLACE_UNSET, true,
         WO_PLACE_HOST},
        {"model.layers.1.mlp.experts.gate_up_proj", 128 * MiB, -1, WO_PLACE_UNSET, true,
         WO_PLACE_DEVICE},
        {"blk.0.ffn_up_exps.weight", 64 * MiB, -1, WO_PLACE_UNSET, true, WO_PLACE_HOST},
        {"model.layers.0.self_attn.o_proj.weight", 256 * MiB, -1, WO_PLACE_UNSET, true,
         WO_PLACE_HOST},
    };
    (void)state;

    assert_true(wo_gguf_experts_name("blk.0.ffn_up_exps.weight"));
    assert_true(wo_gguf_experts_name("blk.12.ffn_down_exps.weight"));
    assert_false(wo_gguf_experts_name("blk.0.ffn_up_shexp.weight"));
    assert_false(wo_gguf_experts_name("model.layers.0.mlp.experts.gate_up_proj"));
    assert_false(wo_gguf_experts_name(NULL));
    /* the 96 MiB one: the 128 MiB one stays on the device, attention is no expert */
    assert_int_equal(wo_fit_picks_room(v, 4, 3, true), 3 * 96 * MiB);
    assert_int_equal(wo_fit_picks_room(v, 4, 3, false), 3 * 96 * MiB);
    /* GGUF only: its room only where the ggml hook registers picks */
    assert_int_equal(wo_fit_picks_room(v + 2, 2, 3, true), 3 * 64 * MiB);
    assert_int_equal(wo_fit_picks_room(v + 2, 2, 3, false), 0);
    assert_int_equal(wo_fit_picks_room(NULL, 0, 3, true), 0);
}

static struct wo_policy *load(const char *yaml, struct wo_diags *d)
{
    struct wo_policy *p = NULL;
    memset(d, 0, sizeof(*d));
    wo_policy_load_buffer(yaml, strlen(yaml), "t.yaml", NULL, &p, d);
    return p;
}

static void expect_error(const char *yaml, unsigned line, unsigned col, const char *sub)
{
    struct wo_diags d;
    struct wo_policy *p = load(yaml, &d);
    bool found = false;
    assert_null(p);
    for (size_t i = 0; i < d.n; i++)
        found |= d.v[i].line == line && d.v[i].column == col &&
                 d.v[i].severity == WO_DIAG_ERROR && strstr(d.v[i].message, sub);
    if (!found) {
        wo_diags_print(&d, stderr);
        fail_msg("no error at %u:%u containing '%s'", line, col, sub);
    }
    wo_diags_clear(&d);
}

static void key_parses_and_dumps(void **state)
{
    struct wo_diags d;
    struct wo_policy *p;
    const struct wo_policy_globals *g;
    char *buf = NULL;
    size_t len = 0;
    FILE *f;
    (void)state;

    /* absent: disabled, defaults */
    p = load("rules: []\n", &d);
    assert_non_null(p);
    g = wo_policy_globals(p);
    assert_false(g->fit.enabled);
    assert_true(wo_policy_passthrough(p));
    assert_int_equal(g->prefetch.mode, WO_PREFETCH_MODE_AUTO); /* the default, fit: or not */
    p = wo_policy_free(p);
    wo_diags_clear(&d);

    /* short form */
    p = load("fit: 90%\n", &d);
    assert_non_null(p);
    g = wo_policy_globals(p);
    assert_true(g->fit.enabled);
    assert_int_equal(g->fit.device.kind, WO_BUDGET_PERCENT);
    assert_int_equal(g->fit.device.ppm, 900000);
    assert_int_equal(g->fit.keep_free, WO_FIT_KEEP_FREE_DEFAULT);
    assert_int_equal(g->fit.reserve, WO_FIT_RESERVE_DEFAULT);
    assert_int_equal(g->fit.rest, WO_PLACE_HOST);
    assert_false(wo_policy_passthrough(p)); /* fit places: the window opens at start */
    assert_int_equal(g->window.open, WO_WINDOW_OPEN_AT_START);
    /* auto, the default (under fit: as everywhere), unless the policy names one */
    assert_int_equal(g->prefetch.mode, WO_PREFETCH_MODE_AUTO);
    p = wo_policy_free(p);
    wo_diags_clear(&d);
    p = load("fit: 90%\nprefetch: {mode: hot-set}\n", &d);
    assert_non_null(p);
    assert_int_equal(wo_policy_globals(p)->prefetch.mode, WO_PREFETCH_MODE_HOT_SET);
    p = wo_policy_free(p);
    wo_diags_clear(&d);
    p = load("prefetch: {mode: hot-set}\nfit: 90%\n", &d);
    assert_non_null(p);
    assert_int_equal(wo_policy_globals(p)->prefetch.mode, WO_PREFETCH_MODE_HOT_SET);
    p = wo_policy_free(p);
    wo_diags_clear(&d);

    /* long form, dumped and loaded back */
    p = load("fit:\n  device: 20GiB\n  keep_free: 1.5GiB\n  rest: managed\n  reserve: 512MiB\n", &d);
    assert_non_null(p);
    g = wo_policy_globals(p);
    assert_int_equal(g->fit.device.kind, WO_BUDGET_BYTES);
    assert_int_equal(g->fit.device.bytes, 20 * GiB);
    assert_int_equal(g->fit.keep_free, 3 * GiB / 2);
    assert_int_equal(g->fit.rest, WO_PLACE_MANAGED);
    assert_int_equal(g->fit.reserve, 512 * MiB);
    f = open_memstream(&buf, &len);
    assert_int_equal(wo_policy_dump(p, f), 0);
    fclose(f);
    assert_non_null(strstr(buf, "fit:\n  device: 21474836480\n  keep_free: 1610612736\n  reserve: "
                                "536870912\n  rest: managed\n"));
    p = wo_policy_free(p);
    wo_diags_clear(&d);
    p = load(buf, &d);
    assert_non_null(p);
    assert_int_equal(wo_policy_globals(p)->fit.keep_free, 3 * GiB / 2);
    assert_int_equal(wo_policy_globals(p)->fit.rest, WO_PLACE_MANAGED);
    assert_int_equal(wo_policy_globals(p)->fit.reserve, 512 * MiB);
    p = wo_policy_free(p);
    wo_diags_clear(&d);
    free(buf);

    /* errors, located */
    expect_error("fit: 20GX\n", 1, 6, "expected a size");
    expect_error("fit: 0\n", 1, 6, "expected more than 0 bytes");
    expect_error("fit: 0%\n", 1, 6, "expected more than 0%");
    expect_error("fit: 101%\n", 1, 6, "expected a percentage from 0% to 100%");
    expect_error("fit:\n  device: 2GiB\n  keep_free: 2GiB\n", 3, 14, "expected keep_free below device");
    expect_error("fit:\n  device: 2GiB\n  rest: device\n", 3, 9, "expected host or managed");
    expect_error("fit:\n  device: 2GiB\n  kep_free: 1GiB\n", 3, 3, "did you mean 'keep_free'?");
    expect_error("fit:\n  rest: host\n", 2, 3, "without 'device'");
    expect_error("fit:\n  device: 2GiB\n  keep_free: -1\n", 3, 14, "negative size");
    expect_error("fit:\n  device: 2GiB\n  reserve: lots\n", 3, 12, "expected a size");
    expect_error("fit:\n  device: 2GiB\n  reserv: 1GiB\n", 3, 3, "did you mean 'reserve'?");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(classes_of_real_names),
        cmocka_unit_test(budget_arithmetic),
        cmocka_unit_test(choose_by_class_skip_and_fill),
        cmocka_unit_test(choose_by_weight),
        cmocka_unit_test(choose_fixed_and_unmovable),
        cmocka_unit_test(choose_is_deterministic),
        cmocka_unit_test(choose_spreads_equal_values),
        cmocka_unit_test(choose_by_layer_takes_whole_layers),
        cmocka_unit_test(picks_room),
        cmocka_unit_test(key_parses_and_dumps),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
