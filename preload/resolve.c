/* preload/resolve.c: every path by which a caller obtains a driver function
 * pointer, and the substitution of our wrappers for the real functions.
 *
 * - dlsym/dlvsym: the real lookup first; a result is replaced only when it
 *   is exactly the driver library's own definition of a function we hook (so
 *   a CUDA-like name from another library, or a failed lookup, comes back
 *   untouched). RTLD_NEXT is resolved relative to the caller (see next_lookup).
 * - cuGetProcAddress(_v2) and the inner "cuGetProcAddress" pointer they hand
 *   out, cudaGetDriverEntryPoint(ByVersion): the real resolver first, a
 *   wrapper only on success, the status filled by the real call.
 *
 * Wrapper slots: the resolvers key on (name, version, flags). The version
 * picks the ABI (WO_DRIVER_PROCS, the highest version <= the request), the
 * flags pick the legacy or the per-thread (_ptsz/_ptds) ABI symbol. Each ABI
 * symbol has NSLOTS wrappers, each bound to one real function: the first
 * resolution returning a function claims a slot and stores it, later ones
 * returning the same function get the same wrapper. So a per-thread variant
 * (a different real function) always has its own wrapper, and so does a
 * driver that hands out two entry points for one ABI (an alias and its
 * export, say). More distinct functions than slots: that caller gets the
 * real function unwrapped (counted as proc_conflict): never a wrong forward. */
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <string.h>

#include "core/log.h"
#include "preload/hook.h"

#define NFLAGS 3 /* CU_GET_PROC_ADDRESS_DEFAULT, _LEGACY_STREAM, _PER_THREAD_DEFAULT_STREAM */
#define NSLOTS 4

static void *slot_real[WO_NHOOKS][NSLOTS];

static inline void *slot_get(int id, int k)
{
    return __atomic_load_n(&slot_real[id][k], __ATOMIC_ACQUIRE);
}

/* The wrappers handed out by the resolvers: NSLOTS per hooked ABI symbol,
 * each bound to the real function stored in its slot. */
#define WO_SLOT_WRAPPER(sym, hook, RET, PARAMS, ARGS, k)                                           \
    static RET slot_##sym##_##k PARAMS                                                             \
    {                                                                                              \
        return hook((wo_pfn_##sym)slot_get(WO_HOOK_##sym, k), WO_HOOK_##sym,                       \
                    __builtin_return_address(0), WO_UNPACK ARGS);                                  \
    }
#define WO_SLOT_WRAPPERS(sym, pt, hook, RET, PARAMS, ARGS)                                         \
    WO_SLOT_WRAPPER(sym, hook, RET, PARAMS, ARGS, 0)                                               \
    WO_SLOT_WRAPPER(sym, hook, RET, PARAMS, ARGS, 1)                                               \
    WO_SLOT_WRAPPER(sym, hook, RET, PARAMS, ARGS, 2)                                               \
    WO_SLOT_WRAPPER(sym, hook, RET, PARAMS, ARGS, 3)
WO_DRIVER_HOOKS(WO_SLOT_WRAPPERS)
#undef WO_SLOT_WRAPPERS
#undef WO_SLOT_WRAPPER

#define WO_SLOT_ROW(sym, pt, hook, RET, PARAMS, ARGS)                                              \
    {(void *)slot_##sym##_0, (void *)slot_##sym##_1, (void *)slot_##sym##_2,                       \
     (void *)slot_##sym##_3},
static void *const slot_wrapper[WO_NHOOKS][NSLOTS] = {WO_DRIVER_HOOKS(WO_SLOT_ROW)};
#undef WO_SLOT_ROW

#define WO_EXPORT_ADDR(sym, pt, hook, RET, PARAMS, ARGS) (void *)sym,
void *const wo_hook_exports[WO_NHOOKS] = {WO_DRIVER_HOOKS(WO_EXPORT_ADDR)};
#undef WO_EXPORT_ADDR

struct proc {
    const char *name;
    int version;
    int id;    /* legacy / default */
    int id_pt; /* per-thread */
};
#define WO_PROC_ROW(name, ver, sym, sym_pt) {name, ver, WO_HOOK_##sym, WO_HOOK_##sym_pt},
static const struct proc procs[] = {WO_DRIVER_PROCS(WO_PROC_ROW)};
#undef WO_PROC_ROW

/* --- our own address range ------------------------------------------------ */

static uintptr_t self_lo, self_hi;

static int find_self(struct dl_phdr_info *info, size_t size, void *ud)
{
    uintptr_t me = (uintptr_t)ud;
    (void)size;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
        if (ph->p_type == PT_LOAD && (ph->p_flags & PF_X) && me >= lo && me < lo + ph->p_memsz) {
            self_lo = lo;
            self_hi = lo + ph->p_memsz;
            return 1;
        }
    }
    return 0;
}

static void init_self(void)
{
    dl_iterate_phdr(find_self, (void *)(uintptr_t)&find_self);
}

bool wo_is_our_function(const void *p)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, init_self);
    return (uintptr_t)p >= self_lo && (uintptr_t)p < self_hi;
}

