/* tests/ggml/ggml-client.c: loads a "model" the way llama.cpp does, through
 * the fake libggml-base.so (tests/ggml/fake-ggml.c) and the fake CUDA
 * runtime and driver (tests/fake), for the ggml hook's tests:
 *
 *   0. common_fit_params' dry run (no_alloc: dummy buffers, a backend);
 *   1. a device context of weights (GGUF names, sizes that leave tensors
 *      sharing pages) and a host context (the CPU buffer of -ot/--n-cpu-moe),
 *      allocated with ggml_backend_alloc_ctx_tensors_from_buft and marked
 *      GGML_BACKEND_BUFFER_USAGE_WEIGHTS, as llama_model::load_tensors does;
 *   2. every weight written with ggml_backend_tensor_set (load_all_data);
 *   3. a backend and a KV cache context allocated after (llama_context);
 *   4. the first graph compute (the hook seals there), then a kernel that
 *      reads every weight, the same kernels captured into a CUDA graph
 *      launched twice, and every weight read back.
 *
 * Checks, from the shim's woffload_stats() and the fake driver: each weight
 * is named once, at its own range (a repeat tag of exactly that range is
 * accepted as the same tag), with the policy's placement (--host REGEX: the
 * names expected on the host; the others on the device) and its page's
 * advice, its launches (the graph's included) attributed to it; the host
 * context's and the KV cache's tensors carry no name; the
 * KV cache is not managed memory; the kernel's sums and the bytes read back
 * are bit-exact. --unnamed: the hook cannot name anything (ggml linked into
 * this executable): no weight is named, the data is still exact. --pass: a
 * policy that places nothing (examples/empty.yaml): every weight is named,
 * at its range, and passes through (placement "unplaceable"). --late: run
 * with WOFFLOAD_LATE_BIND=1: the model buffer is a VMM range, and each
 * weight's middle is backed where its placement says (the fake's
 * fakecuda_where) instead of advised. --stream: then STREAM_STEPS steps of
 * eager launches, each host weight (--host) read STREAM_READS times a step
 * and every other weight once: the host experts, tensors between device
 * ones inside the one model buffer, are streamed as sub-spans
 * (uvm/hotpath.h): launches on them redirected into device slots, never a
 * device weight's, every sum exact, and after a copy into a streamed
 * weight the next step reads the new bytes. --picks: then PICKS_STEPS
 * computes of two MoE layers (E experts, top-K, the nodes llama.cpp names
 * ffn_moe_probs-L, ffn_moe_argsort-L and ffn_moe_topk-L, the last a view of
 * the first K columns of the argsort), each reading the picked rows of the
 * layer's expert tensors in the compute (as ggml-cuda's MUL_MAT_ID): with
 * PICKS_TOKENS tokens every sum is exact, the host experts' launches read a
 * buffer of the shim's (the picks were registered), the shim copied only
 * rows the router picked (never the other ids of an argsort row), and a
 * compute of PICKS_MANY tokens (most experts picked) registers nothing;
 * (under WOFFLOAD_GGML_PICKS=80); --picks-off (the default, 0): nothing
 * registered, all in place.
 * With --stream too, the picks' computes come first: the streaming
 * executor then takes the host experts all the same, unless hot experts
 * are asked (WOFFLOAD_PICKS_HOT): then the picks keep them, read in place
 * between registrations, and no staging slot is made. --claims: the same
 * computes with no picks registered: few tokens claim the expert tensors
 * read in place (WOFFLOAD_GGML_STREAM), many stage them (claims_steps).
 * --band-on / --band-off: computes of 7 tokens (87% picked, in the hook's
 * band from WOFFLOAD_GGML_PICKS_FROM) registered or not (band_steps).
 * --fit: the policy is fit: every weight is advised to the host before
 * loading (fit chooses at seal); after seal as --host says.
 * --split: the hook split the device model buffer by tensor (a multi
 * buffer; without it, one buffer is checked): each weight of 1 MiB or more
 * was announced before its bytes and is in an allocation of its own, a host
 * one pinned before loading (never managed), the others managed as
 * without the split; the smaller ones share buffers that pass through as
 * the engine's device memory, left unnamed. --full: run on a
 * device whose free memory is less than the model buffer (WOFAKE_TOTAL_MEM)
 * under fit: the managed cap pinned nothing and fit placed bytes on the
 * device (one buffer fails it: pinned whole).
 *
 * One "ok"/"FAIL" line per check; exit 1 on any failure. */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <errno.h>
#include <regex.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fake-ggml.h"
#include "fakecuda.h"

static int failures;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (cond) {                                                                                \
            printf("ok ");                                                                         \
        } else {                                                                                   \
            printf("FAIL ");                                                                       \
            failures++;                                                                            \
        }                                                                                          \
        printf(__VA_ARGS__);                                                                       \
        putchar('\n');                                                                             \
    } while (0)

#define KiB 1024ul
#define MiB (1024ul * 1024ul)

/* Sizes not page multiples, so neighbours share 4 KiB pages. */
static const struct {
    const char *name;
    size_t size;
} weights[] = {
    {"token_embd.weight", 1 * MiB + 384},        {"blk.0.attn_q.weight", 256 * KiB + 128},
    {"blk.0.ffn_gate_inp.weight", 8 * KiB},      {"blk.0.ffn_up_exps.weight", 2 * MiB + 640},
    {"blk.0.ffn_down_exps.weight", 2 * MiB},     {"blk.1.attn_q.weight", 256 * KiB + 128},
    {"blk.1.ffn_up_exps.weight", 2 * MiB + 640}, {"blk.1.ffn_down_exps.weight", 2 * MiB},
    {"output_norm.weight", 4 * KiB + 256},       {"output.weight", 1 * MiB + 384},
    /* large enough to hold whole 2 MiB granules wherever it lands */
    {"blk.0.ffn_gate_exps.weight", 6 * MiB + 128},
};
#define NW (sizeof(weights) / sizeof(weights[0]))

static long (*access_fn)(const void *, size_t, int, int);
static int (*page_state)(const void *, struct fakecuda_page_state *);
static uint64_t (*calls_fn)(const char *name);
static long (*stats_fn)(char *, size_t);
static int (*tag_fn)(const void *, size_t, const char *);

/* The graph: one kernel that sums a weight's bytes into *out. */
static void k_sum(void **p, const uint32_t grid[3], const uint32_t block[3])
{
    const uint8_t *x = *(const uint8_t **)p[0];
    size_t n = *(size_t *)p[1];
    uint64_t *out = *(uint64_t **)p[2];
    uint64_t s = 0;
    (void)grid;
    (void)block;
    if (access_fn) {
        access_fn(x, n, 0, 0);
        access_fn(out, sizeof(*out), 0, 1);
    }
    for (size_t i = 0; i < n; i++)
        s += x[i] * (uint64_t)(i % 7 + 1);
    *out = s;
}
static volatile int stub_calls;
__attribute__((noinline)) static void stub_sum(void)
{
    stub_calls++;
}

static uint8_t pattern(size_t w, size_t i)
{
    return (uint8_t)(w * 37 + i * 13 + (i >> 9));
}

static char *stats(void)
{
    long n = stats_fn(NULL, 0);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (s)
        stats_fn(s, (size_t)n + 1);
    return s;
}

/* The object of name `name` in the stats' "names" list, copied; NULL if the
 * shim holds no such name. */
static char *name_entry(const char *js, const char *name)
{
    char key[256];
    const char *p, *e;
    char *out;

    snprintf(key, sizeof(key), "{\"name\":\"%s\"", name);
    p = strstr(js, key);
    if (!p)
        return NULL;
    e = strchr(p, '}');
    if (!e)
        return NULL;
    out = strndup(p, (size_t)(e - p + 1));
    return out;
}

static long long field(const char *obj, const char *key)
{
    char k[64];
    const char *p;
    snprintf(k, sizeof(k), "\"%s\":", key);
    p = strstr(obj, k);
    return p ? strtoll(p + strlen(k), NULL, 10) : -1;
}

/* The data pointers the sum kernel was handed (k_sum records them). */
#define SEEN_MAX 4096
static const void *seen[SEEN_MAX];
static unsigned nseen;

static void k_sum_seen(void **p, const uint32_t grid[3], const uint32_t block[3])
{
    if (nseen < SEEN_MAX)
        seen[nseen++] = *(const void **)p[0];
    k_sum(p, grid, block);
}

