/* tests/fake/fake-core.c: the fake driver's spine: the per-symbol call
 * counters and fault injection behind FK_ENTER, the WOFAKE_* environment,
 * cuInit, devices, contexts (primary context, the per-thread stack) and the
 * fakecuda_* counter API. */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fake-priv.h"

pthread_mutex_t fk_lock = PTHREAD_MUTEX_INITIALIZER;
uint64_t fk_total_mem = UINT64_C(16) << 30;
uint64_t fk_module_bytes;
bool fk_lazy;
bool fk_managed_guard;
bool fk_uvm_cache;
unsigned long fk_managed_guard_violations;
int fk_ndevices = 1;

static const char *const sym_names[FK_NSYMS + 1] = {
#define X(sym, chk) #sym,
    FK_SYMS(X)
#undef X
        NULL,
};

enum { CHK_N, CHK_I, CHK_C };
#define N CHK_N
#define I CHK_I
#define C CHK_C
static const unsigned char sym_check[FK_NSYMS] = {
#define X(sym, chk) chk,
    FK_SYMS(X)
#undef X
};
#undef N
#undef I
#undef C

static _Atomic uint64_t calls[FK_NSYMS];
static _Atomic uint64_t calls_total;
static _Atomic uint64_t injected;
/* Set while any rule names the symbol, so the common path costs one load. */
static _Atomic int armed[FK_NSYMS];
/* WOFAKE_DELAY: CPU time (us) a call takes before it does anything, as the
 * real driver's prefetch and advice calls do (guide/device-facts.md). */
static _Atomic uint32_t delay_us[FK_NSYMS];
/* name:us:n: only the n-th call (0: every call); WOFAKE_DELAY_THREAD: only
 * calls from threads of that name, counted among themselves */
static _Atomic uint64_t delay_calls[FK_NSYMS], delay_seen[FK_NSYMS];
static char delay_thread[16];

#define MAX_RULES 64
struct rule {
    int id;         /* -1: free slot */
    uint64_t at;    /* absolute call number that fails; 0: every call */
    CUresult err;
};
static struct rule rules[MAX_RULES];
static int nrules;
static pthread_mutex_t rule_lock = PTHREAD_MUTEX_INITIALIZER;

static bool no_device;
static bool trace;
/* 0: cuInit not called; 1: succeeded; 2: failed; 3: inherited by fork. */
static _Atomic int init_state;
static bool fork_ok;
bool fk_proc_missing_success;
static pthread_once_t env_once = PTHREAD_ONCE_INIT;

uint64_t fk_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int sym_id(const char *name)
{
    if (!name)
        return -1;
    for (int i = 0; i < FK_NSYMS; i++)
        if (strcmp(sym_names[i], name) == 0)
            return i;
    return -1;
}

static void rearm_locked(void)
{
    int a[FK_NSYMS] = { 0 };
    for (int i = 0; i < nrules; i++)
        if (rules[i].id >= 0)
            a[rules[i].id] = 1;
    for (int i = 0; i < FK_NSYMS; i++)
        atomic_store(&armed[i], a[i]);
}

/* nth relative to `base` calls already made; nth 0 = every call. */
static int add_rule(const char *name, uint64_t nth, bool every, CUresult err, bool relative)
{
    int id = sym_id(name);
    if (id < 0)
        return -ENOENT;
    if ((!every && nth == 0) || err == CUDA_SUCCESS)
        return -EINVAL;
    pthread_mutex_lock(&rule_lock);
    int slot = -1;
    for (int i = 0; i < nrules; i++)
        if (rules[i].id < 0) {
            slot = i;
            break;
        }
    if (slot < 0) {
        if (nrules == MAX_RULES) {
            pthread_mutex_unlock(&rule_lock);
            return -ENOSPC;
        }
        slot = nrules++;
    }
    uint64_t base = relative ? atomic_load(&calls[id]) : 0;
    rules[slot] = (struct rule){ .id = id, .at = every ? 0 : base + nth, .err = err };
    rearm_locked();
    pthread_mutex_unlock(&rule_lock);
    return 0;
}

static uint64_t parse_size(const char *s, bool *ok)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    *ok = errno == 0 && end != s;
    switch (*end) {
    case 'T': case 't': v <<= 10; /* fall through */
    case 'G': case 'g': v <<= 10; /* fall through */
    case 'M': case 'm': v <<= 10; /* fall through */
    case 'K': case 'k': v <<= 10; end++; break;
    default: break;
    }
    if (*end == 'i' || *end == 'B' || *end == 'b')
        end++;
    if (*end == 'B')
        end++;
    *ok = *ok && *end == '\0';
    return v;
}

