/* core/settings.c: the table of WOFFLOAD_* variables, their parsing and
 * validation, and the one place that reads them from the environment (see
 * settings.h). */
#include "core/settings.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/log.h"

#define OFF(f) offsetof(struct wo_settings, f)

const struct wo_setting_def wo_setting_defs[] = {
    {"WOFFLOAD_LOG", WO_SETTING_LEVEL, "warn",
     "log level: off, error, warn, info, debug, trace", OFF(log_level), 0, 0},
    {"WOFFLOAD_LOG_FILE", WO_SETTING_PATH, "",
     "append log lines to this file instead of stderr", OFF(log_file), 0, 0},
    {"WOFFLOAD_POLICY", WO_SETTING_PATH, "",
     "YAML placement policy; unset: every allocation passes through untouched", OFF(policy), 0, 0},
    {"WOFFLOAD_TRACE", WO_SETTING_PATH, "",
     "record the event stream to this file (docs/trace-format.md)", OFF(trace), 0, 0},
    {"WOFFLOAD_DEVICE_MODEL", WO_SETTING_PATH, "",
     "device model file (woffload-calibrate) whose rates the prefetcher's cost rule weighs moves with; unset: the lent H100's figures", OFF(device_model), 0, 0},
    {"WOFFLOAD_STATS", WO_SETTING_PATH, "",
     "write the JSON stats snapshot to this file at exit", OFF(stats), 0, 0},
    {"WOFFLOAD_STATS_EVERY", WO_SETTING_UINT, "0",
     "also rewrite the WOFFLOAD_STATS file every this many seconds while the process runs (replaced whole: a reader never sees half of it; a process killed by SIGKILL leaves the last one); 0: at exit only", OFF(stats_every), 0, 86400},
    {"WOFFLOAD_CUDA_LIB", WO_SETTING_PATH, "libcuda.so.1",
     "the CUDA driver library to dlopen", OFF(cuda_lib), 0, 0},
    {"WOFFLOAD_NVML_LIB", WO_SETTING_PATH, "libnvidia-ml.so.1",
     "the NVML library to dlopen for the process's own device memory (fit takes its CUDA contexts out of the fit size); one that cannot be loaded leaves them in, as the seal line says", OFF(nvml_lib), 0, 0},
    {"WOFFLOAD_DISABLE", WO_SETTING_BOOL, "0",
     "1: load but intercept nothing (every call goes straight to CUDA)", OFF(disable), 0, 0},
    {"WOFFLOAD_PREFETCH", WO_SETTING_BOOL, "1",
     "0: never start the prefetch thread (managed memory then migrates on demand)", OFF(prefetch), 0, 0},
    {"WOFFLOAD_PREFETCH_OWN_CONTEXT", WO_SETTING_BOOL, "1",
     "0: prefetch from the engine's context (each prefetch call then holds up the engine's launches)",
     OFF(prefetch_own_ctx), 0, 0},
    {"WOFFLOAD_SUMMARY", WO_SETTING_BOOL, "1",
     "print the placement summary at seal and at exit (at log level info or above: always)", OFF(summary), 0, 0},
    {"WOFFLOAD_OBSERVE", WO_SETTING_BOOL, "0",
     "1: observe launches (scan, events, per-name stats) even when the policy places nothing", OFF(observe), 0, 0},
    {"WOFFLOAD_MANAGED_MARGIN", WO_SETTING_UINT, "1024",
     "MiB of free device memory that managed memory the shim serves never takes (the managed cap, docs/placement.md)", OFF(managed_margin_mib), 0, UINT64_C(1) << 20},
    {"WOFFLOAD_QUIET", WO_SETTING_BOOL, "0",
     "1: no progress line while many GiB are pinned or placed", OFF(quiet), 0, 0},
    {"WOFFLOAD_PROGRESS", WO_SETTING_BOOL, "0",
     "1: progress as log lines also when stderr is not a TTY", OFF(progress), 0, 0},
    {"WOFFLOAD_STREAM_CHECK", WO_SETTING_BOOL, "0",
     "1 (debugging, slow): after each launch redirected into a staging slot or a picked buffer, wait for it and compare the slot with the host copy (stats stream.checked, check_mismatch), and the buffer's picked experts (the ids read back) with the tensor's rows (stats picks.checked, check_mismatch); its synchronous calls would break a global-mode stream capture on another thread", OFF(stream_check), 0, 0},
    {"WOFFLOAD_STREAM_RECHECK", WO_SETTING_UINT, "64",
     "prefetch.mode auto: streamed steps after which a decision to stream managed ranges (ones the planner could keep on the device) is taken again in place, then twice as many after each that confirms it, up to 1024: the ranges go back in place, the planner settles, and the step read in place is set against the streamed one; 0: never (a try taken while the planner was still learning the batch's experts then stands; docs/prefetch.md, auto by step time)", OFF(stream_recheck), 0, 1u << 20},
    {"WOFFLOAD_WRITE_CHECKS", WO_SETTING_BOOL, "1",
     "0 (measuring their cost only): the streaming executor does not check its slots for writes by launches before reusing them; a launch that writes a streamed weight then loses the write (docs/prefetch.md, Write checks)", OFF(write_checks), 0, 0},
    {"WOFFLOAD_LATE_BIND", WO_SETTING_BOOL, "0",
     "1 (experimental; the streaming executor never stages the ranges it serves: llama-server with host experts under it failed with an illegal address on the H200 once they were staged): serve placeable allocations as VMM ranges re-backed at seal at the same address, instead of managed memory, so any tensor can still move when placement is decided (docs/placement.md, Late binding)", OFF(late_bind), 0, 0},
    {"WOFFLOAD_FIT_BIND", WO_SETTING_BOOL, "0",
     "1 (experimental; under fit): what would be managed memory is served as a VMM range re-backed at seal (late binding), while the names announced before their bytes that the plan puts on the host are still served as pinned host memory (staged and copied picked as without it); a weight that yields to the engine after seal then gives its device memory back at once (re-backed on the host at the same address, then read in place) (docs/placement.md, Late binding)", OFF(fit_bind), 0, 0},
    {"WOFFLOAD_FIT_SQUEEZE", WO_SETTING_BOOL, "1",
     "1 (the default; under fit): when fit's managed weights yield to the engine after seal, the device memory their pages held is taken back from UVM's cache (which keeps it after the prefetch to the host, so the process would fill the device before it went: 1.12x the fit size on the H200) by device allocations of the free memory plus the yielded bytes, freed at once: for a moment the device has almost nothing free (the engine's own allocations that fail then are made again after it), and another process's allocation then may fail; 0: the pages stay cached until the engine's own allocations reach them (docs/policy.md, fit)", OFF(fit_squeeze), 0, 0},
    {"WOFFLOAD_FIT_SQUEEZE_LENT", WO_SETTING_BOOL, "0",
     "1 (under fit, with WOFFLOAD_FIT_SQUEEZE): the same squeeze each time the prefetcher evicts the weights lent the staging slots' room (at least 2 MiB, at most once a second), so the process ends near the fit size (llama-server at -ot exps=CPU's memory: 1.010x it against 1.056x); off by default: for each such moment, while serving, the process holds all the free device memory (the gpu suite's bigload-gpu sampled 1.29x the fit size) (docs/placement.md, fit)", OFF(fit_squeeze_lent), 0, 0},
    {"WOFFLOAD_FIT_LEND", WO_SETTING_BOOL, "1",
     "1 (the default): under fit, the room kept for the streaming executor's slots is lent to the weights fit would choose next, as managed memory the prefetcher holds on the device while the slots are empty and gives back to the host while they are busy; 0: the room stays empty and those weights are host, staged as the others (to measure what lending costs where the slots stay busy: llama-server at 32 requests read the lent weights in place beside the copies, bench/results/llamacpp-serve-20261206-p32-spread-h100) (docs/placement.md, fit)", OFF(fit_lend), 0, 0},
    {"WOFFLOAD_FIT_SPREAD", WO_SETTING_BOOL, "1",
     "1 (the default; under fit, at seal and in woffload-policy fit): tensors of equal value to fit (reads per step within 5% of each other, or none known, and one kind) are chosen for the device spread through their order (every other one, then every fourth between those...), so that those it sends off the device are spread through the step and the streaming executor copies each while device layers compute; 0: in their order, as before (the last layers' go off the device together, one block the step waits for on the link; for A/B runs) (docs/policy.md, Equal values spread through the step)", OFF(fit_spread), 0, 0},
    {"WOFFLOAD_FIT_LAYERS", WO_SETTING_BOOL, "1",
     "1 (the default; under fit, at seal and in woffload-policy fit and gguf; with WOFFLOAD_FIT_SPREAD): the spread of equal-value tensors takes a layer's together, so that fit sends whole layers off the device, spread through the step, as a hand policy's `layers:` rule does (llama-server at 32 requests: 0.999x the hand split at its memory, bench/results/llamacpp-serve-20261207-p32-fitbylayer-h100); 0: tensor by tensor, so that a layer of three expert tensors may keep one or two of them (for A/B runs) (docs/policy.md, Equal values spread through the step)", OFF(fit_layers), 0, 0},
    {"WOFFLOAD_BIND_COPIES", WO_SETTING_BOOL, "0",
     "1 (experimental, to test on a GPU): late-bound ranges off the device (WOFFLOAD_LATE_BIND, or weights that yielded under WOFFLOAD_FIT_BIND) are staged by the streaming executor and copied picked, as host memory, instead of read in place; off by default because llama-server failed once they were staged and llama.cpp gave other tokens once they were copied picked on the H200, while bench/vmm-host-copy.cu finds every copy out of such ranges right (docs/placement.md, Late binding)", OFF(bind_copies), 0, 0},
    {"WOFFLOAD_FIT_MEMO", WO_SETTING_PATH, "",
     "the file where `fit: {reserve: auto}` keeps the engine's high water after seal from one run to the next; empty (the default): $XDG_CACHE_HOME/woffload (else ~/.cache/woffload), one file per command line and working directory (docs/policy.md, fit)", OFF(fit_memo), 0, 0},
    {"WOFFLOAD_READONLY", WO_SETTING_BOOL, "1",
     "0: woffload_readonly declarations are ignored (the ggml hook makes one for each of llama.cpp's model buffers): CUDA graphs reading them count as launches that may write them, which retires the streaming executor's pinned copies and stages again after each (docs/prefetch.md, Blind launches)", OFF(readonly), 0, 0},
    {"WOFFLOAD_DEPARTURE_FENCES", WO_SETTING_BOOL, "1",
     "0 (measuring their effect): the streaming executor records a slot's read event at the end of the engine's stream before it reuses the slot, as before departure fences, so each staging copy waits for the kernels the engine submitted last (docs/prefetch.md, Departure fences)", OFF(departure_fences), 0, 0},
    {"WOFFLOAD_DEPARTURE_LAG", WO_SETTING_UINT, "2",
     "with departure fences on: the ranges the engine must have moved past a streamed range before its hook records the range's departure fence, which lets the streaming executor reuse the range's staging slot without waiting for the kernels the engine submitted after it; given, it wins over the engine's word (woffload_departure_lag, which the ggml hook calls with 1). 2 (the default where the engine says nothing): two, so that the kernels of the range after it were submitted too, and the executor keeps the range just behind the engine staged besides the current one and slots - 2 ahead; 1 (llama.cpp's kernels read the weights through their own arguments, or through a table a kernel of the same compute builds): one, recorded before the first launch of the next range, and the executor stages slots - 1 ranges ahead of the current one, keeping none behind, so that two slots overlap a range's copy with the kernels of the one before (docs/prefetch.md, Departure fences)", OFF(departure_lag), 1, 2},
    {"WOFFLOAD_PICKS", WO_SETTING_BOOL, "1",
     "0: woffload_moe_picks does nothing (and the Python hook registers no experts hooks): expert tensors off the device are staged whole or read in place instead of only their picked rows (docs/picks.md, Picked experts)", OFF(picks), 0, 0},
    {"WOFFLOAD_PREPIN", WO_SETTING_BOOL, "1",
     "0: no worker pins host memory ahead of the loader for the names announced before their bytes that the plan puts on the host; each is pinned inside its allocation, on the engine's thread (docs/placement.md, Names before bytes)", OFF(prepin), 0, 0},
    {"WOFFLOAD_KEEP_WARMUP", WO_SETTING_BOOL, "0",
     "1: the Python hook leaves transformers' allocator warm-up as it is (one allocation as large as every weight, placeable only as a whole) and announces no weights before loading; 0: the warm-up is a no-op while the policy places something, and the weights of the model it is handed are announced by name and size (woffload_expect; docs/placement.md, Names before bytes)", OFF(keep_warmup), 0, 0},
    {"WOFFLOAD_PICKS_HOT", WO_SETTING_UINT, "0",
     "MiB of device memory for hot experts (experimental): of each expert tensor with picks (woffload_moe_picks) off the device, the experts its picked copies moved most often (decayed counts; chosen at each registration while the set has free slots, then twice as far apart after a choice that filled none, up to every 8th) are kept on the device, in an equal share of this, and copied from there rather than over the link; the bytes come off the prefetcher's device budget. Overrides the policy's prefetch.hot_experts; 0 (the default): the policy's, none without it (docs/picks.md, Hot experts)", OFF(picks_hot_mib), 0, UINT64_C(1) << 24},
    {"WOFFLOAD_PICKS_ENGINE", WO_SETTING_UINT, "0",
     "0 (the default): never (on the GPU it runs llama-batched-bench to its end, but slower than the kernel's copies: docs/llamacpp.md); a percent: a picked copy (woffload_moe_picks) of an expert tensor in host memory runs on the copy engine when a uniform router picks at least this many percent of its experts at the registration's ids (n ids of E experts: 1 - (1 - 1/E)^n; in rows of k: 1 - (1 - k/E)^rows): a shim thread reads the ids once the engine's stream has written them and copies the picked experts' runs, and the launch's stream waits for them on the device (cuStreamWaitValue32), with no host sync on the engine's thread; each kernel's first launch behind the copy engine's gate under CUDA's lazy module loading (WOFFLOAD_PICKS_LAZY); below it, and for managed tensors, a kernel on the launch's stream copies them; with hot experts the kernels copy the hot rows from the device and the copy engine the others (docs/picks.md, Picked experts on the copy engine)", OFF(picks_engine), 0, 100},
    {"WOFFLOAD_PICKS_WHOLE", WO_SETTING_UINT, "92",
     "a host expert tensor whose registration's ids (woffload_moe_picks) pick at least this many percent of its experts under a uniform router (n ids of E: 1 - (1 - 1/E)^n) is left to the streaming executor until one picks under 4/5 of that, which prefetch.mode auto lets copy it whole on the copy engine when its step time says so (the picked copies stay the launch's fallback: a copy by the kernels of nearly every row is slower than the whole tensor on the copy engine); not with hot experts, nor for managed tensors; 92 by default (the line WOFFLOAD_GGML_STREAM draws for llama.cpp's computes), 0: never (docs/picks.md, Picked experts)", OFF(picks_whole), 0, 100},
    {"WOFFLOAD_PICKS_EARLY", WO_SETTING_UINT, "1",
     "with the copy engine on (WOFFLOAD_PICKS_ENGINE): 1 (the default): when a launch's picked copy goes to the copy engine, the other expert tensors registered with the same picks by the same thread (a layer's gate_up and down) are copied right behind it, and their own launches wait for those copies on the device; 0: each tensor's copy is queued at its own launch (docs/picks.md, Picked experts on the copy engine)", OFF(picks_early), 0, 1},
    {"WOFFLOAD_PICKS_BUFFERS", WO_SETTING_UINT, "2",
     "device buffers for picked copies (woffload_moe_picks), each as large as the largest expert tensor staged, one pool that the engine's streams share (a stream takes another's least recently used one after an event): 2 (the default) holds two tensors one launch reads at once (a fused gate and up); 1 saves one tensor's bytes of device memory (384 MiB on a 128-expert top-8 GGUF of Qwen3-30B-A3B's layer), and a launch that reads two registered tensors then reads the second in place; launches of one tensor after another copy the same either way, in stream order (docs/picks.md, Picked experts)", OFF(picks_buffers), 1, 2},
    {"WOFFLOAD_PICKS_STALL_MS", WO_SETTING_UINT, "5000",
     "with the copy engine on (WOFFLOAD_PICKS_ENGINE), how long a driver call of the shim's copy or mirror thread, the oldest queued copy, or a free or wait for the context holding the copy engine's gate may last before the shim says once what each was doing (a warning, and stats picks.engine.stalls); the engine's stream waits on the device for the copy thread, so a copy thread held in one driver call past it has the jobs waiting for it rescued: their rows copied by the kernels on the engine's streams, their flags written from the host (stats picks.engine.rescues; docs/picks.md, The rescue)", OFF(picks_stall_ms), 10, 600000},
    {"WOFFLOAD_PICKS_LAZY", WO_SETTING_BOOL, "1",
     "1 (the default): the copy engine (WOFFLOAD_PICKS_ENGINE) runs under CUDA's lazy module loading, CUDA's own default: the first launch of each kernel, which may load its module and wait for the context's work, goes behind the copy engine's gate (the queued copies are issued first: stats interpose.gated_first_launches), and so does a function's other first use that may load it (its attributes, cache config, occupancy, cuModuleGetFunction); a load none of those sees is a stall that the rescue ends (WOFFLOAD_PICKS_STALL_MS); on the H200 tokens identical, 0 stalls, and the CUDA context grew by 20 MiB after seal against eager loading's 606 (bench/results/bigload-20261204b-moe128-lazy-h200). 0: the shim asks for eager loading instead (CUDA_MODULE_LOADING=EAGER when unset: about 1 GiB of device memory and 4 s of start-up for PyTorch's kernels), and any other CUDA_MODULE_LOADING keeps the copy engine off (docs/picks.md, Lazy loading behind the gate)", OFF(picks_lazy), 0, 0},
    {"WOFFLOAD_GGML_PICKS_FROM", WO_SETTING_UINT, "80",
     "the ggml hook also registers a layer's router picks when a uniform router picks at least this many percent of its experts and less than WOFFLOAD_GGML_STREAM, once an expert tensor is off the device: a kernel on the engine's stream copies the picked experts (on the copy engine from a pinned mirror of the model buffer with WOFFLOAD_PICKS_ENGINE), and llama.cpp's CUDA graphs are replayed for it; 80 by default (a batch of 32 on a 128-expert top-8 GGUF: 102.7 tok/s against 95.9 read in place and llama.cpp's -ot exps=CPU 101.7); under fit 0 unless given (fit then keeps no room for the copies' buffers: llama-server at 32 requests on an H100 decoded 77.2 and 68.9 tok/s so against 59.1 and 60.1 with the band at the same fit size, bench/results/llamacpp-serve-20261206c-p32-fitpicks-h100); 0: never (docs/llamacpp.md, Picked experts)", OFF(ggml_picks_from), 0, 100},
    {"WOFFLOAD_GGML_PICKS", WO_SETTING_UINT, "0",
     "the ggml hook registers a layer's router picks (llama.cpp's ffn_moe_topk) so that only the picked experts of its host expert tensors are copied, when the share of the experts a uniform router would pick at the step's batch is at most this many percent (top-k of E experts, n tokens: 1 - (1 - k/E)^n); 0 (the default: llama.cpp's kernels reading host experts in place already fetch only the picked ones, and the copies made its decode 2-3% slower on the H200): never, 100: always (the default while hot experts are on, WOFFLOAD_PICKS_HOT or prefetch.hot_experts: a copy then takes the hot rows from the device, a single token's compute too, its decode graph replayed for it: b1 1.29x faster so on the H200). Otherwise the tensors are staged whole or read in place (docs/llamacpp.md, Picked experts)", OFF(ggml_picks), 0, 100},
    {"WOFFLOAD_GRAPH_REPLAY", WO_SETTING_BOOL, "1",
     "a CUDA graph launch that reads a range the streaming executor stages, not claimed read in place, is replayed kernel by kernel (the graph's kernels, copies and memsets, read at its instantiation or update), each launch redirected into the staging slots as an eager one; other graph launches run whole. 0: every graph runs whole and reads in place (docs/prefetch.md, CUDA graphs)", OFF(graph_replay), 0, 0},
    {"WOFFLOAD_GGML_SPLIT", WO_SETTING_UINT, "1",
     "the ggml hook announces a device model buffer's tensors by name before their bytes (woffload_expect) and has ggml allocate one buffer a tensor (its multi buffer: a tensor under 1 MiB shares a small buffer of the engine's own device memory, unnamed), so that the plan, not the order of arrival, decides what is served as pinned host memory and what stays movable: a model larger than the free device memory is then not pinned whole by the managed cap (docs/llamacpp.md, The model buffer split by tensor); 1 (the default): under fit, and under any placing policy where the one buffer would pass the managed cap (the engine's free device memory, less the cap's margin and the managed memory served); 2: under any placing policy; 0: never (one buffer, served as managed memory within the cap); never under late binding", OFF(ggml_split), 0, 2},
    {"WOFFLOAD_GGML_STREAM", WO_SETTING_UINT, "92",
     "the ggml hook claims a MoE layer's expert tensors read in place (woffload_read_in_place), from a compute until one of a larger share, when a uniform router picks less than this many percent of their experts at its token count (1 - (1 - k/E)^n), so that the streaming executor copies them whole only in the steps that read nearly all of them: llama.cpp's kernels read only the picked experts in place, at 50-51 GB/s, and a whole copy runs at the copy engine's 55 GB/s (92 is their ratio); 0: never claim (every step may stage them whole). Under prefetch.mode auto the claimed tensors are streamed in the other steps (docs/llamacpp.md, Streaming the host experts)", OFF(ggml_stream), 0, 100},
    {"WOFFLOAD_RING_EVENTS", WO_SETTING_UINT_POW2, "16384",
     "capacity of the event ring (power of two); a full ring drops and counts (stats: ring)", OFF(ring_events), 1024, UINT64_C(1) << 24},
    {"WOFFLOAD_SCAN_WORDS", WO_SETTING_UINT, "512",
     "most 8-byte words of kernel parameters scanned per launch for tracked addresses", OFF(scan_words), 0, 4096},
};
const size_t wo_setting_ndefs = WO_ARRAY_SIZE(wo_setting_defs);
_Static_assert(WO_ARRAY_SIZE(wo_setting_defs) <= WO_SETTINGS_MAX,
               "wo_settings.given holds WO_SETTINGS_MAX rows");

