/* ggml/woffload-ggml.c: the ggml registration hook (libwoffload-ggml.so).
 *
 * Preloaded after libwoffload.so into a program that uses ggml as shared
 * libraries (llama.cpp's llama-server, llama-cli, llama-batched-bench), it
 * names the model's weights by their GGUF names (blk.3.ffn_up_exps.weight)
 * through the public API of include/woffload.h, as python/woffload does for
 * PyTorch. It is a client of that API only: it never reaches into the shim,
 * and every woffload_* function is looked up with dlsym(RTLD_DEFAULT), so
 * without the shim it passes everything through.
 *
 * What it interposes (exported functions of libggml-base.so that libllama.so
 * calls through its PLT), and why (docs/llamacpp.md has the source lines):
 *   ggml_backend_alloc_ctx_tensors_from_buft  the model buffer's allocation:
 *       on a device buffer type, opened inside the placeable window so the
 *       buffer's cudaMalloc is served by the shim (same address, placeable)
 *   ggml_backend_buft_get_max_size  asked by ggml inside that allocation:
 *       under fit (or where the one buffer would pass the managed cap) the
 *       hook has announced the buffer's tensors by name (woffload_expect)
 *       and answers 1 MiB, so ggml gives each tensor a buffer of its own,
 *       which the shim serves by the plan ("names before bytes" below)
 *   ggml_backend_buffer_set_usage  llama.cpp marks a model buffer WEIGHTS
 *       right after allocating it, before any byte is written: the tensors of
 *       such a buffer are tagged by name then (never the KV cache's)
 *   ggml_backend_tensor_set, ggml_backend_tensor_set_async,
 *   ggml_backend_dev_init  the first write (or the upload backend of
 *       --no-mmap) after a weights buffer: loading has begun, no model
 *       buffer follows; later buffers (KV cache, LoRA) are left alone
 *   ggml_backend_sched_graph_compute(_async)  the first graph computed after
 *       loading: every weight is written, seal; and at every compute, each
 *       MoE layer's router picks (the node ffn_moe_topk-L, llama.cpp's
 *       name) registered for the layer's expert tensors
 *       (woffload_moe_picks_rows) before the real call and cleared after
 *       it: the shim then copies only the picked experts of host expert
 *       tensors on the launches' own stream, or, in a compute of few
 *       tokens, the tensors claimed read in place (woffload_read_in_place):
 *       the streaming executor copies them whole only in the computes of
 *       many ("picked experts" below)
 * Accessors (ggml_get_first_tensor, ggml_get_next_tensor, ggml_get_name,
 * ggml_get_data, ggml_nbytes, ggml_backend_buffer_get_base/_size/_type,
 * ggml_backend_buft_is_host, ggml_backend_buft_name; for the split
 * ggml_backend_buft_get_alloc_size/_alignment,
 * ggml_backend_buffer_is_multi_buffer; for the picks
 * ggml_graph_n_nodes, ggml_graph_node, ggml_nelements, ggml_nrows,
 * ggml_is_contiguous, ggml_element_size) are resolved with dlsym too: no
 * struct offset of ggml is used, so ggml versions can change them.
 *
 * A program with ggml linked into the executable cannot be interposed: one
 * message says so and everything passes through. */
#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define WO_GGML_EXPORT __attribute__((visibility("default")))

#include "ggml-abi.h"

/* ---- the table of real functions ------------------------------------------- */

static struct {
    ggml_backend_buffer_t (*alloc_ctx_tensors_from_buft)(struct ggml_context *,
                                                         ggml_backend_buffer_type_t);
    void (*buffer_set_usage)(ggml_backend_buffer_t, enum ggml_backend_buffer_usage);
    void (*tensor_set)(struct ggml_tensor *, const void *, size_t, size_t);
    void (*tensor_set_async)(ggml_backend_t, struct ggml_tensor *, const void *, size_t, size_t);
    ggml_backend_t (*dev_init)(ggml_backend_dev_t, const char *);
    enum ggml_status (*sched_graph_compute)(ggml_backend_sched_t, struct ggml_cgraph *);
    enum ggml_status (*sched_graph_compute_async)(ggml_backend_sched_t, struct ggml_cgraph *);
    size_t (*buft_get_max_size)(ggml_backend_buffer_type_t);
    /* accessors */
    struct ggml_tensor *(*get_first_tensor)(const struct ggml_context *);
    struct ggml_tensor *(*get_next_tensor)(const struct ggml_context *, struct ggml_tensor *);
    const char *(*get_name)(const struct ggml_tensor *);
    void *(*get_data)(const struct ggml_tensor *);
    size_t (*nbytes)(const struct ggml_tensor *);
    void *(*buffer_get_base)(ggml_backend_buffer_t);
    size_t (*buffer_get_size)(ggml_backend_buffer_t);
    ggml_backend_buffer_type_t (*buffer_get_type)(ggml_backend_buffer_t);
    bool (*buft_is_host)(ggml_backend_buffer_type_t);
    const char *(*buft_name)(ggml_backend_buffer_type_t);
    /* the split's (NULL: no split) */
    size_t (*buft_get_alloc_size)(ggml_backend_buffer_type_t, const struct ggml_tensor *);
    size_t (*buft_get_alignment)(ggml_backend_buffer_type_t);
    bool (*buffer_is_multi_buffer)(ggml_backend_buffer_t); /* NULL: an older ggml */
    /* the picks' (NULL: no picks) */
    int (*graph_n_nodes)(struct ggml_cgraph *);
    struct ggml_tensor *(*graph_node)(struct ggml_cgraph *, int);
    long long (*nelements)(const struct ggml_tensor *);
    long long (*nrows)(const struct ggml_tensor *);
    bool (*is_contiguous)(const struct ggml_tensor *);
    size_t (*element_size)(const struct ggml_tensor *);
    /* include/woffload.h, from the shim when it is loaded */
    int (*window_open)(void);
    int (*window_close)(void);
    int (*tag)(const void *, size_t, const char *);
    int (*seal)(void);
    long (*stats)(char *, size_t);
    int (*readonly)(const void *, size_t); /* NULL: a libwoffload without it */
    int (*picks_rows)(const void *, size_t, unsigned, const void *, size_t, size_t, size_t,
                      unsigned); /* NULL: a libwoffload without it */
    int (*read_in_place)(const void *, size_t, int); /* NULL: a libwoffload without it */
    int (*departure_lag)(unsigned);                  /* NULL: a libwoffload without it */
    int (*expect)(const char *, size_t);             /* NULL: a libwoffload without it */
    int (*expect_end)(void);
} fwd; /* what each wrapper forwards to: the next definition (RTLD_NEXT), or libwoffload's */

static pthread_once_t real_once = PTHREAD_ONCE_INIT;
/* Set when the accessors were all found and the shim is loaded: the hook
 * names; otherwise every wrapper only forwards. */
static bool naming;

/* ---- logging (the shim's WOFFLOAD_LOG levels, read once) -------------------- */

enum { L_OFF, L_ERROR, L_WARN, L_INFO, L_DEBUG };
static int log_level = -1;

