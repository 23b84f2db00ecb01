/* tools/doctor.c: `woffload doctor`: what this machine offers the shim,
 * read from the machine itself every time (driver, GPUs, versions, memory
 * limits, the policy that would load). Nothing here is canned: a line either
 * reports what a call returned or says which call failed. */
#include "tools/doctor.h"

#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cuda.h>
#include <cudaTypedefs.h>

#include "core/meminfo.h"
#include "core/nvml.h"
#include "core/settings.h"
#include "policy/policy.h"
#include "uvm/stream-pin.h"
#include "wo-config.h"

static void human(uint64_t b, char *buf, size_t len)
{
    static const char *const u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)b;
    size_t i = 0;
    while (v >= 1024.0 && i + 1 < WO_ARRAY_SIZE(u)) {
        v /= 1024.0;
        i++;
    }
    snprintf(buf, len, i ? "%.1f %s" : "%.0f %s", v, u[i]);
}

static int read_first_line(const char *path, char *buf, size_t len)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return -errno;
    if (!fgets(buf, (int)len, f)) {
        fclose(f);
        return -EIO;
    }
    fclose(f);
    buf[strcspn(buf, "\n")] = '\0';
    return 0;
}

/* The toolkit's version as its cuda.h says, read now (not at build time). */
static int toolkit_version(const char *root, int *ret)
{
    char path[1024], line[512];
    FILE *f;
    snprintf(path, sizeof(path), "%s/include/cuda.h", root);
    f = fopen(path, "re");
    if (!f)
        return -errno;
    while (fgets(line, sizeof(line), f)) {
        int v;
        if (sscanf(line, "#define CUDA_VERSION %d", &v) == 1) {
            *ret = v;
            fclose(f);
            return 0;
        }
    }
    fclose(f);
    return -ENOENT;
}

static void report_driver(FILE *out, const char *lib)
{
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    PFN_cuInit_v2000 init;
    PFN_cuDriverGetVersion_v2020 getver;
    PFN_cuDeviceGetCount_v2000 count;
    PFN_cuDeviceGet_v2000 devget;
    PFN_cuDeviceGetName_v2000 name;
    PFN_cuDeviceTotalMem_v3020 total;
    PFN_cuDeviceGetAttribute_v2000 attr;
    PFN_cuGetErrorName_v6000 errname;
    int ver = 0, n = 0;
    CUresult r;

    if (!h) {
        fprintf(out, "driver:       not found (dlopen %s: %s)\n", lib, dlerror());
        fprintf(out, "GPU:          none usable: no CUDA driver on this machine; the shim loads and passes everything through\n");
        return;
    }
    {
        Dl_info info;
        void *sym = dlsym(h, "cuInit");
        if (sym && dladdr(sym, &info) && info.dli_fname)
            fprintf(out, "driver:       %s\n", info.dli_fname);
    }
    init = (PFN_cuInit_v2000)dlsym(h, "cuInit");
    getver = (PFN_cuDriverGetVersion_v2020)dlsym(h, "cuDriverGetVersion");
    count = (PFN_cuDeviceGetCount_v2000)dlsym(h, "cuDeviceGetCount");
    devget = (PFN_cuDeviceGet_v2000)dlsym(h, "cuDeviceGet");
    name = (PFN_cuDeviceGetName_v2000)dlsym(h, "cuDeviceGetName");
    total = (PFN_cuDeviceTotalMem_v3020)dlsym(h, "cuDeviceTotalMem_v2");
    attr = (PFN_cuDeviceGetAttribute_v2000)dlsym(h, "cuDeviceGetAttribute");
    errname = (PFN_cuGetErrorName_v6000)dlsym(h, "cuGetErrorName");
    if (!init || !getver || !count) {
        fprintf(out, "driver:       %s lacks cuInit/cuDriverGetVersion/cuDeviceGetCount\n", lib);
        return;
    }
    if (getver(&ver) == CUDA_SUCCESS)
        fprintf(out, "driver CUDA:  %d.%d (cuDriverGetVersion %d)\n", ver / 1000, (ver % 1000) / 10, ver);
    r = init(0);
    if (r != CUDA_SUCCESS) {
        const char *e = "?";
        if (errname)
            errname(r, &e);
        fprintf(out, "GPU:          none usable: cuInit failed with %s (%d)\n", e, (int)r);
        return;
    }
    if (count(&n) != CUDA_SUCCESS || n == 0) {
        fprintf(out, "GPU:          none: the driver reports 0 devices\n");
        return;
    }
    for (int i = 0; i < n; i++) {
        CUdevice d;
        char nm[256] = "?", tb[32] = "?";
        size_t bytes = 0;
        int major = 0, minor = 0, managed = 0, pageable = 0, concurrent = 0;
        if (devget(&d, i) != CUDA_SUCCESS)
            continue;
        if (name)
            name(nm, (int)sizeof(nm), d);
        if (total && total(&bytes, d) == CUDA_SUCCESS)
            human(bytes, tb, sizeof(tb));
        if (attr) {
            attr(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, d);
            attr(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, d);
            attr(&managed, CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, d);
            attr(&concurrent, CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, d);
            attr(&pageable, CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS, d);
        }
        fprintf(out, "GPU %d:        %s, %s, compute %d.%d, managed memory %s, concurrent managed access %s, HMM %s\n",
                i, nm, tb, major, minor, managed ? "yes" : "no", concurrent ? "yes" : "no",
                pageable ? "yes" : "no");
        if (!concurrent)
            fprintf(out, "              (without concurrent managed access the `managed` placement cannot be prefetched ahead of use)\n");
    }
}