static uint64_t want_sum(size_t w, uint8_t add)
{
    uint64_t want = 0;
    for (size_t i = 0; i < weights[w].size; i++)
        want += (uint8_t)(pattern(w, i) + add) * (uint64_t)(i % 7 + 1);
    return want;
}

/* the step is found after WO_STEPPER_MIN_MATCH (256) keys: five a step
 * here (a key per host expert), so about 55 steps */
#define STREAM_STEPS 80
#define STREAM_STEPS_MAX 400
#define STREAM_READS 3

static char *stats(void);
static long long field(const char *obj, const char *key);

/* --picks */
#define PE 8 /* experts: every expert tensor's size is a multiple */
#define PK 2
#define PICKS_TOKENS 2  /* 1 - (6/8)^2: 44% of the experts picked, under WOFFLOAD_GGML_PICKS=80 */
#define PICKS_MANY 16   /* 99%: over it */
#define PICKS_STEPS 10
#define PICKS_MAXT 16

struct picks_ctx {
    struct ggml_tensor **wt;
    int *ids[2];      /* device: each layer's argsort, PICKS_MAXT rows of PE */
    uint64_t *out;    /* device: a sum per launch row */
    long long tokens; /* this compute's */
    size_t launches, moved, in_place, wrong;
    uint64_t want[NW][PE];
    int picks[2][PICKS_MAXT][PK];
    /* WO_GGML_TEST_ALIAS: both layers' ids at one address, as a graph that
     * reuses a freed node's memory: each layer's argsort rows written there
     * right before its launches (rows: the compute's, held; held_by: the
     * layer whose rows the address holds, -1 none) */
    bool alias;
    int rows[2][PICKS_MAXT * PE];
    int held_by;
};

static volatile int rows_calls;
__attribute__((noinline)) static void stub_rows(void)
{
    rows_calls++;
}
static const void *rows_seen;

/* params: const uint8_t *w, const int *ids, size_t k, size_t rows, size_t stride,
 * size_t row_bytes, uint64_t *out: out[r * k + j] = the weighted sum (k_sum's) of
 * the expert row ids[r * stride + j] of w, its bytes' indices counted from w */
static void k_rows(void **p, const uint32_t grid[3], const uint32_t block[3])
{
    const uint8_t *w = *(const uint8_t **)p[0];
    const int *ids = *(const int **)p[1];
    size_t k = *(size_t *)p[2], rows = *(size_t *)p[3], stride = *(size_t *)p[4];
    size_t rb = *(size_t *)p[5];
    uint64_t *out = *(uint64_t **)p[6];
    (void)grid;
    (void)block;
    rows_seen = w;
    for (size_t r = 0; r < rows; r++)
        for (size_t j = 0; j < k; j++) {
            int e = ids[r * stride + j];
            uint64_t s = 0;
            for (size_t i = (size_t)e * rb; i < (size_t)(e + 1) * rb; i++)
                s += w[i] * (uint64_t)(i % 7 + 1);
            out[r * k + j] = s;
        }
}

static int layer_of_weight(size_t w)
{
    int l;
    return strstr(weights[w].name, "_exps.") && sscanf(weights[w].name, "blk.%d.", &l) == 1 ? l
                                                                                            : -1;
}

/* the compute (fggml_set_compute): each expert tensor read at the picks */
static void picks_compute(struct ggml_cgraph *g, void *ud)
{
    struct picks_ctx *c = ud;
    (void)g;
    for (size_t w = 0; w < NW; w++) {
        int l = layer_of_weight(w);
        if (l < 0)
            continue;
        const void *x = fggml_data(c->wt[w]);
        const int *ids = c->ids[l];
        if (c->alias && c->held_by != l) {
            c->wrong += cudaMemcpy(c->ids[l], c->rows[l], (size_t)c->tokens * PE * sizeof(int),
                                   cudaMemcpyHostToDevice) != cudaSuccess;
            c->held_by = l;
        }
        size_t k = PK, rows = (size_t)c->tokens, stride = PE, rb = weights[w].size / PE;
        uint64_t *o = c->out, got[PICKS_MAXT * PK];
        void *args[] = {&x, &ids, &k, &rows, &stride, &rb, &o};
        rows_seen = NULL;
        c->launches++;
        if (cudaLaunchKernel((const void *)stub_rows, (dim3){1, 1, 1}, (dim3){1, 1, 1}, args, 0,
                             NULL) != cudaSuccess ||
            cudaMemcpy(got, o, rows * k * sizeof(uint64_t), cudaMemcpyDeviceToHost) != cudaSuccess) {
            c->wrong++;
            continue;
        }
        *(rows_seen == x ? &c->in_place : &c->moved) += 1;
        for (size_t r = 0; r < rows; r++)
            for (size_t j = 0; j < k; j++)
                c->wrong += got[r * k + j] != c->want[w][c->picks[l][r][j]];
    }
}

static unsigned picks_rng = 12345;

/* One compute of `tokens` tokens: fresh picks, the argsort rows (the picks
 * first, then every other expert, as an argsort over all of them), the
 * graph's nodes, the compute. */
static void picks_step(struct picks_ctx *c, long long tokens)
{
    struct ggml_cgraph *g = fggml_graph_new();
    char nm[64];

    c->tokens = tokens;
    for (int l = 0; l < 2; l++) {
        int rowsv[PICKS_MAXT * PE];
        for (long long r = 0; r < tokens; r++) {
            int used[PE] = {0}, n = 0;
            for (int j = 0; j < PK; j++) {
                int e;
                do {
                    picks_rng = picks_rng * 1103515245u + 12345u;
                    e = (int)((picks_rng >> 16) % PE);
                } while (used[e]);
                used[e] = 1;
                c->picks[l][r][j] = e;
                rowsv[r * PE + n++] = e;
            }
            for (int e = PE - 1; e >= 0; e--)
                if (!used[e])
                    rowsv[r * PE + n++] = e;
        }
        memcpy(c->rows[l], rowsv, (size_t)tokens * PE * sizeof(int));
        c->held_by = -1;
        if (!c->alias && cudaMemcpy(c->ids[l], rowsv, (size_t)tokens * PE * sizeof(int),
                                    cudaMemcpyHostToDevice) != cudaSuccess)
            c->wrong++;
        snprintf(nm, sizeof(nm), "ffn_moe_probs-%d", l);
        fggml_graph_add(g, fggml_node(nm, c->out, PE, tokens, 4, true));
        snprintf(nm, sizeof(nm), "ffn_moe_argsort-%d", l);
        fggml_graph_add(g, fggml_node(nm, c->ids[l], PE, tokens, 4, true));
        snprintf(nm, sizeof(nm), "ffn_moe_topk-%d", l);
        fggml_graph_add(g, fggml_node(nm, c->ids[l], PK, tokens, 4, false));
    }
    (void)ggml_backend_sched_graph_compute(NULL, g);
    fggml_graph_free(g);
}

/* The picks' computes: each expert row's weighted sum, the ids and sums
 * buffers, the compute installed (picks_compute); NULL out of memory. */
static struct picks_ctx *picks_ctx_new(struct ggml_tensor **wt, const char *what)
{
    struct picks_ctx *c = calloc(1, sizeof(*c));

    if (!c)
        return NULL;
    c->wt = wt;
    for (size_t w = 0; w < NW; w++)
        for (int e = 0; e < PE && layer_of_weight(w) >= 0; e++) {
            size_t rb = weights[w].size / PE;
            for (size_t i = (size_t)e * rb; i < (size_t)(e + 1) * rb; i++)
                c->want[w][e] += pattern(w, i) * (uint64_t)(i % 7 + 1);
        }
    c->alias = getenv("WO_GGML_TEST_ALIAS") != NULL;
    CHECK(cudaMalloc((void **)&c->ids[0], PICKS_MAXT * PE * sizeof(int)) == cudaSuccess &&
              (c->alias ? (c->ids[1] = c->ids[0], 1)
                        : cudaMalloc((void **)&c->ids[1], PICKS_MAXT * PE * sizeof(int)) ==
                              cudaSuccess) &&
              cudaMalloc((void **)&c->out, PICKS_MAXT * PE * sizeof(uint64_t)) == cudaSuccess,
          "%s: the compute buffers", what);
    fggml_set_compute(picks_compute, c);
    return c;
}