static void parse_fail_env(const char *spec)
{
    char *copy = strdup(spec);
    if (!copy)
        return;
    char *save = NULL;
    for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *c1 = strchr(tok, ':');
        char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c1 || !c2) {
            fprintf(stderr, "fakecuda: WOFAKE_FAIL: '%s' is not name:nth:err\n", tok);
            continue;
        }
        *c1 = *c2 = '\0';
        bool every = strcmp(c1 + 1, "*") == 0;
        uint64_t nth = every ? 0 : strtoull(c1 + 1, NULL, 10);
        CUresult err = (CUresult)strtol(c2 + 1, NULL, 0);
        int r = add_rule(tok, nth, every, err, false);
        if (r < 0)
            fprintf(stderr, "fakecuda: WOFAKE_FAIL: rule for '%s' rejected (%s)\n", tok,
                    strerror(-r));
    }
    free(copy);
}

/* A forked child inherits the parent's address space but no driver state:
 * CUDA in the child of an initialised parent is undefined and in practice
 * fails, so the fake refuses every call there (WOFAKE_FORK_OK=1 keeps the
 * inherited state usable). The locks may have been held by threads that do
 * not exist in the child. */
static void atfork_child(void)
{
    pthread_mutex_init(&fk_lock, NULL);
    pthread_mutex_init(&rule_lock, NULL);
    if (atomic_load(&init_state) == 1 && !fork_ok)
        atomic_store(&init_state, 3);
}

static void parse_delay_env(const char *spec)
{
    char *copy = strdup(spec);
    if (!copy)
        return;
    char *save = NULL;
    for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *c = strchr(tok, ':');
        int id;
        if (!c) {
            fprintf(stderr, "fakecuda: WOFAKE_DELAY: '%s' is not name:microseconds[:calls]\n", tok);
            continue;
        }
        *c = '\0';
        id = sym_id(tok);
        if (id < 0) {
            fprintf(stderr, "fakecuda: WOFAKE_DELAY: no function '%s'\n", tok);
            continue;
        }
        char *n = strchr(c + 1, ':');
        atomic_store(&delay_calls[id], n ? strtoull(n + 1, NULL, 10) : 0);
        atomic_store(&delay_us[id], (uint32_t)strtoul(c + 1, NULL, 10));
    }
    free(copy);
}

static void read_env(void)
{
    pthread_atfork(NULL, NULL, atfork_child);
    for (int i = 0; i < MAX_RULES; i++)
        rules[i].id = -1;
    const char *s = getenv("WOFAKE_TOTAL_MEM");
    if (s && *s) {
        bool ok;
        uint64_t v = parse_size(s, &ok);
        if (ok && v > 0)
            fk_total_mem = v;
        else
            fprintf(stderr, "fakecuda: WOFAKE_TOTAL_MEM='%s' is not a size; using 16G\n", s);
    }
    s = getenv("WOFAKE_MODULE_BYTES");
    if (s && *s) {
        bool ok;
        uint64_t v = parse_size(s, &ok);
        if (ok)
            fk_module_bytes = v;
        else
            fprintf(stderr, "fakecuda: WOFAKE_MODULE_BYTES='%s' is not a size; using 0\n", s);
    }
    s = getenv("WOFAKE_LAZY");
    fk_lazy = s && *s && strcmp(s, "0") != 0;
    s = getenv("WOFAKE_MANAGED_GUARD");
    fk_managed_guard = s && *s && strcmp(s, "0") != 0;
    s = getenv("WOFAKE_UVM_CACHE");
    fk_uvm_cache = s && *s && strcmp(s, "0") != 0;
    s = getenv("WOFAKE_DEVICES");
    if (s && *s) {
        int n = atoi(s);
        fk_ndevices = n >= 1 && n <= 8 ? n : 1;
    }
    s = getenv("WOFAKE_NO_DEVICE");
    no_device = s && *s && strcmp(s, "0") != 0;
    s = getenv("WOFAKE_PROC_MISSING");
    fk_proc_missing_success = s && strcmp(s, "success") == 0;
    s = getenv("WOFAKE_FORK_OK");
    fork_ok = s && *s && strcmp(s, "0") != 0;
    s = getenv("WOFAKE_TRACE");
    trace = s && *s && strcmp(s, "0") != 0;
    s = getenv("WOFAKE_FAIL");
    if (s && *s)
        parse_fail_env(s);
    s = getenv("WOFAKE_DELAY_THREAD");
    if (s)
        snprintf(delay_thread, sizeof(delay_thread), "%s", s);
    s = getenv("WOFAKE_DELAY");
    if (s && *s)
        parse_delay_env(s);
}

