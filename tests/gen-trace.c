/* tests/gen-trace.c: writes a synthetic MoE-like decode trace through the
 * real trace writer (see gen-trace.h). Synthetic traces are for unit tests
 * only: the shape (a load phase, tags, a seal, repeating decode steps whose
 * expert launches touch per-expert slices of stacked expert tensors, skewed
 * routing) is realistic, the timings are made up.
 *
 * Built twice: linked into test-trace (GEN_TRACE_NO_MAIN) and as the
 * gen-trace program the replay tests and the corpus use. */
#include "gen-trace.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define GEN_STREAM UINT64_C(0x5555aaaa0010)
#define GEN_TID 4242u
#define GEN_FUNC_BASE UINT64_C(0x7f3a00000000)

enum kern {
    K_EMBED, K_RMSNORM, K_GEMM_Q, K_GEMM_K, K_GEMM_V, K_ROPE, K_ATTN, K_GEMM_O, K_ROUTER,
    K_TOPK, K_GATE_UP, K_SILU, K_DOWN, K_INDEX_ADD, K_LM_HEAD, K_ARGMAX, K_MAX
};

static const char *const kernel_names[K_MAX] = {
    [K_EMBED] = "void at::native::(anonymous namespace)::indexSelectSmallIndex<c10::BFloat16, long, unsigned int, 2, 2, -2>",
    [K_RMSNORM] = "void at::native::vectorized_elementwise_kernel<4, rms_norm_bf16>",
    [K_GEMM_Q] = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64_q",
    [K_GEMM_K] = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x32x64_k",
    [K_GEMM_V] = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x32x64_v",
    [K_ROPE] = "void at::native::elementwise_kernel<128, 2, rotary_embedding>",
    [K_ATTN] = "void pytorch_flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4>>",
    [K_GEMM_O] = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64_o",
    [K_ROUTER] = "gemv2T_kernel_val<int, int, __nv_bfloat16, float, 128, 16, 4, 4, false>",
    [K_TOPK] = "void at::native::sbtopk::gatherTopK<float, unsigned int, 2, false>",
    [K_GATE_UP] = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x128x64_gate_up",
    [K_SILU] = "void at::native::vectorized_elementwise_kernel<4, silu_and_mul>",
    [K_DOWN] = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64_down",
    [K_INDEX_ADD] = "void at::native::indexFuncLargeIndex<c10::BFloat16, long, unsigned int, 2, 2, -2, true>",
    [K_LM_HEAD] = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x64x64_lm_head",
    [K_ARGMAX] = "void at::native::reduce_kernel<512, 1, argmax>",
};

struct grange {
    uint32_t id, gen;
    uint64_t base, size;
    uint64_t at; /* its offset inside its allocation (one_buffer's tensors) */
};

struct layer {
    struct grange norm1, norm2, q, k, v, o, router, gate_up, down, kv;
};

struct gen {
    struct wo_trace *t;
    const struct wo_gen_opts *o;
    uint64_t now;
    uint64_t next_addr;
    uint64_t seq;
    uint32_t next_id;
    uint64_t rng;
    int err;
    struct grange buf; /* one_buffer: the model buffer (size 0: not made yet) */
    uint64_t buf_used;
};

static uint64_t rnd(struct gen *g)
{
    /* xorshift64*: reproducible across machines for a given seed */
    g->rng ^= g->rng >> 12;
    g->rng ^= g->rng << 25;
    g->rng ^= g->rng >> 27;
    return g->rng * UINT64_C(2685821657736338717);
}

static void check(struct gen *g, int r)
{
    if (r < 0 && !g->err)
        g->err = r;
}

static struct wo_event ev_new(struct gen *g, unsigned type)
{
    struct wo_event ev;

    memset(&ev, 0, sizeof(ev));
    ev.type = (uint16_t)type;
    ev.t_ns = g->now;
    ev.tid = GEN_TID;
    ev.stream = GEN_STREAM;
    return ev;
}

/* An allocation the engine makes while loading, optionally tagged, then
 * filled from the host. */
