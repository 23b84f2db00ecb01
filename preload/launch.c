/* preload/launch.c: launch attribution (cuLaunchKernel, cuLaunchKernelEx,
 * cudaLaunchKernel, cudaLaunchKernelExC, and __cudaLaunchKernel, which
 * nvcc 13's <<<>>> code calls).
 *
 * The launch path is hot: O(1) in the number of launches and functions, no
 * lock, no syscall, no allocation, no getenv. Per launch:
 *  1. the parameter layout of the function (the size of each parameter)
 *     from a lock-free open-addressing cache; on first sight of a function
 *     it is read from the driver (cuFuncGetParamInfo, cuKernelGetParamInfo
 *     for CUkernel handles; a runtime stub is mapped to its function with
 *     cudaGetFuncBySymbol) and published; a thread that loses the race to
 *     publish reads it into its stack instead of waiting;
 *  2. the parameter bytes scanned at 8-byte steps (unaligned reads through
 *     memcpy) against the registry (wo_registry_lookup, lock-free): this
 *     also finds pointers inside by-value structs, since a pointer member is
 *     8-byte aligned inside its struct and the struct inside the buffer;
 *  3. before the real launch: when a hit lies in a range the streaming
 *     executor staged into a device slot, the launch gets parameters with
 *     that pointer moved into the slot (redirect.c, uvm/hotpath.h);
 *  4. after it, one WO_EV_LAUNCH event pushed into the ring (a full ring
 *     drops and counts; no ring: nothing pushed), naming the host ranges.
 *     Only a launch that touches a
 *     watched range (one with a name, or served by the shim: the registry's
 *     mark) is worth an event to the consumer; the others are pushed only
 *     when a trace is recorded or WOFFLOAD_OBSERVE asks for books on every
 *     range (wo_events_all), and then at low priority, so they never take
 *     the ring's last quarter from the launches the prefetcher learns from.
 *     Otherwise they are only counted (launch_skipped).
 * With no tracked range at all, 1 and 2 are skipped. With nothing placed and
 * nothing recorded (an empty policy: wo_launch_scan off) a launch is counted,
 * per API and per calling library, and forwarded: no scan, no event. */
#include <pthread.h>
#include <string.h>

#include "core/kernel-name.h"
#include "core/log.h"
#include "core/registry.h"
#include "core/settings.h"
#include "preload/hook.h"
#include "preload/first-launch.h"
#include "preload/redirect.h"
#include "uvm/hotpath.h"

#define LAYOUT_SLOTS 16384u /* power of two */
#define LAYOUT_PROBES 32u
#define INLINE_PARAMS 24
#define MAX_PARAMS 1024
#define ARENA_SIZES 65536u
/* Runtime stubs and driver handles share the cache; the tag keeps them apart. */
#define RUNTIME_KEY_TAG WO_LAUNCH_KEY_RUNTIME

/* STALE: the module (or library) the function came from was unloaded; the
 * driver may give its handle to another function, so the entry is filled
 * again at the next launch through it (wo_h_module_unload). */
enum { LAYOUT_FILLING = 0, LAYOUT_READY = 1, LAYOUT_UNKNOWN = 2, LAYOUT_STALE = 3 };

struct layout {
    uintptr_t key;  /* 0: empty; set once by CAS */
    uint32_t state; /* LAYOUT_*; written once, released after the sizes */
    uint16_t nparams;
    uint16_t blind; /* the function may write through pointers the scan cannot see
                     * (blind_name): written before state is released */
    uint32_t arena; /* nparams > INLINE_PARAMS: offset of the sizes in arena[] */
    uint16_t sizes[INLINE_PARAMS];
    /* bit w: scanned word w (in scan order) has held a small non-zero
     * integer in some launch of this function: it is no pointer slot (a
     * size, a stride, or what an unused struct member was left holding),
     * and an address found there later is a coincidence (scan_word) */
    uint64_t notptr[WO_NOTPTR_WORDS / 64];
    /* The off-device ranges (those the streaming executor knows) this
     * function's launches reached: the first (registry id + 1), and 1 in
     * many once a second one came. A kernel that reads weights reads them
     * in layer after layer; one that reached a single range only reached
     * it through a word that held an address by chance (see notptr: a
     * word that never held a small integer is not caught there). */
    uint32_t first_off;
    uint32_t many_off;
    /* the module the function came from (cuFuncGetModule), 0 unknown: its
     * unload makes the entry stale (an unknown one goes stale at any unload) */
    uintptr_t owner;
};

static struct layout layouts[LAYOUT_SLOTS];
static uint16_t arena[ARENA_SIZES];
static uint32_t arena_used;
static cudaError_t (*get_func_by_symbol)(cudaFunction_t *, const void *);

/* The fork child forgets the cached layouts: the parent's function handles
 * mean nothing there (registered by this file's constructor: init.c knows no
 * list of the parts; only an active shim has anything to forget). */
static void launch_atfork_child(void)
{
    if (wo_preload_state != WO_STATE_ACTIVE)
        return;
    memset(layouts, 0, sizeof(layouts));
    arena_used = 0;
}

__attribute__((constructor)) static void launch_ctor(void)
{
    (void)pthread_atfork(NULL, NULL, launch_atfork_child);
}

/* Reads the parameter sizes of f from the driver: the count, or -1 when the
 * driver cannot say (no cuFuncGetParamInfo, foreign handle). */