static int level_of(const char *s)
{
    static const char *const names[] = {"off", "error", "warn", "info", "debug", "trace"};
    if (!s || !*s)
        return L_WARN;
    if (s[0] >= '0' && s[0] <= '5' && !s[1])
        return s[0] - '0' > L_DEBUG ? L_DEBUG : s[0] - '0';
    if (strcasecmp(s, "warning") == 0)
        return L_WARN;
    for (int i = 0; i < 6; i++)
        if (strcasecmp(s, names[i]) == 0)
            return i > L_DEBUG ? L_DEBUG : i;
    return L_WARN;
}

__attribute__((format(printf, 2, 3))) static void say(int level, const char *fmt, ...)
{
    static const char *const tag[] = {"", "error: ", "warning: ", "", "debug: "};
    char line[1024];
    va_list ap;
    int n;

    if (log_level < 0)
        log_level = level_of(getenv("WOFFLOAD_LOG"));
    if (level > log_level)
        return;
    n = snprintf(line, sizeof(line), "woffload: ggml: %s", tag[level]);
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", line);
}

static void *next_sym(const char *name)
{
    return dlsym(RTLD_NEXT, name);
}

#define RESOLVE(field, sym) (*(void **)&fwd.field = next_sym(sym))
#define RESOLVE_API(field, sym) (*(void **)&fwd.field = dlsym(RTLD_DEFAULT, sym))

static void resolve(void)
{
    RESOLVE(alloc_ctx_tensors_from_buft, "ggml_backend_alloc_ctx_tensors_from_buft");
    RESOLVE(buffer_set_usage, "ggml_backend_buffer_set_usage");
    RESOLVE(tensor_set, "ggml_backend_tensor_set");
    RESOLVE(tensor_set_async, "ggml_backend_tensor_set_async");
    RESOLVE(dev_init, "ggml_backend_dev_init");
    RESOLVE(sched_graph_compute, "ggml_backend_sched_graph_compute");
    RESOLVE(sched_graph_compute_async, "ggml_backend_sched_graph_compute_async");
    RESOLVE(buft_get_max_size, "ggml_backend_buft_get_max_size");
    RESOLVE(buft_get_alloc_size, "ggml_backend_buft_get_alloc_size");
    RESOLVE(buft_get_alignment, "ggml_backend_buft_get_alignment");
    RESOLVE(buffer_is_multi_buffer, "ggml_backend_buffer_is_multi_buffer");
    RESOLVE(get_first_tensor, "ggml_get_first_tensor");
    RESOLVE(get_next_tensor, "ggml_get_next_tensor");
    RESOLVE(get_name, "ggml_get_name");
    RESOLVE(get_data, "ggml_get_data");
    RESOLVE(nbytes, "ggml_nbytes");
    RESOLVE(buffer_get_base, "ggml_backend_buffer_get_base");
    RESOLVE(buffer_get_size, "ggml_backend_buffer_get_size");
    RESOLVE(buffer_get_type, "ggml_backend_buffer_get_type");
    RESOLVE(buft_is_host, "ggml_backend_buft_is_host");
    RESOLVE(buft_name, "ggml_backend_buft_name");
    RESOLVE_API(window_open, "woffload_window_open");
    RESOLVE_API(window_close, "woffload_window_close");
    RESOLVE_API(tag, "woffload_tag");
    RESOLVE_API(seal, "woffload_seal");
    RESOLVE_API(stats, "woffload_stats");
    RESOLVE_API(readonly, "woffload_readonly");
    RESOLVE(graph_n_nodes, "ggml_graph_n_nodes");
    RESOLVE(graph_node, "ggml_graph_node");
    RESOLVE(nelements, "ggml_nelements");
    RESOLVE(nrows, "ggml_nrows");
    RESOLVE(is_contiguous, "ggml_is_contiguous");
    RESOLVE(element_size, "ggml_element_size");
    RESOLVE_API(picks_rows, "woffload_moe_picks_rows");
    RESOLVE_API(read_in_place, "woffload_read_in_place");
    RESOLVE_API(departure_lag, "woffload_departure_lag");
    RESOLVE_API(expect, "woffload_expect");
    RESOLVE_API(expect_end, "woffload_expect_end");

    if (!fwd.get_first_tensor || !fwd.get_next_tensor || !fwd.get_name || !fwd.get_data ||
        !fwd.nbytes || !fwd.buffer_get_base || !fwd.buffer_get_size || !fwd.buffer_get_type ||
        !fwd.buft_is_host || !fwd.buft_name) {
        say(L_WARN, "this ggml lacks an accessor the hook uses (ggml_get_data, ggml_nbytes, "
                    "ggml_backend_buft_is_host, ...): names cannot be learned; everything "
                    "passes through");
        return;
    }
    if (!fwd.window_open || !fwd.window_close || !fwd.tag || !fwd.seal || !fwd.stats) {
        say(L_WARN, "libwoffload.so is not loaded (LD_PRELOAD it before libwoffload-ggml.so, "
                    "or use woffload-run): names go nowhere; everything passes through");
        return;
    }
    naming = true;
}

static void ensure(void)
{
    pthread_once(&real_once, resolve);
}

/* A wrapper whose real function is missing cannot forward: ggml called a
 * function it does not define, which only a broken preload order causes. */
static void missing(const char *name)
{
    say(L_ERROR,
        "%s: the real function was not found after this library (dlsym RTLD_NEXT); "
        "preload libwoffload-ggml.so, do not link it",
        name);
    abort();
}

/* ---- the loading state ----------------------------------------------------- */

/* ALLOC: model buffers may come; LOADING: weights are being written, no
 * model buffer follows; SEALED: woffload_seal() was called. Only moves
 * forward. */
enum phase { PH_ALLOC, PH_LOADING, PH_SEALED };