static void tag_and_fill(struct gen *g, const struct grange *r, const char *name, unsigned place,
                         uint32_t rule, int placeable);

static struct grange alloc(struct gen *g, uint64_t size, const char *name, unsigned place,
                           uint32_t rule, int placeable)
{
    struct grange r = {g->next_id++, 1, g->next_addr, size, 0};
    struct wo_event ev = ev_new(g, WO_EV_ALLOC);

    g->next_addr = WO_ALIGN_UP(g->next_addr + size, 2 * WO_MiB);
    ev.a.base = r.base;
    ev.a.size = size;
    ev.a.seq = ++g->seq;
    ev.a.flags = placeable ? 1u : 0u; /* WO_RANGE_PLACEABLE */
    ev.api = 1;
    check(g, wo_trace_event_ids(g->t, &ev, r.id, r.gen));
    g->now += 3000;
    if (name)
        tag_and_fill(g, &r, name, place, rule, placeable);
    return r;
}

/* one_buffer: a weight carved from the model buffer (allocated at the
 * first, `total` bytes, placeable, untagged), tagged and filled as a tensor
 * of it (ggml's 512-byte alignment between tensors) */
static struct grange carve(struct gen *g, uint64_t total, uint64_t size, const char *name,
                           unsigned place, uint32_t rule)
{
    struct grange r;

    if (!g->buf.size)
        g->buf = alloc(g, total, NULL, 0, 0, 1);
    r = (struct grange){g->buf.id, g->buf.gen, g->buf.base + g->buf_used, size, g->buf_used};
    g->buf_used = WO_ALIGN_UP(g->buf_used + size, 512);
    if (g->buf_used > total)
        g->err = -EINVAL;
    tag_and_fill(g, &r, name, place, rule, 1);
    return r;
}

static void tag_and_fill(struct gen *g, const struct grange *r, const char *name, unsigned place,
                         uint32_t rule, int placeable)
{
    struct wo_trace_tag tag = {
        .id = r->id, .gen = r->gen, .base = r->base - r->at, .offset = r->at, .size = r->size,
        .placement = place, .rule = rule,
        .flags = placeable ? WO_TRACE_TAG_PLACEABLE : 0u, .name = name,
    };
    struct wo_event ev = ev_new(g, WO_EV_TAG);

    ev.a.base = r->base;
    ev.a.size = r->size;
    check(g, wo_trace_tag(g->t, &tag));
    check(g, wo_trace_event_ids(g->t, &ev, r->id, r->gen));
    ev = ev_new(g, WO_EV_COPY);
    ev.c.dst = r->base;
    ev.c.src = UINT64_C(0x7ff000000000) + r->base % (1u << 30);
    ev.c.bytes = r->size;
    ev.c.kind = WO_COPY_H2D;
    check(g, wo_trace_event_ids(g->t, &ev, WO_TRACE_NO_ID, 0));
    /* a synchronous H2D copy at ~20 GB/s of pageable memory */
    g->now += r->size / 20;
}

struct hit {
    const struct grange *r;
    uint64_t offset, hi;
};

static void launch(struct gen *g, enum kern k, const struct hit *hits, unsigned n)
{
    struct wo_event ev = ev_new(g, WO_EV_LAUNCH);
    uint64_t func = GEN_FUNC_BASE + (uint64_t)k * 0x1000;

    if (!wo_trace_kernel_known(g->t, func))
        check(g, wo_trace_kernel(g->t, func, kernel_names[k]));
    ev.api = 9;
    ev.l.func = func;
    ev.l.grid[0] = 132;
    ev.l.grid[1] = ev.l.grid[2] = 1;
    ev.l.block[0] = 256;
    ev.l.block[1] = ev.l.block[2] = 1;
    ev.nhits = (uint16_t)n;
    for (unsigned i = 0; i < n && i < WO_EV_MAX_HITS; i++) {
        ev.l.hits[i].id = hits[i].r->id;
        ev.l.hits[i].gen = hits[i].r->gen;
        ev.l.hits[i].offset = hits[i].r->at + hits[i].offset;
        ev.l.hits[i].hi = hits[i].r->at + hits[i].hi;
    }
    check(g, wo_trace_event_ids(g->t, &ev, WO_TRACE_NO_ID, 0));
    /* host-side launch cost; the GPU runs behind */
    g->now += k == K_GATE_UP || k == K_DOWN ? 7000 : 4000;
}