static const char *const level_names[] = {"off", "error", "warn", "info", "debug", "trace"};

int wo_log_level_from_string(const char *s)
{
    for (size_t i = 0; i < WO_ARRAY_SIZE(level_names); i++)
        if (strcasecmp(s, level_names[i]) == 0)
            return (int)i;
    if (strcasecmp(s, "warning") == 0)
        return WO_LOG_WARN;
    if (s[0] >= '0' && s[0] <= '5' && s[1] == '\0')
        return s[0] - '0';
    return -EINVAL;
}

const char *wo_log_level_to_string(int level)
{
    if (level < 0 || (size_t)level >= WO_ARRAY_SIZE(level_names))
        return "?";
    return level_names[level];
}

int wo_setting_bool(const char *s, bool *ret)
{
    static const char *const yes[] = {"1", "yes", "true", "on"};
    static const char *const no[] = {"0", "no", "false", "off"};
    for (size_t i = 0; i < WO_ARRAY_SIZE(yes); i++) {
        if (strcasecmp(s, yes[i]) == 0) {
            *ret = true;
            return 0;
        }
        if (strcasecmp(s, no[i]) == 0) {
            *ret = false;
            return 0;
        }
    }
    return -EINVAL;
}

static void report_fmt(void (*report)(void *, const char *), void *ud, const char *fmt, ...)
    WO_PRINTF(3, 4);
