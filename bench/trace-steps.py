#!/usr/bin/env python3
"""bench/trace-steps.py: where a recorded run's decode steps went, host side.

Reads the Chrome JSON that `woffload-trace export-chrome` writes and splits
every step (launch to launch of the kernel that touches --anchor, by default
the LM head) into:

  own    the gaps between the engine's calls that do not follow a wait: the
         host's own work (Python, the framework, the launch path)
  waits  the gaps that follow a sync (or, in traces without sync events, a
         copy to the host): the wait for the GPU plus the host's work after it

Only steps with the most common launch count are kept (decode steps; a step
holding a generate call's end and the next prefill has ~3x the launches).
Prints, per trace, the median step, own and waits over the last --last such
steps. usage: trace-steps.py [--anchor NAME] [--last N] EXPORT.json ...
"""
import argparse
import collections
import json
import statistics
import sys
from typing import Any, Dict, List


def steps(path: str, anchor: str) -> List[Dict[str, float]]:
    with open(path) as f:
        d = json.load(f)
    ev = [e for e in d["traceEvents"] if e.get("ph") == "i" and e.get("cat") in ("launch", "copy", "sync")]
    ev.sort(key=lambda e: e["ts"])
    has_sync = any(e["cat"] == "sync" for e in ev)

    def is_wait(e: Any) -> bool:
        return e["cat"] == "sync" if has_sync else (e["cat"] == "copy" and "D2H" in e["name"])

    marks = [i for i, e in enumerate(ev) if e["cat"] == "launch" and anchor in json.dumps(e.get("args", {}))]
    out = []
    for a, b in zip(marks, marks[1:]):
        own = waits = 0.0
        launches = 0
        for x, y in zip(ev[a:b], ev[a + 1:b + 1]):
            g = y["ts"] - x["ts"]
            if is_wait(x):
                waits += g
            else:
                own += g
            launches += x["cat"] == "launch"
        out.append(dict(step=(ev[b]["ts"] - ev[a]["ts"]) / 1e3, own=own / 1e3, waits=waits / 1e3,
                        launches=launches))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--anchor", default="lm_head")
    ap.add_argument("--last", type=int, default=48)
    ap.add_argument("exports", nargs="+")
    args = ap.parse_args()
    print("%-40s %6s %10s %10s %10s" % ("trace", "steps", "step ms", "own ms", "waits ms"))
    for p in args.exports:
        s = steps(p, args.anchor)
        if not s:
            print("%-40s no step found (anchor %r)" % (p, args.anchor), file=sys.stderr)
            continue
        common = collections.Counter(x["launches"] for x in s).most_common(1)[0][0]
        s = [x for x in s if x["launches"] == common][-args.last:]
        med = {k: statistics.median(x[k] for x in s) for k in ("step", "own", "waits")}
        print("%-40s %6d %10.2f %10.2f %10.2f" % (p.split("/")[-1][:40], len(s), med["step"], med["own"],
                                                 med["waits"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