/* --- substitution --------------------------------------------------------- */

/* Whether resolvers hand out wrappers: only once the shim is active (the
 * first resolution is a relevant call: it runs init, so WOFFLOAD_DISABLE and
 * a missing driver are known). While this thread initialises, no. */
static bool substituting(void)
{
    int state = __atomic_load_n(&wo_preload_state, __ATOMIC_ACQUIRE);
    if (WO_UNLIKELY(state == WO_STATE_UNINIT))
        state = wo_preload_init_slow();
    return state == WO_STATE_ACTIVE;
}

static const struct proc *find_proc(const char *name, int version)
{
    const struct proc *best = NULL;
    for (size_t i = 0; i < WO_ARRAY_SIZE(procs); i++)
        if (procs[i].version <= version && strcmp(procs[i].name, name) == 0 &&
            (!best || procs[i].version > best->version))
            best = &procs[i];
    return best;
}

/* A driver library linked without -Bsymbolic takes the address of its own
 * exported functions through the GOT, which the preloaded shim interposes:
 * its resolver then hands out our export. The function it meant is its own
 * definition of that name. Anything else comes back as it is. */
static void *driver_function(void *p)
{
    const struct wo_real *r;
    int i;

    if (!wo_is_our_function(p))
        return p;
    for (i = 0; i < WO_NHOOKS && wo_hook_exports[i] != p; i++)
        ;
    r = i < WO_NHOOKS ? wo_real_driver() : NULL;
    return r && r->hook[i] ? r->hook[i] : p;
}

void *wo_resolve_proc(const char *name, int version, uint64_t flags, void *real,
                      CUresult (*resolve)(const char *name, void **pfn, int ver, uint64_t flags))
{
    const struct proc *pr;
    int id, k;
    void *cur;

    if (!real || !name || flags >= NFLAGS)
        return real;
    real = driver_function(real);
    if (wo_is_our_function(real))
        return real; /* one of our resolved wrappers already */
    pr = find_proc(name, version);
    if (!pr)
        return real;
    /* A version newer than our headers may name a newer ABI of the same
     * function: wrap only when the driver gives the very same function at
     * the version we know. */
    if (version > CUDA_VERSION) {
        void *known = NULL;
        if (!resolve || resolve(name, &known, CUDA_VERSION, flags) != CUDA_SUCCESS ||
            driver_function(known) != real)
            return real;
    }
    id = flags == CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM ? pr->id_pt : pr->id;
    /* The slot holding this very function, or a free one. */
    for (k = 0; k < NSLOTS; k++) {
        cur = slot_get(id, k);
        if (!cur && !__atomic_compare_exchange_n(&slot_real[id][k], &cur, real, false,
                                                 __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE) &&
            cur != real)
            continue; /* another thread took it for another function */
        if (!cur || cur == real) {
            wo_count(WO_CTR_proc_substituted, 1);
            return slot_wrapper[id][k];
        }
    }
    wo_count(WO_CTR_proc_conflict, 1);
    wo_log_once(WO_LOG_WARN, "%s (version %d, flags %llu): more than %d different functions for one "
                             "ABI; this one is not observed",
                name, version, (unsigned long long)flags, NSLOTS);
    return real;
}

/* The driver's resolver as a plain function for the version re-check. */
static CUresult proc_v1_resolve(const char *name, void **pfn, int ver, uint64_t flags)
{
    wo_pfn_cuGetProcAddress f = (wo_pfn_cuGetProcAddress)slot_get(WO_HOOK_cuGetProcAddress, 0);
    const struct wo_real *r = wo_real_driver();
    if (!f && r)
        f = (wo_pfn_cuGetProcAddress)r->hook[WO_HOOK_cuGetProcAddress];
    return f ? f(name, pfn, ver, flags) : CUDA_ERROR_NOT_FOUND;
}

