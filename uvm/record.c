/* uvm/record.c: WOFFLOAD_TRACE on the consumer thread.
 *
 * The hooks only push events into the ring; everything a trace needs beyond
 * them is added here, off the engine's threads: the trace is opened at the
 * first event (so an engine that never reaches CUDA leaves no file), the
 * header gets the driver version and the GPUs' attributes, the policy's
 * rule names are written once, each new kernel is named once (cuFuncGetName
 * for driver launches; runtime launches carry a host stub, named through
 * dladdr when it is an exported symbol), and every event is written. A write
 * error stops recording (core/trace.c logs it once); the engine goes on. */
#include "uvm/record.h"

#include <stdio.h>
#include <string.h>

#include "core/kernel-name.h"
#include "core/log.h"
#include "core/registry.h"
#include "core/settings.h"
#include "policy/policy.h"
#include "uvm/internal.h"
#include "uvm/hotpath.h"
#include "uvm/picks.h"

/* preload/launch.c marks runtime launches (cudaLaunchKernel's host stub, not
 * a CUfunction) by setting this bit of wo_event.l.func. */

/* Consumer thread only (and the fork child, which has no other thread). */
static struct wo_trace *trace;
static bool tried;
/* Ranges (id, gen) whose alloc event is in the trace: open addressing,
 * key (id << 32 | gen) + 1 so that 0 marks an empty slot. */
static uint64_t *seen;
static size_t seen_cap, nseen;

/* true when (id, gen) was not in the set (and now is). */
static bool seen_insert(uint32_t id, uint32_t gen)
{
    uint64_t key = ((uint64_t)id << 32 | gen) + 1;
    size_t i;

    if ((nseen + 1) * 2 > seen_cap) {
        size_t ncap = seen_cap ? seen_cap * 2 : 1024;
        uint64_t *n = calloc(ncap, sizeof(*n));
        if (!n)
            return false; /* no memory: the range goes unrecorded, replay skips its hits */
        for (size_t k = 0; k < seen_cap; k++) {
            if (!seen[k])
                continue;
            for (i = (seen[k] * 0x9E3779B97F4A7C15ull) >> 20 & (ncap - 1); n[i]; i = (i + 1) & (ncap - 1))
                ;
            n[i] = seen[k];
        }
        free(seen);
        seen = n;
        seen_cap = ncap;
    }
    for (i = (key * 0x9E3779B97F4A7C15ull) >> 20 & (seen_cap - 1); seen[i]; i = (i + 1) & (seen_cap - 1))
        if (seen[i] == key)
            return false;
    seen[i] = key;
    nseen++;
    return true;
}

static void seen_free(void)
{
    free(seen);
    seen = NULL;
    seen_cap = nseen = 0;
}

/* Launch hits, tags and placement events name ranges by (id, gen); replay
 * needs each range's address and size. The hooks do not push an alloc event
 * for every allocation, so the first reference to a range writes one from
 * the registry (api 0: made by the recorder), at the referencing time. */
static void ensure_range(uint32_t id, uint32_t gen, uint64_t t_ns)
{
    struct wo_range r;
    struct wo_event a;

    if (id == WO_TRACE_NO_ID || !seen_insert(id, gen))
        return;
    if (wo_registry_get(id, &r) < 0 || r.gen != gen)
        return; /* freed (and maybe reused) since: nothing true to write */
    memset(&a, 0, sizeof(a));
    a.type = WO_EV_ALLOC;
    a.t_ns = t_ns;
    a.a.base = r.base;
    a.a.size = r.size;
    a.a.seq = r.seq;
    a.a.flags = r.flags;
    a.a.device = r.device;
    wo_trace_event_ids(trace, &a, id, gen);
}

static void add_gpu_info(void)
{
    const struct wo_driver *d = wo_uvm_driver();
    char buf[64];
    int v = 0, n = 0;

    if (!d)
        return;
    if (d->cuDriverGetVersion && d->cuDriverGetVersion(&v) == CUDA_SUCCESS) {
        snprintf(buf, sizeof(buf), "%d.%d", v / 1000, v % 1000 / 10);
        wo_trace_info(trace, "cuda_driver_version", buf);
    }
    if (!d->cuDeviceGetCount || d->cuDeviceGetCount(&n) != CUDA_SUCCESS)
        return;
    snprintf(buf, sizeof(buf), "%d", n);
    wo_trace_info(trace, "gpu_count", buf);
    for (int i = 0; i < n && i < 16 && d->cuDeviceGet && d->cuDeviceGetAttribute; i++) {
        CUdevice dev;
        int major = 0, minor = 0, sms = 0;
        char key[32];
        if (d->cuDeviceGet(&dev, i) != CUDA_SUCCESS)
            continue;
        d->cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
        d->cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
        d->cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
        snprintf(key, sizeof(key), "gpu%d", i);
        snprintf(buf, sizeof(buf), "compute capability %d.%d, %d SMs", major, minor, sms);
        wo_trace_info(trace, key, buf);
    }
}

static void add_rules(void)
{
    const struct wo_policy *p = wo_uvm_policy();
    size_t n;

    if (!p)
        return;
    wo_trace_info(trace, "policy", wo_policy_source(p));
    n = wo_policy_nrules(p);
    /* tags name a rule by index; WO_TRACE_NO_ID is the policy's default */
    for (size_t i = 0; i < n; i++) {
        char label[256];
        wo_trace_rule(trace, (uint32_t)i, wo_policy_rule_label(p, i, label, sizeof(label)));
    }
}

