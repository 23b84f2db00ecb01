#!/usr/bin/env python3
"""bench/serve-plot.py: a PNG of a bench/serve.py run's memory samples (issue
40's soak): the server's RSS and its device memory against time, one
panel each, with the output tokens/s of the interval lines when the run
wrote them (--report-every).

    python3 bench/serve-plot.py RUN.json [--out RUN.png] [--phase N]

RUN.json is serve.py's --out of a run with --pid (its "memory"; with
--rates, each phase's: the last phase unless --phase N, 1-based). Needs
matplotlib; without it, says so and exits 3 (nothing else fails: the
figures are in the JSON). Exit 2: no memory samples in the file.
"""
import argparse
import json
import os
import sys


def phase_report(rep: dict, phase: int) -> dict:
    if "phases" in rep:
        ph = rep["phases"]
        if not ph:
            return {}
        return ph[(phase - 1) if phase else -1]
    return rep


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", help="serve.py's JSON report")
    p.add_argument("--out", help="the PNG (default: RUN with .png)")
    p.add_argument("--phase", type=int, default=0, help="with --rates: which phase, 1-based (default the last)")
    p.add_argument("--title", help="the figure's title (default: the file's name and the run's rate)")
    a = p.parse_args()
    with open(a.run) as f:
        rep = json.load(f)
    ph = phase_report(rep, a.phase)
    mem = ph.get("memory") or {}
    samples = mem.get("samples") or []
    if not samples:
        sys.stderr.write(f"serve-plot: {a.run}: no memory samples (run serve.py with --pid)\n")
        return 2
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.stderr.write("serve-plot: matplotlib is not importable here: no PNG (the samples are in the JSON; "
                         "apt-get install python3-matplotlib, or pip install matplotlib)\n")
        return 3
    out = a.out or os.path.splitext(a.run)[0] + ".png"
    cols = mem.get("columns") or ["t", "rss_kib", "gpu_pid_mib", "gpu_all_mib"]
    idx = {c: i for i, c in enumerate(cols)}
    t = [s[idx["t"]] / 60.0 for s in samples]

    def series(name: str, scale: float):
        return [None if s[idx[name]] is None else s[idx[name]] * scale for s in samples]

    rss = series("rss_kib", 1 / 1024)
    gpu = series("gpu_pid_mib", 1.0)
    if all(v is None for v in gpu):
        gpu, gpu_label = series("gpu_all_mib", 1.0), "device memory, every compute process (MiB)"
    else:
        gpu_label = "device memory of the pid (MiB)"
    intervals = ph.get("intervals") or []
    panels = 3 if intervals else 2
    fig, ax = plt.subplots(panels, 1, figsize=(9, 2.6 * panels), sharex=True)
    ax[0].plot(t, [v if v is not None else float("nan") for v in rss], lw=1)
    ax[0].set_ylabel("RSS (MiB)")
    dev = series("gpu_dev_mib", 1.0) if "gpu_dev_mib" in idx else []
    if any(v is not None for v in dev):
        # the device's used memory: what the per-process figure leaves out
        # (the shim's managed memory resident on the device) counts there
        ax[1].plot(t, [v if v is not None else float("nan") for v in dev], lw=1, color="tab:blue")
        gpu_label += "; blue: the device's used memory (MiB)"
    if any(v is not None for v in gpu):
        ax[1].plot(t, [v if v is not None else float("nan") for v in gpu], lw=1, color="tab:green")
    elif not any(v is not None for v in dev):
        ax[1].text(0.5, 0.5, f"no device memory samples (source: {mem.get('gpu_source', 'none')})",
                   ha="center", va="center", transform=ax[1].transAxes)
    ax[1].set_ylabel("MiB")
    ax[1].set_title(gpu_label, fontsize=9)
    if intervals:
        ax[2].step([x["t"] / 60.0 for x in intervals], [x["tok_s"] for x in intervals], where="pre",
                   color="tab:orange")
        ax[2].set_ylabel("output tok/s")
    ax[-1].set_xlabel("minutes since the phase's first arrival")
    rate = ph.get("rate") or (rep.get("config") or {}).get("rate")
    load = (f", {ph['closed']} requests in flight" if ph.get("closed")
            else f", {rate:g} req/s" if isinstance(rate, (int, float)) else "")
    fig.suptitle(a.title or f"{os.path.basename(a.run)}: pid {mem.get('pid')}" + load, fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    print(f"serve-plot: wrote {out} ({len(samples)} samples over {t[-1]:.1f} min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
