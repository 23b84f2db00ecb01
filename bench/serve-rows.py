#!/usr/bin/env python3
"""bench/serve-rows.py: issue 20's serving rows on the GPU machine, one
model load per row, several arrival rates a row.

    python3 bench/serve-rows.py --out OUT [--build build-gpu] [--model moe8] [--rates 1,3,10]
        [--duration 15] [--rows plain,empty,host,managed] [--smoke] [--dry-run] [--deadline 520]

Each row is a fresh process of bench/serve.py --inprocess e2e:MODEL --rates
R1,R2,R3 (transformers' continuous-batching manager in the load generator's
process, bench/serve_engine.py): the phases run one after another on the
same engine, each with its own report and its own shim-stats delta. Rows,
in this order:

- plain: no shim, everything on the GPU (the all-GPU row); records the
  greedy outputs (--record-greedy) the other rows check (--greedy-check);
- empty: under woffload-run with the empty policy (the shim's own cost);
- host: every expert `host` (e2e.py's experts-host-all);
- managed: every expert `managed` within half the experts' bytes, default
  prefetch mode (the policy e2e.py's continuous-batching rows use for the
  model: experts-managed-6g for moe8).

The shim rows run under build/tools/woffload-run with the automatic Python
hook, as bench/e2e.py runs its scenarios; the policies are e2e.py's
(POLICIES), written into OUT. Writes OUT/serve-rows-STAMP.md (one table:
row, rate, throughput, TTFT/ITL p50/p99, the running batch, errors, greedy,
the shim's hit rate, PCIe bytes a step, read multiplicity, events dropped;
then the issue's targets), OUT/serve-rows-STAMP.json, and each row's
serve.py JSON and log. --smoke: one short phase a row (a first check).
--dry-run: print the policies and command lines, run nothing.

The driver itself never touches CUDA.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import e2e  # noqa: E402  (MODELS, POLICIES, SCENARIOS, machine(): no torch at import)

ROWS = ("plain", "empty", "host", "managed")

# The request shape of e2e.py's continuous-batching rows (CB: prompts of
# 16-128 tokens, 32 new tokens), whose tok/s on the H100 give the rates:
# moe8 all-GPU 430 tok/s = 13 req/s, experts host 133 tok/s = 4.2 req/s,
# managed 151 tok/s = 4.7 req/s (e2e-20261125-121146, before the cost rule;
# 218 = 6.8 req/s on the H200 after it, e2e-20261125-124345). 1 req/s is
# light load, 3 below the offloaded rows' saturation, 10 past it for both
# (0.75x the all-GPU row's).
PROMPT_LEN = "uniform:16:128"
OUTPUT_LEN = "fixed:32"
RATES = "1,3,10"
SMOKE_RATE = "3"


def shim_policy(model: str, row: str) -> Optional[str]:
    """The name of e2e.POLICIES a row runs with; None for plain. host and
    managed are the policies of e2e.py's continuous-batching rows for the
    model (cb_rows), so both benchmarks place the same bytes."""
    if row == "plain":
        return None
    if row == "empty":
        return "empty"
    suffix = {"host": "-shim-experts-host-all", "managed": "-shim-experts-managed-half"}[row]
    for s in e2e.SCENARIOS:
        if (s.get("cb") and s["model"] == model and not s.get("skew") and s["name"].startswith("cb-")
                and s["name"].endswith(suffix)):
            return s["policy"]
    raise SystemExit(f"serve-rows.py: bench/e2e.py has no continuous-batching {row} row for model {model!r}")


def row_command(args: argparse.Namespace, row: str, paths: Dict[str, str], greedy: str) -> List[str]:
    serve = [sys.executable, os.path.join(HERE, "serve.py"), "--inprocess", f"e2e:{args.model}",
             "--rates", args.rates, "--duration", str(args.duration), "--prompt-len", args.prompt_len,
             "--output-len", args.output_len, "--warmup-requests", "1", "--drain-timeout", str(args.drain_timeout),
             "--cb-max-batch-tokens", str(args.max_batch_tokens), "--report-every", str(args.report_every),
             "--greedy-n", str(args.greedy_n), "--out", paths["json"]]
    # the all-GPU row is the reference; a row with no reference to check
    # against (plain failed, or was not run) runs without the check
    if row == "plain":
        serve += ["--record-greedy", greedy]
    elif os.path.exists(greedy) or args.dry_run:
        serve += ["--greedy-check", greedy, "--greedy-load-check", "report"]
    pol = shim_policy(args.model, row)
    if pol is None:
        return serve
    launcher = os.path.join(args.build, "tools", "woffload-run")
    return [launcher, "--policy", paths["policy"], "--log", args.log, "--stats", paths["stats"], "--"] + serve


def dry_check(cmd: List[str], pol: Optional[str]) -> None:
    """--dry-run: serve.py parses the options the row passes, and where the
    launcher is built it checks the policy and prints what it would set
    (woffload-run --dry-run, with the policy in a temporary file)."""
    import tempfile
    import serve
    i = next(k for k, c in enumerate(cmd) if c.endswith(os.path.join("bench", "serve.py")))
    a = serve.parse_args(cmd[i + 1:])  # exits 2 with argparse's message on a bad option
    print(f"#   serve.py parses: --inprocess {a.inprocess}, rates {a.rates}, {a.duration:g} s a phase, "
          f"drain {a.drain_timeout:g} s, greedy {'record' if a.record_greedy else 'check'}")
    if pol is None:
        return
    if not os.access(cmd[0], os.X_OK):
        print(f"#   {cmd[0]} is not built here: the launcher was not run")
        return
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, f"{pol}.yaml")
        with open(path, "w") as f:
            f.write(e2e.policy_text(pol))
        # the policy and the stats file in the temporary directory: --out
        # need not exist for a dry run, and the launcher checks both paths
        opts = cmd[1:cmd.index("--")]
        opts[opts.index("--policy") + 1] = path
        opts[opts.index("--stats") + 1] = os.path.join(d, "stats.json")
        dry = [cmd[0]] + opts + ["--dry-run"] + cmd[cmd.index("--"):]
        p = subprocess.run(dry, capture_output=True, text=True, timeout=60)
        for line in (p.stdout + p.stderr).splitlines():
            print(f"#   woffload-run --dry-run: {line}")
        if p.returncode != 0:
            raise SystemExit(f"serve-rows.py: woffload-run refused the {pol} row (exit {p.returncode})")


def run_row(cmd: List[str], env: Dict[str, str], log: str, timeout: float, cpus: Optional[List[int]]) -> Dict[str, Any]:
    """One row's process, its output into its log. Past the timeout it gets
    SIGTERM, then SIGKILL: serve.py writes its JSON after every phase, so
    the phases it finished are kept."""
    t0 = time.time()
    pre = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    with open(log, "w") as f:
        f.write("$ " + " ".join(shlex.quote(c) for c in cmd) + "\n")
        f.flush()
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, preexec_fn=pre)
        try:
            rc: Optional[int] = p.wait(timeout=max(1.0, timeout))
            why = None
        except subprocess.TimeoutExpired:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            rc, why = p.returncode, f"stopped after {timeout:.0f} s (--deadline)"
    return dict(rc=rc, wall_s=round(time.time() - t0, 1), stopped=why)


def fmt(v: Any, spec: str = ".1f") -> str:
    return "–" if v is None else format(v, spec)


def pair(d: Dict[str, Any]) -> str:
    return f"{fmt(d.get('p50'), '.0f')} / {fmt(d.get('p99'), '.0f')}"


def greedy_cell(g: Optional[Dict[str, Any]]) -> str:
    if not g:
        return "–"
    if "recorded" in g:
        return "ref" if g.get("ok") else "ref (incomplete)"
    s = f"{g.get('identical')}/{g.get('compared')}"
    if g.get("different") or not g.get("endpoint_ok", True):
        s = f"**{s}; differ: {','.join(g.get('different') or []) or 'endpoint'}**"
    if g.get("missing"):
        s += f" ({len(g['missing'])} failed or cut)"
    return s


def table(rows: List[Dict[str, Any]]) -> List[str]:
    out = ["| row | rate req/s | offered req/s | tok/s | req/s | TTFT p50 / p99 ms | ITL p50 / p99 ms | "
           "running batch | errors | greedy = plain | shim hit rate | PCIe GB/step | read mult. | events dropped |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        phases = (r.get("report") or {}).get("phases") or []
        if not phases:
            out.append(f"| {r['row']} | – | – | – | – | – | – | – | {r.get('status', 'no report')} |"
                       + " – |" * 5)
            continue
        for p in phases:
            s, sh = p["summary"], p.get("shim") or {}
            c, rq = s["concurrency"], s["requests"]
            # the engine's own active requests; the client's count of those
            # with a first token where the engine does not say
            batch = c.get("engine_active")
            batch_s = fmt(batch) if batch is not None else f"{fmt(c.get('sampled_decoding'))} (client)"
            err = str(rq["failed"]) + (f" (+{rq['cut']} cut)" if rq.get("cut") else "")
            if rq["failed"]:
                err += " " + ", ".join(f"{k} {v}" for k, v in sorted(s["errors"].items()))
            pcie = sh.get("pcie_bytes_per_step")
            out.append(
                f"| {r['row']} | {p['rate']:g} | {fmt(s.get('offered_rate'), '.2f')} | "
                f"{fmt(s['throughput'].get('output_tok_s'))} | {fmt(s['throughput'].get('requests_s'), '.2f')} | "
                f"{pair(s['ttft_ms'])} | {pair(s['itl_ms'])} | {batch_s} | {err} | "
                f"{greedy_cell(s.get('greedy'))} | {fmt(sh.get('hit_rate'), '.3f')} | "
                f"{fmt(pcie / 1e9 if pcie is not None else None, '.2f')} | "
                f"{fmt(sh.get('read_multiplicity_max'), '.2f')} | "
                f"{fmt(sh.get('events_dropped'), '.0f') if sh else '–'} |")
    return out


def targets(rows: List[Dict[str, Any]]) -> List[str]:
    """Issue 20's ratios, rate by rate, side by side in this run."""
    by: Dict[str, Dict[float, Dict[str, Any]]] = {}
    for r in rows:
        for p in (r.get("report") or {}).get("phases") or []:
            by.setdefault(r["row"], {})[p["rate"]] = p["summary"]
    lines = []

    def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
        return a / b if a is not None and b else None

    for rate in sorted(by.get("plain", {})):
        pl, em = by["plain"][rate], by.get("empty", {}).get(rate)
        if em:
            q = ratio(em["throughput"]["output_tok_s"], pl["throughput"]["output_tok_s"])
            lines.append(f"| empty / plain throughput at {rate:g} req/s | {fmt(q, '.3f')} | ≥ 0.98 | "
                         f"{'met' if q is not None and q >= 0.98 else 'NOT met'} |")
            q = ratio(em["ttft_ms"]["p99"], pl["ttft_ms"]["p99"])
            lines.append(f"| empty / plain TTFT p99 at {rate:g} req/s | {fmt(q, '.3f')} | ≤ 1.05 | "
                         f"{'met' if q is not None and q <= 1.05 else 'NOT met'} |")
            q = ratio(em["itl_ms"]["p50"], pl["itl_ms"]["p50"])
            lines.append(f"| empty / plain ITL p50 at {rate:g} req/s (the step time; no target) | "
                         f"{fmt(q, '.3f')} | | |")
    for rate in sorted(by.get("managed", {})):
        ho = by.get("host", {}).get(rate)
        if ho:
            q = ratio(by["managed"][rate]["throughput"]["output_tok_s"], ho["throughput"]["output_tok_s"])
            # the target is for saturation: host serving < 90% of what it is offered
            sat = (ho["throughput"].get("requests_s") or 0) < 0.9 * (ho.get("offered_rate") or 0)
            verdict = ("met" if q is not None and q >= 2 else "NOT met") if sat else "host not saturated: no target"
            lines.append(f"| managed / host throughput at {rate:g} req/s | {fmt(q, '.2f')} | ≥ 2 at saturation | "
                         f"{verdict} |")
    if not lines:
        return []
    return ["", "## Targets (issue 20)", "",
            "Below a row's saturation an open loop serves what it is offered, so a throughput ratio is ~1 "
            "by construction there: it tests the shim's cost only at a rate past plain's saturation; "
            "below it, TTFT and ITL carry the cost.", "",
            "| ratio | value | target | |", "|---|---|---|---|"] + lines