static void open_trace(void)
{
    const char *path = wo_settings()->trace;

    tried = true;
    if (!path || wo_trace_open(path, &trace) < 0)
        return;
    add_gpu_info();
    add_rules();
    wo_info("recording the event stream to %s", path);
}

static void name_kernel(uint64_t key)
{
    const struct wo_driver *d = wo_uvm_driver();
    const char *name = NULL;
    char buf[512];

    if (!(key & WO_LAUNCH_KEY_RUNTIME) && d && d->cuFuncGetName &&
        d->cuFuncGetName(&name, (CUfunction)(uintptr_t)key) != CUDA_SUCCESS)
        name = NULL;
    wo_trace_kernel(trace, key, wo_kernel_name(key, name, buf, sizeof(buf)));
}

/* ---- picked staging's figures (PICKS records) ---- */

struct picks_rec {
    struct wo_trace_pick v[WO_PICKS_SPANS];
    uint32_t n;
};

static void pick_add(void *ud, const struct wo_picks_figs *f)
{
    struct picks_rec *pr = ud;

    if (pr->n == WO_PICKS_SPANS)
        return;
    pr->v[pr->n++] = f->k;
}

/* Picks records at least this often while launches come: a run without
 * the prefetcher has no step events, and the replay takes a tensor's
 * steady state from the first record that had its hot set (its figures
 * before the hot set was made are all over the link). */
#define PICKS_EVERY_NS (100ull * 1000000ull)
static uint64_t picks_at;
static uint32_t picks_epoch; /* wo_picks_hot_epoch at the last look */

/* At a step event, every PICKS_EVERY_NS of launches, and at the end: every
 * expert tensor's cumulative figures, when any changed since the last
 * record. */
static void record_picks(uint64_t t_ns)
{
    static struct picks_rec pr;
    static uint64_t written;
    struct wo_picks_totals t;
    uint64_t sum = 0;

    picks_at = t_ns;

    pr.n = 0;
    wo_picks_report(&t, pick_add, &pr);
    for (uint32_t i = 0; i < pr.n; i++)
        sum += pr.v[i].regs + pr.v[i].staged + pr.v[i].reused + pr.v[i].rows + pr.v[i].resident +
               pr.v[i].hot + pr.v[i].hot_rows;
    if (!pr.n || sum == written)
        return;
    written = sum;
    for (uint32_t i = 0; i < pr.n; i++)
        ensure_range(pr.v[i].id, pr.v[i].gen, t_ns);
    wo_trace_picks(trace, t_ns, pr.v, pr.n);
}

void wo_record_event(const struct wo_event *ev, const struct wo_trace_tag *tag)
{
    if (!tried)
        open_trace();
    if (!trace || !wo_trace_ok(trace))
        return;
    switch (ev->type) {
    case WO_EV_ALLOC: {
        struct wo_range r;
        /* same range only when the sequence number matches (see trace.c) */
        if (wo_registry_find(ev->a.base, &r) == 0 && r.seq == ev->a.seq && seen_insert(r.id, r.gen)) {
            wo_trace_event_ids(trace, ev, r.id, r.gen);
            return;
        }
        break;
    }
    case WO_EV_LAUNCH: {
        uint32_t epoch = __atomic_load_n(&wo_picks_hot_epoch, __ATOMIC_RELAXED);

        if (ev->t_ns - picks_at >= PICKS_EVERY_NS || epoch != picks_epoch) {
            picks_epoch = epoch;
            record_picks(ev->t_ns);
        }
        if (!wo_trace_kernel_known(trace, ev->l.func))
            name_kernel(ev->l.func);
        for (unsigned i = 0; i < ev->nhits && i < WO_EV_MAX_HITS; i++)
            ensure_range(ev->l.hits[i].id, ev->l.hits[i].gen, ev->t_ns);
        break;
    }
    case WO_EV_PLACE:
    case WO_EV_PREFETCH:
    case WO_EV_EVICT:
        ensure_range(ev->p.id, ev->p.gen, ev->t_ns);
        break;
    case WO_EV_STEP:
        record_picks(ev->t_ns);
        break;
    case WO_EV_SEAL: {
        /* resolved at seal (uvm/place.c) before the event was pushed: a
         * replay with no policy of its own takes the run's budget from here */
        char buf[32];
        snprintf(buf, sizeof(buf), "%llu",
                 (unsigned long long)__atomic_load_n(&wo_uvm.device_budget, __ATOMIC_ACQUIRE));
        wo_trace_info(trace, "device_budget", buf);
        /* what the process held beyond its allocations at seal (NVML):
         * woffload-policy fit takes it out of --device as fit does */
        if (__atomic_load_n(&wo_uvm.fit.context_known, __ATOMIC_ACQUIRE)) {
            snprintf(
                buf, sizeof(buf), "%llu",
                (unsigned long long)__atomic_load_n(&wo_uvm.fit.context_bytes, __ATOMIC_RELAXED));
            wo_trace_info(trace, "context_bytes", buf);
        }
        break;
    }
    default:
        break;
    }
    if (tag) {
        ensure_range(tag->id, tag->gen, ev->t_ns);
        wo_trace_tag(trace, tag);
    }
    wo_trace_event(trace, ev);
}

void wo_record_finish(void)
{
    if (!trace)
        return;
    if (wo_trace_ok(trace))
        record_picks(wo_now_ns());
    wo_trace_close(trace, wo_events ? wo_ring_dropped(wo_events) : 0);
    trace = NULL;
    seen_free();
}

void wo_record_forget(void)
{
    wo_trace_abandon(trace);
    trace = NULL;
    tried = true;
    seen_free();
}