static void report_fmt(void (*report)(void *, const char *), void *ud, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    if (report)
        report(ud, buf);
    else
        wo_log_write(WO_LOG_ERROR, "%s", buf);
}

/* Applies one value; returns 0 or -EINVAL with *accepted describing what is. */
static int apply(const struct wo_setting_def *d, const char *v, struct wo_settings *out,
                 char *accepted, size_t alen)
{
    char *field = (char *)out + d->offset;
    switch (d->type) {
    case WO_SETTING_BOOL: {
        bool b;
        snprintf(accepted, alen, "1, 0, yes, no, true, false, on, off");
        if (wo_setting_bool(v, &b) < 0)
            return -EINVAL;
        memcpy(field, &b, sizeof(b));
        return 0;
    }
    case WO_SETTING_LEVEL: {
        int l = wo_log_level_from_string(v);
        snprintf(accepted, alen, "off, error, warn, info, debug, trace (or 0-5)");
        if (l < 0)
            return -EINVAL;
        memcpy(field, &l, sizeof(l));
        return 0;
    }
    case WO_SETTING_PATH: {
        const char *p = *v ? v : NULL;
        /* A variable with a default (WOFFLOAD_CUDA_LIB) has no "none": an
         * empty value would otherwise turn into dlopen(NULL). */
        bool need = *d->def != '\0';
        size_t n = strlen(v);
        snprintf(accepted, alen, "%s (no control characters, under %d bytes)",
                 need ? "a non-empty path" : "a path, or empty for none", PATH_MAX);
        if ((need && n == 0) || n >= PATH_MAX)
            return -EINVAL;
        for (const char *c = v; *c; c++)
            if ((unsigned char)*c < 0x20 || *c == 0x7f)
                return -EINVAL;
        memcpy(field, &p, sizeof(p));
        return 0;
    }
    case WO_SETTING_UINT:
    case WO_SETTING_UINT_POW2: {
        uint64_t u;
        uint32_t u32;
        snprintf(accepted, alen, "%s integer from %llu to %llu",
                 d->type == WO_SETTING_UINT_POW2 ? "a power-of-two" : "an",
                 (unsigned long long)d->min, (unsigned long long)d->max);
        if (wo_parse_uint(v, &u) < 0 || u < d->min || u > d->max)
            return -EINVAL;
        if (d->type == WO_SETTING_UINT_POW2 && (u & (u - 1)) != 0)
            return -EINVAL;
        u32 = (uint32_t)u;
        memcpy(field, &u32, sizeof(u32));
        return 0;
    }
    }
    return -EINVAL;
}

