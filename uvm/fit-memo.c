/* uvm/fit-memo.c: `fit: {reserve: auto}`: the engine's high water after
 * seal, kept from one run to the next.
 *
 * fit keeps a reserve of its budget for what the engine allocates after
 * seal (activations, workspaces). How much that is depends on the engine
 * and the batch, not on anything the shim sees before seal: transformers'
 * default experts backend gathers 3 GiB at b32 on a 128-expert model, 84
 * MiB at b1. When the reserve is too small the weights yield at run time,
 * and managed weights that yield leave their pages in UVM's cache: the
 * process passes the fit size (bench/results/bigload-20261202-0626-moe128-h200:
 * 1.12x). So `auto` takes the high water of the runs before, written at
 * exit into a small file, one per command line and working directory (or
 * WOFFLOAD_FIT_MEMO), rounded up to 32 MiB; the default reserve until a run
 * has ended. The file keeps the largest high water seen: a larger batch
 * once is a larger batch again; deleting the file forgets it. A file that
 * cannot be read or written costs the reserve, never the run.
 *
 * Beside it the file keeps what the device's free memory fell by after
 * seal beyond every allocation the shim saw (optional line 3,
 * untracked_bytes): the CUDA context's own growth, kernels loaded on first
 * use and local memory, which no allocation shows. On the H200 a run that
 * reserved its whole high water still peaked 0.49 GiB over the fit size
 * (bench/results/bigload-20261202-1236-moe128-f05-h200, fit-auto2). The
 * reserve is the two together. */
#include "uvm/internal.h"
#include "uvm/place-int.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/log.h"
#include "core/settings.h"

#define MEMO_HEAD "woffload fit memo 1"

static struct {
    bool read;      /* looked for once */
    bool have;      /* an earlier run's high water */
    uint64_t peak;
    uint64_t untracked; /* the context's growth after seal beyond the allocations */
    char path[PATH_MAX];
} memo;

static uint64_t fnv(uint64_t h, const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= UINT64_C(1099511628211);
    }
    return h;
}

/* WOFFLOAD_FIT_MEMO, or the cache folder's file for this command line and
 * working directory; "" when neither can be said. */
static void find_path(void)
{
    const char *set = wo_settings()->fit_memo, *xdg = getenv("XDG_CACHE_HOME"),
               *home = getenv("HOME");
    unsigned char buf[8192];
    char cwd[PATH_MAX];
    uint64_t h = UINT64_C(14695981039346656037);
    FILE *f;
    size_t n;

    if (set) {
        snprintf(memo.path, sizeof(memo.path), "%s", set);
        return;
    }
    f = fopen("/proc/self/cmdline", "rb");
    if (!f)
        return;
    while ((n = fread(buf, 1, sizeof(buf), f)) > 0)
        h = fnv(h, buf, n);
    fclose(f);
    if (getcwd(cwd, sizeof(cwd)))
        h = fnv(h, (const unsigned char *)cwd, strlen(cwd));
    if (xdg && *xdg == '/')
        snprintf(memo.path, sizeof(memo.path), "%s/woffload/fit-%016llx", xdg,
                 (unsigned long long)h);
    else if (home && *home == '/')
        snprintf(memo.path, sizeof(memo.path), "%s/.cache/woffload/fit-%016llx", home,
                 (unsigned long long)h);
}

static void load(void)
{
    char line[128];
    unsigned long long v;
    FILE *f;

    memo.read = true;
    find_path();
    if (!memo.path[0] || !(f = fopen(memo.path, "r"))) {
        if (memo.path[0] && errno != ENOENT)
            wo_warn("fit: reserve auto: cannot read %s: %s; the default reserve for this run",
                    memo.path, strerror(errno));
        return;
    }
    if (!fgets(line, sizeof(line), f) || strncmp(line, MEMO_HEAD "\n", strlen(MEMO_HEAD) + 1) != 0)
        wo_warn("fit: reserve auto: %s:1: expected '" MEMO_HEAD "'; the file is ignored (the "
                "default reserve for this run; the next exit writes it again)",
                memo.path);
    else if (!fgets(line, sizeof(line), f) || sscanf(line, "engine_peak_bytes %llu", &v) != 1)
        wo_warn("fit: reserve auto: %s:2: expected 'engine_peak_bytes N' (N bytes); the file is "
                "ignored (the default reserve for this run; the next exit writes it again)",
                memo.path);
    else {
        memo.have = true;
        memo.peak = v;
        /* line 3 is optional (files of the first version have none) */
        if (fgets(line, sizeof(line), f)) {
            if (sscanf(line, "untracked_bytes %llu", &v) == 1)
                memo.untracked = v;
            else
                wo_warn("fit: reserve auto: %s:3: expected 'untracked_bytes N' (N bytes); the "
                        "line is ignored",
                        memo.path);
        }
    }
    fclose(f);
}

