/* uvm/devmodel.h: the device model the planner weighs moves with and replay
 * times a trace against:
 * bandwidths and per-call costs of one GPU machine. Written by
 * woffload-calibrate, read by woffload-replay and, through
 * WOFFLOAD_DEVICE_MODEL, by the shim. No CUDA. The built-in default is
 * guide/device-facts.md's H100 (PCIe Gen5); tools/models/h100.model is the
 * calibrated one.
 *
 * File format (docs/prefetch.md): UTF-8 text, one `key = value` a line,
 * `#` starts a comment, blank lines are ignored. Values are decimal numbers
 * (bandwidths in GB/s = 1e9 bytes/s, times in microseconds, sizes in bytes)
 * except `name` (the rest of the line). Every key is optional (the default
 * fills in); an unknown key, a duplicate or a bad number is an error naming
 * file:line. */
#pragma once

#include <stdio.h>

#include "core/macro.h"
#include "uvm/plan.h"

struct wo_devmodel {
    char name[128];
    uint64_t device_bytes;  /* device_bytes: total device memory */
    double hbm_gbs;         /* hbm_gbs: kernel streaming read of device memory */
    double zc_gbs;          /* zc_gbs: kernel streaming read of host memory over PCIe */
    double h2d_gbs;         /* h2d_gbs: pinned cuMemcpy host->device */
    double d2h_gbs;         /* d2h_gbs: pinned cuMemcpy device->host */
    double pf_gbs[4];       /* prefetch_2m_gbs, _16m_, _64m_, _1g_: host->GPU by piece size */
    double pf_call_us;      /* prefetch_call_us: CPU time inside one prefetch call */
    double rm_pf_gbs;       /* readmostly_prefetch_gbs: prefetch making a duplicate, 1 GiB calls */
    double copyback_gbs;    /* copyback_gbs: prefetch GPU->host (eviction that copies) */
    double collapse_gbs;    /* collapse_gbs: UNSET_READ_MOSTLY dropping the GPU copy (64 MiB pieces) */
    double remap_gbs;       /* remap_gbs: SET_ACCESSED_BY mapping a collapsed piece for the GPU again */
    double advise_us;       /* advise_us: one cuMemAdvise on a small range */
    double launch_us;       /* launch_us: CPU cost of one kernel launch (floor of the host gap) */
    double kernel_us;       /* kernel_us: smallest GPU time of a kernel */
    double sync_us;         /* sync_us: host work between a sync returning and the next launch */
    /* host_zc_slowdown, host_dma_slowdown: the host's own work runs this
     * many times slower while the PCIe link carries the GPU's in-place
     * reads of host memory, or a copy engine's transfer */
    double host_zc_slow, host_dma_slow;
};

/* The built-in H100 model (device-facts.md). */
void wo_devmodel_default(struct wo_devmodel *m);
/* Reads a model file over the defaults. 0, or -errno / -EINVAL with a
 * message "file:line: ..." in err. */
int wo_devmodel_load(const char *path, struct wo_devmodel *m, char *err, size_t errlen);
int wo_devmodel_parse(const char *text, size_t len, const char *display, struct wo_devmodel *m,
                      char *err, size_t errlen);
/* Writes every key with a comment; the output parses back to the same model. */
int wo_devmodel_write(FILE *f, const struct wo_devmodel *m);

/* Prefetch bandwidth (bytes/s) of one call of `bytes`, interpolated in
 * log(size) between the measured piece sizes. */
double wo_devmodel_pf_bps(const struct wo_devmodel *m, uint64_t bytes);
/* The planner's cost figures from the model. */
void wo_devmodel_plan_costs(const struct wo_devmodel *m, struct wo_plan_costs *c);
