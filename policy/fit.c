/* policy/fit.c: the automatic fit's choice (the policy's `fit:` key), pure:
 * which tensors stay on the device within a byte budget. The shim (uvm/)
 * feeds it the names it has seen; `woffload-policy fit` feeds it a trace's
 * names with their reads per step. No CUDA, no I/O. */
#include <limits.h>
#include <math.h>
#include <string.h>

#include "policy/policy-internal.h"

/* ---- classes from names ---- */

/* The name's dot-separated components, each tested by fn; true when one holds. */
static bool any_component(const char *name, bool (*fn)(const char *c, size_t len))
{
    const char *p = name;
    while (*p) {
        const char *e = strchr(p, '.');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len && fn(p, len))
            return true;
        if (!e)
            break;
        p = e + 1;
    }
    return false;
}

static bool is(const char *c, size_t len, const char *word)
{
    return strlen(word) == len && memcmp(c, word, len) == 0;
}

static bool has(const char *c, size_t len, const char *sub)
{
    size_t n = strlen(sub);
    for (size_t i = 0; i + n <= len; i++)
        if (memcmp(c + i, sub, n) == 0)
            return true;
    return false;
}

static bool ends(const char *c, size_t len, const char *suf)
{
    size_t n = strlen(suf);
    return len >= n && memcmp(c + len - n, suf, n) == 0;
}

/* Small tensors every token reads: norms, biases, routers, rotary tables. */
static bool small_comp(const char *c, size_t len)
{
    return has(c, len, "norm") || is(c, len, "bias") || ends(c, len, "_bias") ||
           is(c, len, "ln_1") || is(c, len, "ln_2") || is(c, len, "ln_f") ||
           is(c, len, "gate") || is(c, len, "router") || is(c, len, "ffn_gate_inp") ||
           is(c, len, "shared_expert_gate") || is(c, len, "inv_freq") ||
           is(c, len, "rotary_emb");
}

static bool embed_comp(const char *c, size_t len)
{
    return is(c, len, "embed_tokens") || is(c, len, "wte") || is(c, len, "wpe") ||
           is(c, len, "tok_embeddings") || is(c, len, "word_embeddings") || is(c, len, "embed_in");
}

static bool shared_comp(const char *c, size_t len)
{
    /* Qwen2-MoE shared_expert, DeepSeek shared_experts, llama.cpp ffn_*_shexp */
    return has(c, len, "shared_expert") || (has(c, len, "ffn_") && has(c, len, "_shexp"));
}

/* llama.cpp's (GGUF's) ffn_up_exps, ffn_gate_exps, ffn_down_exps */
static bool gguf_experts_comp(const char *c, size_t len)
{
    return has(c, len, "ffn_") && ends(c, len, "_exps");
}

static bool experts_comp(const char *c, size_t len)
{
    /* mlp.experts.N, block_sparse_moe.experts.N, llama.cpp ffn_up_exps */
    return is(c, len, "experts") || gguf_experts_comp(c, len);
}

static bool head_comp(const char *c, size_t len)
{
    return is(c, len, "lm_head") || is(c, len, "embed_out");
}

static bool attn_comp(const char *c, size_t len)
{
    return has(c, len, "attn") || has(c, len, "attention") || is(c, len, "q_proj") ||
           is(c, len, "k_proj") || is(c, len, "v_proj") || is(c, len, "o_proj") ||
           is(c, len, "qkv_proj") || is(c, len, "wq") || is(c, len, "wk") || is(c, len, "wv") ||
           is(c, len, "wo");
}

int wo_fit_class(const char *name)
{
    if (!name)
        return 2;
    /* llama.cpp keeps its input layer (token_embd) in a CPU buffer, never
     * the GPU's: a `token_embd.weight` in device memory is the output head
     * of a model with tied embeddings (its loader's TENSOR_DUPLICATED copy,
     * named as the input), which every step reads whole */
    if (strcmp(name, "token_embd.weight") == 0)
        return 3;
    if (any_component(name, small_comp))
        return 0;
    if (any_component(name, embed_comp))
        return 5;
    if (any_component(name, shared_comp))
        return 2;
    if (any_component(name, experts_comp))
        return WO_FIT_CLASS_EXPERTS;
    /* llama.cpp's output projection is the bare `output.weight` */
    if (any_component(name, head_comp) || strcmp(name, "output.weight") == 0)
        return 3;
    if (any_component(name, attn_comp))
        return 1;
    return 2;
}