struct candidate {
    ggml_backend_buffer_t buf;
    struct ggml_context *ctx;
    bool named;
    bool split; /* a buffer a tensor (split_model_buffer): a multi buffer of ggml's */
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int phase;         /* enum phase; read without the lock on the write paths (atomic) */
static bool weights_seen; /* a candidate was marked WEIGHTS (under lock; atomic reads) */
static bool window_checked;
/* The shim was not initialised when the hook looked (no CUDA call yet): its
 * start window opens with the first API call, so an -EALREADY from the
 * first woffload_window_open() is that window, closed after the buffer. */
static bool start_window_unknown;
static struct candidate *cands;
static size_t ncands, cap_cands;
static struct {
    unsigned long long buffers, tensors, bytes, unseen, failed, unnamed_buffers;
    unsigned long long split_buffers;
} books;
static bool called; /* any wrapper ran: the hook is in the call path */

static int phase_now(void)
{
    return __atomic_load_n(&phase, __ATOMIC_ACQUIRE);
}

/* The shim's stats (woffload_stats), malloc'd; NULL when it fails. */
static char *stats_json(void)
{
    long n = fwd.stats(NULL, 0);
    char *buf;

    for (int tries = 0; n >= 0 && tries < 4; tries++) {
        /* the stats may grow between two calls: room to spare */
        if (!(buf = malloc((size_t)n + 4097)))
            return NULL;
        long m = fwd.stats(buf, (size_t)n + 4097);
        if (m >= 0 && m < n + 4097)
            return buf;
        free(buf);
        n = m;
    }
    return NULL;
}

/* With a placing policy the shim opens its placeable window at start. For
 * ggml that would make every allocation of 1 MiB and more before seal
 * placeable (the KV cache, compute buffers): the hook opens the window
 * itself around each model buffer instead, so close it once. Under lock. */
static void close_start_window(void)
{
    char *buf;

    if (window_checked)
        return;
    window_checked = true;
    if (!(buf = stats_json()))
        return;
    if (strstr(buf, "\"initialised\":false"))
        start_window_unknown = true;
    else if (strstr(buf, "\"window_open\":true") && fwd.window_close() == 0)
        say(L_DEBUG, "closed the placeable window the policy opened at start: only model "
                     "buffers are opened to it, not the KV cache or compute buffers");
    free(buf);
}

/* Whether the shim keeps hot experts (WOFFLOAD_PICKS_HOT or the policy's
 * prefetch.hot_experts), picks on: its stats' picks object begins
 * {"enabled":true,"hot_experts":BYTES,"hot_experts_auto":BOOL,"names":... */
static bool hot_experts_asked(void)
{
    static const char on[] = "\"picks\":{\"enabled\":true,\"hot_experts\":";
    char *buf = stats_json();
    const char *p = buf ? strstr(buf, on) : NULL;
    char *end = NULL;
    bool r = false;

    if (p) {
        unsigned long long bytes = strtoull(p + strlen(on), &end, 10);
        r = bytes > 0 || strncmp(end, ",\"hot_experts_auto\":true", 24) == 0;
    }
    free(buf);
    return r;
}

static struct candidate *find(ggml_backend_buffer_t buf)
{
    for (size_t i = 0; i < ncands; i++)
        if (cands[i].buf == buf)
            return &cands[i];
    return NULL;
}

/* Room for one more element in the array *v of n (capacity *cap, doubled
 * from `first`); false when out of memory (the element is then not kept). */
static bool room(void **v, size_t *cap, size_t n, size_t size, size_t first)
{
    size_t c = *cap ? 2 * *cap : first;
    void *p;

    if (n < *cap)
        return true;
    if (!(p = realloc(*v, c * size)))
        return false;
    *v = p;
    *cap = c;
    return true;
}

static void remember(ggml_backend_buffer_t buf, struct ggml_context *ctx, bool split)
{
    if (!room((void **)&cands, &cap_cands, ncands, sizeof(*cands), 8))
        return;
    cands[ncands++] = (struct candidate){.buf = buf, .ctx = ctx, .split = split};
}

/* ---- names before bytes: a model buffer split by tensor ---------------------
 *
 * llama.cpp allocates a device context's weights as one buffer, one
 * cudaMalloc. The shim serves it as managed memory within the managed cap
 * (never more than the free device memory less its margin), so a model
 * larger than the free memory gets the whole buffer as pinned host memory:
 * nothing of it can reach the device, fit chooses among nothing, and a hand
 * policy's device names stay on the host (docs/placement.md, the managed
 * cap). Before that cudaMalloc the hook already knows every tensor's name
 * and size (the context). So it announces them (woffload_expect: the shim's
 * plan is made before a byte arrives) and has ggml allocate one buffer a
 * tensor, by ggml's own path for a buffer type's largest allocation: the
 * hook answers ggml_backend_buft_get_max_size with SPLIT_MAX in that call,
 * and ggml returns the buffers as one multi buffer, which llama.cpp takes
 * (its model buffers may be one already). Each allocation then matches its
 * name by size: one the plan puts on the host is pinned at once (by the
 * shim's worker, ahead of the loader), the others are managed memory within
 * the cap, and fit at seal chooses among all of them (docs/llamacpp.md,
 * "The model buffer split by tensor"). Tensors under SPLIT_MAX (norms, the
 * routers) share buffers of at most SPLIT_MAX, as ggml packs them; the shim
 * never matches them (uvm/place-expect.c).
 *
 * WOFFLOAD_GGML_SPLIT: 1 (the default) under fit, and under any placing
 * policy when the one buffer would pass the managed cap (it would be pinned
 * whole); 2 under any placing policy; 0 never (one buffer, served as
 * before). Never under late binding (WOFFLOAD_LATE_BIND=1), which places
 * the one buffer by tensor itself. */

#define SPLIT_MAX ((size_t)1 << 20)
/* the buffer type being split by this thread (set under lock) */
static __thread ggml_backend_buffer_type_t splitting;
static int split_mode = -1; /* WOFFLOAD_GGML_SPLIT */

/* The bytes ggml will allocate for ctx's tensors on buft: each one's
 * allocation size padded to the buffer type's alignment (ggml-alloc.c). */
static size_t padded_size(ggml_backend_buffer_type_t buft, const struct ggml_tensor *t)
{
    size_t align = fwd.buft_get_alignment(buft), size = fwd.buft_get_alloc_size(buft, t);
    return align > 1 ? (size + align - 1) / align * align : size;
}

/* A number after "key": in the stats json s (0 when absent). */
static unsigned long long stats_field(const char *s, const char *key)
{
    const char *p = s ? strstr(s, key) : NULL;
    return p ? strtoull(p + strlen(key), NULL, 10) : 0;
}

/* Whether the buffer of ctx on buft would pass the managed cap, which would
 * serve it whole as pinned host memory: its bytes beyond the free device
 * memory (cudaMemGetInfo, the engine's runtime, looked up as any symbol)
 * less the cap's margin and the managed memory the shim already serves
 * (stats json s). False when the free memory cannot be read. */
static bool past_cap(struct ggml_context *ctx, ggml_backend_buffer_type_t buft, const char *s)
{
    int (*mem_info)(size_t *, size_t *);
    const char *cap = s ? strstr(s, "\"managed_cap\":{") : NULL;
    unsigned long long margin = stats_field(cap, "\"margin\":"),
                       live = stats_field(cap, "\"live\":"), total = 0;
    size_t fr = 0, tot = 0;

    *(void **)&mem_info = dlsym(RTLD_DEFAULT, "cudaMemGetInfo");
    if (!mem_info || mem_info(&fr, &tot) != 0)
        return false;
    for (struct ggml_tensor *t = fwd.get_first_tensor(ctx); t; t = fwd.get_next_tensor(ctx, t))
        if (!fwd.get_data(t))
            total += padded_size(buft, t);
    say(L_DEBUG, "model buffer of %llu bytes; free %zu, the cap's margin %llu, managed %llu", total,
        fr, margin, live);
    return total + live + margin > fr;
}

/* Whether to split the model buffer of ctx on buft (under lock): the
 * setting, the functions it takes, and the shim's stats (a placing policy;
 * fit, or a buffer past the managed cap). */
static bool split_wanted(struct ggml_context *ctx, ggml_backend_buffer_type_t buft)
{
    char *buf;
    bool r;

    if (split_mode < 0) {
        const char *v = getenv("WOFFLOAD_GGML_SPLIT");
        split_mode = v && v[0] >= '0' && v[0] <= '2' && !v[1] ? v[0] - '0' : 1;
    }
    if (!split_mode || !fwd.expect || !fwd.expect_end || !fwd.buft_get_max_size ||
        !fwd.buft_get_alloc_size || !fwd.buft_get_alignment)
        return false;
    if (!(buf = stats_json()))
        return false;
    /* late binding places a buffer by tensor itself (uvm/place-bind.c) */
    r = strstr(buf, "\"placing\":true") && !strstr(buf, "\"late_bind\":{\"enabled\":true") &&
        (split_mode == 2 || strstr(buf, ",\"fit\":{") || past_cap(ctx, buft, buf));
    free(buf);
    return r;
}

/* Announces each tensor of ctx that the buffer will hold, by the size ggml
 * will allocate it (its allocation size, padded to the buffer type's
 * alignment), then says they are all (the shim places them now). Returns
 * how many it announced, *bytes their bytes. */
static unsigned long long announce_tensors(struct ggml_context *ctx,
                                           ggml_backend_buffer_type_t buft,
                                           unsigned long long *bytes)
{
    unsigned long long n = 0;

    *bytes = 0;
    for (struct ggml_tensor *t = fwd.get_first_tensor(ctx); t; t = fwd.get_next_tensor(ctx, t)) {
        const char *name = fwd.get_name(t);
        size_t size = padded_size(buft, t);
        int r;

        if (fwd.get_data(t) || size < SPLIT_MAX || !name || !*name)
            continue;
        r = fwd.expect(name, size);
        if (r == 0) {
            n++;
            *bytes += size;
        } else {
            say(L_WARN, "announcing '%s' (%zu bytes) before its bytes: %s", name, size,
                strerror(-r));
        }
    }
    (void)fwd.expect_end();
    return n;
}

/* ---- picked experts ---------------------------------------------------------
 *
 * A MoE layer's expert tensors (blk.L.ffn_{gate,up,down,gate_up}_exps.weight,
 * experts stacked on the slowest axis) are read only at the experts the
 * router picked for the step's tokens: llama.cpp's node ffn_moe_topk-L, the
 * first k columns of an argsort over the E experts (a row a token, E ids
 * apart), written on the GPU before the layer's MUL_MAT_ID. Before each
 * compute the hook registers those ids for the layer's expert tensors
 * (woffload_moe_picks_rows), and clears them after the call, whose launches
 * have all been issued by then. The shim copies, for a host expert tensor,
 * only the picked experts' bytes into a device buffer on the launch's stream
 * (uvm/picks.h); a tensor on the device is left alone, and a launch into a
 * CUDA graph capture (llama.cpp's single-sequence steps) reads in place.
 *
 * Only when asked, and only where it may pay: at n tokens a uniform router
 * picks 1 - (1 - k/E)^n of the experts, and a layer is registered when that
 * is at most WOFFLOAD_GGML_PICKS percent (0 by default: never). Above a
 * share near one the whole tensor is better moved by the copy engine,
 * overlapped with the kernels, than most of it copied on the engine's
 * stream; below it, llama.cpp's MUL_MAT_ID reading a host tensor in place
 * already fetches only the picked experts (on the H200 the picks made its
 * decode 2-3% slower: docs/llamacpp.md, "Picked experts"). E comes
 * from the node ffn_moe_probs-L (E columns, a row a token).
 *
 * From WOFFLOAD_GGML_PICKS_FROM percent (80 by default) up to
 * WOFFLOAD_GGML_STREAM a layer is registered as well: the shim's kernel
 * copies the picked experts to the device before MUL_MAT_ID reads them there
 * (on the H200, a 128-expert top-8 GGUF at a batch of 32, 87% picked: 102.7
 * tok/s against 95.9 read in place, llama.cpp's own -ot 101.7). Under fit
 * the default is 0 (band_from): llama-server at 32 requests under --fit decoded
 * 1.15-1.31x faster without the band, whose buffers took fit's room and
 * whose copies ran on the engine's stream, a pass of their own before each
 * MUL_MAT_ID, which without them reads the picked experts in place (the
 * claim below WOFFLOAD_GGML_STREAM)
 * (bench/results/llamacpp-serve-20261206c-p32-fitpicks-h100). With
 * WOFFLOAD_PICKS_ENGINE the copy engine moves their runs instead (uvm/
 * picks-dma.h), the way llama.cpp's -ot moves them, without its host sync.
 *
 * The same share says when a whole copy pays: read in place, MUL_MAT_ID
 * fetches the picked experts at 50-51 GB/s; the copy engine moves the whole
 * tensor at 55. So a layer not registered for picks whose share is below
 * WOFFLOAD_GGML_STREAM percent (92 by default, the ratio of the two) has its
 * expert tensors claimed read in place from that compute until one of a
 * larger share (woffload_read_in_place): the streaming executor stages
 * them only in computes of enough tokens (a prompt's ubatch, a batch of 32
 * on the 32-expert GGUF), and under prefetch.mode auto streams them for
 * those. */

#define MAX_LAYERS 1024
#define MAX_PICKED 1024 /* the shim's WO_PICKS_SPANS */

struct expert_tensor {
    int layer;
    void *data;
    size_t size;
};
static struct expert_tensor *experts; /* under lock while loading; read-only once sealed */
static size_t nexperts, cap_experts;
static int picks_pct = -1;  /* WOFFLOAD_GGML_PICKS */
static int stream_pct = -1; /* WOFFLOAD_GGML_STREAM */
static int from_pct = -1;   /* WOFFLOAD_GGML_PICKS_FROM */
static struct {
    unsigned long long computes, registered, too_many, layers, claimed, claims;
} pbooks; /* atomics */

/* Remembers a tagged weight that is a layer's stacked expert tensor. Under lock. */
static void note_expert(const char *name, void *data, size_t size)
{
    int layer, end = 0;

    if (sscanf(name, "blk.%d.ffn_%*[a-z_]%n", &layer, &end) != 1 || layer < 0 ||
        layer >= MAX_LAYERS || end < 5 || strncmp(name + end - 5, "_exps", 5) != 0 ||
        strcmp(name + end, ".weight") != 0)
        return;
    if (!room((void **)&experts, &cap_experts, nexperts, sizeof(*experts), 64))
        return;
    experts[nexperts++] = (struct expert_tensor){layer, data, size};
}

static int layer_of(const char *name, const char *prefix)
{
    size_t n = strlen(prefix);
    char *end;
    long l;

    if (strncmp(name, prefix, n) != 0 || name[n] < '0' || name[n] > '9')
        return -1;
    l = strtol(name + n, &end, 10);
    return *end || l >= MAX_LAYERS ? -1 : (int)l;
}

/* A percent setting; the shim's settings check reports a bad value, the
 * default here too. */
static int pct_setting(const char *name, int dflt)
{
    const char *v = getenv(name);
    char *end;
    long p;

    if (!v || !*v)
        return dflt;
    p = strtol(v, &end, 10);
    return *end || p < 0 || p > 100 ? dflt : (int)p;
}

/* Where the band of WOFFLOAD_GGML_PICKS_FROM starts, once sealed, from one
 * read of the shim's stats: 0 unless it placed an expert tensor off the
 * device (host or managed, by the stats' names); else the setting, whose
 * default is 80, and 0 under fit (the stats have a fit object), as fit
 * keeps no room for the band's buffers unless it is given
 * (uvm/fit-split.c, fit_picks_room). */
static int band_from(void)
{
    static const char key[] = "_exps.weight\",\"placement\":\"";
    char *buf = stats_json();
    bool off = false;
    int r = 0;

    for (const char *p = buf; p && !off && (p = strstr(p, key)); p += sizeof(key) - 1)
        off = strncmp(p + sizeof(key) - 1, "host\"", 5) == 0 ||
              strncmp(p + sizeof(key) - 1, "managed\"", 8) == 0;
    if (off)
        r = pct_setting("WOFFLOAD_GGML_PICKS_FROM", strstr(buf, ",\"fit\":{\"budget\":") ? 0 : 80);
    free(buf);
    return r;
}

/* A thread's compute with picks: what the graph holds per layer (up to
 * `top`, the highest layer seen + 1; cleared after each compute), and what
 * was registered, to clear after it. Made once a thread (24 KiB). */
struct scratch {
    struct ggml_tensor *topk[MAX_LAYERS];
    long long n_exp[MAX_LAYERS];
    int top;
    struct reg {
        const struct expert_tensor *t;
        unsigned n_experts;
    } regs[MAX_PICKED];
};

/* Layer l's expert tensors claimed read in place (want) or not, from this
 * compute on. A claim holds across computes until one of another share
 * comes: cleared after each compute, it would leave the executor a moment
 * between two computes of few tokens to stage the whole tensors. A tensor
 * with nothing streamed is claimed at a later compute, once it is. */
static pthread_mutex_t claims_lock = PTHREAD_MUTEX_INITIALIZER;
static bool *claimed_now; /* by experts[] index, the first claimed_n of them */
static size_t claimed_n;

static void claim_layer(int l, bool want)
{
    unsigned long long n = 0;

    if (!fwd.read_in_place)
        return;
    pthread_mutex_lock(&claims_lock);
    if (!claimed_now && (claimed_now = calloc(nexperts, sizeof(*claimed_now))))
        claimed_n = nexperts; /* tagged before seal: no expert tensor comes after */
    for (size_t x = 0; x < claimed_n; x++) {
        const struct expert_tensor *et = &experts[x];
        if (et->layer != l || claimed_now[x] == want)
            continue;
        if (!want) {
            (void)fwd.read_in_place(et->data, et->size, 0);
            claimed_now[x] = false;
        } else if (fwd.read_in_place(et->data, et->size, 1) > 0) {
            claimed_now[x] = true; /* > 0: a streamed span was claimed */
            n++;
        }
    }
    pthread_mutex_unlock(&claims_lock);
    if (n)
        __atomic_add_fetch(&pbooks.claims, n, __ATOMIC_RELAXED);
}

/* Whether the graph walk of claims can pay: a graph of a few thousand nodes
 * costs tens of microseconds to walk, a few percent of an all-GPU decode
 * step, so with claims alone (no picks asked) the hook walks only once an
 * expert tensor turned out to be streamed (a claim of it found a span).
 * Until then it probes at the 1st, 2nd, 4th, ... compute, then every 1024th:
 * a claim made and ended at once for each expert tensor. */
static bool claims_pay(void)
{
    static unsigned long long computes, probe_at = 1;
    static int found;
    unsigned long long n;
    bool any = false;

    if (__atomic_load_n(&found, __ATOMIC_ACQUIRE))
        return true;
    pthread_mutex_lock(&claims_lock);
    n = ++computes;
    if (n >= probe_at && !found) {
        probe_at = n < 1024 ? 2 * n : n + 1024;
        for (size_t x = 0; x < nexperts; x++)
            if (fwd.read_in_place(experts[x].data, experts[x].size, 1) > 0) {
                (void)fwd.read_in_place(experts[x].data, experts[x].size, 0);
                any = true;
            }
        if (any)
            __atomic_store_n(&found, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&claims_lock);
    return any;
}

/* With picks from a share (WOFFLOAD_GGML_PICKS_FROM), each expert tensor of
 * layer l is made known to the shim at its first compute, registered or
 * not (a clear: no ids): the shim then starts its pinned mirror, seconds
 * of copying, before the first batch large enough to copy from it
 * (llama-batched-bench's b32 lasts a fraction of a second). Once each. */
static void announce(int l, unsigned e)
{
    static unsigned char *done; /* by expert tensor; under claims_lock */
    static size_t ndone;

    pthread_mutex_lock(&claims_lock);
    if (ndone < nexperts) {
        /* a model loaded since: room for its tensors too */
        unsigned char *p = realloc(done, nexperts);
        if (p) {
            memset(p + ndone, 0, nexperts - ndone);
            done = p;
            ndone = nexperts;
        }
    }
    for (size_t x = 0; done && x < ndone && x < nexperts; x++) {
        const struct expert_tensor *et = &experts[x];
        if (et->layer != l || done[x] || et->size % e)
            continue;
        done[x] = 1;
        (void)fwd.picks_rows(et->data, et->size, e, NULL, 0, 0, 0, 0);
    }
    pthread_mutex_unlock(&claims_lock);
}

/* Registers the picks of every MoE layer of graph g into sc->regs (and
 * returns how many), and claims the others' expert tensors read in place or
 * not, by their share of experts picked. */
static size_t picks_register(struct ggml_cgraph *g, struct scratch *sc)
{
    struct ggml_tensor **topk = sc->topk;
    long long *n_exp = sc->n_exp;
    int n = fwd.graph_n_nodes(g), layers = 0, claimed = 0;
    size_t nr = 0;
    bool want;

    sc->top = 0;
    for (int i = 0; i < n; i++) {
        struct ggml_tensor *t = fwd.graph_node(g, i);
        const char *name = t ? fwd.get_name(t) : NULL;
        int l;

        if (!name || strncmp(name, "ffn_moe_", 8) != 0)
            continue;
        if ((l = layer_of(name, "ffn_moe_topk-")) >= 0) {
            topk[l] = t;
        } else if ((l = layer_of(name, "ffn_moe_probs-")) >= 0) {
            long long rows = fwd.nrows(t), el = fwd.nelements(t);
            n_exp[l] = rows > 0 && el > 0 && el % rows == 0 ? el / rows : 0;
        } else {
            continue;
        }
        sc->top = l + 1 > sc->top ? l + 1 : sc->top;
    }
    for (int l = 0; l < sc->top; l++) {
        struct ggml_tensor *t = topk[l];
        long long rows, k, e = n_exp[l];
        size_t width, stride;
        void *ids;
        double share;

        if (!t || e <= 0 || e > 1024 || !(ids = fwd.get_data(t)))
            continue;
        rows = fwd.nrows(t);
        k = rows > 0 ? fwd.nelements(t) / rows : 0;
        width = fwd.element_size(t);
        if (k <= 0 || k > e || rows * k != fwd.nelements(t) || (width != 4 && width != 8))
            continue;
        /* the view of an argsort: its rows are E ids apart; a top-k op's own
         * output (contiguous) k apart */
        stride = fwd.is_contiguous(t) ? (size_t)k : (size_t)e;
        share = 1.0;
        for (long long r = 0; r < rows && share > 1e-6; r++)
            share *= 1.0 - (double)k / (double)e;
        share = 1.0 - share; /* the share of the experts a uniform router picks */
        if (fwd.picks_rows && ((picks_pct > 0 && share * 100.0 <= picks_pct + 1e-9) ||
                               (from_pct > 0 && share * 100.0 >= from_pct - 1e-9 &&
                                !(stream_pct > 0 && share * 100.0 >= stream_pct - 1e-9)))) {
            layers++;
            for (size_t x = 0; x < nexperts && nr < MAX_PICKED; x++) {
                const struct expert_tensor *et = &experts[x];
                if (et->layer != l || et->size % (size_t)e)
                    continue;
                if (fwd.picks_rows(et->data, et->size, (unsigned)e, ids, (size_t)k, (size_t)rows,
                                    stride, (unsigned)width) == 0)
                    sc->regs[nr++] = (struct reg){et, (unsigned)e};
            }
            claim_layer(l, false); /* the picks claim it */
            continue;
        }
        __atomic_add_fetch(&pbooks.too_many, 1, __ATOMIC_RELAXED);
        if (from_pct > 0)
            announce(l, (unsigned)e);
        /* below the share, read in place; at or above it the streaming
         * executor may copy them whole */
        want = fwd.read_in_place && stream_pct > 0 && share * 100.0 < stream_pct - 1e-9;
        claimed += want;
        claim_layer(l, want);
    }
    /* the next compute finds its own nodes */
    memset(topk, 0, (size_t)sc->top * sizeof(*topk));
    memset(n_exp, 0, (size_t)sc->top * sizeof(*n_exp));
    __atomic_add_fetch(&pbooks.computes, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&pbooks.registered, nr, __ATOMIC_RELAXED);
    __atomic_add_fetch(&pbooks.layers, (unsigned long long)layers, __ATOMIC_RELAXED);
    __atomic_add_fetch(&pbooks.claimed, (unsigned long long)claimed, __ATOMIC_RELAXED);
    return nr;
}

static void picks_clear(const struct scratch *sc, size_t nr)
{
    for (size_t i = 0; i < nr; i++)
        (void)fwd.picks_rows(sc->regs[i].t->data, sc->regs[i].t->size, sc->regs[i].n_experts,
                              NULL, 0, 0, 0, 0);
}

static bool picks_wanted(void)
{
    if (__atomic_load_n(&picks_pct, __ATOMIC_RELAXED) < 0) {
        __atomic_store_n(&stream_pct, pct_setting("WOFFLOAD_GGML_STREAM", 92), __ATOMIC_RELAXED);
        /* with hot experts every compute registers: a copy then takes the
         * hot rows from the device, whatever the share picked. A single
         * token's too, though its decode graph is then replayed kernel by
         * kernel: on the H200 (moe32 GGUF, 9 GiB hot) b1 decoded 26.30 and
         * 26.48 tok/s so, against 20.48 and 20.49 with single-token computes
         * read in place (bench/results/llamacpp-hook-20261205-hot-b1-h200.md) */
        bool hot = naming && fwd.picks_rows && hot_experts_asked();
        __atomic_store_n(&picks_pct, pct_setting("WOFFLOAD_GGML_PICKS", hot ? 100 : 0),
                         __ATOMIC_RELAXED);
    }
    /* once sealed: only with an expert tensor off the device (the walk of
     * each compute's graph is a cost an all-device model must not pay) */
    if (__atomic_load_n(&from_pct, __ATOMIC_RELAXED) < 0 && naming && fwd.picks_rows &&
        phase_now() == PH_SEALED)
        __atomic_store_n(&from_pct, band_from(), __ATOMIC_RELAXED);
    return naming && fwd.graph_n_nodes && fwd.graph_node && fwd.nelements && fwd.nrows &&
           fwd.is_contiguous && fwd.element_size && nexperts && phase_now() == PH_SEALED &&
           ((fwd.picks_rows && (picks_pct > 0 || from_pct > 0)) ||
            (fwd.read_in_place && stream_pct > 0));
}

/* The compute, with the picks registered around it. Each thread keeps its
 * own table of what it registered (a thread's launches use only its own
 * registrations: uvm/picks.h): two contexts computing on two threads at
 * once are not serialised. Two registering the same tensor at once take
 * turns on it; a launch whose thread's registration was replaced reads in
 * place (speed, never data). */
static enum ggml_status compute_with_picks(enum ggml_status (*fn)(ggml_backend_sched_t,
                                                                  struct ggml_cgraph *),
                                           ggml_backend_sched_t sched, struct ggml_cgraph *graph)
{
    static __thread struct scratch *sc; /* the thread's, kept for its life */
    /* ggml_backend_sched_graph_compute calls the _async one through the PLT,
     * that is through this hook again: the outer call registered already */
    static __thread int inside;
    static int said;
    enum ggml_status st;
    size_t nr;

    if (!graph || inside || !picks_wanted() ||
        (!(fwd.picks_rows && (picks_pct > 0 || from_pct > 0)) && !claims_pay()))
        return fn(sched, graph);
    if (!sc && !(sc = calloc(1, sizeof(*sc))))
        return fn(sched, graph);
    nr = picks_register(graph, sc);
    if (nr && !__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
        say(L_INFO, "picks: %zu expert tensors read only at their router's picks this compute "
                    "(ffn_moe_topk; up to %d%% of the experts picked)", nr, picks_pct);
    inside = 1;
    st = fn(sched, graph);
    inside = 0;
    picks_clear(sc, nr);
    return st;
}

/* Tags every tensor of a model buffer by its GGUF name, at the address
 * ggml gave it, before a byte is written. Under lock. */
static void name_tensors(struct candidate *c)
{
    unsigned long long n = 0, bytes = 0;
    const char *bname = fwd.buft_name(fwd.buffer_get_type(c->buf));

    for (struct ggml_tensor *t = fwd.get_first_tensor(c->ctx); t;
         t = fwd.get_next_tensor(c->ctx, t)) {
        const char *name = fwd.get_name(t);
        void *data = fwd.get_data(t);
        size_t size = fwd.nbytes(t);
        int r;

        if (!data || !size || !name || !*name)
            continue;
        /* split: a tensor under SPLIT_MAX is in a small buffer of the
         * engine's own device memory, which nothing can move (as the KV
         * cache): left unnamed */
        if (c->split && padded_size(fwd.buffer_get_type(c->buf), t) < SPLIT_MAX)
            continue;
        r = fwd.tag(data, size, name);
        say(L_DEBUG, "tag '%s' [%p, +%zu): %s", name, data, size, r == 0 ? "ok" : strerror(-r));
        if (r == 0) {
            n++;
            bytes += size;
            note_expert(name, data, size);
        } else if (r == -ENOENT) {
            books.unseen++; /* not memory the shim saw: the buffer did not come from cudaMalloc */
        } else {
            books.failed++;
            say(L_WARN, "tagging '%s' [%p, +%zu) in the %s buffer: %s", name, data, size,
                bname ? bname : "?", strerror(-r));
        }
    }
    /* llama.cpp never writes its weights from a kernel (copies into them,
     * a LoRA swap or a reload, are still seen): so a CUDA graph that reads
     * them is no blind launch, and streamed experts keep their staged
     * copies (woffload.h, woffload_readonly; WOFFLOAD_READONLY=0: not) */
    if (n && fwd.readonly && c->split) {
        /* a split buffer has no base: each of its buffers, at its first
         * tensor, the one not right after the one before it (ggml packs a
         * buffer's tensors at their padded sizes) */
        ggml_backend_buffer_type_t buft = fwd.buffer_get_type(c->buf);
        const char *end = NULL;
        unsigned long long ok = 0, asked = 0;
        for (struct ggml_tensor *t = fwd.get_first_tensor(c->ctx); t;
             t = fwd.get_next_tensor(c->ctx, t)) {
            const char *data = fwd.get_data(t);
            if (!data)
                continue;
            if (data != end) {
                asked++;
                ok += fwd.readonly(data, 0) == 0;
            }
            end = data + padded_size(buft, t);
        }
        say(ok == asked ? L_DEBUG : L_WARN,
            "split model buffer: %llu of its %llu buffers declared read-only to kernels", ok,
            asked);
    } else if (n && fwd.readonly) {
        int r = fwd.readonly(fwd.buffer_get_base(c->buf), 0);
        say(r == 0 ? L_DEBUG : L_WARN, "model buffer at %p declared read-only to kernels: %s",
            fwd.buffer_get_base(c->buf), r == 0 ? "ok" : strerror(-r));
    }
    c->named = true;
    books.buffers++;
    books.tensors += n;
    books.bytes += bytes;
    say(L_DEBUG, "%s model buffer%s (%zu bytes): %llu tensors named (%llu bytes)",
        bname ? bname : "?", c->split ? " split by tensor" : "", fwd.buffer_get_size(c->buf), n,
        bytes);
}

/* The first write after a weights buffer: loading has begun. */
static void loading_begins(const char *why)
{
    if (phase_now() != PH_ALLOC || !__atomic_load_n(&weights_seen, __ATOMIC_ACQUIRE))
        return;
    pthread_mutex_lock(&lock);
    if (phase == PH_ALLOC) {
        for (size_t i = 0; i < ncands; i++)
            if (!cands[i].named)
                books.unnamed_buffers++;
        __atomic_store_n(&phase, PH_LOADING, __ATOMIC_RELEASE);
        say(L_DEBUG, "loading begins (%s): %llu model buffers, %llu tensors named", why,
            books.buffers, books.tensors);
    }
    pthread_mutex_unlock(&lock);
}

/* After seal: a model buffer left whole that the managed cap served as
 * pinned host memory (the stats' managed_cap.pinned_largest is at least its
 * size) keeps every tensor on the host, whatever the policy says; the split
 * would not (said once, with the setting that asks it). */
static void pinned_whole_hint(void)
{
    char *buf = stats_json();
    unsigned long long largest = stats_field(buf, "\"pinned_largest\":");

    free(buf);
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < ncands && largest; i++) {
        size_t size = fwd.buffer_get_size(cands[i].buf);
        if (!cands[i].named || cands[i].split || !size || largest < size)
            continue;
        say(L_WARN,
            "the %.2f GiB model buffer passed the managed cap and was served whole as pinned "
            "host memory: every tensor in it stays on the host, whatever the policy places on "
            "the device; WOFFLOAD_GGML_SPLIT=2 has the hook split it by tensor (by default it "
            "does under fit, and where it sees the buffer pass the cap), so that what the "
            "policy keeps on the device can go there "
            "(docs/llamacpp.md, The model buffer split by tensor)",
            (double)size / (1024.0 * 1024.0 * 1024.0));
        break;
    }
    pthread_mutex_unlock(&lock);
}

static void seal_now(void)
{
    char b[64];
    int r;

    if (phase_now() != PH_LOADING)
        return;
    pthread_mutex_lock(&lock);
    if (phase != PH_LOADING) {
        pthread_mutex_unlock(&lock);
        return;
    }
    __atomic_store_n(&phase, PH_SEALED, __ATOMIC_RELEASE);
    snprintf(b, sizeof(b), "%.2f GiB", (double)books.bytes / (1024.0 * 1024.0 * 1024.0));
    say(L_INFO,
        "%llu tensors named (%s) in %llu model buffers (%llu split by tensor); sealing at the "
        "first graph compute",
        books.tensors, b, books.buffers, books.split_buffers);
    if (books.unseen)
        say(L_WARN,
            "%llu tensors were in memory the shim did not see allocated (not through "
            "cudaMalloc): their names are not recorded",
            books.unseen);
    if (books.unnamed_buffers)
        say(L_DEBUG,
            "%llu device buffers allocated before loading were never marked as "
            "weights: left unnamed",
            books.unnamed_buffers);
    pthread_mutex_unlock(&lock);
    /* llama.cpp launches every kernel that reads a weight, the one that
     * reads it through a pointer table another kernel of the same compute
     * wrote (cuBLAS's batched GEMM) included, before its first launch at the
     * next weight: a streamed range's staging slot may be reused once the
     * engine leaves it (a lag of one range; on llama-server at --parallel 32
     * 3.8-6.7% more tokens a second than two, on two H100s:
     * bench/results/llamacpp-serve-20261207c-p32-lag-fit-h100) */
    if (fwd.departure_lag && fwd.departure_lag(1) < 0)
        say(L_WARN, "woffload_departure_lag(1) refused: the streaming executor keeps its default "
                    "lag");
    r = fwd.seal();
    if (r < 0 && r != -EALREADY)
        say(L_WARN, "woffload_seal: %s (the shim's message above says which range)", strerror(-r));
    pinned_whole_hint();
}

/* ---- the exported wrappers ------------------------------------------------- */

WO_GGML_EXPORT ggml_backend_buffer_t
ggml_backend_alloc_ctx_tensors_from_buft(struct ggml_context *ctx, ggml_backend_buffer_type_t buft)
{
    ggml_backend_buffer_t buf;
    bool opened = false, split;
    unsigned long long n = 0, b = 0;
    int r;

    ensure();
    __atomic_store_n(&called, true, __ATOMIC_RELAXED);
    if (!fwd.alloc_ctx_tensors_from_buft)
        missing(__func__);
    if (!naming || phase_now() != PH_ALLOC || !buft || fwd.buft_is_host(buft))
        return fwd.alloc_ctx_tensors_from_buft(ctx, buft);

    pthread_mutex_lock(&lock);
    close_start_window();
    /* The buffer's cudaMalloc is made in the window: served by the shim,
     * placeable at the same address. -EALREADY: the program opened it
     * itself (leave it as found), or it is the policy's start window that
     * the shim opened just now (close it). */
    r = fwd.window_open();
    opened = r == 0 || (r == -EALREADY && start_window_unknown);
    start_window_unknown = false;
    split = split_wanted(ctx, buft);
    if (split)
        split = (n = announce_tensors(ctx, buft, &b)) > 0;
    splitting = split ? buft : NULL;
    buf = fwd.alloc_ctx_tensors_from_buft(ctx, buft);
    splitting = NULL;
    if (opened)
        (void)fwd.window_close();
    if (buf && split) {
        /* the split took when ggml asked the hook's max size: a multi buffer
         * (an older ggml without the test: taken as split; one tensor
         * announced may be the buffer's only one) */
        if (n > 1 && fwd.buffer_is_multi_buffer && !fwd.buffer_is_multi_buffer(buf)) {
            split = false;
            say(L_WARN,
                "the %s model buffer stayed one buffer (ggml did not ask the hook's "
                "ggml_backend_buft_get_max_size): the %llu names announced before their bytes "
                "match no allocation, and it is served as one (WOFFLOAD_GGML_SPLIT=0 says so "
                "without announcing)",
                fwd.buft_name(buft), n);
        } else {
            books.split_buffers++;
            say(L_INFO,
                "%s model buffer split by tensor: %llu tensors (%.2f GiB) announced before "
                "their bytes, each in an allocation of its own",
                fwd.buft_name(buft), n, (double)b / (1024.0 * 1024.0 * 1024.0));
        }
    }
    if (buf)
        remember(buf, ctx, split);
    pthread_mutex_unlock(&lock);
    return buf;
}

/* ggml-alloc.c asks it once per context it allocates: in the hook's own
 * allocation of a model buffer split by tensor, SPLIT_MAX, so that ggml
 * gives each tensor of SPLIT_MAX or more a buffer of its own. */
WO_GGML_EXPORT size_t ggml_backend_buft_get_max_size(ggml_backend_buffer_type_t buft)
{
    size_t m;

    ensure();
    if (!fwd.buft_get_max_size)
        missing(__func__);
    m = fwd.buft_get_max_size(buft);
    return splitting && buft == splitting && m > SPLIT_MAX ? SPLIT_MAX : m;
}

WO_GGML_EXPORT void ggml_backend_buffer_set_usage(ggml_backend_buffer_t buffer,
                                                  enum ggml_backend_buffer_usage usage)
{
    ensure();
    if (!fwd.buffer_set_usage)
        missing(__func__);
    fwd.buffer_set_usage(buffer, usage);
    if (!naming || usage != GGML_BACKEND_BUFFER_USAGE_WEIGHTS || phase_now() != PH_ALLOC)
        return;
    pthread_mutex_lock(&lock);
    struct candidate *c = find(buffer);
    if (c && !c->named && phase == PH_ALLOC) {
        name_tensors(c);
        __atomic_store_n(&weights_seen, true, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&lock);
}

WO_GGML_EXPORT void ggml_backend_tensor_set(struct ggml_tensor *tensor, const void *data,
                                            size_t offset, size_t size)
{
    ensure();
    if (!fwd.tensor_set)
        missing(__func__);
    if (naming)
        loading_begins("ggml_backend_tensor_set");
    fwd.tensor_set(tensor, data, offset, size);
}

WO_GGML_EXPORT void ggml_backend_tensor_set_async(ggml_backend_t backend,
                                                  struct ggml_tensor *tensor, const void *data,
                                                  size_t offset, size_t size)
{
    ensure();
    if (!fwd.tensor_set_async)
        missing(__func__);
    if (naming)
        loading_begins("ggml_backend_tensor_set_async");
    fwd.tensor_set_async(backend, tensor, data, offset, size);
}

WO_GGML_EXPORT ggml_backend_t ggml_backend_dev_init(ggml_backend_dev_t device, const char *params)
{
    ensure();
    if (!fwd.dev_init)
        missing(__func__);
    if (naming)
        loading_begins("ggml_backend_dev_init");
    return fwd.dev_init(device, params);
}

WO_GGML_EXPORT enum ggml_status ggml_backend_sched_graph_compute_async(ggml_backend_sched_t sched,
                                                                       struct ggml_cgraph *graph)
{
    ensure();
    if (!fwd.sched_graph_compute_async)
        missing(__func__);
    if (naming)
        seal_now();
    return compute_with_picks(fwd.sched_graph_compute_async, sched, graph);
}

WO_GGML_EXPORT enum ggml_status ggml_backend_sched_graph_compute(ggml_backend_sched_t sched,
                                                                 struct ggml_cgraph *graph)
{
    ensure();
    if (!fwd.sched_graph_compute)
        missing(__func__);
    if (naming)
        seal_now();
    return compute_with_picks(fwd.sched_graph_compute, sched, graph);
}

/* ---- static builds ---------------------------------------------------------- */

static const char static_msg[] =
    "ggml is linked into the executable (%s), not loaded from libggml-base.so: its calls "
    "never reach this hook, so GGUF tensor names cannot be learned; everything passes "
    "through unnamed. Build llama.cpp with shared libraries (-DBUILD_SHARED_LIBS=ON, the "
    "default) to name tensors (docs/llamacpp.md)";

/* Where ggml's allocation function lives, decided before main: in the
 * executable, the hook can never see a call (its own definition binds
 * first); in no object yet, the program may dlopen ggml later, so the
 * verdict waits for exit. */
__attribute__((constructor)) static void at_load(void)
{
    void *sym = dlsym(RTLD_DEFAULT, "ggml_get_first_tensor");
    void *self = dlopen(NULL, RTLD_NOW | RTLD_NOLOAD);
    struct link_map *main_map = NULL, *where = NULL;
    Dl_info info;

    if (!sym || !self)
        return;
    if (dlinfo(self, RTLD_DI_LINKMAP, &main_map) == 0 &&
        dladdr1(sym, &info, (void **)&where, RTLD_DL_LINKMAP) && where == main_map)
        say(L_WARN, static_msg, program_invocation_short_name);
}

__attribute__((destructor)) static void at_exit_picks(void)
{
    unsigned long long c = __atomic_load_n(&pbooks.computes, __ATOMIC_RELAXED);

    if (!c)
        return;
    unsigned long long over = __atomic_load_n(&pbooks.too_many, __ATOMIC_RELAXED);
    unsigned long long claimed = __atomic_load_n(&pbooks.claimed, __ATOMIC_RELAXED);

    say(L_INFO,
        "picks: %llu graph computes; %llu layer computes registered (%llu expert tensor "
        "registrations), %llu not, their share of experts picked over WOFFLOAD_GGML_PICKS=%d%%: "
        "%llu of them read in place (%llu claims of streamed tensors made), their share under "
        "WOFFLOAD_GGML_STREAM=%d%%, %llu left to the streaming executor",
        c, __atomic_load_n(&pbooks.layers, __ATOMIC_RELAXED),
        __atomic_load_n(&pbooks.registered, __ATOMIC_RELAXED), over, picks_pct, claimed,
        __atomic_load_n(&pbooks.claims, __ATOMIC_RELAXED), stream_pct,
        over > claimed ? over - claimed : 0);
}

__attribute__((destructor)) static void at_exit_check(void)
{
    if (__atomic_load_n(&called, __ATOMIC_RELAXED) || dlsym(RTLD_NEXT, "ggml_get_first_tensor"))
        return;
    if (!dlsym(RTLD_DEFAULT, "ggml_get_first_tensor"))
        say(L_WARN,
            "no ggml library came through the hook in %s (not a ggml program, or ggml "
            "linked statically without exported symbols): no tensor was named",
            program_invocation_short_name);
}