/* The value as it can be shown in one log line: control and non-ASCII bytes
 * (and quotes, backslashes) as \xNN, cut to fit `out` with "...". */
static void quote(const char *v, char *out, size_t outlen)
{
    size_t o = 0;
    for (; *v && o + 5 < outlen; v++) {
        unsigned char c = (unsigned char)*v;
        if (c < 0x20 || c >= 0x7f || c == '"' || c == '\\')
            o += (size_t)snprintf(out + o, outlen - o, "\\x%02x", c);
        else
            out[o++] = (char)c;
    }
    if (*v && outlen >= 4) {
        o = WO_MIN(o, outlen - 4);
        memcpy(out + o, "...", 3);
        o += 3;
    }
    out[o] = '\0';
}

/* Edit distance, for "did you mean" on misspelt names (short strings only). */
static size_t distance(const char *a, size_t la, const char *b, size_t lb)
{
    size_t row[64], prev, tmp;
    if (la >= WO_ARRAY_SIZE(row) || lb >= WO_ARRAY_SIZE(row))
        return SIZE_MAX;
    for (size_t j = 0; j <= lb; j++)
        row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        prev = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            tmp = row[j];
            row[j] = WO_MIN(WO_MIN(row[j] + 1, row[j - 1] + 1),
                            prev + (a[i - 1] != b[j - 1]));
            prev = tmp;
        }
    }
    return row[lb];
}

