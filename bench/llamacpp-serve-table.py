#!/usr/bin/env python3
"""bench/llamacpp-serve-table.py: the rows of bench/llamacpp-serve-rows.sh
side by side, a table a phase, each figure beside the reference row's.

    python3 bench/llamacpp-serve-table.py OUTROOT [--ref plain] [--rows "plain shim-empty ..."]
    python3 bench/llamacpp-serve-table.py --peak-mib OUTROOT/pP-ROW   (one row's peak, below)

OUTROOT holds the rows' folders pP-ROW (and pP-ROW.N, the same row run
again: bench/llamacpp-serve-rows.sh's ROWS may name a row more than once,
to interleave runs). A phase is a rate of the sweep (req/s, Poisson) or cN,
a closed loop of N requests in flight: the server's throughput at N
concurrent requests, the figure the issue's targets name. Each row gives,
over the phase's steady window: the client's output tokens/s, the tokens
the server processed a second (prompt + generated, from its /metrics), ITL
and TTFT p50/p99, errors, and the most device memory the server's process
held; with repeats, the median and [min-max] of the runs. "x ref"
is a row's median over the reference row's (--ref, default plain, else the
first row): throughput and ITL p99 as ratios, the device memory too, so
that a comparison at equal memory shows whether it was one. Greedy: the
greedy prompts sent alone to the idle server after the sweep, against
plain's (every run of the row). Below the tables, the shim's books of each
run that left its stats (stats.json or stats.json.gz): what fit chose and
what was copied.

The device memory is the devices' used memory less what they used before
the server started (bench/llamacpp-serve.sh writes it to the row's
gpu-idle-mib), the server being the one process on them: the per-process
figure (NVML's, nvidia-smi's) leaves out managed memory resident on the
device, which is where the shim keeps llama.cpp's device tensors (its one
model buffer is managed memory): on an H100, a `--n-cpu-moe`-like policy's
server showed 5,174 MiB per process and held 16,056. A row without that
file (recorded before 2026-12-05) gives the per-process figure, marked `*`.

--peak-mib ROWDIR prints the most device memory the row's server process
held in any phase (MiB, an integer), or fails saying why: the rows script's
FIT=from:ROW, a `--fit` row at the same device memory as ROW.
"""
import argparse
import json
import os
import re
import statistics
import sys
from typing import Any, Dict, List, Optional, Tuple


def load_rows(root: str) -> Dict[Tuple[int, str], List[Dict[str, Any]]]:
    """(P, row) -> every run's sweep.json, in the order of their folders."""
    rows: Dict[Tuple[int, str], List[Dict[str, Any]]] = {}
    for d in sorted(os.listdir(root)):
        m = re.fullmatch(r"p(\d+)-(.+?)(?:\.(\d+))?", d)
        path = os.path.join(root, d, "sweep.json")
        if not m or not os.path.isfile(path):
            continue
        try:
            with open(path) as f:
                rep = json.load(f)
        except (OSError, ValueError) as e:
            sys.stderr.write(f"llamacpp-serve-table: {path}: {e}: skipped\n")
            continue
        rep["_run"] = d
        rep["_gpu_idle"] = gpu_idle(os.path.join(root, d))
        rows.setdefault((int(m.group(1)), m.group(2)), []).append(rep)
    return rows


def phase_label(ph: Dict[str, Any]) -> str:
    return f"c{ph['closed']}" if ph.get("closed") else f"{ph['rate']:g}"


def gpu_idle(rowdir: str) -> Optional[float]:
    """The devices' used memory before the row's server started (MiB), or
    None when the row did not record it."""
    try:
        with open(os.path.join(rowdir, "gpu-idle-mib")) as f:
            return float(f.read().strip())
    except (OSError, ValueError):
        return None