/* A kernel reading a whole tensor gets its base pointer: one hit at offset 0. */
static struct hit whole(const struct grange *r)
{
    return (struct hit){r, 0, 1};
}

static struct hit slice(const struct grange *r, uint64_t off)
{
    return (struct hit){r, off, off + 1};
}

unsigned wo_gen_launches_per_step(const struct wo_gen_opts *o)
{
    return 1 + o->layers * (10 + 4 * o->topk) + 3;
}

/* Picks topk distinct experts; weights 1/(rank+1)^skew, ranks rotated per
 * layer so each layer has its own hot set. */
static void route(struct gen *g, unsigned layer, unsigned *out)
{
    const struct wo_gen_opts *o = g->o;
    double w[256], total = 0;
    unsigned e = o->experts > 256 ? 256 : o->experts;

    for (unsigned i = 0; i < e; i++) {
        unsigned rank = (i + layer * 3) % e;
        w[i] = 1.0 / pow(rank + 1.0, o->skew);
        total += w[i];
    }
    for (unsigned k = 0; k < o->topk && k < e; k++) {
        double x = (double)(rnd(g) >> 11) / 9007199254740992.0 * total;
        unsigned pick = e - 1;
        for (unsigned i = 0; i < e; i++) {
            if (w[i] == 0)
                continue;
            if (x < w[i]) {
                pick = i;
                break;
            }
            x -= w[i];
        }
        while (w[pick] == 0) /* rounding left x past the last live weight */
            pick = (pick + e - 1) % e;
        out[k] = pick;
        total -= w[pick];
        w[pick] = 0;
    }
}

/* The experts one step launches in a layer. One token: its top-k in
 * routing order (batch-1 decode). Several (continuous batching): the
 * union of every token's top-k, in expert order, each once (a grouped
 * experts path reads each picked expert once a step). Returns how many. */
static unsigned route_step(struct gen *g, unsigned layer, unsigned *out)
{
    unsigned tok[256], n = 0;
    bool picked[256] = {false};

    if (g->o->tokens <= 1) {
        route(g, layer, out);
        return g->o->topk;
    }
    for (unsigned t = 0; t < g->o->tokens; t++) {
        route(g, layer, tok);
        for (unsigned k = 0; k < g->o->topk; k++)
            picked[tok[k]] = true;
    }
    for (unsigned e = 0; e < g->o->experts && e < 256; e++)
        if (picked[e])
            out[n++] = e;
    return n;
}