/* The known name closest to name[0..len), or NULL when none is close. */
static const char *closest_name(const char *name, size_t len)
{
    const char *best = NULL;
    size_t bestd = 4; /* more than 3 edits away is not a typo */
    for (size_t i = 0; i < wo_setting_ndefs; i++) {
        const char *n = wo_setting_defs[i].name;
        size_t d = distance(name, len, n, strlen(n));
        if (d < bestd) {
            bestd = d;
            best = n;
        }
    }
    return best;
}

static const char *env_lookup(char *const *envp, const char *name)
{
    size_t n = strlen(name);
    if (!envp)
        return NULL;
    for (; *envp; envp++)
        if (strncmp(*envp, name, n) == 0 && (*envp)[n] == '=')
            return *envp + n + 1;
    return NULL;
}

int wo_settings_parse(char *const *envp, struct wo_settings *out,
                      void (*report)(void *ud, const char *msg), void *ud)
{
    char accepted[160];
    int bad = 0;

    memset(out, 0, sizeof(*out));
    for (size_t i = 0; i < wo_setting_ndefs; i++) {
        const struct wo_setting_def *d = &wo_setting_defs[i];
        const char *v = env_lookup(envp, d->name);
        int r = apply(d, d->def, out, accepted, sizeof(accepted));
        if (r < 0) /* a bad default is a bug in the table above */
            abort();
        if (!v)
            continue;
        if (apply(d, v, out, accepted, sizeof(accepted)) < 0) {
            char q[128];
            quote(v, q, sizeof(q));
            report_fmt(report, ud, "%s=\"%s\" is not valid: expected %s; using the default \"%s\"",
                       d->name, q, accepted, d->def);
            apply(d, d->def, out, accepted, sizeof(accepted));
            bad++;
        } else {
            out->given[i / 64] |= UINT64_C(1) << (i % 64);
        }
    }
    /* Names that look like ours but are not in the table: most likely typos. */
    for (char *const *e = envp; e && *e; e++) {
        bool known = false;
        if (strncmp(*e, "WOFFLOAD_", 9) != 0)
            continue;
        for (size_t i = 0; i < wo_setting_ndefs && !known; i++) {
            size_t n = strlen(wo_setting_defs[i].name);
            known = strncmp(*e, wo_setting_defs[i].name, n) == 0 && (*e)[n] == '=';
        }
        if (!known) {
            const char *eq = strchr(*e, '=');
            size_t len = eq ? (size_t)(eq - *e) : strlen(*e);
            const char *near = closest_name(*e, len);
            report_fmt(report, ud,
                       "%.*s is not a libwoffload setting (see `woffload doctor --env`); ignored%s%s%s",
                       (int)WO_MIN(len, 64), *e, near ? "; did you mean " : "", near ? near : "",
                       near ? "?" : "");
        }
    }
    out->nerrors = bad;
    return bad;
}