uint64_t wo_fit_reserve_for(uint64_t peak)
{
    const uint64_t round = 32ull << 20;

    return (peak + round - 1) & ~(round - 1);
}

uint64_t wo_fit_memo_reserve(void)
{
    char b[32];

    if (!memo.read) {
        load();
        if (memo.have) {
            char u[32], why[96] = "";
            if (memo.untracked)
                snprintf(why, sizeof(why), ", with %s the CUDA context grew by beyond the "
                                           "allocations",
                         wo_format_size(memo.untracked, u, sizeof(u)));
            wo_info("fit: reserve auto: %s, the engine's high water after seal in the runs "
                    "before%s (%s)",
                    wo_format_size(wo_fit_reserve_for(memo.peak + memo.untracked), b, sizeof(b)),
                    why, memo.path);
        }
        else
            wo_info("fit: reserve auto: no run before%s%s: the default reserve",
                    memo.path[0] ? " in " : "", memo.path);
    }
    return memo.have ? wo_fit_reserve_for(memo.peak + memo.untracked) : WO_FIT_RESERVE_DEFAULT;
}

bool wo_fit_memo_have(void)
{
    return memo.have;
}

/* mkdir -p of path's folder (0700: a cache of one user's runs) */
static int make_dirs(char *path)
{
    for (char *p = path + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        int r = mkdir(path, 0700);
        *p = '/';
        if (r < 0 && errno != EEXIST)
            return -errno;
    }
    return 0;
}

const char *wo_fit_memo_save(uint64_t peak, uint64_t untracked)
{
    char tmp[PATH_MAX + 16], dir[PATH_MAX];
    FILE *f;
    int r;

    if (!memo.read)
        load();
    /* a run that allocated nothing after seal (loaded and left) says
     * nothing of the next one's needs */
    if (!memo.path[0] || (!peak && !untracked && !memo.have))
        return NULL;
    if (memo.have && memo.peak >= peak && memo.untracked >= untracked)
        return memo.path; /* the largest high water stays */
    if (memo.have) {
        peak = peak > memo.peak ? peak : memo.peak;
        untracked = untracked > memo.untracked ? untracked : memo.untracked;
    }
    snprintf(dir, sizeof(dir), "%s", memo.path);
    snprintf(tmp, sizeof(tmp), "%s.%ld", memo.path, (long)getpid());
    if ((r = make_dirs(dir)) < 0 || !(f = fopen(tmp, "w"))) {
        wo_warn("fit: reserve auto: cannot write %s: %s; the next run starts from what it "
                "held before",
                memo.path, strerror(r < 0 ? -r : errno));
        return NULL;
    }
    fprintf(f, MEMO_HEAD "\nengine_peak_bytes %llu\n", (unsigned long long)peak);
    if (untracked)
        fprintf(f, "untracked_bytes %llu\n", (unsigned long long)untracked);
    if (fclose(f) != 0 || rename(tmp, memo.path) != 0) {
        wo_warn("fit: reserve auto: cannot write %s: %s", memo.path, strerror(errno));
        (void)unlink(tmp);
        return NULL;
    }
    memo.have = true;
    memo.peak = peak;
    memo.untracked = untracked;
    return memo.path;
}

struct wo_fit wo_fit_memo_resolve(const struct wo_fit *fit)
{
    struct wo_fit eff = *fit;

    if (eff.reserve == WO_FIT_RESERVE_AUTO)
        eff.reserve = wo_fit_memo_reserve();
    return eff;
}