static void picks_ctx_free(struct picks_ctx *c)
{
    fggml_set_compute(NULL, NULL);
    cudaFree(c->ids[0]);
    if (!c->alias)
        cudaFree(c->ids[1]);
    cudaFree(c->out);
    free(c);
}

static long long picks_field(const char *key)
{
    char *js = stats();
    const char *p = js ? strstr(js, "\"picks\":") : NULL;
    const char *t = p ? strstr(p, "},\"tensors\":") : NULL;
    long long v = t ? field(t, key) : -1;
    free(js);
    return v;
}

/* key of the stats' first object that opens with obj, or -1 */
static long long object_field(const char *obj, const char *key)
{
    char *js = stats();
    const char *o = js ? strstr(js, obj) : NULL;
    long long v = o ? field(o, key) : -1;
    free(js);
    return v;
}

/* the copy engine's picked-copy counter key (picks.engine), or -1 */
static long long engine_field(const char *key)
{
    return object_field("\"engine\":{", key);
}

/* the copy engine's last stall report (picks.engine.stall_report), as said,
 * into out ("" when none); false when the stats have no such field */
static bool engine_report(char *out, size_t cap)
{
    char *js = stats();
    const char *o = js ? strstr(js, "\"engine\":{") : NULL;
    const char *r = o ? strstr(o, "\"stall_report\":\"") : NULL;
    size_t n = 0;

    if (r)
        for (r += strlen("\"stall_report\":\""); *r && *r != '"' && n + 1 < cap; r++)
            out[n++] = *r;
    out[n] = '\0';
    free(js);
    return r != NULL;
}

static void picks_steps(struct ggml_tensor **wt, int off)
{
    struct picks_ctx *c = picks_ctx_new(wt, "--picks");
    long long staged0, staged1, copied, whole;
    size_t launches0;
    /* hot experts asked (WOFFLOAD_PICKS_HOT, or the policy's hot_experts:
     * auto, which the stats say) and no WOFFLOAD_GGML_PICKS: the hook
     * registers every compute */
    const char *hot_env = getenv("WOFFLOAD_PICKS_HOT"), *pct = getenv("WOFFLOAD_GGML_PICKS");
    char *js = stats();
    int every =
        ((hot_env && atoi(hot_env) > 0) || (js && strstr(js, "\"hot_experts_auto\":true"))) &&
        (!pct || !*pct);

    free(js);

    if (!c)
        return;
    for (int s = 0; s < PICKS_STEPS; s++)
        picks_step(c, PICKS_TOKENS);
    CHECK(c->wrong == 0, "--picks: every sum of %zu launches at the picks exact (%zu wrong)",
          c->launches, c->wrong);
    if (off) {
        CHECK(c->moved == 0 && picks_field("staged") <= 0,
              "--picks-off: every launch read its tensor in place (%zu moved), nothing staged",
              c->moved);
    } else {
        CHECK(c->moved == c->launches,
              "--picks: every launch on a host expert tensor read the shim's buffer (%zu of %zu)",
              c->moved, c->launches);
        /* the rows counters are read back at most every ms, at a
         * registration: one more compute after a pause */
        usleep(20000);
        picks_step(c, PICKS_TOKENS);
        copied = picks_field("bytes_copied");
        whole = picks_field("whole_bytes");
        CHECK(copied > 0 && whole > 0 && copied * 10 < whole * 6,
              "--picks: the bytes copied (%lld) at most the picked rows' share of the whole "
              "tensors' (%lld): the argsort's other ids were not copied",
              copied, whole);
    }
    /* registered from a share (WOFFLOAD_GGML_PICKS_FROM) with the copy engine
     * on (WOFFLOAD_PICKS_ENGINE): the copies went to it from pinned mirrors of the model buffer's tensors */
    if (!off && getenv("WOFFLOAD_GGML_PICKS_FROM") && atoi(getenv("WOFFLOAD_GGML_PICKS_FROM")) > 0 &&
        getenv("WOFFLOAD_PICKS_ENGINE") && atoi(getenv("WOFFLOAD_PICKS_ENGINE")) > 0)
        CHECK(engine_field("copies") > 0 && engine_field("mirrors") > 0 &&
                  engine_field("kernel_fallbacks") == 0 && engine_field("waits_refused") == 0,
              "--picks: copies on the copy engine (%lld) from pinned mirrors (%lld), no kernel "
              "fallback, no stream wait refused (%lld: on the fake, a wait ran out while a "
              "free or a synchronize held the copy thread off, where a GPU hangs)",
              engine_field("copies"), engine_field("mirrors"), engine_field("waits_refused"));
    /* hot experts with the copy engine on: each copy split, the hot rows
     * by the kernels from the device, the others on the copy engine */
    if (!off && getenv("WOFFLOAD_PICKS_HOT") && getenv("WOFFLOAD_PICKS_ENGINE") &&
        atoi(getenv("WOFFLOAD_PICKS_ENGINE")) > 0)
        CHECK(engine_field("copies") > 0 && picks_field("hot_rows") > 0 &&
                  engine_field("waits_refused") == 0,
              "--picks: hot experts on the copy engine: %lld copies there, %lld rows from the "
              "hot sets, no stream wait refused",
              engine_field("copies"), picks_field("hot_rows"));
    /* early copies (WOFFLOAD_PICKS_EARLY) on the copy engine: each read by
     * its launch; with the layers' ids at one address
     * (WO_GGML_TEST_ALIAS) none, for five tensors share those ids: an early
     * copy by one layer's picks would be read at another's (the sums above
     * count it wrong); with hot experts none either (each tensor's own
     * launch may change its set) */
    if (!off && getenv("WOFFLOAD_PICKS_ENGINE") && atoi(getenv("WOFFLOAD_PICKS_ENGINE")) > 0) {
        bool none = c->alias || getenv("WOFFLOAD_PICKS_HOT");
        CHECK(none ? picks_field("early") == 0
                   : picks_field("early") > 0 && picks_field("early_used") == picks_field("early"),
              "--picks: early copies %lld, %lld of them read (%s)", picks_field("early"),
              picks_field("early_used"),
              c->alias ? "ids aliased: none"
              : none   ? "hot experts: none"
                       : "each read");
    }
    /* a stall report only where the test slows the copy thread past a
     * short WOFFLOAD_PICKS_STALL_MS (-stall): none at the default 5 s */
    if (!off && getenv("WOFFLOAD_PICKS_ENGINE") && atoi(getenv("WOFFLOAD_PICKS_ENGINE")) > 0) {
        const char *st = getenv("WOFFLOAD_PICKS_STALL_MS");
        bool want = st && atoi(st) < 1000;
        char said[1536];

        CHECK((engine_field("stalls") > 0) == want,
              "--picks: the copy engine's stall report %s (stalls %lld)",
              want ? "made, the copy thread slowed past WOFFLOAD_PICKS_STALL_MS" : "not made",
              engine_field("stalls"));
        /* what it said (the stats keep it): the driver call a thread of
         * the shim was in, the queued copy or the gate, the captures, and
         * what the copy stream held, asked of the driver */
        bool kept = engine_report(said, sizeof(said));
        if (want)
            CHECK((strstr(said, "thread has been in cu") || strstr(said, "queued, the oldest for") ||
                   strstr(said, "has held the gate for")) &&
                      strstr(said, "captures under way") &&
                      (strstr(said, "the copy stream has work") ||
                       strstr(said, "the copy stream is idle")),
                  "--picks: the stall report says where the copy thread was, the captures "
                  "and the copy stream: '%s'",
                  said);
        else
            CHECK(kept && said[0] == '\0', "--picks: no stall report, none kept: '%s'%s", said,
                  kept ? "" : " (no stall_report in the stats)");
    }
    staged0 = picks_field("staged");
    c->moved = c->in_place = 0;
    launches0 = c->launches;
    picks_step(c, PICKS_MANY);
    staged1 = picks_field("staged");
    if (every) {
        CHECK(c->wrong == 0 && c->moved == c->launches - launches0 && staged1 > staged0,
              "--picks: hot experts, WOFFLOAD_GGML_PICKS unset: %d tokens (99%% of the experts "
              "picked) registered too (%zu of %zu launches moved, staged %lld then %lld), sums "
              "exact",
              PICKS_MANY, c->moved, c->launches - launches0, staged0, staged1);
        /* ... and a single token's compute too: its copy takes the hot
         * rows from the device (on the H200 b1 decoded 1.29x faster so
         * than with it read in place, its decode graph replayed for it) */
        c->moved = 0;
        launches0 = c->launches;
        staged0 = picks_field("staged");
        picks_step(c, 1);
        CHECK(c->wrong == 0 && c->moved == c->launches - launches0 && c->launches > launches0 &&
                  picks_field("staged") > staged0,
              "--picks: hot experts, WOFFLOAD_GGML_PICKS unset: a single token's compute "
              "registered too (%zu of %zu launches moved, staged %lld then %lld), sums exact",
              c->moved, c->launches - launches0, staged0, picks_field("staged"));
    } else {
        CHECK(c->wrong == 0 && c->moved == 0 && staged1 == staged0,
              "--picks: %d tokens (99%% of the experts picked): nothing registered, read in "
              "place (%zu moved, staged %lld then %lld), sums exact",
              PICKS_MANY, c->moved, staged0, staged1);
    }
    picks_ctx_free(c);
}

