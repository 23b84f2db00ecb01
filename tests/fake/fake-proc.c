/* tests/fake/fake-proc.c: cuGetProcAddress (11.3 ABI) and
 * cuGetProcAddress_v2 (12.0 ABI) over the FK_PROCS table, with the real
 * driver's rules: the highest entry whose version is <= the requested one
 * wins; CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM selects the
 * _ptsz/_ptds variant where one exists; a name known only at later versions
 * gives CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT, an unknown one
 * CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND, both with *pfn = NULL and
 * CUDA_ERROR_NOT_FOUND (or CUDA_SUCCESS, as the real driver 580 does, with
 * WOFAKE_PROC_MISSING=success). "cuGetProcAddress" at 12000+ resolves to cuGetProcAddress_v2
 * itself: the inner resolver a CUDA runtime uses for everything else. */
#include <string.h>

#include "fake-priv.h"

struct proc {
    const char *name;
    int version;
    void *def, *pt;
};

static const struct proc procs[] = {
#define X(name, ver, def, pt) { #name, ver, (void *)(def), (void *)(pt) },
    FK_PROCS(X)
#undef X
};
#define NPROCS (sizeof(procs) / sizeof(procs[0]))

static const char *proc_names[NPROCS + 1];
static pthread_once_t names_once = PTHREAD_ONCE_INIT;

static void build_names(void)
{
    size_t n = 0;
    for (size_t i = 0; i < NPROCS; i++) {
        bool dup = false;
        for (size_t j = 0; j < n && !dup; j++)
            dup = strcmp(proc_names[j], procs[i].name) == 0;
        if (!dup)
            proc_names[n++] = procs[i].name;
    }
    proc_names[n] = NULL;
}

FK_EXPORT const char *const *fakecuda_proc_names(void)
{
    pthread_once(&names_once, build_names);
    return proc_names;
}

static CUresult resolve(const char *symbol, void **pfn, int version, cuuint64_t flags,
                        CUdriverProcAddressQueryResult *status)
{
    if (!symbol || !pfn ||
        (flags & ~(cuuint64_t)(CU_GET_PROC_ADDRESS_LEGACY_STREAM |
                               CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)))
        return CUDA_ERROR_INVALID_VALUE;
    /* Asking for a newer CUDA than the driver is an error that leaves the
     * out-parameters alone (measured on driver 580). */
    if (version > FK_DRIVER_VERSION)
        return CUDA_ERROR_INVALID_VALUE;
    const struct proc *best = NULL;
    bool known = false;
    for (size_t i = 0; i < NPROCS; i++) {
        if (strcmp(procs[i].name, symbol) != 0)
            continue;
        known = true;
        if (procs[i].version <= version && (!best || procs[i].version > best->version))
            best = &procs[i];
    }
    if (!best) {
        *pfn = NULL;
        if (status)
            *status = known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                            : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        /* Driver 580 (CUDA 13.0) returns CUDA_SUCCESS here, as its
         * documentation says; callers must test *pfn. The default keeps
         * CUDA_ERROR_NOT_FOUND until the tests written against it move. */
        return fk_proc_missing_success ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
    }
    bool per_thread = flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
    *pfn = per_thread && best->pt ? best->pt : best->def;
    if (status)
        *status = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                       cuuint64_t flags, CUdriverProcAddressQueryResult *symbolStatus)
{
    FK_ENTER(cuGetProcAddress_v2);
    return resolve(symbol, pfn, cudaVersion, flags, symbolStatus);
}

FK_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                    cuuint64_t flags)
{
    FK_ENTER(cuGetProcAddress);
    return resolve(symbol, pfn, cudaVersion, flags, NULL);
}