static void env_init(void)
{
    pthread_once(&env_once, read_env);
}

CUresult fk_enter(enum fk_sym_id id)
{
    env_init();
    uint64_t n = atomic_fetch_add_explicit(&calls[id], 1, memory_order_relaxed) + 1;
    atomic_fetch_add_explicit(&calls_total, 1, memory_order_relaxed);
    if (trace)
        fprintf(stderr, "fakecuda: %s #%llu\n", sym_names[id], (unsigned long long)n);
    uint32_t d = atomic_load_explicit(&delay_us[id], memory_order_relaxed);
    if (d && delay_thread[0]) {
        char me[16] = "";
        if (pthread_getname_np(pthread_self(), me, sizeof(me)) != 0 ||
            strcmp(me, delay_thread) != 0)
            d = 0;
    }
    uint64_t dn = atomic_load_explicit(&delay_calls[id], memory_order_relaxed);
    if (d && (!dn || atomic_fetch_add(&delay_seen[id], 1) + 1 == dn)) {
        struct timespec ts = { .tv_sec = d / 1000000u, .tv_nsec = (long)(d % 1000000u) * 1000 };
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
            ;
    }
    if (atomic_load_explicit(&armed[id], memory_order_relaxed)) {
        CUresult err = CUDA_SUCCESS;
        pthread_mutex_lock(&rule_lock);
        for (int i = 0; i < nrules; i++) {
            if (rules[i].id != (int)id)
                continue;
            if (rules[i].at == 0 || rules[i].at == n) {
                err = rules[i].err;
                break;
            }
        }
        pthread_mutex_unlock(&rule_lock);
        if (err != CUDA_SUCCESS) {
            atomic_fetch_add(&injected, 1);
            if (trace)
                fprintf(stderr, "fakecuda: %s #%llu fails with %d (injected)\n", sym_names[id],
                        (unsigned long long)n, (int)err);
            return err;
        }
    }
    switch (sym_check[id]) {
    case CHK_N:
        return CUDA_SUCCESS;
    case CHK_I:
        return atomic_load(&init_state) == 1 ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
    default:
        if (atomic_load(&init_state) != 1)
            return CUDA_ERROR_NOT_INITIALIZED;
        return fk_current_ctx() ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
    }
}

/* --- fakecuda_* counters and rules --------------------------------------- */

FK_EXPORT const char *const *fakecuda_functions(void)
{
    return sym_names;
}

FK_EXPORT uint64_t fakecuda_calls(const char *name)
{
    int id = sym_id(name);
    return id < 0 ? 0 : atomic_load(&calls[id]);
}

FK_EXPORT uint64_t fakecuda_calls_total(void)
{
    return atomic_load(&calls_total);
}

FK_EXPORT void fakecuda_reset_counts(void)
{
    env_init();
    pthread_mutex_lock(&rule_lock);
    /* Rules armed for an absolute call number would never fire once the
     * counter restarts below it; rebase them to "the same distance ahead". */
    for (int i = 0; i < nrules; i++)
        if (rules[i].id >= 0 && rules[i].at) {
            uint64_t done = atomic_load(&calls[rules[i].id]);
            rules[i].at = rules[i].at > done ? rules[i].at - done : 0;
            if (!rules[i].at)
                rules[i].id = -1;
        }
    for (int i = 0; i < FK_NSYMS; i++)
        atomic_store(&calls[i], 0);
    atomic_store(&calls_total, 0);
    atomic_store(&injected, 0);
    rearm_locked();
    pthread_mutex_unlock(&rule_lock);
}

FK_EXPORT int fakecuda_fail(const char *name, uint64_t nth, CUresult err)
{
    env_init();
    return add_rule(name, nth, false, err, true);
}

FK_EXPORT int fakecuda_fail_every(const char *name, CUresult err)
{
    env_init();
    return add_rule(name, 0, true, err, true);
}

FK_EXPORT void fakecuda_fail_clear(void)
{
    env_init();
    pthread_mutex_lock(&rule_lock);
    for (int i = 0; i < MAX_RULES; i++)
        rules[i].id = -1;
    nrules = 0;
    rearm_locked();
    pthread_mutex_unlock(&rule_lock);
}

FK_EXPORT uint64_t fakecuda_injected(void)
{
    return atomic_load(&injected);
}

/* --- init, version, devices ---------------------------------------------- */