/* the streaming executor's counter key, or -1 */
static long long stream_field(const char *key)
{
    return object_field("\"stream\":{", key);
}

/* The staging copies counted once the executor stopped making them: the
 * same count over 3 polls 20 ms apart (at most 2 s: a copy of the computes
 * before, made late by a thread kept off the CPU, would otherwise count in
 * the next phase). */
static long long staged_settled(void)
{
    long long v = stream_field("staged"), w;

    for (int same = 0, n = 0; same < 3 && n < 100; n++) {
        usleep(20000);
        w = stream_field("staged");
        same = w == v ? same + 1 : 0;
        v = w;
    }
    return v;
}

/* --band-on / --band-off: computes of BAND_TOKENS (87% of the experts
 * picked: inside the hook's band, from WOFFLOAD_GGML_PICKS_FROM up to
 * WOFFLOAD_GGML_STREAM's 92) registered, every launch on a host expert
 * tensor reading the shim's buffer, or not, all read in place: on with a hand
 * policy by default (80), off under fit unless WOFFLOAD_GGML_PICKS_FROM is
 * given. Every sum exact either way. */
#define BAND_TOKENS 7
static void band_steps(struct ggml_tensor **wt, int on)
{
    const char *what = on ? "--band-on" : "--band-off";
    struct picks_ctx *c = picks_ctx_new(wt, what);
    long long staged0;

    if (!c)
        return;
    staged0 = picks_field("staged");
    for (int s = 0; s < 4; s++)
        picks_step(c, BAND_TOKENS);
    CHECK(c->wrong == 0 && c->launches > 0, "%s: every sum of %zu launches exact (%zu wrong)", what,
          c->launches, c->wrong);
    if (on)
        CHECK(c->moved == c->launches && picks_field("staged") > staged0,
              "%s: computes of %d tokens registered: every launch on a host expert tensor read "
              "the shim's buffer (%zu of %zu; staged %lld, then %lld)",
              what, BAND_TOKENS, c->moved, c->launches, staged0, picks_field("staged"));
    else
        CHECK(c->moved == 0 && picks_field("staged") == staged0,
              "%s: computes of %d tokens registered nothing: read in place (%zu of %zu moved; "
              "staged %lld, then %lld)",
              what, BAND_TOKENS, c->moved, c->launches, staged0, picks_field("staged"));
    picks_ctx_free(c);
}

/* --claims: the picks' computes with the host experts streamed and no picks
 * registered (WOFFLOAD_GGML_PICKS 0): a compute of PICKS_TOKENS (44% of the
 * experts picked, under WOFFLOAD_GGML_STREAM's 92) claims the layers'
 * expert tensors read in place until a compute of PICKS_MANY (99%) comes,
 * whose launches read them staged. Every sum exact; no staging copy while
 * the claims hold; launches on the claimed tensors read in place; staging
 * again after. Under prefetch.mode auto the claims are what streams them. */
#define CLAIMS_MAX 300
static void claims_steps(struct ggml_tensor **wt)
{
    struct picks_ctx *c = picks_ctx_new(wt, "--claims");
    long long staged0, staged1, staged2, claimed0, claimed1;
    int n;

    if (!c)
        return;
    /* few tokens first: the claims (under auto, what makes them streamed) */
    for (n = 0; n < 4; n++)
        picks_step(c, PICKS_TOKENS);
    /* many: on until a launch read a staged copy (the executor learns the
     * step first; a loaded machine takes longer) */
    c->moved = 0;
    for (n = 0; n < CLAIMS_MAX && c->moved == 0; n++)
        picks_step(c, PICKS_MANY);
    CHECK(c->moved > 0, "--claims: computes of %d tokens: a launch read a staged copy after %d",
          PICKS_MANY, n);
    /* few again: the claims hold from the first one on */
    picks_step(c, PICKS_TOKENS);
    staged0 = staged_settled();
    claimed0 = stream_field("inplace_claimed");
    c->moved = c->in_place = 0;
    for (n = 0; n < 12; n++)
        picks_step(c, PICKS_TOKENS);
    usleep(50000);
    staged1 = stream_field("staged");
    claimed1 = stream_field("inplace_claimed");
    CHECK(staged0 >= 0 && staged1 == staged0,
          "--claims: no staging copy while %d computes of %d tokens claimed the experts (%lld, "
          "then %lld)",
          n, PICKS_TOKENS, staged0, staged1);
    CHECK(claimed1 > claimed0 && c->in_place > 0,
          "--claims: their launches read the claimed tensors in place (%lld counted, %zu of "
          "%zu launches; %zu read a copy staged before)",
          claimed1 - claimed0, c->in_place, c->launches, c->moved);
    CHECK(stream_field("inplace_claims") > 0, "--claims: claims made (%lld)",
          stream_field("inplace_claims"));
    /* until a launch read a copy and a new one was staged: the first
     * launches may read a copy still published from before the claims, and
     * the executor (a thread of its own, slow under TSan on a loaded
     * machine: staged 5, then 5, 50 ms after the first such launch) stages
     * when it gets to it */
    c->moved = 0;
    staged2 = staged1;
    for (n = 0; n < CLAIMS_MAX && (c->moved == 0 || staged2 <= staged1); n++) {
        picks_step(c, PICKS_MANY);
        staged2 = stream_field("staged");
    }
    CHECK(c->moved > 0 && staged2 > staged1,
          "--claims: computes of %d tokens stage them again (staged %lld, then %lld; a launch "
          "read a copy after %d)",
          PICKS_MANY, staged1, staged2, n);
    /* and they go on staging: at a departure lag of one (the hook's word)
     * the executor keeps every range moving through the slots; a range no
     * slot was free for on the hooks' moves (the executor's view of the
     * engine one range behind), or whose size no free slot fits, was read
     * in place at every compute (20 of 20: docs/prefetch.md, "The lag") */
    if (stream_field("departure_lag") == 1) {
        long long st0 = stream_field("staged"), ns0 = stream_field("inplace_no_slot");

        for (n = 0; n < 20; n++)
            picks_step(c, PICKS_MANY);
        CHECK(stream_field("staged") > st0 && stream_field("inplace_no_slot") - ns0 < n,
              "--claims: %d more computes of %d tokens staged %lld copies, and launches read "
              "in place for want of a slot %lld times (fewer than one a compute; slots given "
              "to a larger range %lld)",
              n, PICKS_MANY, stream_field("staged") - st0, stream_field("inplace_no_slot") - ns0,
              stream_field("slot_swaps"));
    }
    CHECK(c->wrong == 0, "--claims: every sum of %zu launches exact (%zu wrong)", c->launches,
          c->wrong);
    picks_ctx_free(c);
}

/* A graph of one stub_sum launch per weight into out[w], captured on s in
 * mode, as ggml-cuda captures its CUDA graphs. */
static void capture_sums(struct ggml_tensor **wt, uint64_t *out, cudaStream_t s,
                         enum cudaStreamCaptureMode mode, cudaGraph_t *g, cudaGraphExec_t *ge)
{
    CHECK(cudaStreamBeginCapture(s, mode) == cudaSuccess, "capture begins");
    for (size_t w = 0; w < NW; w++) {
        const void *x = fggml_data(wt[w]);
        size_t n = weights[w].size;
        uint64_t *o = out + w;
        void *args[] = {&x, &n, &o};
        CHECK(cudaLaunchKernel((const void *)stub_sum, (dim3){1, 1, 1}, (dim3){1, 1, 1}, args, 0,
                               s) == cudaSuccess,
              "captured launch on %s", weights[w].name);
    }
    CHECK(cudaStreamEndCapture(s, g) == cudaSuccess && cudaGraphInstantiate(ge, *g, 0) == cudaSuccess,
          "graph instantiated");
}