bool wo_gguf_experts_name(const char *name)
{
    return name && any_component(name, gguf_experts_comp);
}

uint64_t wo_fit_picks_room(const struct wo_fit_item *v, size_t n, unsigned buffers, bool gguf_picks)
{
    uint64_t largest = 0;

    for (size_t i = 0; i < n; i++)
        if (v[i].out != WO_PLACE_DEVICE && wo_fit_class(v[i].name) == WO_FIT_CLASS_EXPERTS &&
            (gguf_picks || !wo_gguf_experts_name(v[i].name)))
            largest = WO_MAX(largest, v[i].size);
    return largest * buffers;
}

/* ---- budget ---- */

uint64_t wo_fit_budget(const struct wo_fit *fit, uint64_t device_total,
                       uint64_t device_free_for_weights, uint64_t engine_bytes)
{
    uint64_t dev, a, cap;

    if (!fit)
        return 0;
    dev = fit->device.kind == WO_BUDGET_PERCENT || fit->device.kind == WO_BUDGET_BYTES
              ? wo_budget_resolve(&fit->device, device_total, 0)
              : 0;
    a = dev > engine_bytes ? dev - engine_bytes : 0;
    cap = device_free_for_weights > fit->keep_free ? device_free_for_weights - fit->keep_free : 0;
    return WO_MIN(a, cap);
}

uint64_t wo_fit_reserve(const struct wo_fit *fit, uint64_t budget)
{
    if (!fit)
        return 0;
    return WO_MIN(fit->reserve == WO_FIT_RESERVE_AUTO ? WO_FIT_RESERVE_DEFAULT : fit->reserve,
                  budget / 2);
}

/* ---- the choice ---- */

struct ord {
    int tier;   /* 0: weight > 0 known, 1: unknown, 2: weight 0 */
    long wkey;  /* known weights in 5% steps, higher first */
    int cls;
    size_t i;
};

static int ord_cmp(const void *pa, const void *pb)
{
    const struct ord *a = pa, *b = pb;
    if (a->tier != b->tier)
        return a->tier < b->tier ? -1 : 1;
    if (a->wkey != b->wkey)
        return a->wkey > b->wkey ? -1 : 1;
    if (a->cls != b->cls)
        return a->cls < b->cls ? -1 : 1;
    return a->i < b->i ? -1 : a->i > b->i;
}

/* Equal in everything but the index: one run of equal value. */
static bool same_value(const struct ord *a, const struct ord *b)
{
    return a->tier == b->tier && a->wkey == b->wkey && a->cls == b->cls;
}

/* x's low `bits` bits in reverse order. */
static size_t bit_reverse(size_t x, unsigned bits)
{
    size_t r = 0;

    for (unsigned b = 0; b < bits; b++, x >>= 1)
        r = r << 1 | (x & 1);
    return r;
}

/* First fit: the item goes to the device while the charged total stays
 * within budget, else to rest. */
static void take(struct wo_fit_item *it, uint64_t budget, uint64_t *charged, enum wo_placement rest)
{
    if (it->size <= budget && *charged <= budget - it->size) {
        it->out = WO_PLACE_DEVICE;
        *charged += it->size;
    } else {
        it->out = rest;
    }
}

/* The run o[0..m) (equal value, in index order) taken spread through it:
 * the ranks in bit-reversed order (van der Corput: for b = ceil(log2 m)
 * bits, x = 0..2^b-1 gives rank bitreverse_b(x) where that is below m).
 * The first 2^j of that order are every 2^(b-j)-th rank, and any prefix
 * lies between two such sets, so whatever prefix the budget takes is
 * spread evenly through the run, and so is what it leaves: the streaming
 * executor then copies an off-device tensor while the device ones before
 * it compute, where in index order the last layers' tensors went off the
 * device as one block that the step waited for on the link (the copy
 * engine idled 21% of llama-server's streaming steps: 38.1 GB/s over them against
 * 48.2 while it copied, bench/results/llamacpp-serve-20261205b-p32-fit-h100). The order depends
 * on the run alone, never on the budget: for equal-size items first fit
 * takes a prefix of it, so a larger budget's device set contains a
 * smaller one's, as in index order. */
static void take_spread(const struct ord *o, size_t m, struct wo_fit_item *v, uint64_t budget,
                        uint64_t *charged, enum wo_placement rest)
{
    unsigned bits = 0;

    while (((size_t)1 << bits) < m)
        bits++;
    for (size_t x = 0; x < (size_t)1 << bits; x++) {
        size_t r = bit_reverse(x, bits);
        if (r < m)
            take(&v[o[r].i], budget, charged, rest);
    }
}

