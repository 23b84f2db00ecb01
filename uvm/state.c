/* uvm/state.c: the ground floor of uvm/: the state every file of it
 * shares (wo_uvm, the driver table, the capture and busy counts), and the
 * questions asked of it from every floor: a driver error's name, the CPU's
 * reads of the engine's memory, the managed and off-device pieces, the
 * device budget and the policy, and the gate a driver call that may wait
 * for the context goes behind. Nothing here calls a file above it: what a
 * higher file does at the gate (the copy engine's drain, uvm/picks-dma.c)
 * is installed here (wo_uvm_gate_install). */
#include "uvm/internal.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/event.h"
#include "core/log.h"
#include "core/macro.h"
#include "core/settings.h"

struct wo_uvm_state wo_uvm = {
    .lock = PTHREAD_MUTEX_INITIALIZER,
    .cpu_read_cv = PTHREAD_COND_INITIALIZER,
};

static const struct wo_driver *driver;
struct wo_ring *wo_events;
int wo_captures_live;
int wo_prefetch_busy;
int wo_captures_strict;
int wo_dma_busy;
int wo_launch_scan = 1;
uint32_t wo_scan_words = 512;
int wo_events_all = 1;

void wo_uvm_set_driver(const struct wo_driver *drv)
{
    __atomic_store_n(&driver, drv, __ATOMIC_RELEASE);
}

const struct wo_driver *wo_uvm_driver(void)
{
    return __atomic_load_n(&driver, __ATOMIC_ACQUIRE);
}

const char *wo_cu_error_name(CUresult r)
{
    const struct wo_driver *d = wo_uvm_driver();
    const char *s = NULL;

    if (d && d->cuGetErrorName && d->cuGetErrorName(r, &s) == CUDA_SUCCESS && s)
        return s;
    return "CUDA error";
}

static bool cpu_reading(uint64_t base, uint64_t size)
{
    for (unsigned k = 0; k < WO_CPU_READERS; k++)
        if (wo_uvm.cpu_read[k].lo < base + size && base < wo_uvm.cpu_read[k].hi)
            return true;
    return false;
}

void wo_uvm_wait_cpu_read(uint64_t base, uint64_t size)
{
    while (cpu_reading(base, size))
        pthread_cond_wait(&wo_uvm.cpu_read_cv, &wo_uvm.lock);
}

/* A piece: about 2 ms of memcpy, the longest a free of the range waits
 * (measured on the H100 with the whole copy under the lock instead: the
 * first 10 s after load, while 12 GiB of copies were made, decoded 0.55x
 * to 0.95x as fast: bench/results/e2e-20261126-121704-pinned-copies-
 * mixtral-h100) */
#define CPU_READ_PIECE (16 * WO_MiB)

#if defined(__SANITIZE_THREAD__)
#define WO_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define WO_TSAN 1
#endif
#endif

/* The copy of one piece. The engine's kernels may write those bytes while
 * the CPU reads them (a launch no scan could see: a blind one, on another
 * context): the copy is then torn, and the shim finds out by its own checks
 * (a write seen drops the copy; a blind launch that could not be fenced
 * stops streaming), never by the copy. Against the fake driver those
 * kernels run on host threads, so under ThreadSanitizer the copy is made
 * by loads the sanitizer does not see, as a GPU's writes are not (as the
 * fake's own device copies are, tests/fake/fake-exec.c): CI's TSan run of
 * 40762e5 reported that race in test-stream-preload's stream-unfenced,
 * the pin worker beside the test's NCCL-named kernel writing range 10.
 * Every other build uses memcpy. */
#ifdef WO_TSAN
__attribute__((no_sanitize("thread"))) static void copy_piece(void *dst, const void *src, size_t n)
{
    const volatile unsigned char *s = src;
    unsigned char *d = dst;
    size_t k = 0;

    if (((uintptr_t)d | (uintptr_t)s) % 8 == 0)
        for (; k + 8 <= n; k += 8)
            *(uint64_t *)(void *)(d + k) =
                *(const volatile uint64_t *)(const volatile void *)(s + k);
    for (; k < n; k++)
        d[k] = s[k];
}
#else
static void copy_piece(void *dst, const void *src, size_t n)
{
    memcpy(dst, src, n);
}
#endif