bool wo_settings_given(const struct wo_settings *s, const char *name)
{
    for (size_t i = 0; i < wo_setting_ndefs; i++)
        if (strcmp(wo_setting_defs[i].name, name) == 0)
            return (s->given[i / 64] >> (i % 64)) & 1;
    return false;
}

static struct wo_settings settings;
static pthread_once_t settings_once = PTHREAD_ONCE_INIT;

/* Whether a file can be made at path: its deepest existing ancestor is a
 * folder this process may write (the folders below it are made when the
 * file is written). 0, or an errno. */
static int can_hold(const char *path)
{
    char dir[PATH_MAX];
    struct stat st;

    snprintf(dir, sizeof(dir), "%s", path);
    for (;;) {
        char *slash = strrchr(dir, '/');
        if (!slash)
            snprintf(dir, sizeof(dir), ".");
        else if (slash == dir)
            dir[1] = '\0';
        else
            *slash = '\0';
        if (stat(dir, &st) == 0)
            break;
        if (errno != ENOENT)
            return errno;
        if (!slash || slash == dir)
            return ENOENT;
    }
    if (!S_ISDIR(st.st_mode))
        return ENOTDIR;
    return access(dir, W_OK | X_OK) == 0 ? 0 : errno;
}

static void settings_init(void)
{
    extern char **environ;
    wo_settings_parse(environ, &settings, NULL, NULL);
    wo_log_set_level(settings.log_level);
    if (settings.log_file) {
        /* Opened once and kept: the log path writes to an fd, never opens. */
        int fd = open(settings.log_file, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0)
            wo_error("WOFFLOAD_LOG_FILE=\"%s\": cannot open: %s; logging to stderr",
                     settings.log_file, strerror(errno));
        else
            wo_log_set_fd(fd);
    }
    if (settings.fit_memo) {
        int e = can_hold(settings.fit_memo);
        if (e) {
            wo_error("WOFFLOAD_FIT_MEMO=\"%s\": no file can be made there: %s; fit's reserve: "
                     "auto starts from the default and keeps nothing",
                     settings.fit_memo, strerror(e));
            settings.fit_memo = ""; /* none: uvm/fit-memo.c reads and writes nothing */
        }
    }
}

