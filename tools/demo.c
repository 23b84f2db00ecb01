/* tools/demo.c: `woffload demo`, the README's main job.
 *
 * With a GPU and PyTorch on the machine it runs the real engine under the
 * shim (bench/e2e.py: transformers MoE all on GPU, then experts on host).
 * Without, it replays a trace recorded on the lent H100 (tests/traces/)
 * through an example policy and the shim's own planner against the device
 * model (the code woffload-replay runs), and prints what a user wants to
 * know: placement by name, PCIe bytes per token, predicted tok/s against
 * all-on-GPU, where the time goes. */
#include "tools/demo.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda.h>

#include "core/trace.h"
#include "policy/policy.h"
#include "uvm/devmodel.h"
#include "tools/doctor.h"
#include "tools/replay.h"
#include "wo-config.h"

/* Where the bundled traces and examples are: the source tree this was built
 * from for the build tree's tool, the installed data directory for an
 * installed one. */
static const char *data_root(void)
{
    static char buf[PATH_MAX];
    snprintf(buf, sizeof(buf), "%s/tests/traces", WO_SOURCE_ROOT);
    if (wo_tool_in_build_tree() && access(buf, R_OK) == 0)
        return WO_SOURCE_ROOT;
    return WO_DATADIR;
}

static bool gpu_present(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    CUresult (*init)(unsigned int);
    CUresult (*count)(int *);
    int n = 0;

    if (!h)
        return false;
    init = (CUresult(*)(unsigned int))dlsym(h, "cuInit");
    count = (CUresult(*)(int *))dlsym(h, "cuDeviceGetCount");
    return init && count && init(0) == CUDA_SUCCESS && count(&n) == CUDA_SUCCESS && n > 0;
}