static int read_param_sizes(CUfunction f, uint16_t *sizes, int max)
{
    typedef CUresult (*info_fn)(void *, size_t, size_t *, size_t *);
    const struct wo_real *r = wo_real_driver_peek();
    info_fn func_info = r ? (info_fn)r->cuFuncGetParamInfo : NULL;
    info_fn kernel_info = r ? (info_fn)r->cuKernelGetParamInfo : NULL;
    info_fn info = func_info ? func_info : kernel_info;
    int n = 0;

    if (!info || !f)
        return -1;
    for (;;) {
        size_t off = 0, size = 0;
        CUresult res = info(f, (size_t)n, &off, &size);
        if (res != CUDA_SUCCESS) {
            /* A CUkernel cast to CUfunction is launchable: ask again as one. */
            if (n == 0 && info == func_info && kernel_info) {
                CUresult res2 = kernel_info(f, 0, &off, &size);
                if (res2 == CUDA_SUCCESS) {
                    info = kernel_info;
                    continue;
                }
                if (res == CUDA_ERROR_INVALID_VALUE && res2 == CUDA_ERROR_INVALID_VALUE)
                    return 0; /* no parameters */
                return -1;
            }
            /* Past the last parameter the driver says INVALID_VALUE. */
            return res == CUDA_ERROR_INVALID_VALUE ? n : -1;
        }
        if (n == max)
            return n; /* truncated: the rest is not scanned */
        sizes[n++] = (uint16_t)WO_MIN(size, (size_t)UINT16_MAX);
    }
}

/* The driver function behind a layout key (runtime stubs are mapped). */
static CUfunction function_of(uintptr_t key, const void *func, bool runtime)
{
    cudaError_t (*get)(cudaFunction_t *, const void *);
    cudaFunction_t cf = NULL;
    (void)key;
    if (!runtime)
        return (CUfunction)(uintptr_t)func;
    /* First sight of a function only. The runtime may have been loaded
     * after init: look it up again (racing threads store the same value). */
    get = __atomic_load_n(&get_func_by_symbol, __ATOMIC_RELAXED);
    if (!get) {
        get = (cudaError_t(*)(cudaFunction_t *, const void *))wo_real_runtime_sym(
            "cudaGetFuncBySymbol");
        __atomic_store_n(&get_func_by_symbol, get, __ATOMIC_RELAXED);
    }
    if (!get || get(&cf, func) != cudaSuccess)
        return NULL;
    return (CUfunction)cf;
}

/* The module function f came from, 0 when the driver cannot say (a
 * CUkernel of a library, a driver without cuFuncGetModule). */
static uintptr_t owner_of(CUfunction f)
{
    const struct wo_real *r = wo_real_driver_peek();
    CUresult (*get)(CUmodule *, CUfunction) =
        r ? (CUresult(*)(CUmodule *, CUfunction))r->cuFuncGetModule : NULL;
    CUmodule m = NULL;

    if (!get || !f || get(&m, f) != CUDA_SUCCESS)
        return 0;
    return (uintptr_t)m;
}

static void publish(struct layout *l, const uint16_t *sizes, int n)
{
    uint32_t state = LAYOUT_READY;

    if (n < 0) {
        state = LAYOUT_UNKNOWN;
        n = 0;
    } else if (n > INLINE_PARAMS) {
        uint32_t off = __atomic_fetch_add(&arena_used, (uint32_t)n, __ATOMIC_RELAXED);
        if (off + (uint32_t)n > ARENA_SIZES) {
            n = INLINE_PARAMS; /* arena full: scan the first parameters only */
        } else {
            memcpy(&arena[off], sizes, (size_t)n * sizeof(*sizes));
            l->arena = off;
        }
    }
    if (n <= INLINE_PARAMS)
        memcpy(l->sizes, sizes, (size_t)n * sizeof(*sizes));
    l->nparams = (uint16_t)n;
    wo_count(WO_CTR_layouts_cached, 1);
    __atomic_store_n(&l->state, state, __ATOMIC_RELEASE);
}

/* Whether f is a kernel that writes through pointers its parameters do not
 * hold, into memory that may be a weight: NCCL's kernels take their
 * buffers from work descriptors in device memory (an RL trainer
 * broadcasts new weights into a serving engine with them). uvm/hotpath.h,
 * blind launches. */
static bool blind_name(CUfunction f)
{
    const struct wo_real *r = wo_real_driver_peek();
    CUresult (*get)(const char **, CUfunction) =
        r ? (CUresult(*)(const char **, CUfunction))r->cuFuncGetName : NULL;
    const char *name = NULL;

    if (!get || !f || get(&name, f) != CUDA_SUCCESS || !name)
        return false;
    return strstr(name, "ncclDevKernel") || strstr(name, "ncclKernel");
}

/* Fills entry l (this thread holds it: a new key, or one made stale by an
 * unload) for the function behind key: what was learned per word and per
 * range is forgotten, the sizes read into tmp and published. Their count. */
static int fill(struct layout *l, uintptr_t key, const void *func, bool runtime, uint16_t *tmp)
{
    CUfunction f = function_of(key, func, runtime);
    int n;

    for (size_t w = 0; w < WO_NOTPTR_WORDS / 64; w++)
        __atomic_store_n(&l->notptr[w], 0, __ATOMIC_RELAXED);
    __atomic_store_n(&l->first_off, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&l->many_off, 0, __ATOMIC_RELAXED);
    n = read_param_sizes(f, tmp, MAX_PARAMS);
    __atomic_store_n(&l->owner, owner_of(f), __ATOMIC_RELAXED);
    __atomic_store_n(&l->blind, (uint16_t)blind_name(f), __ATOMIC_RELAXED);
    publish(l, tmp, n);
    return n;
}

/* The parameter sizes for a launch: a pointer into the cache, or into tmp
 * when this thread could not use the cache; *n = -1 when unknown. */