/* The same with whole layers as the unit (fit->by_layer,
 * WOFFLOAD_FIT_LAYERS): the run's items of one layer (wo_policy_layer_of;
 * consecutive in index order, a name without a layer a unit of its own)
 * are taken together, in index order, and the layers spread through the
 * run as take_spread spreads items. What goes off the device is then whole
 * layers, as a hand policy's `layers:` rule sends them, where by item a
 * layer of three expert tensors kept one or two of them. Falls back to
 * take_spread without memory for the units. */
static void take_spread_layers(const struct ord *o, size_t m, struct wo_fit_item *v,
                               uint64_t budget, uint64_t *charged, enum wo_placement rest)
{
    size_t *start = malloc((m + 1) * sizeof(*start)), nu = 0;
    unsigned bits = 0;
    long prev = -1;

    if (!start) {
        take_spread(o, m, v, budget, charged, rest);
        return;
    }
    for (size_t k = 0; k < m; k++) {
        long l = wo_policy_layer_of(v[o[k].i].name);
        if (k == 0 || l < 0 || l != prev)
            start[nu++] = k;
        prev = l;
    }
    start[nu] = m;
    while (((size_t)1 << bits) < nu)
        bits++;
    for (size_t x = 0; x < (size_t)1 << bits; x++) {
        size_t u = bit_reverse(x, bits);
        if (u < nu)
            for (size_t k = start[u]; k < start[u + 1]; k++)
                take(&v[o[k].i], budget, charged, rest);
    }
    free(start);
}

uint64_t wo_fit_choose(const struct wo_fit *fit, struct wo_fit_item *v, size_t n, uint64_t budget)
{
    enum wo_placement rest = fit && fit->rest == WO_PLACE_MANAGED ? WO_PLACE_MANAGED : WO_PLACE_HOST;
    bool spread = !(fit && fit->in_order);
    uint64_t charged = 0;
    struct ord *o;
    size_t no = 0;

    if (!v || !n)
        return 0;
    /* fixed placements first: the explicit rules' device bytes are spent
     * before fit chooses anything */
    for (size_t i = 0; i < n; i++) {
        struct wo_fit_item *it = &v[i];
        it->out = WO_PLACE_UNSET;
        if (it->fixed == WO_PLACE_UNSET)
            continue;
        if (!it->movable)
            it->out = it->fixed == WO_PLACE_DEVICE ? WO_PLACE_HOST : it->fixed;
        else
            it->out = it->fixed;
        if (it->out == WO_PLACE_DEVICE)
            charged = charged > UINT64_MAX - it->size ? UINT64_MAX : charged + it->size;
    }
    o = malloc(n * sizeof(*o));
    for (size_t i = 0; i < n; i++) {
        struct wo_fit_item *it = &v[i];
        if (it->out != WO_PLACE_UNSET)
            continue;
        if (!it->movable) {
            it->out = WO_PLACE_HOST;
            continue;
        }
        if (!o) {
            /* without memory to sort, the given order still gives a valid fit */
            take(it, budget, &charged, rest);
            continue;
        }
        o[no].i = i;
        o[no].cls = wo_fit_class(it->name);
        if (it->weight < 0 || isnan(it->weight)) {
            o[no].tier = 1;
            o[no].wkey = 0;
        } else if (it->weight == 0) {
            o[no].tier = 2;
            o[no].wkey = 0;
        } else {
            o[no].tier = 0;
            o[no].wkey = isinf(it->weight) ? LONG_MAX : lround(log(it->weight) / log(1.05));
        }
        no++;
    }
    if (o) {
        qsort(o, no, sizeof(*o), ord_cmp);
        /* runs of equal value in importance order; within each, spread
         * (take_spread) or in index order (fit->in_order) */
        for (size_t s = 0, e; s < no; s = e) {
            for (e = s + 1; e < no && same_value(&o[s], &o[e]); e++)
                ;
            if (spread && fit && fit->by_layer) {
                take_spread_layers(o + s, e - s, v, budget, &charged, rest);
                continue;
            }
            if (spread) {
                take_spread(o + s, e - s, v, budget, &charged, rest);
                continue;
            }
            for (size_t k = s; k < e; k++)
                take(&v[o[k].i], budget, &charged, rest);
        }
        free(o);
    }
    return charged;
}