static CUresult proc_v2_resolve(const char *name, void **pfn, int ver, uint64_t flags)
{
    CUdriverProcAddressQueryResult st;
    wo_pfn_cuGetProcAddress_v2 f =
        (wo_pfn_cuGetProcAddress_v2)slot_get(WO_HOOK_cuGetProcAddress_v2, 0);
    const struct wo_real *r = wo_real_driver();
    if (!f && r)
        f = (wo_pfn_cuGetProcAddress_v2)r->hook[WO_HOOK_cuGetProcAddress_v2];
    return f ? f(name, pfn, ver, flags, &st) : CUDA_ERROR_NOT_FOUND;
}

/* cuGetProcAddress (11.3 ABI, no status). */
CUresult wo_h_proc_v1(wo_pfn_cuGetProcAddress real, int id, void *ra, const char *symbol,
                      void **pfn, int ver, cuuint64_t flags)
{
    CUresult res;
    (void)ra;

    wo_count_call(id);
    if (!real)
        return CUDA_ERROR_NOT_FOUND;
    res = real(symbol, pfn, ver, flags);
    wo_count(WO_CTR_proc_calls, 1);
    /* Substituted even while nested: a pointer handed out now is used for
     * the life of the process. */
    if (res == CUDA_SUCCESS && pfn && *pfn && substituting())
        *pfn = wo_resolve_proc(symbol, ver, flags, *pfn, proc_v1_resolve);
    return res;
}

CUresult wo_h_proc_v2(wo_pfn_cuGetProcAddress_v2 real, int id, void *ra, const char *symbol,
                      void **pfn, int ver, cuuint64_t flags, CUdriverProcAddressQueryResult *status)
{
    CUresult res;
    (void)ra;

    wo_count_call(id);
    if (!real)
        return CUDA_ERROR_NOT_FOUND;
    res = real(symbol, pfn, ver, flags, status);
    wo_count(WO_CTR_proc_calls, 1);
    if (res == CUDA_SUCCESS && pfn && *pfn && (!status || *status == CU_GET_PROC_ADDRESS_SUCCESS) &&
        substituting())
        *pfn = wo_resolve_proc(symbol, ver, flags, *pfn, proc_v2_resolve);
    return res;
}

/* --- the runtime's entry-point getters ------------------------------------ */

static int runtime_version(void)
{
    static int ver;
    int v = __atomic_load_n(&ver, __ATOMIC_RELAXED);
    if (!v) {
        cudaError_t (*get)(int *) =
            (cudaError_t(*)(int *))wo_real_runtime_sym("cudaRuntimeGetVersion");
        if (!get || get(&v) != cudaSuccess || v <= 0)
            v = CUDA_VERSION;
        __atomic_store_n(&ver, v, __ATOMIC_RELAXED);
    }
    return v;
}

static void entry_point_substitute(const char *symbol, void **fn, int ver,
                                   unsigned long long flags,
                                   const enum cudaDriverEntryPointQueryResult *status)
{
    void *p;
    wo_count(WO_CTR_entry_point_calls, 1);
    if (!fn || !*fn || (status && *status != cudaDriverEntryPointSuccess) || !substituting())
        return;
    /* The runtime usually asks the driver through our resolver already and
     * got a wrapper; wo_resolve_proc leaves our own functions alone. */
    p = wo_resolve_proc(symbol, ver, flags, *fn, proc_v2_resolve);
    if (p != *fn) {
        wo_count(WO_CTR_entry_point_substituted, 1);
        *fn = p;
    }
}

cudaError_t wo_h_cuda_entry_point(wo_pfn_cudaGetDriverEntryPoint real, int id, void *ra,
                                  const char *symbol, void **fn, unsigned long long flags,
                                  enum cudaDriverEntryPointQueryResult *status)
{
    cudaError_t res;
    (void)ra;

    wo_count_call(WO_NHOOKS + id);
    if (!real)
        return cudaErrorSharedObjectSymbolNotFound;
    res = real(symbol, fn, flags, status);
    if (res == cudaSuccess)
        entry_point_substitute(symbol, fn, runtime_version(), flags, status);
    return res;
}