int wo_gen_every_type(struct wo_trace *t)
{
    struct gen g = {.t = t, .now = UINT64_C(1000000000)};
    struct grange r = {0, 1, UINT64_C(0x7f1000000000), 64 * WO_MiB, 0};
    struct hit h = {&r, 0, 4096};

    check(&g, wo_trace_info(t, "synthetic", "tests/gen-trace --every-type: one event of each type"));
    check(&g, wo_trace_rule(t, 0, "experts"));
    for (unsigned type = 1; type < WO_EV_MAX; type++) {
        struct wo_event ev = ev_new(&g, type);
        switch (type) {
        case WO_EV_ALLOC:
        case WO_EV_FREE:
        case WO_EV_TAG:
            ev.a.base = r.base;
            ev.a.size = r.size;
            ev.a.seq = type == WO_EV_TAG ? 0 : 1;
            ev.a.flags = 1;
            if (type == WO_EV_FREE) {
                /* after everything that uses the range */
                continue;
            }
            check(&g, wo_trace_event_ids(t, &ev, r.id, r.gen));
            if (type == WO_EV_TAG) {
                struct wo_trace_tag tag = {.id = r.id, .gen = r.gen, .base = r.base, .size = r.size,
                                           .placement = WO_TRACE_PLACE_MANAGED, .rule = 0,
                                           .flags = WO_TRACE_TAG_PLACEABLE, .name = "model.layers.0.mlp.experts"};
                check(&g, wo_trace_tag(t, &tag));
            }
            break;
        case WO_EV_LAUNCH:
            launch(&g, K_GATE_UP, &h, 1);
            break;
        case WO_EV_COPY:
            ev.c.dst = r.base;
            ev.c.src = UINT64_C(0x7ff000000000);
            ev.c.bytes = r.size;
            ev.c.kind = WO_COPY_H2D;
            check(&g, wo_trace_event_ids(t, &ev, WO_TRACE_NO_ID, 0));
            break;
        case WO_EV_CAPTURE_BEGIN:
        case WO_EV_CAPTURE_END:
        case WO_EV_GRAPH_INSTANTIATE:
        case WO_EV_GRAPH_LAUNCH:
            ev.g.handle = UINT64_C(0x6000) + type;
            ev.g.aux = type == WO_EV_CAPTURE_BEGIN ? 0 : UINT64_C(0x6000) + type - 1;
            check(&g, wo_trace_event_ids(t, &ev, WO_TRACE_NO_ID, 0));
            break;
        case WO_EV_PLACE:
        case WO_EV_PREFETCH:
        case WO_EV_EVICT:
            ev.p.id = r.id;
            ev.p.gen = r.gen;
            ev.p.offset = 0;
            ev.p.bytes = 16 * WO_MiB;
            ev.p.from = type == WO_EV_EVICT ? WO_TRACE_PLACE_DEVICE : WO_TRACE_PLACE_HOST;
            ev.p.to = type == WO_EV_EVICT ? WO_TRACE_PLACE_HOST : WO_TRACE_PLACE_DEVICE;
            check(&g, wo_trace_event_ids(t, &ev, WO_TRACE_NO_ID, 0));
            break;
        default:
            check(&g, wo_trace_event_ids(t, &ev, WO_TRACE_NO_ID, 0));
            break;
        }
        g.now += 1000;
    }
    {
        struct wo_event ev = ev_new(&g, WO_EV_FREE);
        ev.a.base = r.base;
        ev.a.size = r.size;
        ev.a.seq = 1;
        check(&g, wo_trace_event_ids(t, &ev, r.id, r.gen));
    }
    return g.err;
}

