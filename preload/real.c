/* preload/real.c: the table of real functions.
 *
 * - libc's dlsym/dlvsym. We export dlsym and dlvsym ourselves, and inside
 *   this library a call to dlsym binds to our own export; a versioned
 *   reference (dlsym@GLIBC_2.34) would bind to it too, because our anonymous
 *   version node matches any version. So the real ones are found by reading
 *   libc's dynamic symbol table directly (link map -> l_ld -> DT_GNU_HASH/
 *   DT_SYMTAB/DT_STRTAB/DT_VERSYM), once. That needs no dlsym at all and
 *   cannot find our own definition.
 * - The driver: the library named by WOFFLOAD_CUDA_LIB, dlopen()ed on first
 *   use, every function resolved from that handle with the real dlsym.
 * - The runtime: the next definition after ours (RTLD_NEXT from inside this
 *   library is relative to us, which is what we want here), else an already
 *   loaded libcudart (a runtime loaded RTLD_LOCAL is not in the global scope).
 */
#include <dlfcn.h>
#include <stdio.h>
#include <elf.h>
#include <link.h>
#include <pthread.h>
#include <string.h>

#include "core/log.h"
#include "core/settings.h"
#include "preload/hook.h"

#define WO_HOOK_NAME(sym, pt, hook, RET, PARAMS, ARGS) #sym,
#define WO_HOOK_PT(sym, pt, hook, RET, PARAMS, ARGS) pt,
const char *const wo_hook_names[WO_NHOOKS] = {WO_DRIVER_HOOKS(WO_HOOK_NAME)};
const char *const wo_rt_names[WO_NRT] = {WO_RUNTIME_HOOKS(WO_HOOK_NAME)};
const unsigned char wo_hook_pt[WO_NHOOKS] = {WO_DRIVER_HOOKS(WO_HOOK_PT)};
const unsigned char wo_rt_pt[WO_NRT] = {WO_RUNTIME_HOOKS(WO_HOOK_PT)};
#undef WO_HOOK_NAME
#undef WO_HOOK_PT
uint64_t wo_hook_calls[WO_NHOOKS + WO_NRT];

typedef void *(*dlsym_fn)(void *, const char *);
typedef void *(*dlvsym_fn)(void *, const char *, const char *);

/* --- libc's dlsym/dlvsym ------------------------------------------------- */

/* Found by walking the loaded objects' link maps (_r_debug) and reading
 * libc's dynamic symbol table directly: no dlsym, no dl_iterate_phdr, no
 * locks, no allocation, no libc string functions. That matters because a
 * sanitizer runtime preloaded before us asks dlsym(RTLD_NEXT) for its
 * interceptors while it initialises, before its shadow memory exists: this
 * code must then run uninstrumented and call nothing the sanitizer
 * intercepts. Two threads racing here compute the same values: benign. */
void *wo_libc_dlsym_ptr;
void *wo_libc_dlvsym_ptr;

WO_RAW static bool raw_streq(const char *a, const char *b)
{
    for (; *a && *a == *b; a++, b++)
        ;
    return *a == *b;
}

WO_RAW static bool raw_contains(const char *s, const char *part)
{
    for (; *s; s++) {
        const char *x = s, *y = part;
        for (; *y && *x == *y; x++, y++)
            ;
        if (!*y)
            return true;
    }
    return false;
}

WO_RAW static uint32_t gnu_hash(const char *s)
{
    uint32_t h = 5381;
    for (; *s; s++)
        h = h * 33 + (unsigned char)*s;
    return h;
}

struct elf_obj {
    ElfW(Addr) base;
    const ElfW(Sym) *symtab;
    const char *strtab;
    const uint32_t *gnu_hash;
    const ElfW(Half) *versym;
};

/* Dynamic entries hold absolute addresses once ld.so relocated them, but
 * not on every architecture (or for the vDSO): accept both. */