def report(args: argparse.Namespace, rows: List[Dict[str, Any]], started: str) -> str:
    eng = next(((r.get("report") or {}).get("engine") for r in rows if (r.get("report") or {}).get("engine")), {})
    mi = e2e.MODELS[args.model]["cfg"]
    lines = [
        f"# serve-rows: transformers continuous batching in-process under the shim ({started})",
        "",
        f"- machine: {args.machine.get('gpu')} ({args.machine.get('host')})",
        f"- date: {started}; git commit: {args.commit}",
        f"- command: `python3 bench/serve-rows.py {' '.join(shlex.quote(a) for a in sys.argv[1:])}`",
        f"- torch {eng.get('torch', '?')}, transformers {eng.get('transformers', '?')}; attention "
        f"{eng.get('attn_implementation', '?')}, CUDA graphs (varlen, decode) {eng.get('use_cuda_graph', '?')}, "
        f"paged cache {eng.get('cache_num_blocks', '?')} blocks of {eng.get('cache_block_size', '?')}, "
        f"max batch tokens {eng.get('cache_max_batch_tokens', '?')}",
        f"- model: e2e:{args.model} (bench/e2e.py MODELS: {mi['num_experts']} experts top-{mi['num_experts_per_tok']}, "
        f"{mi['num_hidden_layers']} layers, random weights, router and embeddings at std 1.0), default experts backend",
        f"- load: Poisson arrivals at each rate for {args.duration:g} s a phase, phases in the order given on one "
        f"engine; prompts {args.prompt_len} words (one token each), {args.output_len} output tokens, EOS off; "
        f"{args.greedy_n} greedy requests (48-token prompts, 24 tokens) spread over each phase (\"greedy = plain\": "
        f"under load, batched with whatever arrived around them, so a batched bf16 kernel may pick another token "
        f"with or without the shim), and the same {args.greedy_n} sent together to the idle engine after the last "
        f"phase (\"greedy alone\" in Rows: the same batch in every row, so those must be identical); at most "
        f"{args.drain_timeout:g} s of drain after a phase's last arrival, then the rest is cut",
        "- tok/s, req/s: completed output over the phase (first arrival to last completion); TTFT, ITL: "
        "completed requests; running batch: the engine scheduler's active requests sampled every 100 ms in "
        "the steady window; shim figures: woffload.stats() deltas over the phase (PCIe GB/step: host bytes "
        "read in place, managed misses and prefetches, staged copies, over the stepper's steps)",
        "",
    ] + table(rows) + targets(rows)
    lines += ["", "## Rows", ""]
    for r in rows:
        ga = (r.get("report") or {}).get("greedy_alone") or {}
        alone = ("recorded (the reference)" if "recorded" in ga else
                 f"{ga.get('identical')} of {ga.get('compared')} identical to plain"
                 + (f", differ: {','.join(ga.get('different') or [])}" if ga.get("different") else "")
                 if ga else "not run")
        lines.append(f"- {r['row']}: {r.get('status')}; greedy alone: {alone}; rc {r.get('rc')}, "
                     f"{fmt(r.get('wall_s'), '.0f')} s; `{r.get('command', '')}`")
    used = [shim_policy(args.model, r["row"]) for r in rows if r["row"] != "plain"]
    if used:
        lines += ["", "## Policies (bench/e2e.py POLICIES)"]
        for name in dict.fromkeys(used):
            lines += ["", f"`{name}.yaml`:", "```yaml", e2e.policy_text(name).rstrip(), "```"]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="results directory")
    ap.add_argument("--build", default=os.path.join(ROOT, "build-gpu"), help="meson build directory (woffload-run)")
    ap.add_argument("--model", default="moe8", help="a key of bench/e2e.py MODELS with continuous-batching rows")
    ap.add_argument("--rows", default=",".join(ROWS), help="comma list, in the order to run")
    ap.add_argument("--rates", default=RATES, help="requests/s of the phases (default %(default)s)")
    ap.add_argument("--duration", type=float, default=15.0, help="seconds of arrivals a phase")
    ap.add_argument("--prompt-len", default=PROMPT_LEN)
    ap.add_argument("--output-len", default=OUTPUT_LEN)
    ap.add_argument("--drain-timeout", type=float, default=40.0,
                    help="seconds a phase may take after its last arrival (serve.py --drain-timeout)")
    ap.add_argument("--max-batch-tokens", type=int, default=512)
    ap.add_argument("--report-every", type=float, default=5.0)
    ap.add_argument("--greedy-n", type=int, default=8)
    ap.add_argument("--smoke", action="store_true",
                    help=f"one short phase a row ({SMOKE_RATE} req/s for 6 s): a first check")
    ap.add_argument("--deadline", type=float, default=520.0,
                    help="seconds from the start: a row still running then is stopped, and no row starts with "
                         "fewer than --min-left left (default %(default)s)")
    ap.add_argument("--min-left", type=float, default=45.0)
    ap.add_argument("--cpus", help="A-B: pin every row to these cores (rows compare processes)")
    ap.add_argument("--log", default="info", help="WOFFLOAD_LOG of the shim rows")
    ap.add_argument("--commit", default=os.environ.get("WO_BENCH_COMMIT", "?"))
    ap.add_argument("--dry-run", action="store_true", help="print the policies and command lines, run nothing")
    args = ap.parse_args()

    if args.model not in e2e.MODELS:
        ap.error(f"--model {args.model}: not in bench/e2e.py MODELS ({', '.join(e2e.MODELS)})")
    rows = args.rows.split(",")
    bad = [r for r in rows if r not in ROWS]
    if bad:
        ap.error(f"unknown rows {bad}: expected some of {','.join(ROWS)}")
    if args.smoke:
        args.rates, args.duration, args.drain_timeout = SMOKE_RATE, 6.0, 20.0
    cpus = None
    if args.cpus:
        a, _, b = args.cpus.partition("-")
        cpus = list(range(int(a), int(b or a) + 1))
    for r in rows:
        shim_policy(args.model, r)  # every policy exists before anything runs

    t_start = time.time()
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    if not args.dry_run:
        os.makedirs(args.out, exist_ok=True)
    base = os.path.join(args.out, f"serve-rows-{stamp}")
    greedy = f"{base}-greedy-plain.json"
    env = dict(os.environ, PYTHONUNBUFFERED="1",
               # the shim places only what reaches cudaMalloc (docs/serving.md);
               # set for every row, so plain runs the same allocator
               PYTORCH_CUDA_ALLOC_CONF="expandable_segments:False")
    args.machine = {"host": "?", "gpu": "?"} if args.dry_run else e2e.machine()
    results: List[Dict[str, Any]] = []
    for row in rows:
        pol = shim_policy(args.model, row)
        paths = {"json": f"{base}-{row}.json", "log": f"{base}-{row}.log", "stats": f"{base}-{row}-stats.json",
                 "policy": os.path.join(args.out, f"{pol}.yaml") if pol else ""}
        if pol and not args.dry_run:
            with open(paths["policy"], "w") as f:
                f.write(e2e.policy_text(pol))
        cmd = row_command(args, row, paths, greedy)
        shown = " ".join(shlex.quote(c) for c in cmd)
        res: Dict[str, Any] = dict(row=row, policy=pol, command=shown)
        if args.dry_run:
            print(f"# {row}" + (f" (policy {pol}: {paths['policy']})" if pol else " (no shim)"))
            print(shown)
            dry_check(cmd, pol)
            continue
        left = args.deadline - (time.time() - t_start)
        if left < args.min_left:
            print(f"=== {row}: skipped: {left:.0f} s left of --deadline {args.deadline:g}", flush=True)
            results.append(dict(res, status=f"skipped: {left:.0f} s left of --deadline"))
            continue
        print(f"\n=== {row}: {shown}", flush=True)
        res.update(run_row(cmd, env, paths["log"], left, cpus))
        try:
            with open(paths["json"]) as f:
                res["report"] = json.load(f)
        except (OSError, ValueError):
            res["report"] = None
        n = len((res["report"] or {}).get("phases") or [])
        if res["stopped"]:
            res["status"] = res["stopped"]
        elif res["rc"] == 0:
            res["status"] = "ok"
        elif res["rc"] == 1 and n:  # serve.py's own verdict (a crash before any phase also exits 1)
            ga = (res["report"] or {}).get("greedy_alone") or {}
            res["status"] = ("exit 1: greedy tokens sent alone differ" if ga and not ga.get("ok")
                             else "exit 1 (see the log)")
        else:
            res["status"] = f"exit {res['rc']} (see the log)"
        res["status"] += f", {n} of {len(args.rates.split(','))} phases"
        print(f"{row}: {res['status']} in {res['wall_s']:.0f} s (log {paths['log']})", flush=True)
        if res["rc"] not in (0, 1):
            with open(paths["log"]) as f:
                print("".join(f.readlines()[-30:]), flush=True)
        results.append(res)
        # after every row: a run cut off later keeps the rows it finished
        text = report(args, results, started)
        with open(f"{base}.md", "w") as f:
            f.write(text)
        with open(f"{base}.json", "w") as f:
            json.dump(dict(machine=args.machine, started=started, commit=args.commit, argv=sys.argv,
                           rows=results), f, indent=1)
    if args.dry_run:
        print(f"# policies from bench/e2e.py POLICIES, written to {args.out} when run; "
              f"greedy reference {greedy}")
        return 0
    print("\n" + report(args, results, started))
    print(f"total {time.time() - t_start:.0f} s; wrote {base}.md, {base}.json and the rows' files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