def gpu_mib(mem: Dict[str, Any], idle: Optional[float]) -> Tuple[Optional[float], bool]:
    """The most device memory the server held in a phase, MiB, and whether
    it is the per-process figure (no idle figure, or no device figure)."""
    dev = (mem.get("gpu_dev_mib") or {}).get("max")
    if idle is not None and dev is not None:
        return max(0.0, dev - idle), False
    return (mem.get("gpu_pid_mib") or {}).get("max"), True


def figures(ph: Dict[str, Any], idle: Optional[float] = None) -> Dict[str, Optional[float]]:
    s = ph["summary"]
    sv = ph.get("server") or {}
    mem = ph.get("memory") or {}
    gpu, _ = gpu_mib(mem, idle)
    return {
        "tok_s": (s.get("steady") or {}).get("output_tok_s"),
        "processed": sv.get("processed_tok_s"),
        "itl50": s["itl_ms"].get("p50"), "itl99": s["itl_ms"].get("p99"),
        "ttft50": s["ttft_ms"].get("p50"), "ttft99": s["ttft_ms"].get("p99"),
        "errors": float(sum((s.get("errors") or {}).values())),
        "gpu": gpu,
    }


def agg(xs: List[Optional[float]]) -> Tuple[Optional[float], str]:
    """The median of the runs that have the figure, and how to print it."""
    v = [x for x in xs if x is not None]
    if not v:
        return None, "-"
    med = statistics.median(v)
    txt = num(med)
    if min(v) != max(v):
        txt += f" [{num(min(v))}-{num(max(v))}]"
    return med, txt


def num(x: float) -> str:
    return f"{x:.0f}" if abs(x) >= 100 or x == int(x) else f"{x:.1f}"


def ratio(a: Optional[float], b: Optional[float]) -> str:
    return f"{a / b:.3f}" if a is not None and b else "-"


def greedy(reps: List[Dict[str, Any]]) -> str:
    out = []
    for r in reps:
        g = r.get("greedy_alone") or {}
        if "identical" in g:
            txt = f"{g['identical']}/{g['compared']}"
            if g.get("different"):
                txt += f" (differ: {','.join(g['different'])})"
            if g.get("missing"):
                txt += f" (missing: {','.join(g['missing'])})"
        elif "recorded" in g:
            txt = "reference"
        else:
            txt = "-"
        if (g.get("idle_before") or {}).get("idle") is False:
            txt += " (server busy)"
        out.append(txt)
    return "; ".join(out)


