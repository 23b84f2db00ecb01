/* tools/woffload-replay.c: predicts what a policy does to a recorded run.
 *
 *   woffload-replay TRACE [--policy P] [--device MODEL] [--budget BYTES|PCT]
 *                   [--timeline OUT.json] [--no-prefetch] [--warmup N]
 *                   [--check RATIO] [--host-scale F | --host-step MS]
 *
 * Runs the trace through the policy's placements and the shim's own
 * prefetch planner against a device model (tools/replay.h), and prints the
 * predicted step time, PCIe bytes per step, stalls, the offline-optimal
 * bound and where the time goes per name. --check makes the exit status
 * say whether the prediction is within RATIO of the bound (the CI check of
 * docs/replay.md). Exit: 0 fine, 1 check failed, 2 usage or input error,
 * 77 check skipped (no repeating step to measure). */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/trace.h"
#include "policy/policy.h"
#include "uvm/devmodel.h"
#include "tools/replay.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: woffload-replay TRACE [--policy P] [--device MODEL] [--budget BYTES|PCT%%]\n"
            "                       [--timeline OUT.json] [--no-prefetch] [--warmup N]\n"
            "                       [--check RATIO] [--top N] [--host-scale F | --host-step MS]\n"
            "Predicts step time, PCIe bytes, stalls and the offline-optimal bound of a\n"
            "recorded trace (plain or gzip-compressed .wot.gz) under a policy\n"
            "(docs/replay.md).\n"
            "  --policy P     placements from this policy (default: those the trace recorded)\n"
            "  --device MODEL device model file (default: the built-in H100, uvm/devmodel.c)\n"
            "  --budget B     device budget for managed ranges: bytes (\"8GiB\") or a share\n"
            "                 of the managed bytes (\"50%%\"); default: the policy's device_budget\n"
            "  --timeline F   write the predicted timeline as Chrome trace JSON (Perfetto)\n"
            "  --no-prefetch  managed ranges stay on the host (no prefetcher)\n"
            "  --warmup N     steps left out of the measurement (default: min(3, steps/4))\n"
            "  --check R      exit 1 unless predicted step time <= R x the offline schedule\n"
            "  --top N        names shown in the table (default 15)\n"
            "  --host-scale F the engine's own host work (launch pacing) F times the\n"
            "                 recorded run's: a slower (F > 1) or faster host\n"
            "  --host-step MS the host speed at which the all-GPU replay's decode step\n"
            "                 takes MS milliseconds: give the all-GPU decode step measured\n"
            "                 on the machine the prediction is for\n"
            "Exit status: 0 success; 2 usage or input error (a bad option, trace, policy or\n"
            "model); 1 failure (--check not met, or the replay itself failed).\n");
}

static const char *gb(double bytes, char *buf, size_t len)
{
    if (bytes >= 1e9)
        snprintf(buf, len, "%.2f GB", bytes / 1e9);
    else if (bytes >= 1e6)
        snprintf(buf, len, "%.1f MB", bytes / 1e6);
    else
        snprintf(buf, len, "%.0f B", bytes);
    return buf;
}

static const char *ms(double s, char *buf, size_t len)
{
    snprintf(buf, len, "%.3f ms", s * 1e3);
    return buf;
}