static int picks_registered; /* --picks ran before --stream */

/* WOFFLOAD_BIND_COPIES=1: late-bound ranges are staged and copied picked
 * like host memory (uvm/picks.c, describe; uvm/stream.c, add_seg). */
static int bind_copies(void)
{
    const char *e = getenv("WOFFLOAD_BIND_COPIES");

    return e && strcmp(e, "1") == 0;
}

/* --stream: eager steps as llama.cpp runs a batch (its CUDA graphs off). */
/* --split: the buffers ggml made for the device context (0: one buffer) */
static size_t split_buffers;

static void stream_steps(struct ggml_tensor **wt, uint64_t *sums, regex_t *re)
{
    static volatile int stub_seen;
    uint64_t want[NW];
    size_t moved_host = 0, moved_dev = 0, wrong = 0, written = 0;
    int changed_at = -1, step;

    for (size_t w = 0; w < NW; w++)
        want[w] = want_sum(w, 0);
    (void)stub_seen;
    /* a CUDA graph reading every weight, replayed between the eager steps
     * (llama-server's single-sequence steps are graph replays between its
     * batched eager ones). The ggml hook declared the model buffer
     * read-only to kernels (woffload_readonly): the graph is no blind
     * launch, and nothing is checked for writes. WOFFLOAD_READONLY=0: it
     * is one */
    const char *ro_env = getenv("WOFFLOAD_READONLY"), *late_env = getenv("WOFFLOAD_LATE_BIND");
    const char *hot_env = getenv("WOFFLOAD_PICKS_HOT");
    int ro = !ro_env || strcmp(ro_env, "0") != 0;
    /* late bound: the executor reads the bound range in place (staging it
     * failed on the H200, docs/placement.md): nothing moved, sums exact;
     * with WOFFLOAD_BIND_COPIES=1 it is staged as host memory is; with
     * hot experts asked (after --picks) the picks keep the tensors
     * they registered from the executor: the same */
    int late_bound = late_env && strcmp(late_env, "1") == 0 && !bind_copies();
    int hot = hot_env && atoi(hot_env) > 0 && picks_registered;
    int in_place = late_bound || hot; /* the host experts are never staged */
    size_t graph_wrong = 0, replays = 0;
    uint64_t *gsums = NULL;
    cudaStream_t gs = NULL;
    cudaGraph_t g = NULL;
    cudaGraphExec_t ge = NULL;
    CHECK(cudaMalloc((void **)&gsums, NW * sizeof(uint64_t)) == cudaSuccess, "graph sums");
    CHECK(cudaStreamCreateWithFlags(&gs, cudaStreamNonBlocking) == cudaSuccess, "graph stream");
    capture_sums(wt, gsums, gs, cudaStreamCaptureModeRelaxed, &g, &ge);
    /* at least STREAM_STEPS; on a loaded machine (a sanitizer, two cores)
     * the consumer thread may learn the step later: on until a launch
     * read a slot (at most STREAM_STEPS_MAX), then the copy, then 6 more */
    for (step = 0; step < STREAM_STEPS_MAX && (changed_at < 0 || step < changed_at + 6); step++) {
        if (changed_at < 0 && ((step >= STREAM_STEPS - 6 && (moved_host > 0 || in_place)) ||
                               step == STREAM_STEPS_MAX - 6))
            changed_at = step;
        if (step == changed_at) {
            /* a copy into a streamed weight (a LoRA swap, a reload): the
             * next reads see the new bytes, not an older slot's */
            for (size_t w = 0; w < NW; w++) {
                if (strcmp(weights[w].name, "blk.1.ffn_up_exps.weight") != 0)
                    continue;
                uint8_t *b = malloc(weights[w].size);
                for (size_t i = 0; b && i < weights[w].size; i++)
                    b[i] = (uint8_t)(pattern(w, i) + 1);
                CHECK(b && cudaMemcpy(fggml_data(wt[w]), b, weights[w].size,
                                      cudaMemcpyHostToDevice) == cudaSuccess,
                      "step %d: a copy writes %s", step, weights[w].name);
                free(b);
                want[w] = want_sum(w, 1);
                written = w + 1;
            }
        }
        if (step % 8 == 4) {
            uint64_t got[NW];

            replays++;
            if (cudaGraphLaunch(ge, gs) != cudaSuccess || cudaStreamSynchronize(gs) != cudaSuccess ||
                cudaMemcpy(got, gsums, sizeof(got), cudaMemcpyDeviceToHost) != cudaSuccess)
                graph_wrong++;
            else
                for (size_t w = 0; w < NW; w++)
                    graph_wrong += got[w] != want[w];
        }
        for (size_t w = 0; w < NW; w++) {
            int host = regexec(re, weights[w].name, 0, NULL, 0) == 0;
            for (int r = 0; r < (host ? STREAM_READS : 1); r++) {
                const void *x = fggml_data(wt[w]);
                size_t n = weights[w].size;
                uint64_t *o = sums + w, got = 0;
                void *args[] = {&x, &n, &o};
                unsigned before = nseen;
                if (cudaLaunchKernel((const void *)stub_sum, (dim3){1, 1, 1}, (dim3){1, 1, 1}, args,
                                     0, NULL) != cudaSuccess ||
                    cudaMemcpy(&got, o, sizeof(got), cudaMemcpyDeviceToHost) != cudaSuccess ||
                    got != want[w])
                    wrong++;
                if (nseen > before && seen[nseen - 1] != fggml_data(wt[w]))
                    *(host ? &moved_host : &moved_dev) += 1;
                nseen = 0;
            }
        }
    }
    CHECK(wrong == 0, "--stream: every sum of %d steps exact (%zu wrong)", step, wrong);
    CHECK(graph_wrong == 0, "--stream: every sum of %zu graph replays exact (%zu wrong)", replays,
          graph_wrong);
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    cudaStreamDestroy(gs);
    cudaFree(gsums);
    CHECK(written != 0, "--stream: the copy into a streamed weight was made");
    if (in_place)
        CHECK(moved_host == 0, "--stream: %s: host experts read in place (%zu moved)",
              late_bound ? "late bound" : "hot experts", moved_host);
    else
        CHECK(moved_host > 0, "--stream: launches on host experts read a device slot (%zu)",
              moved_host);
    CHECK(moved_dev == 0, "--stream: no launch on a device weight was moved (%zu)", moved_dev);
    char *js = stats();
    const char *st = js ? strstr(js, "\"stream\":{") : NULL;
    if (in_place) {
        CHECK(st && field(st, "staged") == 0 && field(st, "redirected") == 0,
              "--stream: %s: nothing staged (%lld) or redirected (%lld)",
              late_bound ? "late bound" : "hot experts", st ? field(st, "staged") : -1,
              st ? field(st, "redirected") : -1);
        if (hot)
            CHECK(st && field(st, "auto_tries") == 0 && field(st, "slot_bytes") == 0,
                  "--stream: hot experts: no staging slots held (%lld bytes), auto tried nothing "
                  "(%lld)",
                  st ? field(st, "slot_bytes") : -1, st ? field(st, "auto_tries") : -1);
        free(js);
        return;
    }
    if (split_buffers)
        CHECK(st && field(st, "sub_spans") == 0,
              "--stream: --split: the five host tensors are allocations of their own, no "
              "sub-spans (%lld)",
              st ? field(st, "sub_spans") : -1);
    else
        CHECK(st && field(st, "sub_spans") == 5,
              "--stream: the model buffer's five host tensors are sub-spans (%lld)",
              st ? field(st, "sub_spans") : -1);
    CHECK(st && field(st, "redirected") > 0, "--stream: launches redirected (%lld)",
          st ? field(st, "redirected") : -1);
    CHECK(st && field(st, "staged") > 0, "--stream: staging copies made (%lld)",
          st ? field(st, "staged") : -1);
    /* the copy engine's: timed between two events on the copy stream (the
     * fake copies as it is called: the time between is the copy's) */
    {
        long long timed = st ? field(st, "copies_timed") : -1;
        long long ce = st ? field(st, "staged") - field(st, "staged_by_kernel") : -1;
        CHECK(st && timed >= 0 && timed <= ce && (ce == 0 || timed > 0) &&
                  (timed == 0) == (field(st, "copies_timed_bytes") == 0),
              "--stream: the copy engine's staging copies timed (%lld of %lld; %lld by the "
              "copy kernel, untimed)",
              timed, ce, st ? field(st, "staged_by_kernel") : -1);
    }
    /* the hook says llama.cpp's kernels read a weight before the next
     * weight's first launch (woffload_departure_lag(1)); a lag given in the
     * environment wins */
    {
        const char *given = getenv("WOFFLOAD_DEPARTURE_LAG");
        long long lag_want = given ? atoll(given) : 1;

        CHECK(st && field(st, "departure_lag") == lag_want,
              "--stream: departure lag %lld (%s), the stats say %lld", lag_want,
              given ? "WOFFLOAD_DEPARTURE_LAG" : "the hook's word",
              st ? field(st, "departure_lag") : -1);
        CHECK(st && field(st, "fences_departed") > 0,
              "--stream: slots reused after a departure "
              "fence (%lld)",
              st ? field(st, "fences_departed") : -1);
    }
    const char *al = js ? strstr(js, "\"allocations\":{") : NULL;
    if (ro) {
        /* --split: each of its buffers */
        long long nro = split_buffers ? (long long)split_buffers : 1;
        CHECK(al && field(al, "readonly") == nro,
              "--stream: the model buffer's %lld allocation(s) declared read-only to kernels "
              "(%lld)",
              nro, al ? field(al, "readonly") : -1);
        CHECK(st && field(st, "blind_launches") == 0,
              "--stream: %zu graph replays of read-only weights: no blind launch (%lld)", replays,
              st ? field(st, "blind_launches") : -1);
        CHECK(st && field(st, "write_checks") == 0,
              "--stream: read-only weights' slots not checked for writes (%lld)",
              st ? field(st, "write_checks") : -1);
    } else {
        CHECK(al && field(al, "readonly") == 0, "--stream: WOFFLOAD_READONLY=0: nothing declared");
        CHECK(st && field(st, "blind_launches") > 0,
              "--stream: WOFFLOAD_READONLY=0: the graph replays are blind launches (%lld)",
              st ? field(st, "blind_launches") : -1);
    }
    /* the copy made it a written range: read in place from then on. The
     * executor learns it on the consumer thread, from the copy's event: up
     * to 5 s for it (a loaded machine: the release build in CI, 2026-12-06,
     * once read the stats before it had) */
    bool written_seen = false;
    for (int tries = 0; tries < 100 && !written_seen; tries++) {
        char *wj = stats();
        const char *ws = wj ? strstr(wj, "\"stream\":{") : NULL;
        const char *wn = ws ? strstr(ws, "\"blk.1.ffn_up_exps.weight\":{") : NULL;
        const char *we = wn ? strchr(wn, '}') : NULL;
        const char *ww = wn ? strstr(wn, "\"written\":true") : NULL;
        written_seen = ww && ww < we;
        free(wj);
        if (!written_seen)
            usleep(50000);
    }
    CHECK(written_seen, "--stream: the copy's tensor is written, no longer streamed");
    free(js);
}