def table(rows: Dict[Tuple[int, str], List[Dict[str, Any]]], order: List[str], ref: str) -> List[str]:
    lines: List[str] = []
    starred = False
    for p in sorted({k[0] for k in rows}):
        names = [n for n in order if (p, n) in rows] + sorted(n for q, n in rows if q == p and n not in order)
        refname = ref if (p, ref) in rows else names[0]
        labels: List[str] = []
        for n in names:
            for rep in rows[(p, n)]:
                for ph in rep.get("phases") or []:
                    if phase_label(ph) not in labels:
                        labels.append(phase_label(ph))
        for lab in labels:
            lines += ["", f"### --parallel {p}, phase {lab}" + (" (closed loop: "
                      f"{lab[1:]} requests in flight)" if lab.startswith("c") else " req/s (Poisson arrivals)"), "",
                      f"| row | runs | output tok/s | x {refname} | server tok/s (prompt + generated) | x {refname} "
                      f"| ITL p50 / p99 ms | p99 x {refname} | TTFT p50 / p99 ms | errors | GPU MiB, server (max) "
                      f"| x {refname} | greedy alone |",
                      "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
            base: Dict[str, Optional[float]] = {}
            for n in [refname] + [x for x in names if x != refname]:
                runs = [(rep, ph) for rep in rows[(p, n)] for ph in rep.get("phases") or [] if phase_label(ph) == lab]
                if not runs:
                    continue
                f = [figures(ph, rep.get("_gpu_idle")) for rep, ph in runs]
                per_pid = any(gpu_mib(ph.get("memory") or {}, rep.get("_gpu_idle"))[1] for rep, ph in runs)
                med = {k: agg([x[k] for x in f]) for k in f[0]}
                starred |= per_pid
                if n == refname:
                    base = {k: v[0] for k, v in med.items()}
                lines.append(
                    f"| {n} | {len(runs)} | {med['tok_s'][1]} | {ratio(med['tok_s'][0], base.get('tok_s'))} "
                    f"| {med['processed'][1]} | {ratio(med['processed'][0], base.get('processed'))} "
                    f"| {med['itl50'][1]} / {med['itl99'][1]} | {ratio(med['itl99'][0], base.get('itl99'))} "
                    f"| {med['ttft50'][1]} / {med['ttft99'][1]} | {med['errors'][1]} | {med['gpu'][1]}{'*' if per_pid else ''} "
                    f"| {ratio(med['gpu'][0], base.get('gpu'))} | {greedy([rep for rep, _ in runs])} |")
    if starred:
        lines += ["", "`*`: the server process's own device memory (the row has no gpu-idle-mib): it "
                  "leaves out managed memory resident on the device."]
    return lines


def shim_stats(rowdir: str) -> Optional[Dict[str, Any]]:
    """The shim's stats at exit of the row's server (stats.json, or its
    gzip as the results keep it), None for a row without them."""
    import gzip
    for name, opener in (("stats.json", open), ("stats.json.gz", gzip.open)):
        path = os.path.join(rowdir, name)
        if os.path.isfile(path):
            try:
                with opener(path, "rt") as f:
                    return json.load(f)
            except (OSError, ValueError, EOFError) as e:
                sys.stderr.write(f"llamacpp-serve-table: {path}: {e}: skipped\n")
    return None


def step_s(sx: Dict[str, Any]) -> str:
    """A step that staged: its mean time and the bytes it copied (the
    executor's staged bytes over its staging steps), "-" without them."""
    n, ms, b = sx.get("staging_steps"), sx.get("staging_step_ms"), sx.get("staged_bytes")
    if not n or ms is None or b is None:
        return "-"
    return f"{ms:.1f}, {b / n / 2**30:.2f}"


def books(root: str, rows: Dict[Tuple[int, str], List[Dict[str, Any]]]) -> List[str]:
    """The shim's own figures of each run that left its stats: what fit
    chose (MiB: the budget, weights on the device, room for staging slots
    and picked copies' buffers, the reserve, the process's contexts that
    came out of it) and what was copied (the executor's staging copies, the
    picked copies), how often the router's picks took a streamed tensor
    out of streaming (stream.claim_unselects; in parentheses those whose
    slot still held their copy), a staging step's time and bytes, and the
    copy engine's rate while it copied (stream.copies_busy_gbs)."""
    def mib(b: Optional[float]) -> str:
        return "-" if b is None else f"{b / 1048576:,.0f}"

    lines: List[str] = []
    for _, reps in sorted(rows.items()):
        for rep in reps:
            st = shim_stats(os.path.join(root, rep["_run"]))
            if not st:
                continue
            fit = st.get("fit") or {}
            if not lines:
                lines += ["", "### The shim's books (its stats at exit; MiB)", "",
                          "| run | fit budget | weights on the device | slots' room (lent) | picked copies' room "
                          "| reserve | contexts | staging copies | picked copies "
                          "| taken out by picks | staging step: ms, GiB copied | copy engine GB/s |",
                          "|---|---|---|---|---|---|---|---|---|---|---|---|"]
            lent = fit.get("lent_bytes")
            sx = st.get("stream") or {}
            out = sx.get("claim_unselects")
            out_s = "-" if out is None else f"{out} ({sx.get('claim_unselects_staged', '-')})"
            lines.append(
                f"| {rep['_run']} | {mib(fit.get('budget'))} | {mib(fit.get('device_bytes'))} "
                f"| {mib(fit.get('staging_bytes'))}{f' ({mib(lent)})' if lent else ''} "
                f"| {mib(fit.get('picks_bytes'))} | {mib(fit.get('reserve_bytes'))} "
                f"| {mib(fit.get('context_bytes'))} | {sx.get('staged', '-')} "
                f"| {(st.get('picks') or {}).get('staged', '-')} | {out_s} "
                f"| {step_s(sx)} | {sx.get('copies_busy_gbs', '-')} |")
    where = [w for w in (off_device(os.path.join(root, rep["_run"]))
                         for _, reps in sorted(rows.items()) for rep in reps) if w]
    if where:
        lines += ["", "### Where the weights off the device were (the shim's stats: names, "
                  "and the names the server freed before exit)", ""] + where
    return lines


def off_device(rowdir: str) -> Optional[str]:
    """One line: the layers (blk.N.) whose tensors the shim placed off the
    device in this run, by placement, with their bytes; None without stats."""
    import re
    st = shim_stats(rowdir)
    if not st:
        return None
    by: Dict[str, Dict[str, Any]] = {}
    for n in (st.get("names") or []) + (st.get("released_names") or []):
        pl = n.get("placement")
        if pl in (None, "device"):
            continue
        b = by.setdefault(pl, {"layers": set(), "bytes": 0, "names": 0})
        m = re.match(r"^blk\.([0-9]+)\.", n.get("name", ""))
        if m:
            b["layers"].add(int(m.group(1)))
        b["bytes"] += n.get("bytes") or n.get("peak_bytes") or 0
        b["names"] += 1
    if not by:
        return f"- {os.path.basename(rowdir)}: " + (
            "nothing off the device" if "released_names" in st
            else "not recorded (stats from before released_names: no live names at exit)")
    return f"- {os.path.basename(rowdir)}: " + "; ".join(
        f"{pl}: layers {'|'.join(str(x) for x in sorted(b['layers'])) or '-'} "
        f"({b['bytes'] / 2**30:.2f} GiB in {b['names']} names)" for pl, b in sorted(by.items()))


def peak_mib(rowdir: str) -> int:
    """The most device memory the server process of the row in rowdir held
    in any phase (its sweep.json), MiB; ValueError when there is none."""
    path = os.path.join(rowdir, "sweep.json")
    try:
        with open(path) as f:
            rep = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: {e}")
    idle = gpu_idle(rowdir)
    mib = [figures(ph, idle)["gpu"] for ph in rep.get("phases") or []]
    mib = [m for m in mib if m]
    if not mib:
        raise ValueError(f"{path}: no device memory of the server process sampled")
    return int(max(mib))


def main(argv: Optional[List[str]] = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["--peak-mib"]:
        if len(argv) != 2:
            sys.stderr.write("usage: llamacpp-serve-table.py --peak-mib OUTROOT/pP-ROW\n")
            return 2
        try:
            print(peak_mib(argv[1]))
        except ValueError as e:
            sys.stderr.write(f"llamacpp-serve-table: {e}\n")
            return 1
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", help="the rows' folder (bench/llamacpp-serve-rows.sh's OUTROOT)")
    ap.add_argument("--ref", default="plain", help="the row the others are divided by (default %(default)s)")
    ap.add_argument("--rows", default="", help="the rows' order, space-separated (default: the reference first)")
    a = ap.parse_args(argv)
    if not os.path.isdir(a.root):
        ap.error(f"{a.root}: no such folder")
    rows = load_rows(a.root)
    if not rows:
        sys.stderr.write(f"llamacpp-serve-table: {a.root}: no pP-ROW/sweep.json\n")
        return 1
    order: List[str] = []
    for n in a.rows.split():
        n = re.sub(r"\.\d+$", "", n)
        if n not in order:
            order.append(n)
    print(f"# llama-server rows side by side ({a.root})")
    print("\n".join(table(rows, order, a.ref) + books(a.root, rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