/* fit takes the process's CUDA contexts out of its size where NVML tells
 * them (core/nvml.h, docs/policy.md) */
static void report_nvml(FILE *out)
{
    const char *lib = NULL;
    char why[256];

    wo_nvml_set_dlsym(dlsym);
    if (wo_nvml_status(&lib, why, sizeof(why)) == 0)
        fprintf(out, "NVML:         %s: fit takes the process's CUDA contexts out of its size\n",
                lib);
    else
        fprintf(
            out,
            "NVML:         none usable (%s): fit cannot count the process's CUDA contexts, which "
            "it may then hold beyond the fit size (0.66 GiB under llama-server on an H100)\n",
            why);
}

static void report_memlock(FILE *out)
{
    struct rlimit rl = {RLIM_INFINITY, RLIM_INFINITY}; /* unknown: no limit said */
    char a[32], b[32], line[128];
    uint64_t mem = wo_meminfo_bytes("MemTotal");

    human(mem, a, sizeof(a));
    fprintf(out, "host memory:  %s total, ", a);
    human(wo_meminfo_bytes("MemAvailable"), a, sizeof(a));
    fprintf(out, "%s available\n", a);
    if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0) {
        if (rl.rlim_cur == RLIM_INFINITY)
            snprintf(a, sizeof(a), "unlimited");
        else
            human(rl.rlim_cur, a, sizeof(a));
        if (rl.rlim_max == RLIM_INFINITY)
            snprintf(b, sizeof(b), "unlimited");
        else
            human(rl.rlim_max, b, sizeof(b));
        fprintf(out, "memlock:      soft %s, hard %s: ", a, b);
        if (rl.rlim_cur == RLIM_INFINITY)
            fprintf(out, "pinned host placements are not limited by RLIMIT_MEMLOCK\n");
        else if (rl.rlim_cur < 64 * WO_MiB)
            fprintf(out, "too small for pinned weights: `host` placements with pin: true will fall back to managed "
                         "host memory (or stop, per the policy's pinning.fallback); raise it with `ulimit -l unlimited` "
                         "or the container's memlock setting\n");
        else
            fprintf(out, "pinned host placements beyond this many bytes fall back per the policy's pinning.fallback\n");
    }
    {
        /* prefetch.pinned_copies: auto keeps this much available (uvm/stream-pin.c) */
        human(wo_pin_auto_room(wo_meminfo_bytes("MemAvailable"), mem), a, sizeof(a));
        fprintf(out, "pinned copies: prefetch.pinned_copies: auto could hold up to %s now (what is "
                     "available above max(4 GiB, 10%% of RAM)), within the memlock limit%s\n",
                a, rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < 64 * WO_MiB ? " (too small: they would fail)" : "");
    }
    if (read_first_line("/sys/fs/cgroup/memory.max", line, sizeof(line)) == 0)
        fprintf(out, "cgroup:       memory.max %s%s\n", line,
                strcmp(line, "max") ? " (host placements count against it)" : "");
}