int wo_gen_moe_trace(struct wo_trace *t, const struct wo_gen_opts *o)
{
    struct gen g = {.t = t, .o = o, .now = UINT64_C(1000000000), .next_addr = UINT64_C(0x7f1000000000),
                    .rng = o->seed ? o->seed : 1};
    const uint64_t H = 2048, vocab = 32000;
    uint64_t up = o->expert_mib * WO_MiB, down = up / 2;
    struct layer *L;
    struct grange embed, lm_head, final_norm, act, logits;
    uint64_t total = 0;
    char name[160];
    unsigned sel[256], nsel;

    if (o->layers == 0 || o->experts == 0 || o->topk == 0 || o->topk > o->experts ||
        o->experts > 256 || o->expert_mib == 0 || o->tokens > 4096)
        return -EINVAL;
    L = calloc(o->layers, sizeof(*L));
    if (!L)
        return -ENOMEM;

    check(&g, wo_trace_info(t, "synthetic", "tests/gen-trace: synthetic MoE decode, for unit tests only"));
    snprintf(name, sizeof(name), "layers=%u experts=%u topk=%u steps=%u expert_mib=%llu skew=%g seed=%llu",
             o->layers, o->experts, o->topk, o->steps, (unsigned long long)o->expert_mib, o->skew,
             (unsigned long long)o->seed);
    if (o->tokens > 1 || o->step_us || o->grouped) /* the older traces keep their bytes */
        snprintf(name + strlen(name), sizeof(name) - strlen(name), " tokens=%u step_us=%u%s",
                 o->tokens, o->step_us, o->grouped ? " grouped" : "");
    if (o->repeat > 1)
        snprintf(name + strlen(name), sizeof(name) - strlen(name), " repeat=%u", o->repeat);
    if (o->one_buffer)
        snprintf(name + strlen(name), sizeof(name) - strlen(name), " one_buffer");
    check(&g, wo_trace_info(t, "generator_args", name));
    check(&g, wo_trace_info(t, "gpu", "none (synthetic)"));
    check(&g, wo_trace_rule(t, 0, "experts"));
    check(&g, wo_trace_rule(t, 1, "default"));

    /* one_buffer: the model buffer's bytes, each tensor 512-byte aligned */
    if (o->one_buffer) {
        const uint64_t layer[] = {H * 2, H * H * 2, H * H / 2, H * H / 2, H * H * 2, H * 2,
                                  H * o->experts * 2, up * o->experts, down * o->experts};

        total = WO_ALIGN_UP(vocab * H * 2, 512);
        for (unsigned l = 0; l < o->layers; l++)
            for (size_t k = 0; k < WO_ARRAY_SIZE(layer); k++)
                total = WO_ALIGN_UP(total + layer[k], 512);
        total = WO_ALIGN_UP(WO_ALIGN_UP(total + H * 2, 512) + vocab * H * 2, 512);
    }
#define WEIGHT(sz, nm, place, rule)                                                                \
    (o->one_buffer ? carve(&g, total, sz, nm, place, rule) : alloc(&g, sz, nm, place, rule, 1))
    /* load: the window is open, weights are allocated, tagged, copied in */
    embed = WEIGHT(vocab * H * 2, "model.embed_tokens.weight", WO_TRACE_PLACE_DEVICE, 1);
    for (unsigned l = 0; l < o->layers; l++) {
        struct layer *y = &L[l];
#define W(field, sz, suffix, place, rule)                                                          \
    snprintf(name, sizeof(name), "model.layers.%u.%s", l, suffix);                                  \
    y->field = WEIGHT(sz, name, place, rule)
        W(norm1, H * 2, "input_layernorm.weight", WO_TRACE_PLACE_DEVICE, 1);
        W(q, H * H * 2, "self_attn.q_proj.weight", WO_TRACE_PLACE_DEVICE, 1);
        W(k, H * H / 2, "self_attn.k_proj.weight", WO_TRACE_PLACE_DEVICE, 1);
        W(v, H * H / 2, "self_attn.v_proj.weight", WO_TRACE_PLACE_DEVICE, 1);
        W(o, H * H * 2, "self_attn.o_proj.weight", WO_TRACE_PLACE_DEVICE, 1);
        W(norm2, H * 2, "post_attention_layernorm.weight", WO_TRACE_PLACE_DEVICE, 1);
        W(router, H * o->experts * 2, "mlp.gate.weight", WO_TRACE_PLACE_DEVICE, 1);
        W(gate_up, up * o->experts, "mlp.experts.gate_up_proj", WO_TRACE_PLACE_MANAGED, 0);
        W(down, down * o->experts, "mlp.experts.down_proj", WO_TRACE_PLACE_MANAGED, 0);
#undef W
    }
    final_norm = WEIGHT(H * 2, "model.norm.weight", WO_TRACE_PLACE_DEVICE, 1);
    lm_head = WEIGHT(vocab * H * 2, "lm_head.weight", WO_TRACE_PLACE_DEVICE, 1);
#undef WEIGHT
    {
        struct wo_event ev = ev_new(&g, WO_EV_SEAL);
        check(&g, wo_trace_event_ids(t, &ev, WO_TRACE_NO_ID, 0));
    }
    /* at seal the expert tensors become managed memory, on the host */
    for (unsigned l = 0; l < o->layers; l++) {
        const struct grange *rs[2] = {&L[l].gate_up, &L[l].down};
        for (int i = 0; i < 2; i++) {
            struct wo_event ev = ev_new(&g, WO_EV_PLACE);
            ev.p.id = rs[i]->id;
            ev.p.gen = rs[i]->gen;
            ev.p.offset = rs[i]->at;
            ev.p.bytes = rs[i]->size;
            ev.p.from = WO_TRACE_PLACE_DEVICE;
            ev.p.to = WO_TRACE_PLACE_MANAGED;
            check(&g, wo_trace_event_ids(t, &ev, WO_TRACE_NO_ID, 0));
        }
    }
    /* after seal: the caching allocator's blocks (not placeable, untagged) */
    for (unsigned l = 0; l < o->layers; l++)
        L[l].kv = alloc(&g, 16 * WO_MiB, NULL, 0, 0, 0);
    act = alloc(&g, 32 * WO_MiB, NULL, 0, 0, 0);
    logits = alloc(&g, vocab * 4, NULL, 0, 0, 0);

    for (unsigned s = 0; s < o->steps && !g.err; s++) {
        uint64_t token = rnd(&g) % vocab;
        struct hit h[3];

        h[0] = slice(&embed, token * H * 2);
        h[1] = whole(&act);
        launch(&g, K_EMBED, h, 2);
        for (unsigned l = 0; l < o->layers; l++) {
            struct layer *y = &L[l];
            h[0] = whole(&y->norm1);
            launch(&g, K_RMSNORM, h, 2);
            h[0] = whole(&y->q);
            launch(&g, K_GEMM_Q, h, 2);
            h[0] = whole(&y->k);
            launch(&g, K_GEMM_K, h, 2);
            h[0] = whole(&y->v);
            launch(&g, K_GEMM_V, h, 2);
            launch(&g, K_ROPE, &h[1], 1);
            h[0] = whole(&y->kv);
            launch(&g, K_ATTN, h, 2);
            g.now += (uint64_t)o->step_us * 1000 / o->layers;
            h[0] = whole(&y->o);
            launch(&g, K_GEMM_O, h, 2);
            h[0] = whole(&y->norm2);
            launch(&g, K_RMSNORM, h, 2);
            h[0] = whole(&y->router);
            launch(&g, K_ROUTER, h, 2);
            launch(&g, K_TOPK, &h[1], 1);
            nsel = route_step(&g, l, sel);
            if (o->grouped) {
                /* the routing still draws (the same random stream), but one
                 * kernel per tensor reads whatever experts it picked */
                h[0] = whole(&y->gate_up);
                launch(&g, K_GATE_UP, h, 2);
                launch(&g, K_SILU, &h[1], 1);
                h[0] = whole(&y->down);
                launch(&g, K_DOWN, h, 2);
                launch(&g, K_INDEX_ADD, &h[1], 1);
                nsel = 0;
            }
            for (unsigned k = 0; k < nsel; k++)
                for (unsigned rep = 0; rep < (o->repeat > 1 ? o->repeat : 1); rep++) {
                    h[0] = slice(&y->gate_up, sel[k] * up);
                    launch(&g, K_GATE_UP, h, 2);
                    launch(&g, K_SILU, &h[1], 1);
                    h[0] = slice(&y->down, sel[k] * down);
                    launch(&g, K_DOWN, h, 2);
                    launch(&g, K_INDEX_ADD, &h[1], 1);
                }
        }
        h[0] = whole(&final_norm);
        launch(&g, K_RMSNORM, h, 2);
        h[0] = whole(&lm_head);
        h[2] = whole(&logits);
        launch(&g, K_LM_HEAD, h, 3);
        launch(&g, K_ARGMAX, &h[2], 1);
        {
            /* the next token goes back to the host: a D2H copy and a sync */
            struct wo_event ev = ev_new(&g, WO_EV_COPY);
            ev.c.dst = UINT64_C(0x7ff0ffff0000);
            ev.c.src = logits.base;
            ev.c.bytes = 8;
            ev.c.kind = WO_COPY_D2H;
            check(&g, wo_trace_event_ids(t, &ev, WO_TRACE_NO_ID, 0));
            g.now += 1500000; /* the host waits for the GPU */
            ev = ev_new(&g, WO_EV_SYNC);
            check(&g, wo_trace_event_ids(t, &ev, WO_TRACE_NO_ID, 0));
            g.now += 20000;
        }
    }
    free(L);
    return g.err;
}