static const uint16_t *layout_get(uintptr_t key, const void *func, bool runtime, uint16_t *tmp,
                                  int *n, struct layout **lp)
{
    uint32_t h = (uint32_t)((key * UINT64_C(0x9E3779B97F4A7C15)) >> 40);

    for (uint32_t i = 0; i < LAYOUT_PROBES; i++) {
        struct layout *l = &layouts[(h + i) & (LAYOUT_SLOTS - 1)];
        uintptr_t k = __atomic_load_n(&l->key, __ATOMIC_ACQUIRE);
        if (k == 0) {
            uintptr_t expect = 0;
            if (__atomic_compare_exchange_n(&l->key, &expect, key, false, __ATOMIC_ACQ_REL,
                                            __ATOMIC_ACQUIRE)) {
                *n = fill(l, key, func, runtime, tmp);
                *lp = l;
                return tmp;
            }
            k = expect;
        }
        if (k != key)
            continue;
        *lp = l;
        switch (__atomic_load_n(&l->state, __ATOMIC_ACQUIRE)) {
        case LAYOUT_READY:
            *n = l->nparams;
            return l->nparams > INLINE_PARAMS ? &arena[l->arena] : l->sizes;
        case LAYOUT_UNKNOWN:
            *n = -1;
            return NULL;
        case LAYOUT_STALE: {
            /* its module was unloaded: this may be another function with
             * the same handle. The first thread here fills it again; any
             * other reads the sizes for itself, as while it fills (below) */
            uint32_t st = LAYOUT_STALE;
            if (__atomic_compare_exchange_n(&l->state, &st, LAYOUT_FILLING, false, __ATOMIC_ACQ_REL,
                                            __ATOMIC_ACQUIRE)) {
                *n = fill(l, key, func, runtime, tmp);
                return tmp;
            }
            break;
        }
        default:
            break;
        }
        /* Another thread is filling this slot right now: never wait. */
        *n = read_param_sizes(function_of(key, func, runtime), tmp, MAX_PARAMS);
        return tmp;
    }
    wo_count(WO_CTR_layout_table_full, 1);
    *n = -1;
    return NULL;
}

/* --- module unload ------------------------------------------------------- */

/* The driver unloaded module m (m 0: a library, whose functions the cache
 * cannot tell apart): the entries of its functions, and every entry whose
 * module is unknown, go stale, so a handle the driver gives to a later
 * function is never scanned with a dead one's parameters. An entry being
 * filled now is a live function's (a launch of a function whose module is
 * being unloaded is the engine's own error). */
static void forget(uintptr_t m)
{
    uint64_t n = 0;

    for (uint32_t i = 0; i < LAYOUT_SLOTS; i++) {
        struct layout *l = &layouts[i];
        uintptr_t o;
        uint32_t st;

        if (!__atomic_load_n(&l->key, __ATOMIC_ACQUIRE))
            continue;
        st = __atomic_load_n(&l->state, __ATOMIC_ACQUIRE);
        if (st != LAYOUT_READY && st != LAYOUT_UNKNOWN)
            continue;
        o = __atomic_load_n(&l->owner, __ATOMIC_RELAXED);
        if (m && o && o != m)
            continue;
        if (__atomic_compare_exchange_n(&l->state, &st, LAYOUT_STALE, false, __ATOMIC_ACQ_REL,
                                        __ATOMIC_RELAXED))
            n++;
    }
    if (n)
        wo_count(WO_CTR_layouts_forgotten, n);
}

/* Unloads forward untouched (whatever the nesting or the shim's state:
 * the cache must learn of every one); the cache forgets after success. */
static CUresult unloaded(CUresult r, uintptr_t m)
{
    if (r == CUDA_SUCCESS)
        forget(m);
    return r;
}

/* Unloads wait for the context's work: behind the copy engine's gate
 * (uvm.h: wo_uvm_quiesce_begin). */
CUresult wo_h_module_unload(wo_pfn_cuModuleUnload real, int id, void *ra, CUmodule m)
{
    CUresult r;

    (void)ra;
    wo_count_call(id);
    if (WO_UNLIKELY(!real))
        return CUDA_ERROR_NOT_FOUND;
    wo_uvm_quiesce_begin();
    r = real(m);
    wo_uvm_quiesce_end();
    return unloaded(r, (uintptr_t)m);
}

CUresult wo_h_library_unload(wo_pfn_cuLibraryUnload real, int id, void *ra, CUlibrary lib)
{
    CUresult r;

    (void)ra;
    wo_count_call(id);
    if (WO_UNLIKELY(!real))
        return CUDA_ERROR_NOT_FOUND;
    wo_uvm_quiesce_begin();
    r = real(lib);
    wo_uvm_quiesce_end();
    return unloaded(r, 0);
}

/* Loads wait for the context's work too (under lazy loading a kernel's
 * first launch does, and hung the H200 with a job queued: docs/placement.md,
 * module loading; eager loading moves the load to the library's own load,
 * which an engine may reach mid-run: cuBLAS at its first GEMM, a JIT's
 * module), so they go behind the gate as unloads do: the jobs queued are
 * issued first. */