cudaError_t wo_h_cuda_entry_point_by_version(wo_pfn_cudaGetDriverEntryPointByVersion real, int id,
                                             void *ra, const char *symbol, void **fn,
                                             unsigned int ver, unsigned long long flags,
                                             enum cudaDriverEntryPointQueryResult *status)
{
    cudaError_t res;
    (void)ra;

    wo_count_call(WO_NHOOKS + id);
    if (!real)
        return cudaErrorSharedObjectSymbolNotFound;
    res = real(symbol, fn, ver, flags, status);
    if (res == cudaSuccess)
        entry_point_substitute(symbol, fn, (int)ver, flags, status);
    return res;
}

/* --- dlsym / dlvsym -------------------------------------------------------- */

/* Our export for a driver symbol found by dlsym, or p itself. */
static void *dl_substitute(const char *name, void *p)
{
    const struct wo_real *r;

    if (!p || !name || name[0] != 'c' || name[1] != 'u')
        return p;
    for (int i = 0; i < WO_NHOOKS; i++) {
        if (strcmp(wo_hook_names[i], name) != 0)
            continue;
        if (!substituting())
            return p;
        /* NULL while this thread loads the driver (its constructors). */
        r = wo_real_driver();
        if (!r || r->hook[i] != p)
            return p;
        wo_count(WO_CTR_dlsym_substituted, 1);
        return wo_hook_exports[i];
    }
    return p;
}

/* (Architectures without the assembly exports of exports-dl.c.)
 * dlsym(RTLD_NEXT) asks for the next definition after the *caller's* object.
 * glibc finds the caller from its own return address, which inside this hook
 * is libwoffload: so the search is redone here, relative to the caller: the
 * objects after the caller's in its namespace's link map, each asked through
 * its own handle (dlopen RTLD_NOLOAD) and accepted only when the definition
 * lies in that very object (dladdr), so IFUNCs and versions resolve as glibc
 * resolves them. Differences from glibc: objects loaded RTLD_LOCAL after the
 * caller are searched too, and a miss leaves dlerror() unset. */
#if !defined(__x86_64__)
static void *next_lookup(void *ra, const char *name, const char *version)
{
    Dl_info info;
    struct link_map *caller = NULL;

    wo_count(WO_CTR_dlsym_next, 1);
    if (!dladdr1(ra, &info, (void **)&caller, RTLD_DL_LINKMAP) || !caller)
        return version ? wo_real_dlvsym(RTLD_NEXT, name, version) : wo_real_dlsym(RTLD_NEXT, name);
    for (struct link_map *l = caller->l_next; l; l = l->l_next) {
        void *h, *p;
        struct link_map *def = NULL;
        if (!l->l_name || !*l->l_name)
            continue;
        h = dlopen(l->l_name, RTLD_LAZY | RTLD_NOLOAD);
        if (!h)
            continue;
        p = version ? wo_real_dlvsym(h, name, version) : wo_real_dlsym(h, name);
        dlclose(h);
        if (p && dladdr1(p, &info, (void **)&def, RTLD_DL_LINKMAP) && def == l)
            return p;
        /* TLS and absolute symbols lie outside the object: trust the handle
         * only when dladdr cannot say. */
        if (p && !dladdr(p, &info))
            return p;
    }
    return NULL;
}

#endif

/* No instrumentation: see WO_RAW. Only names of driver functions go on to
 * the (instrumented) substitution. */
WO_RAW void *wo_h_dlsym(void *handle, const char *name, void *ra)
{
    void *p;

    (void)ra;
    __atomic_fetch_add(&wo_counter_values[WO_CTR_dlsym_calls], 1, __ATOMIC_RELAXED);
#if !defined(__x86_64__)
    if (handle == RTLD_NEXT)
        p = next_lookup(ra, name, NULL);
    else
#endif
        p = wo_real_dlsym(handle, name);
    if (!p || !name || name[0] != 'c' || name[1] != 'u')
        return p;
    return dl_substitute(name, p);
}

WO_RAW void *wo_h_dlvsym(void *handle, const char *name, const char *version, void *ra)
{
    void *p;

    (void)ra;
    __atomic_fetch_add(&wo_counter_values[WO_CTR_dlsym_calls], 1, __ATOMIC_RELAXED);
#if !defined(__x86_64__)
    if (handle == RTLD_NEXT)
        p = next_lookup(ra, name, version);
    else
#endif
        p = wo_real_dlvsym(handle, name, version);
    if (!p || !name || name[0] != 'c' || name[1] != 'u')
        return p;
    return dl_substitute(name, p);
}