WO_RAW static const void *dyn_ptr(ElfW(Addr) base, ElfW(Addr) p)
{
    return (const void *)(p < base ? base + p : p);
}

WO_RAW static int elf_obj_init(const struct link_map *l, struct elf_obj *o)
{
    const ElfW(Dyn) *dyn = l->l_ld;

    o->base = l->l_addr;
    o->symtab = NULL;
    o->strtab = NULL;
    o->gnu_hash = NULL;
    o->versym = NULL;
    if (!dyn)
        return -ENOENT;
    for (; dyn->d_tag != DT_NULL; dyn++) {
        if (dyn->d_tag == DT_SYMTAB)
            o->symtab = dyn_ptr(o->base, dyn->d_un.d_ptr);
        else if (dyn->d_tag == DT_STRTAB)
            o->strtab = dyn_ptr(o->base, dyn->d_un.d_ptr);
        else if (dyn->d_tag == DT_GNU_HASH)
            o->gnu_hash = dyn_ptr(o->base, dyn->d_un.d_ptr);
        else if (dyn->d_tag == DT_VERSYM)
            o->versym = dyn_ptr(o->base, dyn->d_un.d_ptr);
    }
    return o->symtab && o->strtab && o->gnu_hash ? 0 : -ENOENT;
}

/* The default-version definition of a function in exactly this object. */
WO_RAW static void *elf_lookup(const struct elf_obj *o, const char *name)
{
    const uint32_t *h = o->gnu_hash;
    uint32_t nbuckets = h[0], symoffset = h[1], bloom_size = h[2];
    const uint32_t *buckets = (const uint32_t *)((const ElfW(Addr) *)(h + 4) + bloom_size);
    const uint32_t *chain = buckets + nbuckets;
    uint32_t hash = gnu_hash(name);
    uint32_t i;

    if (nbuckets == 0)
        return NULL;
    i = buckets[hash % nbuckets];
    if (i < symoffset)
        return NULL;
    for (;; i++) {
        uint32_t ch = chain[i - symoffset];
        const ElfW(Sym) *s = &o->symtab[i];
        if ((ch | 1) == (hash | 1) && raw_streq(o->strtab + s->st_name, name) &&
            s->st_shndx != SHN_UNDEF && ELF64_ST_TYPE(s->st_info) == STT_FUNC &&
            (!o->versym || !(o->versym[i] & 0x8000)))
            return (void *)(o->base + s->st_value);
        if (ch & 1)
            return NULL;
    }
}

WO_RAW void wo_libc_dl_init(void)
{
    void *ds = NULL, *dvs = NULL;

    if (__atomic_load_n(&wo_libc_dlsym_ptr, __ATOMIC_ACQUIRE))
        return;
    /* dlsym lives in libc since glibc 2.34, in libdl before. */
    for (const struct link_map *l = _r_debug.r_map; l && !(ds && dvs); l = l->l_next) {
        struct elf_obj o;
        if (!l->l_name || !(raw_contains(l->l_name, "libc.so") || raw_contains(l->l_name, "libdl.so")))
            continue;
        if (elf_obj_init(l, &o) < 0)
            continue;
        if (!ds)
            ds = elf_lookup(&o, "dlsym");
        if (!dvs)
            dvs = elf_lookup(&o, "dlvsym");
    }
    __atomic_store_n(&wo_libc_dlvsym_ptr, dvs, __ATOMIC_RELEASE);
    __atomic_store_n(&wo_libc_dlsym_ptr, ds, __ATOMIC_RELEASE);
}

WO_RAW void *wo_real_dlsym(void *handle, const char *name)
{
    dlsym_fn f = (dlsym_fn)__atomic_load_n(&wo_libc_dlsym_ptr, __ATOMIC_ACQUIRE);
    if (WO_UNLIKELY(!f)) {
        wo_libc_dl_init();
        f = (dlsym_fn)__atomic_load_n(&wo_libc_dlsym_ptr, __ATOMIC_ACQUIRE);
    }
    return f ? f(handle, name) : NULL;
}

