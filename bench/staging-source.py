#!/usr/bin/env python3
"""bench/staging-source.py: which path the streaming executor's staging
copies took, and at what rate, from recorded e2e.py and bigload.py results.

    python3 bench/staging-source.py RESULT.json...

For each row that staged: the copies (stream.staged), how many went through
the shim's copy kernel (stream.staged_by_kernel: managed sources) and how
many came from a pinned copy of a managed range by the copy engine
(stream.staged_pinned, uvm/stream-pin.h), the rest being pinned sources by
the copy engine; the allocations served managed and pinned. For e2e.py's batched streaming rows with every expert `host`
(`mode: stream`, whole stacked tensors copied once a step): the staging
rate implied by the step time, the experts' bytes over batch / tok/s.
Prints a markdown table; reads files only.
"""
import json
import sys
from typing import Any, Dict, List


def e2e_rows(path: str, d: Dict[str, Any]) -> List[str]:
    out = []
    for r in d.get("results", []):
        st = (r.get("stats") or {}).get("stream") or {}
        al = (r.get("stats") or {}).get("allocations") or {}
        if not st.get("staged"):
            continue
        rate = ""
        host = ((r.get("stats") or {}).get("placements") or {}).get("host", {}).get("bytes", 0)
        b32 = (r.get("batched") or {}).get("32") or {}
        if host and b32.get("decode_tok_s") and "host-stream" in r["name"]:
            step_s = 32 / b32["decode_tok_s"]
            rate = f"{host / 1e9:.1f} GB in {step_s * 1e3:.0f} ms: {host / step_s / 1e9:.1f} GB/s"
        out.append(f"| {path} | {r['name']} | {st['staged']} | {st.get('staged_by_kernel', 0)} | "
                   f"{st.get('staged_pinned', 0)} | "
                   f"{al.get('served_managed', '?')} / {al.get('served_pinned', '?')} | {rate} |")
    return out


def bigload_rows(path: str, d: Dict[str, Any]) -> List[str]:
    out = []
    for r in d.get("rows", []):
        st = r.get("stream") or {}
        if not st.get("staged"):
            continue
        cap = r.get("managed_cap") or {}
        out.append(f"| {path} | {r['name']} | {st['staged']} | {st.get('staged_by_kernel', 0)} | "
                   f"{st.get('staged_pinned', 0)} | pinned past the cap {cap.get('pinned_bytes', 0) / 2**30:.2f} GiB | |")
    return out


def main() -> int:
    if len(sys.argv) < 2:
        sys.stderr.write(__doc__)
        return 2
    print("| file | row | staging copies | by the copy kernel (managed source) | "
          "from pinned copies | allocations managed / pinned | b32 staging rate |")
    print("|---|---|---|---|---|---|---|")
    for path in sys.argv[1:]:
        with open(path) as f:
            d = json.load(f)
        for line in (e2e_rows if "results" in d else bigload_rows)(path, d):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