static bool torch_present(void)
{
    int st = system("python3 -c 'import torch, transformers; assert torch.cuda.is_available()' "
                    ">/dev/null 2>&1");
    return st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

static int run_engine(FILE *out)
{
    char cmd[PATH_MAX * 2];
    int st;

    fprintf(out, "A GPU and PyTorch are here: running transformers under the shim (bench/e2e.py).\n"
                 "Rows: the MoE all on GPU, then its experts of layers 0-3 and of all layers in host\n"
                 "memory through libwoffload (no change to the engine's code).\n\n");
    fflush(out);
    snprintf(cmd, sizeof(cmd),
             "cd '%s' && python3 bench/e2e.py --build '%s' --out \"${TMPDIR:-/tmp}\" "
             "--scenarios moe-gpu,moe-shim-experts-host-l0-3,moe-shim-experts-host-all",
             WO_SOURCE_ROOT, WO_BUILD_ROOT);
    st = system(cmd);
    return st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}

static const char *human(double b, char *buf, size_t len)
{
    if (b >= 1e9)
        snprintf(buf, len, "%.2f GB", b / 1e9);
    else if (b >= 1e6)
        snprintf(buf, len, "%.1f MB", b / 1e6);
    else if (b >= 1e3)
        snprintf(buf, len, "%.1f kB", b / 1e3);
    else
        snprintf(buf, len, "%.0f B", b);
    return buf;
}

static int by_bytes(const void *a, const void *b)
{
    const struct wo_replay_name *x = a, *y = b;
    return x->bytes < y->bytes ? 1 : x->bytes > y->bytes ? -1 : strcmp(x->name, y->name);
}

/* Names under one placement with the same shape but for layer numbers are
 * shown once ("model.layers.*.mlp.experts.gate_up_proj x16"). */
static void fold(const char *name, char *out, size_t len)
{
    size_t o = 0;
    for (const char *p = name; *p && o + 2 < len; p++) {
        if (*p >= '0' && *p <= '9' && (p == name || p[-1] == '.')) {
            out[o++] = '*';
            while (p[1] >= '0' && p[1] <= '9')
                p++;
        } else {
            out[o++] = *p;
        }
    }
    out[o] = '\0';
}

/* The table by name. Its PCIe column is the decode step's bytes (the
 * summary's figure, pcie_step) split between the names as the replayed
 * window splits its PCIe bytes (in-place reads, misses, prefetches): the
 * replay keeps per-name figures for the whole window only, whose steps
 * include the prefills; so the column adds up to the summary. */
static void print_names(FILE *out, struct wo_replay_result *r, double pcie_step)
{
    struct group {
        char name[256];
        uint32_t place;
        uint64_t bytes, n;
        double zc;
    } g[24];
    size_t ng = 0;
    double all = 0, shown = 0;
    char b1[32], b2[48];
    bool whole = false;

    qsort(r->names, r->nnames, sizeof(r->names[0]), by_bytes);
    for (size_t i = 0; i < r->nnames; i++) {
        char f[256];
        size_t j;
        double w = r->names[i].zc_bytes + r->names[i].miss_bytes + r->names[i].prefetched;
        all += w;
        fold(r->names[i].name, f, sizeof(f));
        for (j = 0; j < ng; j++)
            if (g[j].place == r->names[i].place && strcmp(g[j].name, f) == 0)
                break;
        if (j == ng) {
            if (ng == WO_ARRAY_SIZE(g))
                continue;
            snprintf(g[ng].name, sizeof(g[ng].name), "%s", f);
            g[ng].place = r->names[i].place;
            g[ng].bytes = g[ng].n = 0;
            g[ng].zc = 0;
            ng++;
        }
        g[j].bytes += r->names[i].bytes;
        g[j].n++;
        g[j].zc += w;
    }
    fprintf(out, "  %-52s %4s %-8s %10s %16s\n", "name (layers folded)", "n", "place", "bytes",
            "PCIe per token");
    for (size_t j = 0; j < ng && j < 12; j++) {
        double per_token = all > 0 ? g[j].zc / all * pcie_step : 0;
        /* A kernel is handed a pointer, not a length: when only the base of
         * a stacked tensor is seen (a grouped GEMM given the whole expert
         * stack), the replay must count all of it: an upper bound. */
        bool upper = g[j].zc >= 0.9 * (double)g[j].bytes && g[j].bytes >= WO_MiB;
        snprintf(b2, sizeof(b2), "-");
        if (g[j].zc > 0)
            snprintf(b2, sizeof(b2), "%s%s", upper ? "<= " : "", human(per_token, b1, sizeof(b1)));
        whole |= upper && g[j].zc > 0;
        shown += per_token;
        fprintf(out, "  %-52.52s %4llu %-8s %10s %16s\n", g[j].name, (unsigned long long)g[j].n,
                wo_placement_to_string(g[j].place), human((double)g[j].bytes, b1, sizeof(b1)), b2);
    }
    if (pcie_step - shown > 0.005 * pcie_step)
        fprintf(out, "  %-52s %4s %-8s %10s %16s\n", "(the other names)", "", "", "",
                human(pcie_step - shown, b1, sizeof(b1)));
    fprintf(out, "  %-52s %4s %-8s %10s %16s\n", "total (the summary's figure below)", "", "", "",
            pcie_step > 0 ? human(pcie_step, b1, sizeof(b1)) : "0 B");
    fprintf(out,
            "  PCIe per token: a decode step's bytes over PCIe (one token at batch 1), split\n"
            "  between the names as the whole replayed window, prefills included, splits them\n");
    if (whole)
        fprintf(
            out,
            "  <= : the kernels were handed only the base of these tensors, so the replay\n"
            "       counts every byte as read (an upper bound; a batch-1 MoE reads only the\n"
            "       active experts: bench/results/e2e-20261122-143449-issue8.md measured it)\n");
}

static int replay_one(const struct wo_trace_data *d, const struct wo_devmodel *dm,
                      const struct wo_policy *pol, bool all_device, struct wo_replay_result *res)
{
    struct wo_replay_opts o;
    char msg[512];
    int r;

    memset(&o, 0, sizeof(o));
    o.dm = dm;
    o.policy = pol;
    o.all_device = all_device;
    o.no_bound = all_device;
    o.warmup = UINT_MAX;
    r = wo_replay_run(d, &o, res, msg, sizeof(msg));
    if (r < 0)
        fprintf(stderr, "woffload demo: replay failed: %s\n", msg);
    return r;
}

static int run_replay(FILE *out, const char *trace, const char *policy_path)
{
    struct wo_trace_data *d = NULL;
    struct wo_policy *pol = NULL;
    struct wo_diags diags = {0};
    struct wo_devmodel dm;
    struct wo_replay_result gpu, pl;
    char b1[32], b2[32];
    int r, ret = 1;

    memset(&gpu, 0, sizeof(gpu));
    memset(&pl, 0, sizeof(pl));
    wo_devmodel_default(&dm);
    r = wo_trace_load(trace, 0, 0, &d); /* plain or .wot.gz */
    if (r < 0) {
        fprintf(stderr, "woffload demo: %s: %s\n", trace,
                d && d->error_text[0] ? d->error_text : strerror(-r));
        goto out;
    }
    r = wo_policy_load_file(policy_path, NULL, &pol, &diags);
    wo_diags_print(&diags, stderr);
    wo_diags_clear(&diags);
    if (r < 0)
        goto out;

    fprintf(out,
            "No GPU with PyTorch here: replaying a real run instead.\n\n"
            "trace:  %s\n        transformers Qwen3-MoE (16 layers, 32 experts, top-4, bf16, 19.7 "
            "GiB), eager\n"
            "        experts backend, greedy decode at batch 1, every weight on the GPU, recorded\n"
            "        under libwoffload on an H100 (the same engine measured: "
            "bench/results/e2e-20261122-180852-issue7-r7.md)\n"
            "policy: %s\nmodel:  %s\n\n",
            trace, policy_path, dm.name[0] ? dm.name : "built-in H100");
    if (replay_one(d, &dm, NULL, true, &gpu) < 0 || replay_one(d, &dm, pol, false, &pl) < 0)
        goto out;

    fprintf(out, "Placement by name:\n");
    print_names(out, &pl, pl.decode_step_s > 0 ? pl.decode_pcie_bytes : pl.pcie_bytes_step);
    {
        /* decode steps (one token each at batch 1) when the trace has them */
        double gs = gpu.decode_step_s > 0 ? gpu.decode_step_s : gpu.step_s;
        double ps = pl.decode_step_s > 0 ? pl.decode_step_s : pl.step_s;
        double pb = pl.decode_step_s > 0 ? pl.decode_pcie_bytes : pl.pcie_bytes_step;
        double zb = pl.decode_step_s > 0 ? pl.decode_zc_bytes : pl.zc_bytes_step;
        double st = pl.decode_step_s > 0 ? pl.decode_stall_s : pl.stall_s_step;

        fprintf(out, "\n%-30s %14s %14s\n", "per decode step (one token)", "all on GPU", "with policy");
        fprintf(out, "%-30s %11.2f ms %11.2f ms\n", "predicted step time", gs * 1e3, ps * 1e3);
        fprintf(out, "%-30s %14.1f %14.1f\n", "predicted tok/s", 1.0 / gs, 1.0 / ps);
        fprintf(out, "%-30s %14s %14s\n", "bytes over PCIe per token", "0 B", human(pb, b1, sizeof(b1)));
        fprintf(out, "\nWhere a decode step's time goes with the policy:\n");
        fprintf(out, "  the engine's own host work (as recorded, launch-bound) %6.2f ms\n",
                (pl.decode_step_s > 0 ? pl.decode_host_s : pl.cpu_step_s) * 1e3);
        fprintf(out, "  weights read in place over PCIe  %s at %.0f GB/s = %6.2f ms\n",
                human(zb, b2, sizeof(b2)), dm.zc_gbs, zb / (dm.zc_gbs * 1e9) * 1e3);
        fprintf(out, "  waiting for managed data (misses, late prefetches)     %6.2f ms\n", st * 1e3);
        fprintf(out, "  => the step is %.2f ms longer than all on GPU: what of the GPU's work the\n"
                     "     host's own work could not hide (eager MoE waits once per expert)\n",
                (ps - gs) * 1e3);
    }
    fprintf(out,
            "\nTry the experts managed within 9 GiB of the GPU (half their bytes):\n"
            "  WO_EXPERT_BUDGET=9GiB woffload demo --policy %s/examples/moe-experts-managed.yaml\n"
            "(measured on the H100 with the same calls: replays run 2-19%% short of the measured\n"
            "step, docs/history/prefetch.md \"How well the replay predicts\")\n"
            "Or any trace of your own: WOFFLOAD_TRACE=run.wotrace woffload-run --policy P -- CMD\n",
            data_root());
    ret = 0;
out:
    wo_replay_result_free(&gpu);
    wo_replay_result_free(&pl);
    wo_policy_free(pol);
    wo_trace_data_free(d);
    return ret;
}

int wo_demo(FILE *out, const char *trace, const char *policy, bool replay_only)
{
    char tbuf[PATH_MAX], pbuf[PATH_MAX];
    const char *root = data_root();

    if (!replay_only && !trace && gpu_present() && torch_present())
        return run_engine(out);
    if (!trace) {
        snprintf(tbuf, sizeof(tbuf), "%s/tests/traces/h100-eager-moe-r7-gpu.wot.gz", root);
        trace = tbuf;
    }
    if (!policy) {
        snprintf(pbuf, sizeof(pbuf), "%s/examples/moe-experts-host.yaml", root);
        policy = pbuf;
    }
    return run_replay(out, trace, policy);
}
