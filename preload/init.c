/* preload/init.c: the shim's life cycle: a constructor that does nothing,
 * lazy init on the first relevant hook call (settings, the driver table,
 * uvm/), the fork child reset and exit.
 *
 * Why lazy: a preloaded library's constructor runs before the host's own
 * start-up; doing real work there (dlopen, threads) deadlocked hosts in
 * other interposers, and a process that never uses CUDA (python -c pass,
 * /bin/true) must not pay for us at all. */
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/log.h"
#include "core/nvml.h"
#include "core/settings.h"
#include "preload/hook.h"
#include "wo-config.h"

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
/* Set while this thread runs init: hooks reached from inside init (the
 * driver's constructors, uvm/ start-up) pass straight through. */
static __thread int in_init;
static struct wo_driver driver;

/* uvm/ gets the real functions, never our hooks: its own calls must not be
 * routed or recorded again. By name: a hooked function's real pointer, else
 * one of the functions only the shim itself calls. */
static void *real_by_name(void *ud, const char *name)
{
    const struct wo_real *r = ud;

    for (int i = 0; i < WO_NHOOKS; i++)
        if (strcmp(wo_hook_names[i], name) == 0)
            return r->hook[i];
#define WO_BY_NAME(n)                                                                              \
    if (strcmp(name, #n) == 0)                                                                     \
        return r->n;
    WO_DRIVER_INTERNAL(WO_BY_NAME)
#undef WO_BY_NAME
    return NULL;
}

static void fill_driver(const struct wo_real *r)
{
    wo_driver_fill(&driver, real_by_name, (void *)r);
}

static void atfork_child(void)
{
    /* The child starts with the forking thread alone. The parts of preload/
     * that cache the parent's handles (streams, graphs, functions: capture.c,
     * graph-replay.c, launch.c) forget them in fork handlers of their own,
     * registered by their constructors, so run before this one. */
    wo_depth = 0;
    wo_uvm_atfork_child();
}

static void at_exit(void)
{
    /* From here on every hook passes straight through: destructors of the
     * engine and the runtime still free memory, and uvm/ is going away. */
    __atomic_store_n(&wo_preload_state, WO_STATE_OFF, __ATOMIC_RELEASE);
    wo_uvm_shutdown();
}

static void init_once_fn(void)
{
    const struct wo_settings *s;
    const struct wo_real *r;
    int state = WO_STATE_OFF;

    in_init = 1;
    s = wo_settings();
    if (s->disable) {
        wo_info("WOFFLOAD_DISABLE is set: every call passes straight through");
        goto out;
    }
    r = wo_real_driver();
    if (!r || !r->lib) {
        wo_warn("the CUDA driver library (%s) could not be loaded: every call passes straight through",
                s->cuda_lib ? s->cuda_lib : "libcuda.so.1");
        goto out;
    }
    fill_driver(r);
    wo_uvm_set_driver(&driver);
    /* NVML (fit's contexts, core/nvml.h) resolves through libc's dlsym,
     * never through the shim's own export */
    wo_nvml_set_dlsym(wo_real_dlsym);
    wo_nvml_check_setting();
    if (wo_uvm_init() < 0)
        wo_warn("placement is off (see above); calls are still observed");
    pthread_atfork(wo_uvm_atfork_prepare, wo_uvm_atfork_parent, atfork_child);
    atexit(at_exit);
    state = WO_STATE_ACTIVE;
out:
    __atomic_store_n(&wo_preload_state, state, __ATOMIC_RELEASE);
    in_init = 0;
}

int wo_preload_init_slow(void)
{
    if (in_init)
        return WO_STATE_UNINIT;
    pthread_once(&init_once, init_once_fn);
    return __atomic_load_n(&wo_preload_state, __ATOMIC_ACQUIRE);
}

/* Whether the file search the dynamic loader makes for a bare name finds
 * it (LD_LIBRARY_PATH, its cache, the default directories); *where gets
 * the directory, or "the loader's cache". Reads files, loads nothing. */
static bool driver_findable(const char *name, char *where, size_t len)
{
    static const char *const dirs[] = {"/lib/x86_64-linux-gnu",
                                       "/usr/lib/x86_64-linux-gnu",
                                       "/lib64",
                                       "/usr/lib64",
                                       "/lib",
                                       "/usr/lib"};
    const char *lp = getenv("LD_LIBRARY_PATH");
    char path[4096];
    struct stat st;
    bool found = false;
    int fd;

    if (strchr(name, '/')) {
        snprintf(where, len, "%s", name);
        return access(name, R_OK) == 0;
    }
    for (const char *p = lp; p && *p;) {
        size_t n = strcspn(p, ":");
        snprintf(path, sizeof(path), "%.*s/%s", (int)n, p, name);
        if (n && access(path, R_OK) == 0) {
            snprintf(where, len, "%.*s", (int)n, p);
            return true;
        }
        p += n + (p[n] == ':');
    }
    fd = open("/etc/ld.so.cache", O_RDONLY | O_CLOEXEC);
    if (fd >= 0 && fstat(fd, &st) == 0 && st.st_size > 0) {
        void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m != MAP_FAILED) {
            /* the cache stores each name with its terminating NUL */
            found = memmem(m, (size_t)st.st_size, name, strlen(name) + 1) != NULL;
            munmap(m, (size_t)st.st_size);
        }
    }
    if (fd >= 0)
        close(fd);
    if (found) {
        snprintf(where, len, "the loader's cache");
        return true;
    }
    for (size_t i = 0; i < WO_ARRAY_SIZE(dirs); i++) {
        snprintf(path, sizeof(path), "%s/%s", dirs[i], name);
        if (access(path, R_OK) == 0) {
            snprintf(where, len, "%s", dirs[i]);
            return true;
        }
    }
    return false;
}

/* At WOFFLOAD_LOG=info or above, one line says the shim is loaded: its
 * version, the policy, and whether the driver library can be found. From
 * the environment as it is now, not through wo_settings(): the settings are
 * read once, at the first CUDA call (a program may set WOFFLOAD_* before
 * that); the driver is searched for, not loaded (see the top). A bad
 * WOFFLOAD_LOG says nothing here: the settings name it at the first call. */
static void start_line(void)
{
    const char *lv = getenv("WOFFLOAD_LOG"), *pol = getenv("WOFFLOAD_POLICY");
    const char *lib = getenv("WOFFLOAD_CUDA_LIB"), *file = getenv("WOFFLOAD_LOG_FILE");
    const char *off = getenv("WOFFLOAD_DISABLE");
    char line[1024], where[512];
    int n, fd = 2;
    bool found;

    if (!lv || wo_log_level_from_string(lv) < WO_LOG_INFO)
        return;
    if (!lib || !*lib)
        lib = "libcuda.so.1";
    found = driver_findable(lib, where, sizeof(where));
    n = snprintf(
        line, sizeof(line),
        "woffload: info: libwoffload %s loaded (pid %d); policy: %s; CUDA driver %s: %s%s%s\n",
        WO_VERSION, (int)getpid(), pol && *pol ? pol : "none (every allocation passes through)",
        lib, found ? "found in " : "not found (every call would pass straight through)",
        found ? where : "",
        off && (!strcmp(off, "1") || !strcasecmp(off, "yes") || !strcasecmp(off, "true") ||
                !strcasecmp(off, "on"))
            ? "; WOFFLOAD_DISABLE is set: every call passes straight through"
            : "");
    if (n <= 0)
        return;
    if ((size_t)n >= sizeof(line))
        n = (int)sizeof(line) - 1;
    if (file && *file)
        fd = open(file, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        fd = 2;
    if (write(fd, line, (size_t)n) < 0) {
        /* nowhere left to say it */
    }
    if (fd != 2)
        close(fd);
}

/* With the copy engine asked for (WOFFLOAD_PICKS_ENGINE set, not 0) and
 * WOFFLOAD_PICKS_LAZY=0, CUDA's eager module loading, unless
 * CUDA_MODULE_LOADING says otherwise: the driver reads it at cuInit, after
 * this (and PyTorch keeps a value it finds). A kernel loaded lazily while
 * an engine stream waits for the copy thread hangs the GPU; by default
 * (WOFFLOAD_PICKS_LAZY=1) each kernel's first launch goes behind the copy
 * engine's gate instead (uvm.h: wo_uvm_lazy_gate), and eager loading's
 * start-up time and device memory for every kernel of the libraries
 * loaded (1 GiB and 4 s for PyTorch) are not spent (docs/placement.md). */
static void module_loading(void)
{
    const char *pe = getenv("WOFFLOAD_PICKS_ENGINE");
    const char *lazy = getenv("WOFFLOAD_PICKS_LAZY");
    bool on = true;

    /* WOFFLOAD_PICKS_LAZY unset or on: no eager loading (a bad value is
     * said where the settings are read, which then keep the default, on) */
    if (!lazy || wo_setting_bool(lazy, &on) != 0 || on)
        return;
    if (pe && *pe && strcmp(pe, "0") != 0 && !getenv("CUDA_MODULE_LOADING"))
        (void)setenv("CUDA_MODULE_LOADING", "EAGER", 0);
}

/* The per-hook call counters are registered before main() so the stats name
 * them even when no hook ran; the module loading the copy engine needs; and
 * the start line. Nothing else happens here on purpose. */
__attribute__((constructor)) static void preload_ctor(void)
{
    static const char *names[WO_NHOOKS + WO_NRT];
    for (int i = 0; i < WO_NHOOKS; i++)
        names[i] = wo_hook_names[i];
    for (int i = 0; i < WO_NRT; i++)
        names[WO_NHOOKS + i] = wo_rt_names[i];
    wo_counters_register_calls(names, wo_hook_calls, WO_NHOOKS + WO_NRT);
    module_loading();
    start_line();
}