FK_EXPORT CUresult cuInit(unsigned int Flags)
{
    FK_ENTER(cuInit);
    if (Flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (atomic_load(&init_state) == 3)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (no_device) {
        atomic_store(&init_state, 2);
        return CUDA_ERROR_NO_DEVICE;
    }
    atomic_store(&init_state, 1);
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuDriverGetVersion(int *driverVersion)
{
    FK_ENTER(cuDriverGetVersion);
    if (!driverVersion)
        return CUDA_ERROR_INVALID_VALUE;
    *driverVersion = FK_DRIVER_VERSION;
    return CUDA_SUCCESS;
}

bool fk_device_valid(int dev)
{
    return dev >= 0 && dev < fk_ndevices;
}

FK_EXPORT CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
    FK_ENTER(cuDeviceGet);
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    if (!fk_device_valid(ordinal))
        return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuDeviceGetCount(int *count)
{
    FK_ENTER(cuDeviceGetCount);
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    *count = fk_ndevices;
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
    FK_ENTER(cuDeviceGetName);
    if (!name || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (!fk_device_valid(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    snprintf(name, (size_t)len, "Fake CUDA Device %d (libwoffload tests)", dev);
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    FK_ENTER(cuDeviceTotalMem_v2);
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    if (!fk_device_valid(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    *bytes = fk_total_mem;
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
    FK_ENTER(cuDeviceGetAttribute);
    if (!pi)
        return CUDA_ERROR_INVALID_VALUE;
    if (!fk_device_valid(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    int v = 0;
    /* An H100-like device that supports what the shim relies on. */
    switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: v = 64; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: v = 2147483647; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: v = 65535; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: v = 65535; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: v = 49152; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: v = 32; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: v = 132; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: v = 9; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: v = 1980000; break;
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: v = 2619000; break;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: v = 5120; break;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: v = 0x18 + dev; break;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY:
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS:
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY:
    case CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM:
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: /* 1 on the H100 */
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS:
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT:
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH:
        v = 1;
        break;
    /* No HMM/ATS: the fake demands managed memory for advise/prefetch, as a
     * PCIe H100 without HMM does. */
    case CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS:
    case CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES:
    case CU_DEVICE_ATTRIBUTE_DIRECT_MANAGED_MEM_ACCESS_FROM_HOST:
        v = 0;
        break;
    default:
        v = 0;
        break;
    }
    *pi = v;
    return CUDA_SUCCESS;
}

/* --- contexts ------------------------------------------------------------ */

/* Fixed handles, valid from the start so lock-free validity checks never
 * race with their initialisation; only refs changes (under fk_lock). */
#define PRIMARY(d) { .magic = FK_CTX_MAGIC, .device = d }
static struct CUctx_st primary[8] = { PRIMARY(0), PRIMARY(1), PRIMARY(2), PRIMARY(3),
                                      PRIMARY(4), PRIMARY(5), PRIMARY(6), PRIMARY(7) };
#define CTX_STACK 32
static __thread CUcontext ctx_stack[CTX_STACK];
static __thread int ctx_depth;

CUcontext fk_current_ctx(void)
{
    return ctx_depth > 0 ? ctx_stack[ctx_depth - 1] : NULL;
}

struct CUctx_st *fk_primary_ctx(int dev)
{
    /* Pointer attributes name the primary context even before it is
     * retained, as the handle is fixed per device. */
    return fk_device_valid(dev) ? &primary[dev] : NULL;
}

bool fk_ctx_valid(CUcontext c)
{
    return c && c->magic == FK_CTX_MAGIC;
}

FK_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    FK_ENTER(cuDevicePrimaryCtxRetain);
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (!fk_device_valid(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    fk_lock_();
    primary[dev].refs++;
    fk_unlock_();
    *pctx = &primary[dev];
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    FK_ENTER(cuDevicePrimaryCtxRelease_v2);
    if (!fk_device_valid(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    CUresult r = CUDA_SUCCESS;
    fk_lock_();
    /* The context object stays valid (its handle is static): a real driver
     * would destroy it at 0 references, but memory is not reclaimed here so
     * leak checks still see what the program left behind. */
    if (primary[dev].refs > 0)
        primary[dev].refs--;
    else
        r = CUDA_ERROR_INVALID_CONTEXT;
    fk_unlock_();
    return r;
}

FK_EXPORT CUresult cuCtxGetCurrent(CUcontext *pctx)
{
    FK_ENTER(cuCtxGetCurrent);
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    *pctx = fk_current_ctx();
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx)
{
    FK_ENTER(cuCtxSetCurrent);
    if (ctx && !fk_ctx_valid(ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!ctx) {
        if (ctx_depth > 0)
            ctx_depth--;
        return CUDA_SUCCESS;
    }
    if (ctx_depth == 0)
        ctx_depth = 1;
    ctx_stack[ctx_depth - 1] = ctx;
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
    FK_ENTER(cuCtxPushCurrent_v2);
    if (!fk_ctx_valid(ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (ctx_depth == CTX_STACK)
        return CUDA_ERROR_OUT_OF_MEMORY;
    ctx_stack[ctx_depth++] = ctx;
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *pctx)
{
    FK_ENTER(cuCtxPopCurrent_v2);
    if (ctx_depth == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    CUcontext c = ctx_stack[--ctx_depth];
    if (pctx)
        *pctx = c;
    return CUDA_SUCCESS;
}

/* Contexts of their own (cuCtxCreate): a fixed pool, so a handle stays
 * checkable after cuCtxDestroy (its magic is cleared, never its memory). */
#define CREATED 16
static struct CUctx_st created[CREATED];

static CUresult ctx_create(CUcontext *pctx, CUdevice dev)
{
    struct CUctx_st *c = NULL;

    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (!fk_device_valid(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    if (ctx_depth == CTX_STACK)
        return CUDA_ERROR_OUT_OF_MEMORY; /* no room to push it current */
    fk_lock_();
    for (int i = 0; i < CREATED && !c; i++)
        if (created[i].magic != FK_CTX_MAGIC) {
            c = &created[i];
            c->device = dev;
            c->refs = 1;
            c->magic = FK_CTX_MAGIC;
        }
    fk_unlock_();
    if (!c)
        return CUDA_ERROR_OUT_OF_MEMORY;
    /* like the real driver: the new context is pushed, current on this thread */
    ctx_stack[ctx_depth++] = c;
    *pctx = c;
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    FK_ENTER(cuCtxCreate_v2);
    (void)flags;
    return ctx_create(pctx, dev);
}

FK_EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags,
                                  CUdevice dev)
{
    FK_ENTER(cuCtxCreate_v4);
    (void)flags;
    if (params)
        return CUDA_ERROR_NOT_SUPPORTED; /* execution affinity, CIG: not modelled */
    return ctx_create(pctx, dev);
}

FK_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    FK_ENTER(cuCtxDestroy_v2);
    if (!fk_ctx_valid(ctx) || ctx < &created[0] || ctx >= &created[CREATED])
        return CUDA_ERROR_INVALID_CONTEXT; /* a primary context is released, never destroyed */
    for (int i = 0; i < ctx_depth; i++)
        if (ctx_stack[i] == ctx) {
            memmove(&ctx_stack[i], &ctx_stack[i + 1], (size_t)(ctx_depth - i - 1) * sizeof(ctx));
            ctx_depth--;
            i--;
        }
    fk_lock_();
    ctx->magic = 0;
    fk_unlock_();
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuCtxSetLimit(CUlimit limit, size_t value)
{
    FK_ENTER(cuCtxSetLimit);
    (void)value; /* nothing is reserved for limits here */
    return limit <= CU_LIMIT_PERSISTING_L2_CACHE_SIZE ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

FK_EXPORT CUresult cuCtxGetDevice(CUdevice *device)
{
    FK_ENTER(cuCtxGetDevice);
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    *device = fk_current_ctx()->device;
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuCtxGetDevice_v2(CUdevice *device, CUcontext ctx)
{
    FK_ENTER(cuCtxGetDevice_v2);
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    if (!ctx)
        ctx = fk_current_ctx();
    if (!fk_ctx_valid(ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    *device = ctx->device;
    return CUDA_SUCCESS;
}

/* Work runs when it is enqueued, so synchronising has nothing to wait for
 * but a caller blocked in cuStreamWaitValue32, which it waits for holding
 * the driver's quiet lock, as a free does (fk_quiet_wait); it still may not
 * happen inside a capture. */
FK_EXPORT CUresult cuCtxSynchronize(void)
{
    FK_ENTER(cuCtxSynchronize);
    CUresult r = fk_capture_check_unsafe();
    return r == CUDA_SUCCESS ? fk_quiet_wait() : r;
}

FK_EXPORT CUresult cuCtxSynchronize_v2(CUcontext ctx)
{
    FK_ENTER(cuCtxSynchronize_v2);
    if (!ctx)
        ctx = fk_current_ctx();
    if (!fk_ctx_valid(ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    CUresult r = fk_capture_check_unsafe();
    return r == CUDA_SUCCESS ? fk_quiet_wait() : r;
}

FK_EXPORT CUresult cuCtxGetStreamPriorityRange(int *leastPriority, int *greatestPriority)
{
    FK_ENTER(cuCtxGetStreamPriorityRange);
    if (leastPriority)
        *leastPriority = 0;
    if (greatestPriority)
        *greatestPriority = -5;
    return CUDA_SUCCESS;
}