const struct wo_settings *wo_settings(void)
{
    pthread_once(&settings_once, settings_init);
    return &settings;
}

void wo_settings_print(FILE *f, const struct wo_settings *s)
{
    for (size_t i = 0; i < wo_setting_ndefs; i++) {
        const struct wo_setting_def *d = &wo_setting_defs[i];
        const char *field = (const char *)s + d->offset;
        char cur[256];
        switch (d->type) {
        case WO_SETTING_BOOL: {
            bool b;
            memcpy(&b, field, sizeof(b));
            snprintf(cur, sizeof(cur), "%d", b);
            break;
        }
        case WO_SETTING_LEVEL: {
            int l;
            memcpy(&l, field, sizeof(l));
            snprintf(cur, sizeof(cur), "%s", wo_log_level_to_string(l));
            break;
        }
        case WO_SETTING_PATH: {
            const char *p;
            memcpy(&p, field, sizeof(p));
            snprintf(cur, sizeof(cur), "%s", p ? p : "(unset)");
            break;
        }
        default: {
            uint32_t u;
            memcpy(&u, field, sizeof(u));
            snprintf(cur, sizeof(cur), "%u", u);
            break;
        }
        }
        fprintf(f, "%-22s default %-14s now %-14s %s\n", d->name, *d->def ? d->def : "(unset)", cur,
                d->doc);
    }
}