WO_RAW void *wo_real_dlvsym(void *handle, const char *name, const char *version)
{
    dlvsym_fn f = (dlvsym_fn)__atomic_load_n(&wo_libc_dlvsym_ptr, __ATOMIC_ACQUIRE);
    if (WO_UNLIKELY(!f)) {
        wo_libc_dl_init();
        f = (dlvsym_fn)__atomic_load_n(&wo_libc_dlvsym_ptr, __ATOMIC_ACQUIRE);
    }
    return f ? f(handle, name, version) : NULL;
}

/* --- the driver ----------------------------------------------------------- */

static pthread_once_t driver_once = PTHREAD_ONCE_INIT;
static struct wo_real real;
static int driver_loaded;
static __thread int driver_loading;

static void driver_init(void)
{
    const char *lib = wo_settings()->cuda_lib;

    driver_loading = 1;
    if (!lib)
        lib = "libcuda.so.1";
    real.lib = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!real.lib) {
        /* The engine may still reach a driver it loaded itself (linked
         * against it, or dlopen()ed it before this): our exports it binds
         * to must then forward to that one, not fail. */
        char why[256];
        const char *e = dlerror();

        /* copied: the next dlopen frees dlerror()'s string */
        snprintf(why, sizeof(why), "%s", e ? e : "?");
        real.lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
        if (strcmp(lib, "libcuda.so.1") != 0)
            wo_warn("cannot load the CUDA driver %s (%s): %s", lib, why,
                    real.lib ? "forwarding to the libcuda.so.1 this process already loaded"
                             : "no driver: CUDA calls through the shim fail as they would without one");
        else
            wo_debug("dlopen(%s) failed: %s", lib, why);
        if (!real.lib)
            goto out;
    }
    for (int i = 0; i < WO_NHOOKS; i++)
        real.hook[i] = wo_real_dlsym(real.lib, wo_hook_names[i]);
#define WO_REAL_RESOLVE(name) real.name = wo_real_dlsym(real.lib, #name);
    WO_DRIVER_INTERNAL(WO_REAL_RESOLVE)
#undef WO_REAL_RESOLVE
out:
    __atomic_store_n(&driver_loaded, 1, __ATOMIC_RELEASE);
    driver_loading = 0;
}

const struct wo_real *wo_real_driver(void)
{
    if (WO_LIKELY(__atomic_load_n(&driver_loaded, __ATOMIC_ACQUIRE)))
        return &real;
    if (driver_loading)
        return NULL;
    pthread_once(&driver_once, driver_init);
    return &real;
}

const struct wo_real *wo_real_driver_peek(void)
{
    return __atomic_load_n(&driver_loaded, __ATOMIC_ACQUIRE) ? &real : NULL;
}

/* --- the runtime ---------------------------------------------------------- */

static void *rt_real[WO_NRT];

static void *runtime_lookup(const char *name)
{
    static const char *const libs[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so"};
    void *p = wo_real_dlsym(RTLD_NEXT, name);

    for (size_t i = 0; !p && i < WO_ARRAY_SIZE(libs); i++) {
        void *h = dlopen(libs[i], RTLD_LAZY | RTLD_NOLOAD);
        if (!h)
            continue;
        p = wo_real_dlsym(h, name);
        dlclose(h);
    }
    return p;
}

void *wo_real_runtime(enum wo_rt_id id)
{
    void *p = __atomic_load_n(&rt_real[id], __ATOMIC_ACQUIRE);

    /* Two threads may resolve the same name at once: both find the same
     * address, so the race is benign. */
    if (WO_UNLIKELY(!p)) {
        p = runtime_lookup(wo_rt_names[id]);
        if (p)
            __atomic_store_n(&rt_real[id], p, __ATOMIC_RELEASE);
    }
    return p;
}

void *wo_real_runtime_sym(const char *name)
{
    return runtime_lookup(name);
}
