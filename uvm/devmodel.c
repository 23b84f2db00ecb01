/* uvm/devmodel.c: the device model file (see devmodel.h): defaults,
 * parsing with located errors, writing, and the derived figures. */
#include "uvm/devmodel.h"

#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum kt { KT_GBS, KT_US, KT_BYTES, KT_NAME, KT_X };

struct key {
    const char *name;
    enum kt type;
    size_t off;
    const char *doc;
};

#define K(n, t, f, d) {n, t, offsetof(struct wo_devmodel, f), d}
static const struct key keys[] = {
    K("name", KT_NAME, name, "what was measured (machine, GPU, driver, date)"),
    K("device_bytes", KT_BYTES, device_bytes, "total device memory"),
    K("hbm_gbs", KT_GBS, hbm_gbs, "kernel streaming read of device memory"),
    K("zc_gbs", KT_GBS, zc_gbs, "kernel streaming read of pinned host memory over PCIe (zero-copy)"),
    K("h2d_gbs", KT_GBS, h2d_gbs, "pinned copy host to device, 1 GiB"),
    K("d2h_gbs", KT_GBS, d2h_gbs, "pinned copy device to host, 1 GiB"),
    K("prefetch_2m_gbs", KT_GBS, pf_gbs[0], "cuMemPrefetchAsync host to GPU in 2 MiB calls"),
    K("prefetch_16m_gbs", KT_GBS, pf_gbs[1], "... in 16 MiB calls"),
    K("prefetch_64m_gbs", KT_GBS, pf_gbs[2], "... in 64 MiB calls"),
    K("prefetch_1g_gbs", KT_GBS, pf_gbs[3], "... in 1 GiB calls"),
    K("prefetch_call_us", KT_US, pf_call_us, "CPU time inside one prefetch call"),
    K("readmostly_prefetch_gbs", KT_GBS, rm_pf_gbs, "prefetch of a read-mostly range (makes a duplicate), 1 GiB calls"),
    K("copyback_gbs", KT_GBS, copyback_gbs, "eviction by cuMemPrefetchAsync to the host"),
    K("collapse_gbs", KT_GBS, collapse_gbs, "eviction by UNSET_READ_MOSTLY in 64 MiB pieces (synchronous)"),
    K("remap_gbs", KT_GBS, remap_gbs,
      "SET_ACCESSED_BY on a collapsed piece, so that the GPU reads it in place again (bench/managed-read-cost.cu)"),
    K("advise_us", KT_US, advise_us, "one cuMemAdvise on a 2 MiB range"),
    K("launch_us", KT_US, launch_us, "CPU cost of one kernel launch"),
    K("kernel_us", KT_US, kernel_us, "smallest GPU time of a kernel"),
    K("sync_us", KT_US, sync_us, "host work between a sync returning and the next launch"),
    K("host_zc_slowdown", KT_X, host_zc_slow,
      "the host's own work (launches) while the GPU reads host memory in place (bench/pcie-interference.py)"),
    K("host_dma_slowdown", KT_X, host_dma_slow,
      "the same while a copy engine streams host memory to the GPU (prefetches)"),
};
#undef K