#ifndef GEN_TRACE_NO_MAIN
static int parse_u(const char *s, uint64_t max, uint64_t *ret)
{
    char *end;
    unsigned long long v;

    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno || end == s || *end || v > max)
        return -EINVAL;
    *ret = v;
    return 0;
}

int main(int argc, char **argv)
{
    struct wo_gen_opts o = WO_GEN_DEFAULTS;
    const char *out = NULL;
    struct wo_trace *t;
    int r, every = 0;

    for (int i = 1; i < argc; i++) {
        uint64_t v = 0;
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            printf("usage: gen-trace OUT [--layers N] [--experts N] [--topk N] [--steps N]\n"
                   "                 [--expert-mib N] [--skew X] [--seed N] [--tokens N]\n"
                   "                 [--step-us N] [--grouped] [--repeat N] [--one-buffer]\n"
                   "       gen-trace OUT --every-type\n"
                   "Writes a synthetic MoE decode trace (for unit tests only), or a short\n"
                   "trace with one event of every type. --tokens N routes N tokens a step\n"
                   "(continuous batching) and launches each picked expert once; --step-us N\n"
                   "adds N us of host work a step (a step of many tokens computes longer);\n"
                   "--grouped launches one kernel per expert tensor, handed its base pointer;\n"
                   "--repeat N launches each picked expert's slice N times a step (read\n"
                   "multiplicity N); --one-buffer puts every weight in one allocation, as\n"
                   "llama.cpp's model buffer, placed tensor by tensor at seal.\n");
            return 0;
        }
        if (a[0] != '-') {
            out = a;
            continue;
        }
        if (strcmp(a, "--every-type") == 0) {
            every = 1;
            continue;
        }
        if (strcmp(a, "--grouped") == 0) {
            o.grouped = true;
            continue;
        }
        if (strcmp(a, "--one-buffer") == 0) {
            o.one_buffer = true;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "gen-trace: %s needs a value\n", a);
            return 1;
        }
        if (strcmp(a, "--skew") == 0) {
            char *end;
            o.skew = strtod(argv[++i], &end);
            if (*end || o.skew < 0 || o.skew > 16) {
                fprintf(stderr, "gen-trace: --skew wants a number from 0 to 16\n");
                return 1;
            }
            continue;
        }
        if (parse_u(argv[++i], UINT32_MAX, &v) < 0) {
            fprintf(stderr, "gen-trace: %s wants a non-negative integer, got \"%s\"\n", a, argv[i]);
            return 1;
        }
        if (strcmp(a, "--layers") == 0)
            o.layers = (unsigned)v;
        else if (strcmp(a, "--experts") == 0)
            o.experts = (unsigned)v;
        else if (strcmp(a, "--topk") == 0)
            o.topk = (unsigned)v;
        else if (strcmp(a, "--steps") == 0)
            o.steps = (unsigned)v;
        else if (strcmp(a, "--expert-mib") == 0)
            o.expert_mib = v;
        else if (strcmp(a, "--seed") == 0)
            o.seed = v;
        else if (strcmp(a, "--tokens") == 0)
            o.tokens = (unsigned)v;
        else if (strcmp(a, "--step-us") == 0)
            o.step_us = (unsigned)v;
        else if (strcmp(a, "--repeat") == 0)
            o.repeat = (unsigned)v;
        else {
            fprintf(stderr, "gen-trace: unknown option %s (see --help)\n", a);
            return 1;
        }
    }
    if (!out) {
        fprintf(stderr, "usage: gen-trace OUT [options] (see --help)\n");
        return 1;
    }
    if (wo_trace_open(out, &t) < 0)
        return 1;
    r = every ? wo_gen_every_type(t) : wo_gen_moe_trace(t, &o);
    if (r == -EINVAL)
        fprintf(stderr, "gen-trace: bad options: need layers, experts, topk <= experts <= 256, "
                        "expert-mib > 0, tokens <= 4096\n");
    if (wo_trace_close(t, 0) < 0 || r < 0)
        return 1;
    return 0;
}
#endif