int main(int argc, char **argv)
{
    const char *trace = NULL, *policy_path = NULL, *device = NULL, *budget = NULL, *timeline = NULL;
    double check = 0, host_scale = 0, host_step = 0;
    unsigned warmup = UINT_MAX, top = 15;
    bool no_prefetch = false;
    struct wo_devmodel dm;
    struct wo_trace_data *d = NULL;
    struct wo_policy *pol = NULL;
    struct wo_replay_opts o;
    struct wo_replay_result res, ref;
    char err[512], b1[32], b2[32], b3[32], b4[32];
    FILE *tl = NULL;
    int r, ret = 2;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char **slot = NULL;

        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            return 0;
        }
        if (strcmp(a, "--no-prefetch") == 0) {
            no_prefetch = true;
            continue;
        }
        if (a[0] != '-') {
            if (trace) {
                fprintf(stderr, "woffload-replay: one trace at a time (got \"%s\" and \"%s\")\n", trace, a);
                return 2;
            }
            trace = a;
            continue;
        }
        if (strcmp(a, "--policy") && strcmp(a, "--device") && strcmp(a, "--budget") &&
            strcmp(a, "--timeline") && strcmp(a, "--check") && strcmp(a, "--warmup") &&
            strcmp(a, "--top") && strcmp(a, "--host-scale") && strcmp(a, "--host-step")) {
            fprintf(stderr, "woffload-replay: unknown option %s (see --help)\n", a);
            return 2;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "woffload-replay: %s needs a value\n", a);
            return 2;
        }
        if (strcmp(a, "--policy") == 0)
            slot = &policy_path;
        else if (strcmp(a, "--device") == 0)
            slot = &device;
        else if (strcmp(a, "--budget") == 0)
            slot = &budget;
        else if (strcmp(a, "--timeline") == 0)
            slot = &timeline;
        if (slot) {
            *slot = argv[++i];
            continue;
        }
        if (strcmp(a, "--host-scale") == 0 || strcmp(a, "--host-step") == 0) {
            char *end;
            double v = strtod(argv[++i], &end);

            bool scale = strcmp(a, "--host-scale") == 0;

            if (*end || !(v > 0) || v > (scale ? 20 : 1e6)) {
                fprintf(stderr, "woffload-replay: %s wants a positive number%s, got \"%s\"\n", a,
                        scale ? " up to 20" : " (milliseconds)", argv[i]);
                return 2;
            }
            *(scale ? &host_scale : &host_step) = v;
            continue;
        }
        if (strcmp(a, "--check") == 0 || strcmp(a, "--warmup") == 0 || strcmp(a, "--top") == 0) {
            char *end;
            double v = strtod(argv[++i], &end);

            if (*end || !(v >= 0) || v > 1e6) {
                fprintf(stderr, "woffload-replay: %s wants a non-negative number, got \"%s\"\n", a, argv[i]);
                return 2;
            }
            if (a[2] == 'c')
                check = v;
            else if (a[2] == 'w')
                warmup = (unsigned)v;
            else
                top = (unsigned)v;
            continue;
        }
        fprintf(stderr, "woffload-replay: unknown option %s (see --help)\n", a);
        return 2;
    }
    if (!trace) {
        usage(stderr);
        return 2;
    }

    wo_devmodel_default(&dm);
    if (device && wo_devmodel_load(device, &dm, err, sizeof(err)) < 0) {
        fprintf(stderr, "woffload-replay: device model: %s\n", err);
        return 2;
    }
    memset(&o, 0, sizeof(o));
    o.dm = &dm;
    o.warmup = warmup;
    o.no_prefetch = no_prefetch;
    if (budget) {
        size_t n = strlen(budget);
        uint64_t bytes;

        if (n > 1 && budget[n - 1] == '%') {
            char *end;
            double pct = strtod(budget, &end);

            if (end != budget + n - 1 || !(pct > 0) || pct > 100) {
                fprintf(stderr, "woffload-replay: --budget %s: a share wants 0 < PCT <= 100\n", budget);
                return 2;
            }
            o.budget_frac = pct / 100;
        } else if (wo_parse_size(budget, &bytes) < 0 || bytes == 0) {
            fprintf(stderr, "woffload-replay: --budget %s: want bytes (\"8GiB\") or a share (\"50%%\")\n", budget);
            return 2;
        } else {
            o.budget_bytes = bytes;
        }
    }
    if (policy_path) {
        struct wo_diags diags = {0};

        r = wo_policy_load_file(policy_path, NULL, &pol, &diags);
        wo_diags_print(&diags, stderr);
        wo_diags_clear(&diags);
        if (r < 0) {
            fprintf(stderr, "woffload-replay: %s: the policy did not load\n", policy_path);
            return 2;
        }
        o.policy = pol;
    }

    r = wo_trace_load(trace, 0, 0, &d);
    if (r == -EBADMSG) {
        fprintf(stderr, "woffload-replay: %s: corrupt or truncated at byte offset %llu: %s\n", trace,
                (unsigned long long)d->error_offset, d->error_text);
        goto out;
    }
    if (r < 0) {
        fprintf(stderr, "woffload-replay: %s: %s\n", trace, strerror(-r));
        goto out;
    }
    if (!d->has_footer)
        fprintf(stderr, "woffload-replay: %s: no footer (the recording was cut short); replaying what is there\n", trace);

    if (host_scale > 0 && host_step > 0) {
        fprintf(stderr, "woffload-replay: --host-scale and --host-step both set the host speed: give one\n");
        goto out;
    }
    if (host_step > 0) {
        r = wo_replay_host_scale_for(d, &o, host_step * 1e-3, &host_scale, err, sizeof(err));
        if (r < 0) {
            fprintf(stderr, "woffload-replay: %s: --host-step %g: %s\n", trace, host_step,
                    r == -ENOMEM ? "out of memory" : err);
            goto out;
        }
    }
    o.host_scale = host_scale;

    if (timeline) {
        tl = fopen(timeline, "w");
        if (!tl) {
            fprintf(stderr, "woffload-replay: %s: %s\n", timeline, strerror(errno));
            goto out;
        }
        o.timeline = tl;
    }
    r = wo_replay_run(d, &o, &res, err, sizeof(err));
    if (tl && fclose(tl) != 0)
        fprintf(stderr, "woffload-replay: %s: write failed\n", timeline);
    tl = NULL;
    if (r < 0) {
        fprintf(stderr, "woffload-replay: %s: %s\n", trace, r == -ENOMEM ? "out of memory" : err);
        /* the check is about steady-state steps: a single pass (a prefill)
         * has none, which the test harness reports as skipped (77) */
        if (r == -ENODATA && check > 0) {
            printf("check:         skipped: the trace has no repeating step\n");
            ret = 77;
        }
        goto out;
    }
    {
        struct wo_replay_opts ro = o;

        ro.all_device = true;
        ro.no_bound = true;
        ro.timeline = NULL;
        if (wo_replay_run(d, &ro, &ref, err, sizeof(err)) < 0)
            memset(&ref, 0, sizeof(ref));
    }

    printf("trace:         %s (%zu events, %llu launches, %llu steps; measured %llu after %u warm-up)\n",
           trace, d->nevents, (unsigned long long)res.launches, (unsigned long long)res.steps,
           (unsigned long long)res.window_steps, res.warmup);
    printf("device model:  %s\n", dm.name);
    printf("policy:        %s\n", policy_path ? policy_path : "(placements recorded in the trace)");
    printf("managed:       %s, budget %s (%.0f%%), prefetcher %s, peak resident %s\n",
           gb((double)res.managed_bytes, b1, sizeof(b1)), gb((double)res.budget, b2, sizeof(b2)),
           res.managed_bytes ? 100.0 * (double)res.budget / (double)res.managed_bytes : 0.0,
           no_prefetch ? "off" : "on", gb((double)res.max_resident, b3, sizeof(b3)));
    printf("step time:     %s predicted (%.1f steps/s); all on GPU %s; host pacing %s\n",
           ms(res.step_s, b1, sizeof(b1)), res.step_s > 0 ? 1 / res.step_s : 0.0,
           ref.step_s > 0 ? ms(ref.step_s, b2, sizeof(b2)) : "n/a", ms(res.cpu_step_s, b3, sizeof(b3)));
    if (res.median_step_s > 0)
        printf("median step:   %s predicted (the mean above includes phase changes in the window: "
               "a generate call's end, the next prefill); all on GPU %s\n",
               ms(res.median_step_s, b1, sizeof(b1)),
               ref.median_step_s > 0 ? ms(ref.median_step_s, b2, sizeof(b2)) : "n/a");
    if (res.decode_step_s > 0)
        printf("decode step:   %s predicted, mean of %llu decode steps; all on GPU %s; recorded %s\n",
               ms(res.decode_step_s, b1, sizeof(b1)), (unsigned long long)res.decode_steps,
               ref.decode_step_s > 0 ? ms(ref.decode_step_s, b2, sizeof(b2)) : "n/a",
               ms(res.recorded_decode_step_s, b3, sizeof(b3)));
    if (res.decode_step_s > 0)
        printf("decode PCIe:   %s a decode step (zero-copy reads %s), stalls %s\n",
               gb(res.decode_pcie_bytes, b1, sizeof(b1)), gb(res.decode_zc_bytes, b2, sizeof(b2)),
               ms(res.decode_stall_s, b3, sizeof(b3)));
    if (host_scale > 0 && host_scale != 1)
        printf("host speed:    the engine's own work %.3fx the recorded run's%s\n", host_scale,
               host_step > 0 ? " (--host-step: the all-GPU decode step it gives)" : "");
    if (res.recorded_median_step_s > 0)
        /* a check of the step finder, not of the model: under the recorded
         * placements the pacing pass reproduces the run by construction */
        printf("recorded:      %s median step in the recorded run (same steps); predicted / recorded = %.3f\n",
               ms(res.recorded_median_step_s, b1, sizeof(b1)),
               res.median_step_s / res.recorded_median_step_s);
    if (res.oracle_step_s > 0)
        printf("offline:       %s clairvoyant static schedule; predicted / offline = %.3f\n",
               ms(res.oracle_step_s, b1, sizeof(b1)), res.step_s / res.oracle_step_s);
    if (res.bound_step_s > 0)
        printf("bound:         %s lower bound on any schedule; predicted / bound = %.3f\n",
               ms(res.bound_step_s, b1, sizeof(b1)), res.step_s / res.bound_step_s);
    printf("PCIe / step:   %s (zero-copy reads %s, prefetch %s, copies %s); evicted %s\n",
           gb(res.pcie_bytes_step, b1, sizeof(b1)), gb(res.zc_bytes_step, b2, sizeof(b2)),
           gb(res.prefetch_bytes_step, b3, sizeof(b3)), gb(res.copy_bytes_step, b4, sizeof(b4)),
           gb(res.evict_bytes_step, err, sizeof(err)));
    if (res.stream_bytes_step > 0)
        printf("streamed:      %s a step staged into device slots (prefetch mode %s: each "
               "host range copied once a step ahead of its launches)\n",
               gb(res.stream_bytes_step, b1, sizeof(b1)), res.auto_streamed ? "auto" : "stream");
    if (res.pick_bytes_step > 0 && res.pick_engine_bytes_step > 0)
        printf("picked:        %s a step copied over PCIe by picked staging (the trace's PICKS "
               "figures: each expert tensor's picked rows not from its hot experts), %s of it "
               "by the copy engine before the launches and the rest by the copy kernel (in the "
               "zero-copy reads above)\n",
               gb(res.pick_bytes_step, b1, sizeof(b1)),
               gb(res.pick_engine_bytes_step, b2, sizeof(b2)));
    else if (res.pick_bytes_step > 0)
        printf("picked:        %s a step copied over PCIe by picked staging (the trace's PICKS "
               "figures: each expert tensor's picked rows not from its hot experts, read by the "
               "copy kernel; in the zero-copy reads above)\n",
               gb(res.pick_bytes_step, b1, sizeof(b1)));
    if (res.auto_weighed)
        printf("auto:          %s (the decode step %s: %s)\n",
               res.auto_streamed ? "host ranges streamed, the step-time rule keeps them"
                                 : "host ranges read in place, the step-time rule would not keep "
                                   "them streamed",
               res.auto_streamed ? "read in place" : "streamed",
               ms(res.auto_other_step_s, b1, sizeof(b1)));
    printf("stalls / step: %s (managed misses read over PCIe, waits for prefetches%s)\n",
           ms(res.stall_s_step, b1, sizeof(b1)), res.stream_bytes_step > 0 ? ", for staging" : "");
    if (res.managed_bytes && !no_prefetch) {
        /* the planner's cost rule (uvm/cost.h) on the window's reads and moves */
        printf("moves / step:  in %s, out %s (%.1f%% of the budget moved in)\n",
               gb(res.prefetch_bytes_step, b1, sizeof(b1)),
               gb(res.evict_bytes_step, b2, sizeof(b2)),
               res.budget ? 100.0 * res.prefetch_bytes_step / (double)res.budget : 0.0);
        printf("cost rule:     managed reads in place %s a step, as planned %s (plan / in place = "
               "%.3f)\n",
               ms(res.cost_inplace_s, b1, sizeof(b1)), ms(res.cost_plan_s, b2, sizeof(b2)),
               res.cost_inplace_s > 0 ? res.cost_plan_s / res.cost_inplace_s : 0.0);
        if (res.churn)
            printf(
                "warning:       the planner moved more than the device budget in over %u steps: "
                "the "
                "working set does not fit and residency cycles (each cycle costs ~3x an in-place "
                "read); raise device_budget\n",
                WO_PLAN_CHURN_STEPS);
    }
    printf("\nwhere the time goes, per step (kernel read time at model rates):\n");
    printf("  %-48s %-8s %10s %10s %5s %10s %10s %10s\n", "name", "place", "bytes", "read", "mult",
           "time", "stall", "prefetch");
    for (size_t i = 0; i < res.nnames && i < top; i++) {
        const struct wo_replay_name *n = &res.names[i];
        double rd = n->hbm_bytes + n->zc_bytes + n->hit_bytes + n->miss_bytes;
        char nb[49];

        snprintf(nb, sizeof(nb), "%s", strlen(n->name) > 48 ? n->name + strlen(n->name) - 48 : n->name);
        char mu[16] = "-";

        if (n->mult_distinct > 0)
            snprintf(mu, sizeof(mu), "%.1fx", n->mult_read / n->mult_distinct);
        printf("  %-48s %-8s %10s %10s %5s %10s %10s %10s\n", nb, wo_placement_to_string(n->place),
               gb((double)n->bytes, b1, sizeof(b1)), gb(rd, b2, sizeof(b2)), mu,
               ms(n->read_s, b3, sizeof(b3)), ms(n->stall_s, b4, sizeof(b4)),
               gb(n->prefetched, err, sizeof(err)));
    }
    if (res.nnames > top)
        printf("  ... %zu more names (--top N)\n", res.nnames - top);
    ret = 0;
    if (check > 0) {
        /* the offline-optimal reference: the best schedule that knows the
         * future we can construct, never below the lower bound */
        double off = WO_MAX(res.oracle_step_s, res.bound_step_s);

        if (off <= 0) {
            printf("check:         FAILED: no offline schedule to compare with (no managed ranges?)\n");
            ret = 1;
        } else if (res.step_s > check * off) {
            printf("check:         FAILED: predicted %.3f x the offline schedule, more than %.3f\n",
                   res.step_s / off, check);
            ret = 1;
        } else {
            printf("check:         ok: predicted %.3f x the offline schedule (limit %.3f)\n",
                   res.step_s / off, check);
        }
    }
    wo_replay_result_free(&res);
    wo_replay_result_free(&ref);
out:
    if (tl)
        fclose(tl);
    wo_trace_data_free(d);
    wo_policy_free(pol);
    return ret;
}