void wo_devmodel_default(struct wo_devmodel *m)
{
    memset(m, 0, sizeof(*m));
    snprintf(m->name, sizeof(m->name), "%s",
             "built-in: H100 80GB HBM3 PCIe Gen5, uvm/devmodel.c (2026-11-22)");
    m->device_bytes = UINT64_C(85029158912);
    m->hbm_gbs = 2500;
    m->zc_gbs = 50;
    m->h2d_gbs = 55;
    m->d2h_gbs = 55;
    m->pf_gbs[0] = 14;
    m->pf_gbs[1] = 33;
    m->pf_gbs[2] = 43;
    m->pf_gbs[3] = 47;
    m->pf_call_us = 90;
    m->rm_pf_gbs = 41.5;
    m->copyback_gbs = 9.6;
    m->collapse_gbs = 28;
    /* bench/results/managed-read-cost-20261122-h100.txt: unset + accessed-by
     * on 24 MiB took 1.68 ms, of which the collapse ~0.6-0.9 ms; accessed-by
     * on 1 GiB took 40 ms (device-facts.md): ~25 GB/s */
    m->remap_gbs = 25;
    m->advise_us = 9.6;
    m->launch_us = 3.9;
    m->kernel_us = 2.0;
    m->sync_us = 20;
    /* bench/results/pcie-interference-20261122-h100.txt: the launch path
     * while a kernel reads host memory in place: 1.53x and 1.14x (launches
     * alone, a 16-block reader in the background) and 1.18x (the engine's
     * pattern: 6 launches behind a 25 MB read); under a copy engine 1.07x,
     * 1.08x, 1.09x, 1.16x. The medians. */
    m->host_zc_slow = 1.18;
    m->host_dma_slow = 1.09;
}

static void errf(char *err, size_t len, const char *fmt, ...) WO_PRINTF(3, 4);
static void errf(char *err, size_t len, const char *fmt, ...)
{
    va_list ap;

    if (!err || !len)
        return;
    va_start(ap, fmt);
    vsnprintf(err, len, fmt, ap);
    va_end(ap);
}

static char *trim(char *s)
{
    char *e;

    while (*s == ' ' || *s == '\t')
        s++;
    e = s + strlen(s);
    while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r'))
        *--e = 0;
    return s;
}

int wo_devmodel_parse(const char *text, size_t len, const char *display, struct wo_devmodel *m,
                      char *err, size_t errlen)
{
    unsigned char seen[WO_ARRAY_SIZE(keys)] = {0};
    size_t i = 0;
    unsigned line = 0;
    char buf[512];

    if (!display)
        display = "<model>";
    while (i < len) {
        size_t j = i, n;
        char *s, *eq, *k, *v;
        size_t ki;

        while (j < len && text[j] != '\n')
            j++;
        line++;
        n = j - i;
        if (n >= sizeof(buf)) {
            errf(err, errlen, "%s:%u: line longer than %zu bytes", display, line, sizeof(buf) - 1);
            return -EINVAL;
        }
        memcpy(buf, text + i, n);
        buf[n] = 0;
        i = j + 1;
        if (memchr(buf, 0, n)) {
            errf(err, errlen, "%s:%u: NUL byte in a text file", display, line);
            return -EINVAL;
        }
        s = trim(buf);
        if (*s == 0 || *s == '#')
            continue;
        eq = strchr(s, '=');
        if (!eq) {
            errf(err, errlen, "%s:%u: expected `key = value`, got \"%s\"", display, line, s);
            return -EINVAL;
        }
        *eq = 0;
        k = trim(s);
        v = trim(eq + 1);
        for (ki = 0; ki < WO_ARRAY_SIZE(keys); ki++)
            if (strcmp(keys[ki].name, k) == 0)
                break;
        if (ki == WO_ARRAY_SIZE(keys)) {
            errf(err, errlen, "%s:%u: unknown key \"%s\" (keys: hbm_gbs, zc_gbs, prefetch_64m_gbs, ...; see docs/prefetch.md)",
                 display, line, k);
            return -EINVAL;
        }
        if (seen[ki]++) {
            errf(err, errlen, "%s:%u: \"%s\" given twice", display, line, k);
            return -EINVAL;
        }
        if (keys[ki].type == KT_NAME) {
            snprintf(m->name, sizeof(m->name), "%s", v);
            continue;
        }
        if (strchr(v, '#'))
            *strchr(v, '#') = 0;
        v = trim(v);
        {
            char *end;
            double d;

            errno = 0;
            d = strtod(v, &end);
            if (errno || end == v || *end || !isfinite(d) || d < 0 ||
                (keys[ki].type == KT_GBS && d == 0) || (keys[ki].type == KT_BYTES && d >= 1.8e19) ||
                (keys[ki].type == KT_X && (d < 1 || d > 100))) {
                errf(err, errlen, "%s:%u: %s wants a %s, got \"%s\"", display, line, k,
                     keys[ki].type == KT_GBS  ? "positive number"
                     : keys[ki].type == KT_X ? "factor from 1 to 100"
                                             : "non-negative number",
                     v);
                return -EINVAL;
            }
            if (keys[ki].type == KT_BYTES)
                *(uint64_t *)((char *)m + keys[ki].off) = (uint64_t)d;
            else
                *(double *)((char *)m + keys[ki].off) = d;
        }
    }
    return 0;
}