#define GATED_LOAD(hook, sym, PARAMS, ARGS)                                                        \
    CUresult hook(wo_pfn_##sym real, int id, void *ra, WO_UNPACK PARAMS)                           \
    {                                                                                              \
        CUresult r;                                                                                \
        (void)ra;                                                                                  \
        wo_count_call(id);                                                                         \
        if (WO_UNLIKELY(!real))                                                                    \
            return CUDA_ERROR_NOT_FOUND;                                                           \
        wo_uvm_quiesce_begin();                                                                    \
        r = real ARGS;                                                                             \
        wo_uvm_quiesce_end();                                                                      \
        return r;                                                                                  \
    }
GATED_LOAD(wo_h_module_load, cuModuleLoad, (CUmodule * m, const char *fname), (m, fname))
GATED_LOAD(wo_h_module_load_data, cuModuleLoadData, (CUmodule * m, const void *image), (m, image))
GATED_LOAD(wo_h_module_load_data_ex, cuModuleLoadDataEx,
           (CUmodule * m, const void *image, unsigned int n, CUjit_option *opts, void **vals),
           (m, image, n, opts, vals))
GATED_LOAD(wo_h_module_load_fatbin, cuModuleLoadFatBinary, (CUmodule * m, const void *fatbin),
           (m, fatbin))
GATED_LOAD(wo_h_library_load_data, cuLibraryLoadData,
           (CUlibrary * l, const void *code, CUjit_option *jo, void **jv, unsigned int nj,
            CUlibraryOption *lo, void **lv, unsigned int nl),
           (l, code, jo, jv, nj, lo, lv, nl))
/* a module's function looked up by name: under lazy loading the lookup
 * loads it (its handle is not known before, so every lookup: engines look a
 * kernel up once, Triton at each compile) */
GATED_LOAD(wo_h_module_get_function, cuModuleGetFunction,
           (CUfunction * pf, CUmodule m, const char *name), (pf, m, name))
GATED_LOAD(wo_h_library_load_file, cuLibraryLoadFromFile,
           (CUlibrary * l, const char *fname, CUjit_option *jo, void **jv, unsigned int nj,
            CUlibraryOption *lo, void **lv, unsigned int nl),
           (l, fname, jo, jv, nj, lo, lv, nl))
#undef GATED_LOAD

/* --- scanning ------------------------------------------------------------- */

struct scan {
    uint32_t words;
    uint16_t nhits;
    uint16_t overflow;
    uint32_t found;  /* distinct ranges, including those past WO_EV_MAX_HITS */
    uint8_t watched; /* bit i: hits[i] is a watched range */
    bool any_watched;
    struct layout *lay; /* the function's layout (its learned notptr words), or NULL */
    struct wo_ev_hit hits[WO_EV_MAX_HITS];
};

static inline bool word_notptr(const struct scan *s, uint32_t w)
{
    return s->lay && wo_notptr_word(s->lay->notptr, w);
}

/* The ranges of a captured launch whose writes could make a staged copy
 * stale (its graph then is a blind launch): watched ones (named or served:
 * every range the streaming executor stages is one) that are not declared
 * read-only to kernels; those past WO_EV_MAX_HITS count (unknown). An
 * activation or a KV cache (unwatched) holds nothing staged. */
static uint32_t writable_hits(const struct scan *s)
{
    uint32_t n = s->found > s->nhits ? s->found - s->nhits : 0;

    for (unsigned i = 0; i < s->nhits; i++)
        n += (s->watched >> i & 1u) && !wo_readonly(s->hits[i].id, s->hits[i].gen);
    return n;
}

/* Learns that word w of this function's parameters is no pointer slot:
 * uninitialised members of a by-value struct (PyTorch's TensorInfo keeps
 * sizes and strides for 25 dimensions and fills as many as the tensor
 * has) hold whatever the host stack held, now and then an address inside
 * a weight. Seen on the lent H200: the streaming executor then saw a
 * last-layer weight "read" in every layer. */
static inline void mark_notptr(struct scan *s, uint32_t w)
{
    if (s->lay && w < WO_NOTPTR_WORDS && !word_notptr(s, w))
        __atomic_fetch_or(&s->lay->notptr[w / 64], UINT64_C(1) << (w % 64), __ATOMIC_RELAXED);
}

static inline void scan_word(struct scan *s, uint64_t v)
{
    struct wo_hit h;
    uint32_t w = s->words++;

    /* Small integers (sizes, flags, indices) are never device addresses,
     * and the word that held one is no pointer slot. */
    if (v < 65536) {
        if (v)
            mark_notptr(s, w);
        return;
    }
    if (!wo_registry_lookup(v, &h))
        return;
    if (word_notptr(s, w)) {
        /* an address by chance: neither a read, nor where the engine is,
         * nor a word to redirect (and it takes no hit slot from a pointer) */
        wo_count(WO_CTR_launch_hit_notptr, 1);
        return;
    }
    for (uint16_t i = 0; i < s->nhits; i++) {
        struct wo_ev_hit *e = &s->hits[i];
        if (e->id == h.id && e->gen == h.gen) {
            e->offset = WO_MIN(e->offset, h.offset);
            e->hi = WO_MAX(e->hi, h.offset + 1);
            return;
        }
    }
    s->any_watched |= h.watched;
    if (s->nhits < WO_EV_MAX_HITS) {
        s->watched |= (uint8_t)(h.watched << s->nhits);
        s->hits[s->nhits++] = (struct wo_ev_hit){h.id, h.gen, h.offset, h.offset + 1};
        s->found++;
        return;
    }
    /* Counted as a new range even if it repeats one already past the
     * limit: an overflowed launch reports a lower bound anyway. */
    s->overflow = 1;
    s->found++;
    /* A full event keeps watched ranges first: they are what the consumer
     * learns from. (A repeat of a range given up here may come back as a
     * new hit: the same lower bound.) */
    if (h.watched && s->watched != (uint8_t)((1u << WO_EV_MAX_HITS) - 1)) {
        unsigned i = (unsigned)__builtin_ctz(~(unsigned)s->watched);
        s->hits[i] = (struct wo_ev_hit){h.id, h.gen, h.offset, h.offset + 1};
        s->watched |= (uint8_t)(1u << i);
    }
}

static void scan_bytes(struct scan *s, const void *p, size_t size)
{
    const unsigned char *b = p;

    if (!p)
        return;
    for (size_t off = 0; off + 8 <= size && s->words < wo_scan_words; off += 8) {
        uint64_t v;
        memcpy(&v, b + off, sizeof(v));
        scan_word(s, v);
    }
}

/* The `extra` form: CU_LAUNCH_PARAM_BUFFER_POINTER / _SIZE pairs. */
static void scan_extra(struct scan *s, void **extra)
{
    const void *buf;
    size_t size;

    wo_launch_extra(extra, &buf, &size);
    scan_bytes(s, buf, size);
}

static void scan_params(struct scan *s, uintptr_t key, const void *func, bool runtime,
                        void **params, uint16_t *tmp, const uint16_t **sizes, int *n)
{
    *sizes = layout_get(key, func, runtime, tmp, n, &s->lay);
    if (*n < 0) {
        s->lay = NULL;
        return; /* counted after the launch, when it succeeded */
    }
    for (int i = 0; i < *n && s->words < wo_scan_words; i++)
        if ((*sizes)[i] >= 8)
            scan_bytes(s, params[i], (*sizes)[i]);
}

/* Whether the launch's function is blind (blind_name), from its layout
 * entry; one another thread is filling right now is asked directly. */
static bool launch_blind(struct layout *l, uintptr_t key, const void *func, bool runtime)
{
    if (__atomic_load_n(&l->state, __ATOMIC_ACQUIRE) == LAYOUT_READY)
        return __atomic_load_n(&l->blind, __ATOMIC_RELAXED) != 0;
    return blind_name(function_of(key, func, runtime));
}

/* Whether the launch's function reads off-device weights, learned from the
 * ranges its launches reached (struct layout: first_off, many_off). Only
 * asked once launches reach two off-device ranges or more (the executor's
 * `readers`): with one alone (an LM head) every function reaches the same
 * one. Without a layout nothing is known: it counts, as before. */
static bool reads_weights(const struct scan *s)
{
    struct layout *l = s->lay;
    bool any = false;

    if (!l || !__atomic_load_n(&wo_stream_tab.readers, __ATOMIC_RELAXED) ||
        __atomic_load_n(&l->many_off, __ATOMIC_RELAXED))
        return true;
    for (unsigned i = 0; i < s->nhits; i++) {
        const struct wo_ev_hit *h = &s->hits[i];
        const struct wo_stream_entry *e;
        uint32_t it = 0, sid;

        /* each span of the hit's allocation (uvm/hotpath.h) */
        while ((e = wo_stream_span_next(h, &it, &sid))) {
            uint32_t want = sid + 1, cur = 0;

            /* the hits the consumer's reader() counts: inside the span (not
             * an activation in the allocation's tail) and pointer-like */
            if (!wo_stream_hit_in_span(e, h, false))
                continue;
            any = true;
            if (__atomic_compare_exchange_n(&l->first_off, &cur, want, false, __ATOMIC_RELAXED,
                                            __ATOMIC_RELAXED) ||
                cur == want)
                continue;
            __atomic_store_n(&l->many_off, 1, __ATOMIC_RELAXED);
            return true;
        }
    }
    return !any; /* no off-device range: nothing to decide */
}

/* One launch between its scan (before the real launch: a redirected launch
 * needs its hits first) and its event (after the real launch succeeded). */
struct launch {
    uintptr_t key;
    bool observe; /* wo_launch_scan: scan and push */
    bool scanned;
    bool no_layout;
    uint32_t cap;   /* the capture it is recorded into, by the table (0: none) */
    bool captured;  /* recorded into a capture: the table's, or one its stream joined */
    struct scan s;
    struct wo_redirect rd;
    bool blind;                     /* a blind launch begun (wo_stream_blind_begin) */
    unsigned ntouch;                /* streamed ranges it touches in place */
    uint32_t touch[WO_STREAM_TOUCH_MAX]; /* ... their span ids (wo_stream_touch_begin) */
    bool picked; /* wo_picks_stage returned moves: wo_picks_issued after the call */
};

/* Everything a launch hook does before the real launch: the scan, and when
 * a hit lies in a range the streaming executor staged into a device slot,
 * the parameters to launch with instead (preload/redirect.c). *params and
 * *extra are replaced then; b holds the rewritten copies. */
static void prepare_launch(struct launch *l, const void *func, bool runtime, uint64_t stream,
                           void ***params, void ***extra, struct wo_redirect_buf *b)
{
    uint16_t tmp[MAX_PARAMS];
    const uint16_t *sizes = NULL;
    bool active, picks, blind;
    int n = -1;

    l->key = runtime ? ((uintptr_t)func ^ RUNTIME_KEY_TAG) : (uintptr_t)func;
    l->picked = false;
    l->s.words = 0;
    l->s.nhits = 0;
    l->s.overflow = 0;
    l->s.found = 0;
    l->s.watched = 0;
    l->s.lay = NULL;
    l->s.any_watched = false;
    l->scanned = false;
    l->no_layout = false;
    l->cap = 0;
    l->captured = false;
    l->rd.n = l->rd.nslot = 0;
    l->blind = false;
    l->ntouch = 0;
    l->observe = __atomic_load_n(&wo_launch_scan, __ATOMIC_RELAXED);
    if (!l->observe)
        return;
    l->cap = wo_capture_of(stream);
    l->captured = l->cap != 0;
    if (wo_registry_count() == 0)
        return;
    wo_registry_read_begin();
    if (*extra && !*params)
        scan_extra(&l->s, *extra);
    else if (*params)
        scan_params(&l->s, l->key, func, runtime, *params, tmp, &sizes, &n);
    wo_registry_read_end();
    l->scanned = true;
    l->no_layout = *params && !(*extra && !*params) && n < 0;
    active = __atomic_load_n(&wo_stream_tab.active, __ATOMIC_ACQUIRE);
    picks = __atomic_load_n(&wo_picks_any, __ATOMIC_ACQUIRE);
    if (!active && !picks)
        return;
    /* a kernel that writes through pointers the scan cannot see (NCCL's):
     * no slot staged before it is read after it. A captured one is its
     * graph's launch's to say (wo_capture_graph_blind) */
    blind = active && l->s.lay && launch_blind(l->s.lay, l->key, func, runtime);
    if (!l->s.nhits && !blind)
        return;
    /* what it moves or fences must not land in a capture the table does
     * not know of: its stream may have joined one (asked only now, of a
     * launch with something to move or fence) */
    if (!l->captured)
        l->captured = wo_capture_joined(stream);
    if (blind && !l->captured)
        l->blind = wo_stream_blind_begin();
    if (!l->s.nhits)
        return;
    if (active && !reads_weights(&l->s)) {
        /* neither where the engine is nor a read to move */
        __atomic_add_fetch(&wo_stream_tab.n.not_reader, 1, __ATOMIC_RELAXED);
    } else if (active) {
        wo_redirect_begin(&l->rd, l->s.hits, l->s.nhits, stream, l->captured);
    }
    /* the experts its router picked, when the engine said where the picks
     * are (uvm/hotpath.h: picked staging; explicit, so no reader rule) */
    if (picks) {
        struct wo_picks_move mv[WO_REDIRECT_MAX];
        unsigned np = wo_picks_stage(l->s.hits, l->s.nhits, stream, l->captured, l->rd.from,
                                     l->rd.to, l->rd.n, mv, WO_REDIRECT_MAX - l->rd.n, l->key);
        l->picked = np > 0;
        l->rd.key = l->key;
        for (unsigned k = 0; k < np; k++)
            wo_redirect_add(&l->rd, mv[k].from, mv[k].to, mv[k].dev, mv[k].row);
    }
    if (l->rd.n) {
        void **np = *extra && !*params ? NULL : *params;
        const uint64_t *notptr = l->s.lay ? l->s.lay->notptr : NULL;
        unsigned picked = l->rd.n - l->rd.nslot;
        void **ne = NULL;

        if (np)
            np = n >= 0 ? wo_redirect_params(&l->rd, np, sizes, n, wo_scan_words, notptr, b) : NULL;
        else
            ne = wo_redirect_extra(&l->rd, *extra, b);
        if ((!np && !ne) || !wo_redirect_wait(&l->rd, stream)) {
            if (picked)
                wo_picks_unused(picked); /* its copies were made: speed, not data */
            wo_redirect_cancel(&l->rd);
        } else if (np) {
            *params = np;
        } else {
            *extra = ne;
        }
    }
    /* What it reaches of a streamed range in place, it may write: the
     * executor must neither stage those ranges from a copy older than this
     * launch nor leave a slot published that is (uvm/hotpath.h). A captured
     * launch runs later, from its graph: graphs read in place, and what
     * they write is not seen (docs/prefetch.md, Write checks). */
    if (active && !l->captured)
        l->ntouch =
            wo_stream_touch_begin(l->s.hits, l->s.nhits, l->rd.from, l->rd.to, l->rd.n, l->touch);
}

/* Everything a launch hook does after the real launch (ok: it succeeded). */
static void finish_launch(struct launch *l, bool ok, const uint32_t grid[3],
                          const uint32_t block[3], uint64_t stream, int api, void *ra)
{
    struct wo_event ev;

    if (l->picked)
        wo_picks_issued();
    if (l->rd.n && ok && wo_settings()->stream_check)
        wo_redirect_check(&l->rd, stream, l->key);
    if (l->rd.n)
        wo_redirect_end(&l->rd, stream); /* slots released either way */
    if (l->ntouch) {
        struct wo_stream_evfns fn;
        wo_hook_evfns(&fn);
        wo_stream_touch_end(l->touch, l->ntouch, stream, &fn);
    }
    if (l->blind)
        wo_hook_blind_end(stream);
    if (!ok)
        return;
    wo_count(WO_CTR_launch_calls, 1);
    /* Counted per calling library even when nothing is observed: one hash
     * and one relaxed add, and it is what says which libraries reach the
     * driver through the shim (woffload doctor, the gpu suite). */
    wo_count_caller(ra, WO_CALLER_LAUNCH);
    if (!l->observe)
        return;
    if (l->scanned) {
        if (l->no_layout)
            wo_count(WO_CTR_launch_no_layout, 1);
        wo_count(WO_CTR_launch_scanned, 1);
        wo_count(WO_CTR_scan_words, l->s.words);
        if (l->s.found) {
            wo_count(WO_CTR_launch_with_hits, 1);
            wo_count(WO_CTR_launch_hits, l->s.found);
            if (l->s.overflow)
                wo_count(WO_CTR_launch_hit_overflow, 1);
            if (l->s.any_watched)
                wo_count(WO_CTR_launch_watched, 1);
        }
    }
    if (l->cap) {
        wo_count(WO_CTR_launch_captured, 1);
        wo_capture_note_launch(l->cap, l->s.found, writable_hits(&l->s));
    }
    if (!__atomic_load_n(&wo_events, __ATOMIC_RELAXED))
        return;
    if (!l->s.any_watched && !__atomic_load_n(&wo_events_all, __ATOMIC_RELAXED)) {
        wo_count(WO_CTR_launch_skipped, 1);
        return;
    }
    /* the event names the ranges the engine asked for (the host copy), not
     * the slots: accounting and the planner see the engine's reads */
    memset(&ev, 0, offsetof(struct wo_event, l.hits));
    ev.type = WO_EV_LAUNCH;
    ev.nhits = l->s.nhits;
    ev.overflow = l->s.overflow;
    ev.api = (uint16_t)api;
    ev.capture = l->cap;
    ev.stream = stream;
    ev.l.func = l->key;
    memcpy(ev.l.grid, grid, sizeof(ev.l.grid));
    memcpy(ev.l.block, block, sizeof(ev.l.block));
    memcpy(ev.l.hits, l->s.hits, l->s.nhits * sizeof(l->s.hits[0]));
    if (wo_push_event_prio(&ev, !l->s.any_watched) == -ENOSPC)
        wo_count(l->s.any_watched ? WO_CTR_events_dropped_watched
                                  : WO_CTR_events_dropped_unwatched,
                 1);
}

/* --- graph replay (graph-replay.c) ---------------------------------------- */

int wo_launch_param_sizes(CUfunction f, uint16_t *sizes, int max)
{
    uint16_t tmp[MAX_PARAMS];
    struct layout *l = NULL;
    int n = -1;
    const uint16_t *sz = layout_get((uintptr_t)f, f, false, tmp, &n, &l);

    if (!sz || n < 0 || n >= max || n >= MAX_PARAMS)
        return -1; /* unknown, or maybe truncated */
    memcpy(sizes, sz, (size_t)n * sizeof(*sizes));
    return n;
}

unsigned wo_launch_hits(CUfunction f, void **params, void **extra, struct wo_ev_hit *hits,
                        unsigned max)
{
    uint16_t tmp[MAX_PARAMS];
    const uint16_t *sizes = NULL;
    struct scan s;
    int n = -1;

    memset(&s, 0, offsetof(struct scan, hits));
    if ((!params && !extra) || wo_registry_count() == 0)
        return 0;
    wo_registry_read_begin();
    if (params)
        scan_params(&s, (uintptr_t)f, f, false, params, tmp, &sizes, &n);
    else
        scan_extra(&s, extra);
    wo_registry_read_end();
    n = WO_MIN((int)s.nhits, (int)max);
    memcpy(hits, s.hits, (size_t)n * sizeof(*hits));
    return (unsigned)n;
}

CUresult wo_launch_node(CUfunction f, const uint32_t grid[3], const uint32_t block[3],
                        unsigned shmem, const uint32_t cluster[3], bool coop, uint64_t stream,
                        void **params, void **extra, void *ra)
{
    struct wo_redirect_buf b;
    struct launch l;
    CUresult res;
    bool ex = coop || cluster[0] > 1 || cluster[1] > 1 || cluster[2] > 1;

    prepare_launch(&l, f, false, stream, &params, &extra, &b);
    if (ex) {
        wo_pfn_cuLaunchKernelEx real = (wo_pfn_cuLaunchKernelEx)wo_real_hook(WO_HOOK_cuLaunchKernelEx);
        CUlaunchAttribute at[2];
        CUlaunchConfig cfg;
        unsigned na = 0;

        memset(&cfg, 0, sizeof(cfg));
        memset(at, 0, sizeof(at));
        cfg.gridDimX = grid[0];
        cfg.gridDimY = grid[1];
        cfg.gridDimZ = grid[2];
        cfg.blockDimX = block[0];
        cfg.blockDimY = block[1];
        cfg.blockDimZ = block[2];
        cfg.sharedMemBytes = shmem;
        cfg.hStream = (CUstream)(uintptr_t)stream;
        if (cluster[0] > 1 || cluster[1] > 1 || cluster[2] > 1) {
            at[na].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
            at[na].value.clusterDim.x = WO_MAX(cluster[0], 1u);
            at[na].value.clusterDim.y = WO_MAX(cluster[1], 1u);
            at[na].value.clusterDim.z = WO_MAX(cluster[2], 1u);
            na++;
        }
        if (coop) {
            at[na].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
            at[na].value.cooperative = 1;
            na++;
        }
        cfg.attrs = at;
        cfg.numAttrs = na;
        res = real ? real(&cfg, f, params, extra) : CUDA_ERROR_NOT_FOUND;
    } else {
        wo_pfn_cuLaunchKernel real = (wo_pfn_cuLaunchKernel)wo_real_hook(WO_HOOK_cuLaunchKernel);
        res = real ? real(f, grid[0], grid[1], grid[2], block[0], block[1], block[2], shmem,
                          (CUstream)(uintptr_t)stream, params, extra)
                   : CUDA_ERROR_NOT_FOUND;
    }
    if (res == CUDA_SUCCESS)
        wo_count(WO_CTR_graph_replay_kernels, 1);
    finish_launch(&l, res == CUDA_SUCCESS, grid, block, stream, WO_API_CU_LAUNCH, ra);
    return res;
}

/* --- hooks ---------------------------------------------------------------- */

CUresult wo_h_launch_kernel(wo_pfn_cuLaunchKernel real, int id, void *ra, CUfunction f,
                            unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                            unsigned int by, unsigned int bz, unsigned int shmem, CUstream s,
                            void **params, void **extra)
{
    const uint32_t grid[3] = {gx, gy, gz}, block[3] = {bx, by, bz};
    struct wo_redirect_buf b;
    struct launch l;
    uint64_t sid;
    CUresult res;
    bool gated;

    WO_HOOK_ENTER(real(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra));
    gated = wo_first_launch_begin((uintptr_t)f);
    sid = wo_stream_id(s, wo_hook_pt[id]);
    prepare_launch(&l, f, false, sid, &params, &extra, &b);
    res = real(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra);
    wo_first_launch_end(gated);
    if (res == CUDA_SUCCESS)
        wo_count(WO_CTR_launch_driver, 1);
    finish_launch(&l, res == CUDA_SUCCESS, grid, block, sid, WO_API_CU_LAUNCH, ra);
    wo_leave();
    return res;
}

CUresult wo_h_launch_kernel_ex(wo_pfn_cuLaunchKernelEx real, int id, void *ra,
                               const CUlaunchConfig *cfg, CUfunction f, void **params, void **extra)
{
    struct wo_redirect_buf b;
    struct launch l;
    uint64_t sid;
    CUresult res;
    bool gated;

    WO_HOOK_ENTER(real(cfg, f, params, extra));
    if (!cfg) {
        res = real(cfg, f, params, extra);
        wo_leave();
        return res;
    }
    gated = wo_first_launch_begin((uintptr_t)f);
    sid = wo_stream_id(cfg->hStream, wo_hook_pt[id]);
    prepare_launch(&l, f, false, sid, &params, &extra, &b);
    res = real(cfg, f, params, extra);
    wo_first_launch_end(gated);
    {
        const uint32_t grid[3] = {cfg->gridDimX, cfg->gridDimY, cfg->gridDimZ};
        const uint32_t block[3] = {cfg->blockDimX, cfg->blockDimY, cfg->blockDimZ};
        if (res == CUDA_SUCCESS)
            wo_count(WO_CTR_launch_ex, 1);
        finish_launch(&l, res == CUDA_SUCCESS, grid, block, sid, WO_API_CU_LAUNCH_EX, ra);
    }
    wo_leave();
    return res;
}

/* The common shape of the two dim3 runtime launches: fn is a host stub
 * (cudaLaunchKernel) or a kernel handle (__cudaLaunchKernel). */
#define RT_LAUNCH_HOOK(fn, stub)                                                                   \
    do {                                                                                           \
        const uint32_t g_[3] = {grid.x, grid.y, grid.z}, b_[3] = {block.x, block.y, block.z};      \
        struct wo_redirect_buf rb_;                                                                \
        struct launch l_;                                                                          \
        void **ex_ = NULL;                                                                         \
        uint64_t sid_;                                                                             \
        cudaError_t res_;                                                                          \
        bool gated_;                                                                               \
        WO_RT_HOOK_ENTER(real(fn, grid, block, args, shmem, s));                                   \
        gated_ = wo_first_launch_begin((uintptr_t)(fn) | ((stub) ? RUNTIME_KEY_TAG : 0));          \
        sid_ = wo_stream_id(s, wo_rt_pt[id]);                                                      \
        prepare_launch(&l_, fn, stub, sid_, &args, &ex_, &rb_);                                    \
        res_ = real(fn, grid, block, args, shmem, s);                                              \
        wo_first_launch_end(gated_);                                                               \
        if (res_ == cudaSuccess)                                                                   \
            wo_count(WO_CTR_launch_runtime, 1);                                                    \
        finish_launch(&l_, res_ == cudaSuccess, g_, b_, sid_, WO_API_CUDA_LAUNCH, ra);             \
        wo_leave();                                                                                \
        return res_;                                                                               \
    } while (0)

cudaError_t wo_h_cuda_launch_kernel(wo_pfn_cudaLaunchKernel real, int id, void *ra,
                                    const void *func, dim3 grid, dim3 block, void **args,
                                    size_t shmem, cudaStream_t s)
{
    RT_LAUNCH_HOOK(func, true);
}

/* What nvcc 13's <<<>>> launch code calls (crt/host_runtime.h): a kernel
 * handle from __cudaGetKernel, i.e. a CUkernel, not a host stub. */
cudaError_t wo_h_cuda_launch_kernel_handle(wo_pfn___cudaLaunchKernel real, int id, void *ra,
                                           cudaKernel_t k, dim3 grid, dim3 block, void **args,
                                           size_t shmem, cudaStream_t s)
{
    RT_LAUNCH_HOOK(k, false);
}

cudaError_t wo_h_cuda_launch_kernel_ex(wo_pfn_cudaLaunchKernelExC real, int id, void *ra,
                                       const cudaLaunchConfig_t *cfg, const void *func,
                                       void **args)
{
    struct wo_redirect_buf rb;
    struct launch l;
    void **ex = NULL;
    uint64_t sid;
    cudaError_t res;
    bool gated;

    WO_RT_HOOK_ENTER(real(cfg, func, args));
    if (!cfg) {
        res = real(cfg, func, args);
        wo_leave();
        return res;
    }
    gated = wo_first_launch_begin((uintptr_t)func | RUNTIME_KEY_TAG);
    sid = wo_stream_id(cfg->stream, wo_rt_pt[id]);
    prepare_launch(&l, func, true, sid, &args, &ex, &rb);
    res = real(cfg, func, args);
    wo_first_launch_end(gated);
    {
        const uint32_t g[3] = {cfg->gridDim.x, cfg->gridDim.y, cfg->gridDim.z};
        const uint32_t b[3] = {cfg->blockDim.x, cfg->blockDim.y, cfg->blockDim.z};
        if (res == cudaSuccess)
            wo_count(WO_CTR_launch_runtime, 1);
        finish_launch(&l, res == cudaSuccess, g, b, sid, WO_API_CUDA_LAUNCH, ra);
    }
    wo_leave();
    return res;
}