/* Returns whether the policy loads (true without one). */
static bool report_policy(FILE *out, const char *path)
{
    struct wo_diags diags = {0};
    struct wo_policy *p = NULL;
    const struct wo_policy_globals *g;
    char hb[32] = "unlimited";
    int r;

    if (!path) {
        fprintf(out, "policy:       none (WOFFLOAD_POLICY unset): every allocation passes through untouched\n");
        return true;
    }
    r = wo_policy_load_file(path, NULL, &p, &diags);
    for (size_t i = 0; i < diags.n; i++) {
        char line[1024];
        wo_diag_format(&diags.v[i], line, sizeof(line));
        fprintf(out, "              %s\n", line);
    }
    wo_diags_clear(&diags);
    if (r < 0) {
        fprintf(out, "policy:       %s does not load: %s (the shim would pass everything through)\n", path,
                strerror(-r));
        return false;
    }
    g = wo_policy_globals(p);
    if (g->host_budget.kind == WO_BUDGET_BYTES)
        wo_format_size(g->host_budget.bytes, hb, sizeof(hb));
    fprintf(out, "policy:       %s parses: %zu rules, default %s, host budget %s%s\n", path,
            wo_policy_nrules(p), wo_placement_to_string(g->default_place), hb,
            wo_policy_passthrough(p) ? " (places nothing off the device)" : "");
    wo_policy_free(p);
    return true;
}

bool wo_tool_in_build_tree(void)
{
    char self[PATH_MAX], root[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    size_t len;

    if (n <= 0 || !realpath(WO_BUILD_ROOT, root))
        return false;
    self[n] = '\0';
    len = strlen(root);
    return strncmp(self, root, len) == 0 && self[len] == '/';
}

static void report_shim(FILE *out)
{
    char lib[PATH_MAX];

    /* the build tree's library for the build tree's tool, the installed one
     * for an installed tool (even when the build tree is still there) */
    if (wo_tool_in_build_tree())
        snprintf(lib, sizeof(lib), "%s/preload/libwoffload.so", WO_BUILD_ROOT);
    else
        snprintf(lib, sizeof(lib), "%s/libwoffload.so", WO_LIBDIR);
    fprintf(out, "libwoffload:  %s %s\n", WO_VERSION, access(lib, R_OK) == 0 ? lib : "(library not found)");
}

int wo_doctor(FILE *out, const char *policy_path, bool env)
{
    const struct wo_settings *s = wo_settings();
    struct utsname u;
    int tk = 0;
    const char *root = getenv("CUDA_HOME");
    bool policy_ok;

    if (env) {
        wo_settings_print(out, s);
        return s->nerrors ? 2 : 0;
    }
    if (uname(&u) == 0)
        fprintf(out, "machine:      %s %s %s\n", u.nodename, u.sysname, u.release);
    report_shim(out);
    report_driver(out, s->cuda_lib);
    report_nvml(out);
    if (!root)
        root = WO_CUDA_PATH;
    if (toolkit_version(root, &tk) == 0)
        fprintf(out, "toolkit CUDA: %d.%d (%s/include/cuda.h); built against %d.%d\n", tk / 1000,
                (tk % 1000) / 10, root, CUDA_VERSION / 1000, (CUDA_VERSION % 1000) / 10);
    else
        fprintf(out, "toolkit CUDA: not found under %s; built against %d.%d\n", root,
                CUDA_VERSION / 1000, (CUDA_VERSION % 1000) / 10);
    report_memlock(out);
    policy_ok = report_policy(out, policy_path ? policy_path : s->policy);
    if (s->nerrors)
        fprintf(out, "settings:     %d WOFFLOAD_* variable(s) have bad values (messages above); see `woffload doctor --env`\n",
                s->nerrors);
    /* an input error: the policy or a setting the shim would not take */
    return policy_ok && !s->nerrors ? 0 : 2;
}