static void *need(void *h, const char *sym)
{
    void *p = dlsym(h, sym);
    if (!p) {
        printf("FAIL %s not found\n", sym);
        exit(1);
    }
    return p;
}

int main(int argc, char **argv)
{
    const char *host_re = NULL;
    int unnamed = 0, pass = 0, late = 0, stream = 0, picks = 0, picks_off = 0, claims = 0;
    int band = -1; /* --band-on 1, --band-off 0 */
    int fit = 0;   /* --fit: the policy is fit (its choice at seal) */
    int free_early = 0, free_other = 0;
    int split = 0; /* --split: the device model buffer is split by tensor */
    int full = 0;  /* --full: fit on a device whose free memory is under the model's */
    int (*where_fn)(const void *);
    regex_t re;
    struct ggml_tensor *wt[NW], *cpu_t, *kv_t;
    uint64_t *sums;
    uint8_t *src, *back;

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--host") == 0 && i + 1 < argc)
            host_re = argv[++i];
        else if (strcmp(argv[i], "--unnamed") == 0)
            unnamed = 1;
        else if (strcmp(argv[i], "--pass") == 0)
            pass = 1;
        else if (strcmp(argv[i], "--late") == 0)
            late = 1;
        else if (strcmp(argv[i], "--stream") == 0)
            stream = 1;
        else if (strcmp(argv[i], "--picks") == 0)
            picks = 1;
        else if (strcmp(argv[i], "--picks-off") == 0)
            picks = picks_off = 1;
        else if (strcmp(argv[i], "--claims") == 0)
            claims = 1;
        else if (strcmp(argv[i], "--band-on") == 0)
            band = 1;
        else if (strcmp(argv[i], "--band-off") == 0)
            band = 0;
        else if (strcmp(argv[i], "--fit") == 0)
            fit = 1;
        else if (strcmp(argv[i], "--free-early") == 0)
            free_early = 1;
        else if (strcmp(argv[i], "--free-other") == 0)
            free_other = 1;
        else if (strcmp(argv[i], "--split") == 0)
            split = 1;
        else if (strcmp(argv[i], "--full") == 0)
            full = 1;
        else {
            fprintf(stderr,
                    "usage: %s [--host REGEX] [--unnamed | --pass] [--late] [--stream] "
                    "[--picks | --picks-off] [--band-on | --band-off] [--fit] [--claims] "
                    "[--free-early | --free-other] [--split] [--full]\n",
                    argv[0]);
            return 2;
        }
    }
    if (regcomp(&re, host_re ? host_re : "$^", REG_EXTENDED | REG_NOSUB) != 0)
        return 2;

    CHECK(cudaSetDevice(0) == cudaSuccess, "cudaSetDevice");
    void *cu = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!cu) {
        printf("FAIL libcuda.so.1 not loaded by the runtime\n");
        return 1;
    }
    CUfunction (*reg)(const char *, int, const size_t *, fakecuda_kernel_fn) = (CUfunction(*)(
        const char *, int, const size_t *, fakecuda_kernel_fn))need(cu, "fakecuda_kernel");
    *(void **)&access_fn = need(cu, "fakecuda_access");
    *(void **)&page_state = need(cu, "fakecuda_managed_state");
    *(void **)&where_fn = need(cu, "fakecuda_where");
    *(void **)&calls_fn = need(cu, "fakecuda_calls");
    *(void **)&stats_fn = need(RTLD_DEFAULT, "woffload_stats");
    *(void **)&tag_fn = need(RTLD_DEFAULT, "woffload_tag");
    const size_t psz[] = {sizeof(void *), sizeof(size_t), sizeof(void *)};
    CHECK(fakecudart_register((const void *)stub_sum,
                              reg("ggml_sum", 3, psz, stream ? k_sum_seen : k_sum)) == 0,
          "register the graph's kernel");
    const size_t rsz[] = {sizeof(void *), sizeof(void *), sizeof(size_t), sizeof(size_t),
                          sizeof(size_t), sizeof(size_t), sizeof(void *)};
    CHECK(fakecudart_register((const void *)stub_rows, reg("ggml_rows", 7, rsz, k_rows)) == 0,
          "register the picks' kernel");

    /* 0. common_fit_params' dry run: the model "loaded" with no_alloc
     * (dummy buffers marked WEIGHTS), a context made (a backend): the hook
     * must neither name nor think loading has begun */
    ggml_backend_buffer_t dummy = fggml_dummy_buffer(fggml_buft_device());
    ggml_backend_buffer_set_usage(dummy, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    CHECK(ggml_backend_dev_init(NULL, NULL) != NULL, "dry run's backend");
    fggml_buffer_free(dummy);

    /* 1. the model's contexts and buffers (llama_model::load_tensors) */
    struct ggml_context *dev = fggml_ctx_new(), *cpu = fggml_ctx_new();
    for (size_t w = 0; w < NW; w++)
        wt[w] = fggml_new_tensor(dev, weights[w].name, weights[w].size);
    cpu_t = fggml_new_tensor(cpu, "blk.1.ffn_gate_exps.weight", 512 * KiB);
    ggml_backend_buffer_t bdev = ggml_backend_alloc_ctx_tensors_from_buft(dev, fggml_buft_device());
    ggml_backend_buffer_t bcpu = ggml_backend_alloc_ctx_tensors_from_buft(cpu, fggml_buft_host());
    CHECK(bdev && bcpu, "model buffers allocated");
    if (!bdev || !bcpu)
        return 1;
    CHECK(ggml_backend_buffer_is_multi_buffer(bdev) == (split != 0),
          "the device model buffer is %s", split ? "split by tensor" : "one buffer");
    if (split) {
        /* each weight of 1 MiB or more has a buffer (one cudaMalloc) of
         * its own, matched to its announced name by the shim */
        long long big = 0;
        for (size_t w = 0; w < NW; w++) {
            if (weights[w].size < MiB)
                continue;
            big++;
            for (size_t v = 0; v < NW; v++)
                CHECK(v == w || fggml_tensor_buffer(wt[v]) != fggml_tensor_buffer(wt[w]),
                      "--split: %s is not in %s's buffer", weights[v].name, weights[w].name);
        }
        for (size_t w = 0; w < NW; w++) {
            size_t v = 0;
            while (v < w && fggml_tensor_buffer(wt[v]) != fggml_tensor_buffer(wt[w]))
                v++;
            split_buffers += v == w;
        }
        char *js = stats();
        const char *x = js ? strstr(js, "\"expect\":{") : NULL;
        CHECK(x && field(x, "names") == big && field(x, "matched") == big,
              "--split: the %lld weights of 1 MiB or more announced before their bytes and "
              "matched (%lld, %lld)",
              big, x ? field(x, "names") : -1, x ? field(x, "matched") : -1);
        free(js);
    }
    ggml_backend_buffer_set_usage(bdev, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    ggml_backend_buffer_set_usage(bcpu, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    /* Named before a byte is written: a weight placed on the host is
     * advised there already, so llama.cpp's writes land on the host and
     * loading never holds it on the device (seal then only confirms);
     * a device weight's pages are left to the first write. Checked on a
     * page wholly inside each weight. */
    /* Late bound (--late): every 2 MiB granule wholly inside a host
     * weight is backed on the host already (a shared one is seal's). */
    size_t inner = 0;
    for (size_t w = 0; w < NW && !unnamed && !pass; w++) {
        const char *mid = (const char *)fggml_data(wt[w]) + weights[w].size / 2;
        int host = regexec(&re, weights[w].name, 0, NULL, 0) == 0;
        struct fakecuda_page_state ps;
        if (late) {
            const uintptr_t G = 2u << 20, b = (uintptr_t)fggml_data(wt[w]);
            for (uintptr_t g = (b + G - 1) & ~(G - 1); host && g + G <= b + weights[w].size;
                 g += G) {
                inner++;
                CHECK(where_fn((const void *)g) == CU_DEVICE_CPU,
                      "%s: before loading, its granule at +%zu backed on the host (where %d)",
                      weights[w].name, (size_t)(g - b), where_fn((const void *)g));
            }
            continue;
        }
        int got = page_state(mid, &ps);
        if (split && (weights[w].size < MiB || host)) {
            /* small: the engine's own device memory; a host one: pinned
             * before its bytes (the plan's), never managed */
            int want = weights[w].size < MiB ? 0 : CU_DEVICE_CPU;
            CHECK(got == -ENOENT && where_fn(mid) == want,
                  "--split: %s, before loading, %s (page state %d, where %d)", weights[w].name,
                  want ? "pinned host memory" : "device memory", got, where_fn(mid));
            continue;
        }
        /* under fit (--fit) every name waits on the host for seal's choice */
        host |= fit;
        CHECK(got == 0 && (host ? ps.preferred == CU_DEVICE_CPU : ps.preferred != CU_DEVICE_CPU),
              "%s: before loading, its pages %s (preferred %d)", weights[w].name,
              host ? "advised to the host" : "not advised to the host", got == 0 ? ps.preferred : -99);
    }
    if (late && !unnamed && !pass && regexec(&re, "blk.0.ffn_gate_exps.weight", 0, NULL, 0) == 0)
        CHECK(inner > 0, "late bound: %zu whole granules of host weights checked before loading",
              inner);

    /* 2. load_all_data */
    size_t maxw = 0;
    for (size_t w = 0; w < NW; w++)
        maxw = weights[w].size > maxw ? weights[w].size : maxw;
    src = malloc(maxw);
    back = malloc(maxw);
    for (size_t w = 0; w < NW; w++) {
        for (size_t i = 0; i < weights[w].size; i++)
            src[i] = pattern(w, i);
        ggml_backend_tensor_set(wt[w], src, 0, weights[w].size);
    }
    memset(src, 0x5a, 512 * KiB);
    ggml_backend_tensor_set(cpu_t, src, 0, 512 * KiB);

    /* 3. llama_context: a backend, then the KV cache */
    ggml_backend_t be = ggml_backend_dev_init(NULL, NULL);
    CHECK(be != NULL, "backend");
    struct ggml_context *kv = fggml_ctx_new();
    kv_t = fggml_new_tensor(kv, "cache_k_l0", 2 * MiB);
    ggml_backend_buffer_t bkv = ggml_backend_alloc_ctx_tensors_from_buft(kv, fggml_buft_device());
    CHECK(bkv != NULL, "KV cache allocated");
    if (!bkv)
        return 1;

    /* 4. the first graph (seal), its kernels, the bytes back */
    CHECK(ggml_backend_sched_graph_compute_async(NULL, NULL) == GGML_STATUS_SUCCESS,
          "first compute");
    CHECK(cudaMalloc((void **)&sums, NW * sizeof(uint64_t)) == cudaSuccess, "sums");
    for (size_t w = 0; w < NW; w++) {
        const void *x = fggml_data(wt[w]);
        size_t n = weights[w].size;
        uint64_t *o = sums + w;
        void *args[] = {&x, &n, &o};
        CHECK(cudaLaunchKernel((const void *)stub_sum, (dim3){1, 1, 1}, (dim3){1, 1, 1}, args, 0,
                               NULL) == cudaSuccess,
              "launch on %s", weights[w].name);
    }
    /* ggml-cuda's CUDA graphs: the same kernels captured on a stream of
     * its own and the graph launched twice; each launch of the graph
     * counts for every name its kernels read (docs/placement.md, Stats) */
    cudaStream_t s = NULL;
    cudaGraph_t g = NULL;
    cudaGraphExec_t ge = NULL;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "stream");
    capture_sums(wt, sums, s, cudaStreamCaptureModeGlobal, &g, &ge);
    for (int i = 0; i < 2; i++)
        CHECK(cudaGraphLaunch(ge, s) == cudaSuccess, "graph launch %d", i + 1);
    CHECK(cudaStreamSynchronize(s) == cudaSuccess, "graph done");
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    cudaStreamDestroy(s);

    uint64_t got[NW];
    CHECK(cudaMemcpy(got, sums, sizeof(got), cudaMemcpyDeviceToHost) == cudaSuccess, "sums back");
    for (size_t w = 0; w < NW; w++) {
        uint64_t want = 0;
        for (size_t i = 0; i < weights[w].size; i++)
            want += pattern(w, i) * (uint64_t)(i % 7 + 1);
        CHECK(got[w] == want, "kernel sum of %s", weights[w].name);
        CHECK(cudaMemcpy(back, fggml_data(wt[w]), weights[w].size, cudaMemcpyDeviceToHost) ==
                  cudaSuccess,
              "read back %s", weights[w].name);
        int same = 1;
        for (size_t i = 0; i < weights[w].size && same; i++)
            same = back[i] == pattern(w, i);
        CHECK(same, "%s bit-exact", weights[w].name);
    }

    /* --free-early: llama-batched-bench's exit on the H200. One compute asks
     * the copy engine's pinned mirrors of the host expert tensors (made by a
     * shim thread that copies them with the CPU; the test's WOFAKE_DELAY
     * holds it in cuCtxSynchronize), then the model buffer is freed at once,
     * which unmaps those tensors: the shim must drop the mirrors, not read
     * the freed memory (SIGSEGV in memcpy before the fix), and say so */
    /* --free-other: the same, but what is freed is other memory (the
     * compute buffers, one more allocation), as llama-batched-bench does
     * between its steps: the mirrors are made, none dropped (before, any
     * free dropped them: on the H200 they were made again and again, b32
     * 60.53 against the kernel's 101.80 tok/s) */
    if (free_early || free_other) {
        struct picks_ctx *c = picks_ctx_new(wt, free_early ? "--free-early" : "--free-other");
        void *other = NULL;

        if (c) {
            picks_step(c, PICKS_TOKENS);
            picks_ctx_free(c);
        }
        if (free_early) {
            fggml_buffer_free(bdev);
            bdev = NULL;
        } else if (cudaMalloc(&other, 1 << 20) == cudaSuccess) {
            cudaFree(other);
        }
        /* the mirrorer's delayed sync returns meanwhile: until it has made
         * or dropped one (at most 15 s: a sanitizer on a loaded machine) */
        for (int i = 0; i < 300 && engine_field("mirrors_dropped") + engine_field("mirrors") < 1;
             i++)
            usleep(50000);
        if (free_early)
            CHECK(engine_field("mirrors_dropped") >= 1 && engine_field("mirrors") == 0,
                  "--free-early: the mirrors under way at the model buffer's free dropped "
                  "(%lld), none made from the freed memory (%lld)",
                  engine_field("mirrors_dropped"), engine_field("mirrors"));
        else
            CHECK(engine_field("mirrors_dropped") == 0 && engine_field("mirrors") >= 1,
                  "--free-other: frees of other memory dropped no mirror (%lld), %lld made",
                  engine_field("mirrors_dropped"), engine_field("mirrors"));
        /* made as the streaming executor's pinned copies: pages faulted in
         * first, then registered (not cuMemHostAlloc, which zeroes them
         * inside the driver while the engine's launches wait) */
        if (!free_early)
            CHECK(calls_fn("cuMemHostRegister_v2") >= (uint64_t)engine_field("mirrors"),
                  "--free-other: each mirror's pages registered (%llu registrations)",
                  (unsigned long long)calls_fn("cuMemHostRegister_v2"));
        goto out;
    }

    /* picks first: registrations in rows claim a tensor only while they
     * hold ids, so the streaming executor takes the host experts after */
    /* late bound: picked copies read the bound range in place, as the
     * streaming executor (uvm/picks.c, describe): nothing staged; with
     * WOFFLOAD_BIND_COPIES=1 they copy from it as from host memory */
    if (picks)
        picks_steps(wt, picks_off || (late && !bind_copies()));
    picks_registered = picks && !picks_off && !(late && !bind_copies());
    if (band >= 0)
        band_steps(wt, band);
    if (claims)
        claims_steps(wt);
    if (stream)
        stream_steps(wt, sums, &re);

    /* What the shim learned. Launch counts come from its consumer thread:
     * give it up to 5 s. */
    char *js = NULL;
    for (int tries = 0; tries < 100; tries++) {
        int all = 1;
        free(js);
        js = stats();
        for (size_t w = 0; js && w < NW && !unnamed && !pass; w++) {
            if (split && weights[w].size < MiB)
                continue;
            char *e = name_entry(js, weights[w].name);
            all &= e && field(e, "launches") >= 3;
            free(e);
        }
        if (all)
            break;
        nanosleep(&(struct timespec){0, 50 * 1000 * 1000}, NULL);
    }
    CHECK(js != NULL, "woffload_stats");
    if (!js)
        return 1;
    if (full) {
        /* a device whose free memory holds less than the model buffer: one
         * buffer would be pinned whole by the managed cap, and fit would
         * place nothing on the device */
        const char *mc = strstr(js, "\"managed_cap\":{"), *ft = strstr(js, "\"fit\":{");
        CHECK(mc && field(mc, "pinned") == 0, "--full: the managed cap pinned nothing (%lld)",
              mc ? field(mc, "pinned") : -1);
        CHECK(ft && field(ft, "device_bytes") > 0, "--full: fit placed %lld bytes on the device",
              ft ? field(ft, "device_bytes") : -1);
    }
    for (size_t w = 0; w < NW; w++) {
        const char *nm = weights[w].name;
        char *e = name_entry(js, nm);
        int host = regexec(&re, nm, 0, NULL, 0) == 0;
        const char *mid = (const char *)fggml_data(wt[w]) + weights[w].size / 2;
        struct fakecuda_page_state ps;
        if (unnamed || (split && weights[w].size < MiB)) {
            /* --split: a small weight is in a buffer of the engine's own */
            CHECK(e == NULL, "%s not named", nm);
            free(e);
            continue;
        }
        CHECK(e != NULL, "%s named", nm);
        if (!e)
            continue;
        CHECK(field(e, "tensors") == 1 && field(e, "bytes") == (long long)weights[w].size,
              "%s: one tensor of %zu bytes (%s)", nm, weights[w].size, e);
        if (pass) {
            CHECK(strstr(e, "\"placement\":\"unplaceable\"") != NULL &&
                      page_state(mid, &ps) == -ENOENT,
                  "%s passes through as device memory (%s)", nm, e);
        } else {
            CHECK(strstr(e, host ? "\"placement\":\"host\"" : "\"placement\":\"device\"") != NULL,
                  "%s placed on the %s (%s)", nm, host ? "host" : "device", e);
            CHECK(field(e, "launches") >= 3,
                  "%s: its launch and the graph's two attributed to it (launches %lld)", nm,
                  field(e, "launches"));
            if (late) {
                /* 2 MiB granules; one that holds a byte of a device-placed
                 * weight is on the device (docs/llamacpp.md) */
                const uintptr_t G = 2u << 20, g0 = (uintptr_t)mid & ~(G - 1);
                int on_dev = !host;
                for (size_t v = 0; v < NW && !on_dev; v++) {
                    uintptr_t b = (uintptr_t)fggml_data(wt[v]);
                    on_dev = regexec(&re, weights[v].name, 0, NULL, 0) != 0 && b < g0 + G &&
                          b + weights[v].size > g0;
                }
                CHECK(where_fn(mid) == (on_dev ? 0 : CU_DEVICE_CPU),
                      "%s: late bound, its middle's granule backed on the %s (where %d)", nm,
                      on_dev ? "device" : "host", where_fn(mid));
            } else if (split && host) {
                CHECK(page_state(mid, &ps) == -ENOENT && where_fn(mid) == CU_DEVICE_CPU,
                      "--split: %s: pinned host memory (where %d)", nm, where_fn(mid));
            } else {
                CHECK(page_state(mid, &ps) == 0 && ps.preferred == (host ? CU_DEVICE_CPU : 0),
                      "%s: its pages advised to the %s (preferred %d)", nm, host ? "host" : "device",
                      ps.preferred);
            }
        }
        /* the same name on exactly its range is a repeat (0), and still
         * one tensor: the hook's tag is this range, not a neighbour's */
        CHECK(tag_fn(fggml_data(wt[w]), weights[w].size, nm) == 0, "%s tagged at its own range",
              nm);
        free(e);
    }
    if (!unnamed) {
        free(js);
        js = stats();
        for (size_t w = 0; js && w < NW; w++) {
            if (split && weights[w].size < MiB)
                continue; /* never named */
            char *e = name_entry(js, weights[w].name);
            CHECK(e && field(e, "tensors") == 1, "%s: still one tensor after the repeat tag",
                  weights[w].name);
            free(e);
        }
    }
    char *e = name_entry(js, "blk.1.ffn_gate_exps.weight");
    CHECK(e == NULL, "the host buffer's tensor is left alone");
    free(e);
    e = name_entry(js, "cache_k_l0");
    CHECK(e == NULL, "the KV cache is not named");
    free(e);
    /* (ggml linked in, the policy's window is open at start, as without
     * the hook: the KV cache is the window's) */
    struct fakecuda_page_state ps;
    if (!unnamed)
        CHECK(page_state(fggml_data(kv_t), &ps) == -ENOENT,
              "the KV cache is device memory, not managed");
    free(js);

out:
    fggml_buffer_free(bkv);
    if (bdev) /* --free-early freed it */
        fggml_buffer_free(bdev);
    fggml_buffer_free(bcpu);
    cudaFree(sums);
    fggml_ctx_free(kv);
    fggml_ctx_free(dev);
    fggml_ctx_free(cpu);
    free(src);
    free(back);
    regfree(&re);
    printf("%s\n", failures ? "FAILED" : "PASSED");
    return failures ? 1 : 0;
}