int wo_devmodel_load(const char *path, struct wo_devmodel *m, char *err, size_t errlen)
{
    struct stat st;
    char *buf;
    ssize_t got;
    size_t n = 0;
    int fd, r;

    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        r = -errno;
        errf(err, errlen, "%s: %s", path, strerror(-r));
        return r;
    }
    if (fstat(fd, &st) < 0 || st.st_size > (1 << 20)) {
        close(fd);
        errf(err, errlen, "%s: not a model file (larger than 1 MiB or unreadable)", path);
        return -EINVAL;
    }
    buf = malloc((size_t)st.st_size + 1);
    if (!buf) {
        close(fd);
        return -ENOMEM;
    }
    while ((got = read(fd, buf + n, (size_t)st.st_size - n)) > 0)
        n += (size_t)got;
    close(fd);
    r = wo_devmodel_parse(buf, n, path, m, err, errlen);
    free(buf);
    return r;
}

int wo_devmodel_write(FILE *f, const struct wo_devmodel *m)
{
    fprintf(f, "# libwoffload device model (docs/replay.md). GB/s = 1e9 bytes/s, us = microseconds.\n");
    for (size_t i = 0; i < WO_ARRAY_SIZE(keys); i++) {
        const void *p = (const char *)m + keys[i].off;

        fprintf(f, "# %s\n", keys[i].doc);
        switch (keys[i].type) {
        case KT_NAME:
            fprintf(f, "%s = %s\n", keys[i].name, (const char *)p);
            break;
        case KT_BYTES:
            fprintf(f, "%s = %llu\n", keys[i].name, (unsigned long long)*(const uint64_t *)p);
            break;
        default:
            fprintf(f, "%s = %.6g\n", keys[i].name, *(const double *)p);
        }
    }
    return ferror(f) ? -EIO : 0;
}

double wo_devmodel_pf_bps(const struct wo_devmodel *m, uint64_t bytes)
{
    static const double sz[4] = {2.0 * WO_MiB, 16.0 * WO_MiB, 64.0 * WO_MiB, 1.0 * WO_GiB};
    double b = (double)bytes;

    if (b <= sz[0])
        return m->pf_gbs[0] * 1e9;
    for (int i = 1; i < 4; i++) {
        if (b <= sz[i]) {
            double t = (log(b) - log(sz[i - 1])) / (log(sz[i]) - log(sz[i - 1]));
            return (m->pf_gbs[i - 1] + t * (m->pf_gbs[i] - m->pf_gbs[i - 1])) * 1e9;
        }
    }
    return m->pf_gbs[3] * 1e9;
}

void wo_devmodel_plan_costs(const struct wo_devmodel *m, struct wo_plan_costs *c)
{
    c->hbm_s_per_byte = 1.0 / (m->hbm_gbs * 1e9);
    c->zc_s_per_byte = 1.0 / (m->zc_gbs * 1e9);
    c->prefetch_s_per_byte = 1.0 / (m->pf_gbs[2] * 1e9);
    c->prefetch_call_s = m->pf_call_us * 1e-6;
    c->copyback_s_per_byte = 1.0 / (m->copyback_gbs * 1e9);
    c->collapse_s_per_byte = 1.0 / (m->collapse_gbs * 1e9);
    c->remap_s_per_byte = m->remap_gbs > 0 ? 1.0 / (m->remap_gbs * 1e9) : 0;
}