bool wo_uvm_copy_live(unsigned who, uint32_t rid, uint32_t gen, uint64_t src, uint64_t bytes,
                      void *dst, const bool *stop)
{
    for (uint64_t off = 0; off < bytes; off += CPU_READ_PIECE) {
        uint64_t n = WO_MIN(CPU_READ_PIECE, bytes - off);
        struct wo_range rg;
        bool live;

        if (__atomic_load_n(stop, __ATOMIC_RELAXED))
            return false; /* the process exits: do not hold it up */
        pthread_mutex_lock(&wo_uvm.lock);
        live = wo_registry_get(rid, &rg) == 0 && rg.gen == gen && src >= rg.base &&
               src + bytes <= rg.base + rg.size;
        if (live) {
            wo_uvm.cpu_read[who].lo = src + off;
            wo_uvm.cpu_read[who].hi = src + off + n;
        }
        pthread_mutex_unlock(&wo_uvm.lock);
        if (!live)
            return false;
        copy_piece((unsigned char *)dst + off, (const void *)(uintptr_t)(src + off), (size_t)n);
        pthread_mutex_lock(&wo_uvm.lock);
        wo_uvm.cpu_read[who].lo = wo_uvm.cpu_read[who].hi = 0;
        pthread_cond_broadcast(&wo_uvm.cpu_read_cv);
        pthread_mutex_unlock(&wo_uvm.lock);
    }
    return true;
}

/* ---- the pieces off the device (the executors', the stats') ---------------- */

/* One callback per managed piece of a: its managed tags, and the untagged
 * gaps when the allocation's default placement is managed. */
static bool wanted(enum wo_placement p, bool host)
{
    return p == WO_PLACE_MANAGED || (host && p == WO_PLACE_HOST);
}

static int foreach_managed_alloc(const struct wo_alloc *a,
                                 int (*fn)(const struct wo_uvm_segment *s, void *ud), void *ud,
                                 bool host)
{
    uint64_t pos = 0, unnamed = 0;
    int ret = 0;

    for (size_t k = 0; k <= a->ntags && !ret; k++) {
        uint64_t toff = k < a->ntags ? a->tags[k].off : a->size;
        struct wo_uvm_segment s = {.id = a->id, .gen = a->gen, .slices = WO_SLICES_AUTO,
                                   .bound = a->kind == WO_KIND_BOUND};

        /* the longest run of bytes no tag names since the last piece
         * given (the first tag's leading bytes do not count) */
        if (k > 0 && toff > pos && toff - pos > unnamed)
            unnamed = toff - pos;
        if (toff > pos && wanted(a->place, host)) {
            s.place = a->place;
            s.base = a->base + pos;
            s.offset = pos;
            s.size = toff - pos;
            s.name = "(untagged)";
            s.untagged = true;
            ret = fn(&s, ud);
        }
        if (k < a->ntags && !ret) {
            const struct wo_tag *t = &a->tags[k];
            const struct wo_rule *rule =
                t->name->rule >= 0 ? wo_policy_rule(wo_uvm.policy, (size_t)t->name->rule) : NULL;
            pos = t->off + t->size;
            if (!wanted(t->place, host))
                continue;
            s.place = t->place;
            s.untagged = false;
            s.unnamed_before = unnamed;
            unnamed = 0;
            s.base = a->base + t->off;
            s.offset = t->off;
            s.size = t->size;
            s.name = t->name->s;
            s.priority = rule ? rule->priority : 0;
            s.slices = rule ? rule->slices : WO_SLICES_AUTO;
            ret = fn(&s, ud);
        }
    }
    return ret;
}

/* Every piece of the served allocations: managed ones only, or (host)
 * those off the device too (pinned, late-bound). */
static int foreach_served(int (*fn)(const struct wo_uvm_segment *s, void *ud), void *ud, bool host)
{
    int ret = 0;

    pthread_mutex_lock(&wo_uvm.lock);
    for (size_t i = 0; i < wo_uvm.alloc_hash_size && !ret; i++)
        for (struct wo_alloc *a = wo_uvm.alloc_hash[i]; a && !ret; a = a->next)
            if (a->kind == WO_KIND_MANAGED ||
                (host && (a->kind == WO_KIND_PINNED || a->kind == WO_KIND_BOUND)))
                ret = foreach_managed_alloc(a, fn, ud, host);
    pthread_mutex_unlock(&wo_uvm.lock);
    return ret;
}

int wo_uvm_foreach_managed(int (*fn)(const struct wo_uvm_segment *s, void *ud), void *ud)
{
    return foreach_served(fn, ud, false);
}

int wo_uvm_foreach_offdevice(int (*fn)(const struct wo_uvm_segment *s, void *ud), void *ud)
{
    return foreach_served(fn, ud, true);
}

uint64_t wo_uvm_device_budget(void)
{
    return __atomic_load_n(&wo_uvm.device_budget, __ATOMIC_RELAXED);
}

const struct wo_policy *wo_uvm_policy(void)
{
    return wo_uvm.policy;
}

/* ---- the gate ------------------------------------------------------------- */

unsigned wo_uvm_quiescing;
static void (*gate_begin)(void *by, unsigned raised);
static void (*gate_end)(unsigned left);

void wo_uvm_gate_install(void (*begin)(void *by, unsigned raised), void (*end)(unsigned left))
{
    __atomic_store_n(&gate_end, end, __ATOMIC_RELEASE);
    __atomic_store_n(&gate_begin, begin, __ATOMIC_RELEASE);
}

/* CUDA's module loading as the copy engine sees it, read once: 0 unknown,
 * 1 the copy engine stays off (lazy, WOFFLOAD_PICKS_LAZY=0), 2 eager, 3 lazy
 * with WOFFLOAD_PICKS_LAZY (the default: first launches gated) */
static int loading;

unsigned wo_uvm_picks_engine(void)
{
    unsigned pct = wo_settings()->picks_engine;
    int e = __atomic_load_n(&loading, __ATOMIC_ACQUIRE);

    if (!pct || e)
        return e >= 2 ? pct : 0;
    const char *v = getenv("CUDA_MODULE_LOADING");
    int now = v && strcasecmp(v, "EAGER") == 0 ? 2 : wo_settings()->picks_lazy ? 3 : 1;
    /* the first caller says it; another's answer is the same */
    if (__atomic_compare_exchange_n(&loading, &e, now, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        if (now == 1)
            wo_warn("WOFFLOAD_PICKS_ENGINE=%u: the copy engine stays off, the kernels copy the "
                    "picked experts: CUDA_MODULE_LOADING is %s, not EAGER (a kernel loaded "
                    "lazily while an engine stream waits for the copy thread hangs the GPU: "
                    "docs/picks.md, Picked experts on the copy engine; "
                    "with WOFFLOAD_PICKS_LAZY=0; unset or 1, the default, each kernel's first "
                    "launch goes behind the copy engine's gate instead)",
                    pct, v ? v : "unset");
        else if (now == 3)
            wo_info("WOFFLOAD_PICKS_ENGINE=%u under lazy module loading (CUDA_MODULE_LOADING "
                    "%s, WOFFLOAD_PICKS_LAZY): each kernel's first launch goes behind the copy "
                    "engine's gate, and the rescue ends a stall that a load elsewhere causes",
                    pct, v ? v : "unset");
    } else {
        now = e;
    }
    return now >= 2 ? pct : 0;
}

bool wo_uvm_gate_armed(void)
{
    return wo_uvm_picks_engine() != 0;
}

bool wo_uvm_lazy_gate(void)
{
    /* every launch asks: with the copy engine off (the default) two field reads */
    if (!wo_settings()->picks_engine || !wo_settings()->picks_lazy)
        return false;
    return wo_uvm_picks_engine() != 0 && __atomic_load_n(&loading, __ATOMIC_ACQUIRE) == 3;
}

void wo_uvm_quiesce_begin(void)
{
    void (*f)(void *, unsigned) = __atomic_load_n(&gate_begin, __ATOMIC_ACQUIRE);
    unsigned n = __atomic_add_fetch(&wo_uvm_quiescing, 1, __ATOMIC_SEQ_CST);

    if (f)
        f(__builtin_return_address(0), n);
}

void wo_uvm_quiesce_end(void)
{
    void (*f)(unsigned) = __atomic_load_n(&gate_end, __ATOMIC_ACQUIRE);
    unsigned n = __atomic_sub_fetch(&wo_uvm_quiescing, 1, __ATOMIC_SEQ_CST);

    if (f)
        f(n);
}

/* ---- the consumer's doorbell and figures ------------------------------------ */

struct wo_consumer_figs wo_consumer_figs;
static void (*consumer_wake)(void);
static void (*consumer_relieve)(void);

void wo_consumer_install(void (*wake)(void), void (*relieve)(void))
{
    __atomic_store_n(&consumer_relieve, relieve, __ATOMIC_RELEASE);
    __atomic_store_n(&consumer_wake, wake, __ATOMIC_RELEASE);
}

void wo_consumer_wake(void)
{
    void (*f)(void) = __atomic_load_n(&consumer_wake, __ATOMIC_ACQUIRE);

    if (f)
        f();
}

void wo_consumer_relieve(void)
{
    void (*f)(void) = __atomic_load_n(&consumer_relieve, __ATOMIC_ACQUIRE);

    if (f)
        f();
}

void wo_consumer_backlog_stats(struct wo_backlog_stats *ret)
{
    ret->now = __atomic_load_n(&wo_consumer_figs.bl_now, __ATOMIC_RELAXED);
    ret->peak = __atomic_load_n(&wo_consumer_figs.bl_peak, __ATOMIC_RELAXED);
    ret->moved = __atomic_load_n(&wo_consumer_figs.bl_moved, __ATOMIC_RELAXED);
    ret->limit = wo_events ? wo_ring_capacity(wo_events) * WO_BACKLOG_RINGS : 0;
}

void wo_consumer_longest(uint64_t *ns, const char **who, bool *tick)
{
    const char *in = __atomic_load_n(&wo_consumer_figs.longest_in, __ATOMIC_RELAXED);

    *ns = __atomic_load_n(&wo_consumer_figs.longest_ns, __ATOMIC_RELAXED);
    *who = in ? in : "";
    *tick = in && __atomic_load_n(&wo_consumer_figs.longest_tick, __ATOMIC_RELAXED);
}
