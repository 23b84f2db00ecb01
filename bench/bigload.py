#!/usr/bin/env python3
"""bench/bigload.py: a checkpoint larger than the free device memory,
loaded from disk by transformers under the shim (issues 19 and 41), on the GPU.

    python3 bench/bigload.py --build build --out DIR [--shape dense|moe|moe128]
                             [--layers N] [--fractions 0.5,0.25] [--batches 1,8,32]
                             [--modes batched,cb] [--runs plain,host-free,fit,hand]

What it does, each run in its own process:
1. `make`: random bf16 weights written with save_pretrained (safetensors) to
   $BIGLOAD_CKPT_DIR/bigload-ckpt-SHAPE-LAYERS (kept: a later call on the
   same machine loads it again). Every later run loads it with
   from_pretrained(device_map="cuda"), as an unmodified script does, from
   a warm page cache: the checkpoint's files are read once before each row
   (--no-warm-cache: not), so the load ratios against plain compare loads,
   not what the disk still held.
   - dense: a Llama shape (hidden 4096, MLP 14336, GQA 32/8 heads, vocab
     32000), 24 layers by default;
   - moe, moe128: bench/e2e.py's Qwen3-MoE shapes (32 experts top-4, and
     Qwen3-30B-A3B's layer, 128 experts top-8), 16 layers by default (18.8
     GiB for moe128: issue 41's model), their embedding and routers drawn at
     std 1 as e2e.py does, so routing spreads over the experts.
2. `plain`: no shim, no blocker: the load time, peak device memory, greedy
   tokens (batch 1) and decode tok/s that the others are compared with.
3. `fit-F` for each F: a blocker (ordinary device memory, allocated with the
   placeable window closed) leaves F x the weights' bytes free; the engine
   runs under woffload-run with the policy `fit: {device: 100%, keep_free:
   KEEP}` and the automatic hook. Reports load time, peak device memory (the
   process's device use above the blocker, sampled every 5 ms), tokens
   against plain, decode tok/s against the bound of its offloaded bytes
   (each offloaded byte read once a token at 55 GB/s; the embedding's rows
   only, so it is left out of that sum), and the shim's managed-cap and fit
   stats.
   With --shape moe or moe128 (issue 41), per F also `hand-F`: the one-line
   hand policy (every expert on the host, bench/e2e.py's experts-host-all)
   under the same blocker; and `host-free`: that policy with no blocker
   (fit has more device memory than it uses there, so fit must never be
   slower). Decode is timed at each of --batches; `plain` also measures the
   distinct experts each layer's router picks a step at that batch, which
   gives each row's bound: its offloaded bytes (host and managed names, the
   embedding aside) a step, an expert tensor counted at its layer's distinct
   share, at 55 GB/s. --modes cb runs each as `NAME-cb` instead (batched,cb:
   both): transformers' continuous batching (bench/e2e.py's, 64 requests of
   16-128 tokens, 32 new), in its own process; beside a blocker its paged
   cache is sized for those requests, and the shim's Python hook makes its
   free-memory check read the driver's figure (cb_sizing checks it did:
   transformers 5.17 counts PyTorch's reserved bytes twice, and under the
   shim they include host-served weights).
4. `fp8-plain` / `fp8-F`: vLLM #19967's path (dense only). The bf16 checkpoint loads with
   `default: host` (its pages land in host memory: the window's memory is
   advised to the host before the engine writes it), then each Linear
   weight is quantized on the device (weight-only float8_e4m3fn, per-tensor
   scale), the bf16 tensor dropped; peak device memory stays far below the
   bf16 bytes. fp8-plain does the same with everything on the GPU; tokens
   must match.

Prints one JSON line per run (BIGLOAD_RESULT) and writes DIR/bigload.json
and a markdown table DIR/bigload.md.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e  # noqa: E402  (the MoE shapes, the hand policy, continuous batching)

PCIE_GBS = 55.0
STARTED = time.time()
DEFAULT_LAYERS = dict(dense=24, moe=16, moe128=16)
PROMPT = 32  # tokens of each decode prompt


def shape_config(shape: str, layers: int) -> Tuple[str, Dict[str, Any]]:
    """The transformers config class and its arguments for a shape."""
    if shape == "dense":
        return "LlamaConfig", dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=layers,
                                   num_attention_heads=32, num_key_value_heads=8, vocab_size=32000,
                                   max_position_embeddings=4096, tie_word_embeddings=False)
    mi = e2e.MODELS[shape]
    return mi["arch"], dict(mi["cfg"], num_hidden_layers=layers)


class PeakSampler:
    """Device memory in use by anyone (total - free), sampled every 5 ms and
    kept as a timeline: the highest sample of each 100 ms, with its phase
    (the worker names it: load, b1, b8, ...). The peaks are read from it
    (peaks())."""

    def __init__(self, torch: Any) -> None:
        self.torch, self.stop, self.phase = torch, False, "load"
        self.timeline: List[List[Any]] = []  # [s, phase, used bytes]
        self.t0 = time.perf_counter()
        self.t = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stop:
            free, total = self.torch.cuda.mem_get_info()
            used, ph = total - free, self.phase
            tick = int((time.perf_counter() - self.t0) * 10) / 10
            if self.timeline and self.timeline[-1][0] == tick and self.timeline[-1][1] == ph:
                self.timeline[-1][2] = max(self.timeline[-1][2], used)
            else:
                self.timeline.append([tick, ph, used])
            time.sleep(0.005)

    def __enter__(self) -> "PeakSampler":
        self.t.start()
        return self

    def __exit__(self, *a: Any) -> None:
        self.stop = True
        self.t.join()


def peaks(timeline: List[List[Any]]) -> Dict[str, Any]:
    """A timeline's peak overall (bytes, its phase and when, the first time
    it came), by phase in the order the phases came, and when it first came
    within 2% of the peak: the device filling at the first generate, or late."""
    out: Dict[str, Any] = dict(peak=0, phase=None, at=0.0, by_phase={}, near=None)
    for t, ph, used in timeline:
        out["by_phase"][ph] = max(out["by_phase"].get(ph, 0), used)
        if used > out["peak"]:
            out["peak"], out["phase"], out["at"] = used, ph, t
    for t, ph, used in timeline:
        if out["peak"] > 0 and used >= 0.98 * out["peak"]:
            out["near"] = [t, ph]
            break
    return out


def make(spec: Dict[str, Any]) -> Dict[str, Any]:
    """The checkpoint, written once: a later call finds its done file and
    reuses it (the GPU machine keeps /tmp while it stays warm)."""
    done = os.path.join(spec["ckpt"], "bigload-done.json")
    if os.path.exists(done):
        with open(done) as f:
            return dict(json.load(f), reused=True)
    import torch
    import transformers
    arch, cfg = shape_config(spec["shape"], spec["layers"])
    with torch.device("meta"):
        nbytes = sum(p.numel() * p.element_size() for p in transformers.AutoModelForCausalLM.from_config(
            getattr(transformers, arch)(**cfg), dtype=torch.bfloat16).parameters())
    # the GPU machine's 64 GiB disk also holds the GGUFs of a llama.cpp session
    parent = os.path.dirname(os.path.abspath(spec["ckpt"]))
    os.makedirs(parent, exist_ok=True)
    free = shutil.disk_usage(parent).free
    if free < nbytes * 1.05 + (2 << 30):
        raise RuntimeError(f"{parent}: {free / 2**30:.1f} GiB free on its disk, the checkpoint needs "
                           f"{nbytes / 2**30:.1f} GiB and 2 GiB to spare (set BIGLOAD_CKPT_DIR, or "
                           f"remove the GGUFs in /tmp)")
    torch.manual_seed(0)
    t0 = time.perf_counter()
    with torch.device("cuda"):
        m = transformers.AutoModelForCausalLM.from_config(getattr(transformers, arch)(**cfg),
                                                          dtype=torch.bfloat16)
    with torch.no_grad():
        if spec["shape"] == "dense":  # non-degenerate greedy tokens: wider weights than init's 0.02
            for p in m.parameters():
                if p.dim() == 2:
                    p.normal_(0.0, 0.05)
        else:  # as bench/e2e.py: routing spreads over the experts (device-facts.md)
            g = torch.Generator("cuda").manual_seed(1234)
            m.get_input_embeddings().weight.normal_(0.0, 1.0, generator=g)
            for name, p in m.named_parameters():
                if name.endswith("mlp.gate.weight"):
                    p.normal_(0.0, 1.0, generator=g)
    m.save_pretrained(spec["ckpt"], safe_serialization=True)
    res = dict(weight_bytes=nbytes, make_s=time.perf_counter() - t0, shape=spec["shape"],
               layers=spec["layers"])
    with open(done, "w") as f:
        json.dump(res, f)
    return res


def quantize_fp8(torch: Any, m: Any) -> int:
    """Weight-only fp8 (float8_e4m3fn, one scale per tensor) for every Linear
    of the decoder layers, computed on the device from wherever the bf16
    weight lives; the bf16 tensor is dropped. Returns the fp8 bytes."""
    fp8 = torch.float8_e4m3fn
    n = 0

    class FP8Linear(torch.nn.Module):
        def __init__(self, q: Any, s: Any) -> None:
            super().__init__()
            self.register_buffer("q", q)
            self.register_buffer("s", s)

        def forward(self, x: Any) -> Any:
            return torch.nn.functional.linear(x, self.q.to(x.dtype) * self.s.to(x.dtype))

    for layer in m.model.layers:
        for parent in list(layer.modules()):
            for cname, child in list(parent.named_children()):
                if isinstance(child, torch.nn.Linear) and child.bias is None:
                    w = child.weight.data
                    with torch.no_grad():
                        s = (w.abs().amax().float() / torch.finfo(fp8).max).clamp(min=1e-12)
                        q = (w.float() / s).to(fp8)
                    setattr(parent, cname, FP8Linear(q, s))
                    n += q.numel()
                    del w, child
                    # The engine drops each bf16 weight as it goes; PyTorch's
                    # cache must not hand its host-placed block to the next
                    # fp8 tensor (the first measured run did: fp8-0.6 decoded
                    # at 0.03x its bound, bench/results/bigload-20261125-h100.md).
                    torch.cuda.empty_cache()
    torch.cuda.synchronize()
    return n


def timed_decode(torch: Any, m: Any, ids: Any, n: int, wu: int,
                 repeats: int) -> Tuple[float, List[List[int]], float, List[float]]:
    """Aggregate decode tok/s of one batch: a warm-up generate of wu tokens
    (prefetch.mode auto decides after the stepper has found the step, about
    9 tokens, and timed 8 steps in place and 10 streamed: the timed calls then
    run what it kept; every row warms up the same, plain too), then repeats
    full generates of n tokens, each less a one-token generate (the prefill,
    timed once after them). Returns the median rate (bench.md: the median of
    at least 5), the greedy tokens of the first, the warm-up's seconds and
    every repeat's rate."""
    kw = dict(attention_mask=torch.ones_like(ids), do_sample=False, pad_token_id=0)
    fulls: List[float] = []
    out = None
    with torch.no_grad():
        t1 = time.perf_counter()
        m.generate(ids, max_new_tokens=wu, min_new_tokens=wu, **kw)
        torch.cuda.synchronize()
        first = time.perf_counter() - t1
        for k in range(max(1, repeats)):
            t1 = time.perf_counter()
            o = m.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw)
            torch.cuda.synchronize()
            fulls.append(time.perf_counter() - t1)
            out = o if out is None else out
        t1 = time.perf_counter()
        m.generate(ids, max_new_tokens=1, min_new_tokens=1, **kw)
        torch.cuda.synchronize()
        one = time.perf_counter() - t1
    rates = [ids.shape[0] * (n - 1) / max(f - one, 1e-9) for f in fulls]
    return statistics.median(rates), out[:, ids.shape[1]:].tolist(), first, rates


def cb_sizing(torch: Any, cbs: Dict[str, Any]) -> Dict[str, Any]:
    """Continuous batching beside a blocker. transformers sizes its paged
    cache against the device's memory as PyTorch counts it, and two things
    go wrong there: 5.17 subtracts PyTorch's reserved bytes from a figure
    that already excludes them (on the H200 at F = 0.25: "Memory footprint
    4706557952 is more than available memory -13695300403", with 4.70 GiB
    free), and under the shim those reserved bytes include every weight it
    serves from host memory. The shim's Python hook reads the free memory
    from the driver instead while its policy places (python/woffload/_auto.py:
    every row with a blocker runs under it); this checks that it did. And the
    blocker's rows ask for the cache the requests need, not e2e's 512 blocks
    sized for a free GPU (all of them at once: 64 requests of at most 128 +
    32 tokens). Returns what was set."""
    import importlib
    import pkgutil
    from transformers.generation import ContinuousBatchingConfig
    import transformers.generation.continuous_batching as cbm

    block = getattr(ContinuousBatchingConfig(), "block_size", None) or 256
    per_request = -(-(128 + cbs["new"]) // block) + 1
    cbs["num_blocks"] = min(cbs["num_blocks"], cbs["requests"] * per_request)
    hooked = 0
    for info in pkgutil.iter_modules(cbm.__path__):
        mod = importlib.import_module(f"{cbm.__name__}.{info.name}")
        cls = getattr(mod, "PagedAttentionMemoryHandler", None)
        f = vars(cls).get("get_available_memory") if isinstance(cls, type) else None
        hooked += bool(getattr(getattr(f, "__func__", f), "_woffload", False))
    if not hooked:
        raise RuntimeError("continuous batching beside a blocker: the shim's Python hook did not "
                           "make transformers read the free memory from the driver (run under "
                           "woffload-run with a policy that places, transformers "
                           f"{importlib.import_module('transformers').__version__})")
    return dict(block_size=block, num_blocks=cbs["num_blocks"], hooked=hooked)


def worker(spec: Dict[str, Any]) -> Dict[str, Any]:
    import torch
    import transformers
    res: Dict[str, Any] = dict(name=spec["name"], torch=torch.__version__,
                               transformers=transformers.__version__)
    wo = None
    if spec.get("shim"):
        import woffload as wo
        if not wo.available():
            raise RuntimeError("the shim is not preloaded")
    torch.cuda.init()
    free0, total = torch.cuda.mem_get_info()
    blocker = None
    if spec.get("fraction"):
        leave = int(spec["fraction"] * spec["weight_bytes"])
        size = free0 - leave
        if wo is not None:
            with wo.window_closed():
                blocker = torch.empty(size, dtype=torch.uint8, device="cuda")
        else:
            blocker = torch.empty(size, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        res["blocker"] = dict(size=size, free_after=torch.cuda.mem_get_info()[0], leave=leave)
    base = total - torch.cuda.mem_get_info()[0]
    moe = spec["shape"] != "dense"
    _, cfg = shape_config(spec["shape"], spec["layers"])
    with PeakSampler(torch) as ps:
        t0 = time.perf_counter()
        # continuous batching reads the KV cache through paged attention
        attn = dict(attn_implementation="paged|sdpa") if spec.get("cb") else {}
        m = transformers.AutoModelForCausalLM.from_pretrained(
            spec["ckpt"], dtype=torch.bfloat16, device_map="cuda", **attn)
        m.eval()
        torch.cuda.synchronize()
        res["load_s"] = time.perf_counter() - t0
        ps.phase = "after load"
        if spec.get("fp8"):
            t1 = time.perf_counter()
            if wo is not None:
                rep = wo.tag_module(m)
                r = wo.seal()
                res["seal"] = dict(rc=r, tagged=str(rep))
            res["fp8_bytes"] = quantize_fp8(torch, m)
            torch.cuda.empty_cache()
            res["quantize_s"] = time.perf_counter() - t1
        n = spec["new_tokens"]
        wu = max(n, spec.get("warmup_tokens", n))
        if spec.get("cb"):
            ps.phase = "cb"
            cbs = dict(e2e.CB["cb"])
            if blocker is not None:
                res["cb_sizing"] = cb_sizing(torch, cbs)
            res.update(e2e.continuous_batching(torch, m, dict(cb=cbs, repeats=3), wo,
                                               cfg["vocab_size"]))
        else:
            batches = spec.get("batches") or [1]
            g = torch.Generator("cuda").manual_seed(2)
            prompts = torch.randint(100, cfg["vocab_size"], (max(batches), PROMPT), device="cuda", generator=g)
            res["batched"] = {}
            for i, b in enumerate(batches):
                ps.phase = f"b{b}"
                try:
                    rate, toks, first, rates = timed_decode(torch, m, prompts[:b], n,
                                                            wu if i == 0 else n, spec.get("repeats", 5))
                except torch.OutOfMemoryError as e:
                    # the engine's own memory at this batch, not the shim's:
                    # transformers' default experts backend gathers the
                    # picked experts' weights (3 GiB at b32 on the moe shape),
                    # more than a blocker may leave. The batches before it
                    # stand; larger ones would need more.
                    if not i:
                        raise
                    res["batched"][str(b)] = dict(error="engine out of memory: "
                                                  + str(e).split(". ")[0][:100])
                    del e
                    torch.cuda.empty_cache()
                    break
                row: Dict[str, Any] = dict(tok_s=rate, tok_s_repeats=rates, tokens=toks,
                                           first_generate_s=first)
                if moe and spec.get("distinct"):
                    row["distinct_experts"] = e2e.distinct_experts(torch, m, prompts[:b], cfg)
                res["batched"][str(b)] = row
            # the single-batch fields of the dense rows (their table)
            first_b = res["batched"][str(batches[0])]
            res["decode_tok_s"], res["tokens"] = first_b["tok_s"], first_b["tokens"][0]
    # where the peak came: by phase, the overall one's phase and time, and
    # when the device first came near it
    pk = peaks(ps.timeline)
    res["peak_device_bytes"] = pk["peak"] - base
    res["peak_by_phase"] = {ph: v - base for ph, v in pk["by_phase"].items()}
    res["peak_phase"], res["peak_at_s"], res["peak_near"] = pk["phase"], pk["at"], pk["near"]
    res["used_timeline"] = [[t, ph, v - base] for t, ph, v in ps.timeline]
    res["weight_bytes"] = spec["weight_bytes"]
    if wo is not None:
        st = wo.stats() or {}
        res["managed_cap"] = st.get("managed_cap")
        res["expect"] = st.get("expect")
        res["late_bind"] = st.get("late_bind")
        res["load_copies"] = st.get("load_copies")
        res["fit"] = st.get("fit")
        # picked copies, by tensor (staged, reused): where a row's copies went
        res["picks"] = st.get("picks")
        res["stream"] = {k: v for k, v in (st.get("stream") or {}).items() if k != "names"}
        res["placements"] = {k: v for k, v in (st.get("placements") or {}).items()}
        # the names off the device (the embedding's rows aside: a step reads
        # only its tokens' rows), for the bound
        res["offloaded"] = [[nm.get("name", ""), nm.get("placement"), nm.get("bytes", 0)]
                            for nm in st.get("names", [])
                            if nm.get("placement") in ("host", "managed")
                            and "embed_tokens" not in nm.get("name", "")]
        off = sum(x[2] for x in res["offloaded"])
        res["offloaded_bytes"] = off
        res["bound_tok_s"] = PCIE_GBS * 1e9 / off if off else None
    del blocker
    return res


def warm_cache(ckpt: str, chunk: int = 64 << 20) -> Dict[str, Any]:
    """Reads every file of the checkpoint once, so that each row's load
    starts from the same warm page cache: plain's load, the reference of
    every load ratio, took 9.7 to 16.4 s in calls of the same day (why is
    not measured; a page cache that held part of the checkpoint is one
    cause this rules out). Returns the bytes, files and
    seconds of the read (slow: the cache was cold, or could not hold it)."""
    t0, nbytes, files = time.perf_counter(), 0, 0
    buf = bytearray(chunk)
    for root, _, names in os.walk(ckpt):
        for n in sorted(names):
            try:
                with open(os.path.join(root, n), "rb", buffering=0) as f:
                    files += 1
                    while True:
                        k = f.readinto(buf)
                        if not k:
                            break
                        nbytes += k
            except OSError:
                continue
    return dict(bytes=nbytes, files=files, s=time.perf_counter() - t0)


def run(spec: Dict[str, Any], args: argparse.Namespace) -> Dict[str, Any]:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(spec)]
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTORCH_CUDA_ALLOC_CONF="expandable_segments:False")
    if spec.get("shim"):
        pol = os.path.join(args.out, f"{spec['name']}.yaml")
        with open(pol, "w") as f:
            f.write(spec["policy"])
        launcher = os.path.join(args.build, "tools", "woffload-run")
        cmd = [launcher, "--policy", pol, "--log", args.log, "--"] + cmd
        env["WOFFLOAD_PROGRESS"] = "1"
        env.update(spec.get("env", {}))
    timeout = args.timeout
    if args.deadline:  # a device call's time: start no row that cannot end in it
        left = args.deadline - (time.time() - STARTED)
        if left < args.min_left:
            print(f"=== {spec['name']}: skipped: {left:.0f} s left of --deadline", flush=True)
            return dict(name=spec["name"], error=f"skipped: out of time (--deadline {args.deadline:.0f})")
        timeout = min(timeout, left - 5)
    print(f"=== {spec['name']}: {' '.join(shlex.quote(c) for c in cmd[:-1])} '<spec>'", flush=True)
    warm = None
    if spec.get("ckpt") and spec["name"] != "make" and getattr(args, "warm_cache", True) \
            and os.path.isdir(spec["ckpt"]):
        warm = warm_cache(spec["ckpt"])
        print(f"    page cache: {warm['bytes'] / 2**30:.2f} GiB in {warm['files']} files read "
              f"in {warm['s']:.1f} s before the row", flush=True)
    t0 = time.time()
    cpus = parse_cpus(args.cpus)
    # every row on the same cores, the shim's threads too (set before exec):
    # b1 is bound by the engine's launches, the CPU's time
    pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout,
                           preexec_fn=pin)
        out, err, rc = p.stdout, p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = (e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")) + f"\n(timeout: {timeout:.0f} s)"
        rc = -1
    res: Dict[str, Any] = dict(name=spec["name"], rc=rc, wall_s=time.time() - t0)
    if warm is not None:
        res["cache_warm"] = warm
    for line in out.splitlines():
        if line.startswith("BIGLOAD_RESULT "):
            res.update(json.loads(line[len("BIGLOAD_RESULT "):]))
    with open(os.path.join(args.out, f"{spec['name']}.log"), "w") as f:
        f.write(out + "\n--- stderr ---\n" + err)
    if rc != 0:
        # the worker's own account of its failure (BIGLOAD_RESULT's error),
        # else stderr's tail
        res.setdefault("error", err[-3000:])
        print(err[-3000:], flush=True)
    shown = {k: v for k, v in res.items() if k not in ("tokens", "placements")}
    print(json.dumps(shown), flush=True)
    return res


def gib(x: Optional[float]) -> str:
    return "-" if x is None else f"{x / 2**30:.2f}"


def head(cols: List[str]) -> List[str]:
    """A Markdown table's header and rule."""
    return ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]


def error_row(r: Dict[str, Any], cols: int) -> str:
    """A failed row of a table of cols columns: its error's last line that is
    not the shim's own log (its exit summary follows a Python traceback)."""
    lines = [x for x in r["error"].strip().splitlines() if x.strip()] or ["?"]
    said = [x for x in lines if not x.startswith("woffload")] or lines
    return f"| {r['name']} | | error: {said[-1].strip()[:120]} |" + "|" * (cols - 3)


def table(rows: List[Dict[str, Any]], plain: Dict[str, str]) -> str:
    out = head(["run", "free F / weights", "load s (x plain)", "peak device GiB", "fit budget GiB (peak x)",
                "on device GiB", "offloaded GiB", "decode tok/s", "bound tok/s", "x bound", "tokens"])
    for r in rows:
        if r.get("error"):
            out.append(error_row(r, 11))
            continue
        ref = plain.get("fp8" if r["name"].startswith("fp8") else "bf16")
        p_load = next((x["load_s"] for x in rows if x["name"] == ref), None)
        ratio = f" ({r['load_s'] / p_load:.2f}x)" if p_load and r["name"] != ref else ""
        same = "-" if r["name"] == ref else (
            "identical" if r.get("tokens") == next((x.get("tokens") for x in rows if x["name"] == ref), None)
            else "DIFFER")
        fit = r.get("fit") or {}
        b = r.get("bound_tok_s")
        xb = "-" if not b else f"{r['decode_tok_s'] / b:.2f}x"
        bs = "-" if not b else f"{b:.2f}"
        # the fit budget covers the weights, the slots and the reserve for
        # what the engine allocates after seal: the process's peak is
        # compared with it (issue 19: within 5%)
        fb = fit.get("budget")
        fbs = "-" if not fb else (f"{fb / 2**30:.2f} ({r['peak_device_bytes'] / fb:.2f}x)"
                                  if r.get("peak_device_bytes") else f"{fb / 2**30:.2f}")
        out.append(f"| {r['name']} | {r.get('fraction', 1.0) if 'blocker' in r else 'all'} | "
                   f"{r['load_s']:.1f}{ratio} | {gib(r.get('peak_device_bytes'))} | {fbs} | "
                   f"{gib(fit.get('device_bytes'))} | {gib(r.get('offloaded_bytes'))} | "
                   f"{r['decode_tok_s']:.2f} | {bs} | {xb} | {same} |")
    return "\n".join(out)


def prior_rows(files: List[str], weight_bytes: int, shape: str) -> List[Dict[str, Any]]:
    """The rows of earlier calls' bigload.json files (--with), on the same
    checkpoint (its bytes and shape), the later file's row first where two
    share a name. A file of another checkpoint is an error: its rows would
    be compared with this one's."""
    by: Dict[str, Dict[str, Any]] = {}
    for fn in files:
        with open(fn) as f:
            d = json.load(f)
        mk = d.get("make") or {}
        if mk.get("weight_bytes") != weight_bytes or mk.get("shape", shape) != shape:
            raise ValueError(f"{fn}: another checkpoint ({mk.get('shape')}, {mk.get('weight_bytes')} B; "
                             f"this one: {shape}, {weight_bytes} B)")
        for r in d.get("rows") or []:
            by[r["name"]] = dict(r, prior=fn)
    return list(by.values())


def bounds(r: Dict[str, Any], plain: Dict[str, Any], b: str,
           experts: int) -> Tuple[Optional[float], Optional[float]]:
    """Row r's bounds at batch b: the PCIe bound (its offloaded distinct bytes
    a step at 55 GB/s), and the bound its rate is judged by: the lesser of
    that and plain's rate at b (a step is never faster than the engine's own
    step with every weight on the device: at b1 on the 128-expert shape the
    engine's launches, not PCIe, set plain's pace)."""
    pb = (plain.get("batched") or {}).get(b) or {}
    sb = step_bytes(r.get("offloaded") or [], pb.get("distinct_experts"), experts)
    pcie = int(b) * PCIE_GBS * 1e9 / sb if sb else None
    floor = pb.get("tok_s")
    return pcie, (min(pcie, floor) if pcie and floor else pcie)


ENGINE_RUN = re.compile(r"(host-free|fit|hand)-engine(?:-(all|\d+))?((?:-(?:lazy|eager|bind|auto))*)")


def load_line(r: Dict[str, Any]) -> str:
    """Where a shim row's load went: the engine's copies before seal by
    destination (the stats' load_copies: time inside the calls) and the
    loader's own pinning (managed_cap.pin_seconds); "" without them."""
    lc = r.get("load_copies") or {}
    engine = "the engine's memory"
    parts = [f"into {engine if k == 'device' else k} "
             f"{v['bytes'] / 2**30:.2f} GiB in {v['seconds']:.2f} s"
             + (f" ({v['bytes'] / 2**30 / v['seconds']:.1f} GiB/s)" if v.get("seconds") else "")
             for k, v in lc.items() if v.get("bytes")]
    if not parts:
        return ""
    pin = (r.get("managed_cap") or {}).get("pin_seconds")
    return ("load: the engine's copies before seal (time inside the calls): " + ", ".join(parts)
            + (f"; the loader's own pinning {pin:.2f} s" if pin is not None else "")
            + (f"; load {r['load_s']:.1f} s" if r.get("load_s") else ""))


def engine_pct(run_name: str) -> int:
    """WOFFLOAD_PICKS_ENGINE of a copy-engine run,
    KIND-engine[-all|-N][-lazy|-eager][-bind][-auto] with KIND host-free, fit
    or hand: 50 without a suffix, 1 for -all, N (1 to 100); 0 for any other
    name. The other suffixes: engine_env, and -auto (fit's reserve: auto, the
    row run twice)."""
    m = ENGINE_RUN.fullmatch(run_name)
    if not m:
        return 0
    if not m.group(2):
        return 50
    if m.group(2) == "all":
        return 1
    return int(m.group(2)) if 1 <= int(m.group(2)) <= 100 else 0


def engine_suffix_error(run_name: str) -> str:
    """What is wrong with a copy-engine run's suffixes ("" when nothing):
    -lazy with -eager, -bind or -auto on a run that is not fit's, a suffix
    twice."""
    m = ENGINE_RUN.fullmatch(run_name)
    if not m:
        return ""
    sfx = m.group(3).split("-")[1:]
    if len(set(sfx)) != len(sfx):
        return "a suffix twice"
    if "lazy" in sfx and "eager" in sfx:
        return "-lazy and -eager together"
    if m.group(1) != "fit" and ("bind" in sfx or "auto" in sfx):
        return "-bind and -auto are fit's (WOFFLOAD_FIT_BIND, reserve: auto)"
    return ""


def engine_env(run_name: str) -> Dict[str, str]:
    """The environment of a copy-engine run: its WOFFLOAD_PICKS_ENGINE; -lazy
    WOFFLOAD_PICKS_LAZY=1 (the default: the copy engine under CUDA's lazy
    module loading, each kernel's first launch gated), -eager
    WOFFLOAD_PICKS_LAZY=0 (the shim asks for eager loading: its device
    memory and start-up), -bind WOFFLOAD_FIT_BIND=1 (fit's device weights
    late bound: a yield after seal re-backs them on the host and releases
    their device memory at once, where managed weights' pages need the
    squeeze, whose allocations hold the whole free memory for a moment)."""
    m = ENGINE_RUN.fullmatch(run_name)
    suffixes = set(m.group(3).split("-")[1:]) if m else set()
    env = {"WOFFLOAD_PICKS_ENGINE": str(engine_pct(run_name))}
    if "lazy" in suffixes:
        env["WOFFLOAD_PICKS_LAZY"] = "1"
    if "eager" in suffixes:
        env["WOFFLOAD_PICKS_LAZY"] = "0"
    if "bind" in suffixes:
        env["WOFFLOAD_FIT_BIND"] = "1"
    return env


def experts_bytes(rows: List[Dict[str, Any]], weight_bytes: int) -> int:
    """The routed experts' bytes: from a row that offloaded every expert
    (host-free's offloaded list), else half the weights (a guess, said)."""
    for r in rows:
        if r.get("name", "").startswith("host-free") and r.get("offloaded"):
            return int(sum(n for name, _p, n in r["offloaded"] if ".experts." in f".{name}."))
    print("bigload: no host-free row yet: half the experts' bytes taken as a quarter of the "
          "weights", file=sys.stderr)
    return weight_bytes // 2


def step_bytes(offloaded: List[List[Any]], distinct: Optional[List[float]], experts: int) -> Optional[float]:
    """Bytes a decode step must read over PCIe: each offloaded name's bytes,
    an expert tensor's at its layer's distinct share (the distinct experts
    its router picked a step, from the plain run at that batch, over the
    experts). None without the shares or with nothing offloaded."""
    if not distinct or not offloaded:
        return None
    total = 0.0
    for name, _placement, nbytes in offloaded:
        if ".experts." in f".{name}.":
            li = e2e.layer_of(name)
            share = distinct[li] / experts if 0 <= li < len(distinct) else 1.0
            total += nbytes * min(1.0, share)
        else:
            total += nbytes
    return total


def parse_size(text: str) -> int:
    """'1GiB', '256MiB', '512KiB', '4096' (bytes) as bytes."""
    for unit, mult in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10), ("B", 1)):
        if text.endswith(unit):
            return int(float(text[:-len(unit)]) * mult)
    return int(text)


def parse_cpus(text: str) -> List[int]:
    """'0-7', '3', '0-3,8-11' as the cores it names (sorted); '' as none.
    ValueError on anything else."""
    cpus = set()
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        a, dash, b = part.partition("-")
        lo, hi = int(a), int(b) if dash else int(a)
        if lo < 0 or hi < lo:
            raise ValueError(f"{part!r} is not a core or a range of cores (e.g. 0-7)")
        cpus.update(range(lo, hi + 1))
    return sorted(cpus)


def ratio(a: Optional[float], b: Optional[float]) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def announced(x: Optional[Dict[str, Any]]) -> str:
    """The names announced before their bytes (the stats' expect object):
    what was served as pinned host memory at once, and of it what a worker
    had pinned ahead of the loader; '-' when nothing was announced."""
    if not x or not x.get("names"):
        return "-"
    pp = x.get("prepin") or {}
    return f"{gib(x.get('served_host_bytes'))} / {gib(pp.get('taken_bytes'))}"


def moe_tables(rows: List[Dict[str, Any]], experts: int, keep_free: int) -> str:
    """Issue 41's tables: load and memory per run; decode at each batch
    against the bound of the row's own offloaded bytes, host-free (the hand
    policy with the whole device) and the hand policy under the same
    blocker; continuous batching likewise; tokens against plain's."""
    by = {r["name"]: r for r in rows}
    plain = by.get("plain") or {}

    def fr(r: Dict[str, Any]) -> str:
        return "all" if "blocker" not in r else f"{r.get('fraction')}"

    def peer(r: Dict[str, Any], kind: str) -> Dict[str, Any]:
        cb = "-cb" if r["name"].endswith("-cb") else ""
        name = f"host-free{cb}" if kind == "host-free" else f"hand-{r.get('fraction')}{cb}"
        return by.get(name) or {}

    out = head(["run", "free F / weights", "load s (x plain)", "peak device GiB", "fit size GiB (peak x)",
                "device GiB", "host GiB", "managed GiB", "managed cap pinned / passed GiB",
                "announced: served host / pinned ahead GiB"])
    for r in rows:
        if r.get("error"):
            out.append(error_row(r, 10))
            continue
        pl = r.get("placements") or {}
        # the fit size under a blocker: the free memory less keep_free (the
        # process's peak is above what it held once the blocker was there)
        fb = (r["blocker"]["free_after"] - keep_free) if r.get("fit") and r.get("blocker") else None
        cap = r.get("managed_cap") or {}
        ref = plain if not r["name"].endswith("-cb") else by.get("plain-cb") or {}
        out.append(f"| {r['name']} | {fr(r)} | {r['load_s']:.1f}"
                   f"{'' if r is ref else ' (' + ratio(r['load_s'], ref.get('load_s')) + ')'} | "
                   f"{gib(r.get('peak_device_bytes'))} | "
                   f"{'-' if not fb else f'{fb / 2**30:.2f} (' + ratio(r.get('peak_device_bytes'), fb) + ')'} | "
                   f"{gib((pl.get('device') or {}).get('bytes'))} | {gib((pl.get('host') or {}).get('bytes'))} | "
                   f"{gib((pl.get('managed') or {}).get('bytes'))} | "
                   f"{gib(cap.get('pinned_bytes'))} / {gib(cap.get('passed_bytes'))} | "
                   f"{announced(r.get('expect'))} |")
    out += ["", "tok/s: the median of the timed generates (their spread in bigload.json: "
            "tok_s_repeats); PCIe bound: the row's offloaded distinct bytes a step at 55 GB/s; "
            "x bound: against the lesser of the PCIe bound and plain (the engine's own step).", ""]
    out += head(["run", "free F", "batch", "tok/s", "min-max", "PCIe bound tok/s", "x bound", "x host-free",
                 "x hand, same F", "tokens = plain"])
    for r in rows:
        for b, m in (r.get("batched") or {}).items() if not r.get("error") else []:
            if m.get("error"):
                out.append(f"| {r['name']} | {fr(r)} | {b} | {m['error']} ||||||")
                continue
            pb = (plain.get("batched") or {}).get(b) or {}
            pcie, bound = bounds(r, plain, b, experts)
            reps = m.get("tok_s_repeats") or []
            spread = f"{min(reps):.2f}-{max(reps):.2f}" if len(reps) > 1 else "-"
            hf = ((peer(r, "host-free").get("batched") or {}).get(b) or {}).get("tok_s")
            hd = ((peer(r, "hand").get("batched") or {}).get(b) or {}).get("tok_s")
            same = "ref" if r is plain else ("-" if not pb.get("tokens") else
                                             "identical" if m.get("tokens") == pb["tokens"] else "DIFFER")
            out.append(f"| {r['name']} | {fr(r)} | {b} | {m['tok_s']:.2f} | {spread} | "
                       f"{'-' if not pcie else f'{pcie:.2f}'} | {ratio(m['tok_s'], bound)} | "
                       f"{'-' if r['name'].startswith('host-free') else ratio(m['tok_s'], hf)} | "
                       f"{'-' if r['name'].startswith('hand') else ratio(m['tok_s'], hd)} | {same} |")
    cb = [r for r in rows if r["name"].endswith("-cb") and not r.get("error")]
    if cb:
        pc = by.get("plain-cb") or {}
        out += ["", "Continuous batching (64 requests of 16-128 tokens, 32 new, at most 512 tokens a step): "
                "generated tokens over a pass's wall time, the median of 3 after a warm-up pass.", ""]
        out += head(["run", "free F", "tok/s", "x plain", "x host-free", "x hand, same F", "tokens = plain"])
        for r in cb:
            same = "ref" if r is pc else ("-" if not pc.get("tokens") else
                                          "identical" if r.get("tokens") == pc["tokens"] else "DIFFER")
            hf, hd = peer(r, "host-free").get("cb_tok_s"), peer(r, "hand").get("cb_tok_s")
            out.append(f"| {r['name']} | {fr(r)} | {r['cb_tok_s']:.2f} | "
                       f"{'-' if r is pc else ratio(r['cb_tok_s'], pc.get('cb_tok_s'))} | "
                       f"{'-' if r['name'].startswith('host-free') else ratio(r['cb_tok_s'], hf)} | "
                       f"{'-' if r['name'].startswith('hand') else ratio(r['cb_tok_s'], hd)} | {same} |")
    out += targets(rows, experts, keep_free)
    return "\n".join(out)


def targets(rows: List[Dict[str, Any]], experts: int, keep_free: int) -> List[str]:
    """Issue 41's targets for the fit rows, one line each: met, NOT met (with
    the figure), or not measured. Decode at every batch and under continuous
    batching: at least 1.0x host-free and 1.0x the hand policy under the same
    blocker, at least 0.9x the bound of its own offloaded bytes, and never
    slower with more free memory; load at most 1.3x plain; the device peak
    at most 1.05x the fit size; tokens identical."""
    by = {r["name"]: r for r in rows}
    plain = by.get("plain") or {}
    lines: List[str] = []

    def say(what: str, value: Optional[float], want: float, least: bool = True) -> None:
        if value is None:
            lines.append(f"- {what}: not measured")
        else:
            ok = value >= want if least else value <= want
            lines.append(f"- {what}: {'met' if ok else 'NOT met'} ({value:.2f}x, "
                         f"{'at least' if least else 'at most'} {want:.2f}x)")

    def rate(r: Dict[str, Any], b: str) -> Optional[float]:
        m = ((r.get("batched") or {}).get(b) or {})
        return m.get("tok_s")

    fits = sorted((r for r in rows if r["name"].startswith("fit-") and not r["name"].endswith("-cb")
                   and not r.get("error")), key=lambda r: -float(r.get("fraction") or 0))
    for r in fits:
        f = r.get("fraction")
        hand = by.get(f"hand-{f}") or {}
        host = by.get("host-free") or {}
        for b in (r.get("batched") or {}):
            t = rate(r, b)
            pb = (plain.get("batched") or {}).get(b) or {}
            _, bound = bounds(r, plain, b, experts)
            hf, hd = rate(host, b), rate(hand, b)
            say(f"{r['name']} b{b} x host-free", t / hf if t and hf else None, 1.0)
            say(f"{r['name']} b{b} x hand-{f}", t / hd if t and hd else None, 1.0)
            # the other hand policy under the same blocker, when run: with
            # the copy engine
            he = rate(by.get(f"hand-engine-{f}") or {}, b)
            if he:
                say(f"{r['name']} b{b} x hand-engine-{f}", t / he if t else None, 1.0)
            # and with hot experts (the device memory left kept for the
            # most used experts): residency at expert grain, by use
            hh = rate(by.get(f"hand-hot-{f}") or {}, b)
            if hh:
                say(f"{r['name']} b{b} x hand-hot-{f}", t / hh if t else None, 1.0)
            say(f"{r['name']} b{b} x bound", t / bound if t and bound else None, 0.9)
            if t and pb.get("tokens"):
                m = (r.get("batched") or {}).get(b) or {}
                lines.append(f"- {r['name']} b{b} tokens: "
                             f"{'met' if m.get('tokens') == pb['tokens'] else 'NOT met (they differ)'}")
        say(f"{r['name']} load x plain", r["load_s"] / plain["load_s"]
            if plain.get("load_s") and r.get("load_s") else None, 1.3, least=False)
        fb = (r["blocker"]["free_after"] - keep_free) if r.get("blocker") else None
        say(f"{r['name']} peak x fit size", r["peak_device_bytes"] / fb
            if fb and r.get("peak_device_bytes") else None, 1.05, least=False)
    # monotone: more free memory never decodes slower (rows of one kind,
    # fit-F or fit-rSIZE-F, at different F)
    def kind(r: Dict[str, Any]) -> str:
        return r["name"].rsplit("-", 1)[0]

    pairs = [(hi, lo) for i, hi in enumerate(fits) for lo in fits[i + 1:]
             if kind(hi) == kind(lo) and hi.get("fraction") != lo.get("fraction")]
    for hi, lo in pairs:
        for b in (lo.get("batched") or {}):
            th, tl = rate(hi, b), rate(lo, b)
            say(f"b{b}: {hi['name']} x {lo['name']} (more free memory)", th / tl if th and tl else None,
                1.0)
    out = ["", "Issue 41's targets (fit rows):", ""] + lines if lines else []
    # issue 42's, on the rows with no blocker: every expert host at least
    # 0.9x the picked-bytes bound at b8 and b32; half the experts' bytes hot
    # at least 1.7x the all-host row there; b1 never slower than all host
    lines = []
    host, hot = by.get("host-free") or {}, by.get("hot-free") or {}
    # the copy engine's rows, at any threshold (host-free-engine[-all|-N])
    engs = [r for r in rows if engine_pct(r["name"]) and r["name"].startswith("host-free")
            and not r.get("error")]
    for r in [host] + engs:
        for b in ("8", "32"):
            if rate(r, b):
                _, bound = bounds(r, plain, b, experts)
                say(f"{r['name']} b{b} x bound", rate(r, b) / bound if bound else None, 0.9)
    best = {b: max((x for x in [rate(host, b)] + [rate(r, b) for r in engs] if x), default=None)
            for b in ("1", "8", "32")}
    if hot:
        for b in ("8", "32"):
            say(f"hot-free b{b} x the all-host row", rate(hot, b) / best[b]
                if rate(hot, b) and best[b] else None, 1.7)
    for r in engs + [hot]:
        if r and rate(r, "1") and rate(host, "1"):
            say(f"{r['name']} b1 x host-free", rate(r, "1") / rate(host, "1"), 1.0)
    for r in engs + [hot]:
        for b in (r.get("batched") or {}) if r else ():
            pb = (plain.get("batched") or {}).get(b) or {}
            m = (r.get("batched") or {}).get(b) or {}
            if m.get("tokens") and pb.get("tokens"):
                lines.append(f"- {r['name']} b{b} tokens: "
                             f"{'met' if m['tokens'] == pb['tokens'] else 'NOT met (they differ)'}")
    if lines:
        out += ["", "Issue 42's targets (no blocker: every expert host, half their bytes hot):", ""] + lines
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker")
    ap.add_argument("--build", default="build")
    ap.add_argument("--out", default="/tmp/bigload")
    ap.add_argument("--shape", default="dense", choices=sorted(DEFAULT_LAYERS))
    ap.add_argument("--layers", type=int, default=0, help="decoder layers (default: 24 dense, 16 MoE)")
    ap.add_argument("--batches", default="",
                    help="decode batch sizes, comma-separated (default: 1 dense, 1,8,32 MoE)")
    ap.add_argument("--modes", default="batched",
                    help="batched (decode at --batches), cb (continuous batching: a row NAME-cb), or both: "
                         "batched,cb; each row its own process")
    ap.add_argument("--fractions", default="0.5,0.25")
    ap.add_argument("--fp8-fractions", default="0.6",
                    help="free F for the fp8 path: its fp8 weights alone are 0.47x the bf16 bytes")
    ap.add_argument("--keep-free", default="1GiB")
    ap.add_argument("--new-tokens", type=int, default=24)
    ap.add_argument("--with", dest="with_", default="",
                    help="earlier calls' bigload.json files (comma-separated, same checkpoint): their rows "
                         "join this report unless this call ran a row of that name (plain among them "
                         "is not run again): one report over several device calls")
    ap.add_argument("--repeats", type=int, default=5,
                    help="timed generates a batch after the warm-up: the rate is their median")
    ap.add_argument("--warmup-tokens", type=int, default=48,
                    help="tokens of the untimed first generate (auto's decision is taken in it)")
    ap.add_argument("--cpus", default=os.environ.get("BIGLOAD_CPUS", ""),
                    help="cores every row's process runs on, e.g. 0-7 (default $BIGLOAD_CPUS, else "
                         "any): the same cores for every row, the shim's threads included")
    ap.add_argument("--log", default="info")
    ap.add_argument("--no-warm-cache", dest="warm_cache", action="store_false",
                    help="do not read the checkpoint once before each row (the page cache is then "
                         "whatever the rows before left: loads are not comparable)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds a row may take")
    ap.add_argument("--deadline", type=float, default=0,
                    help="seconds from the start: no row starts with fewer than --min-left left, "
                         "none runs past it (a device call's limit)")
    ap.add_argument("--min-left", type=float, default=60)
    ap.add_argument("--runs", default="",
                    help="default: plain,fit,fp8 dense; plain,host-free,fit,hand MoE. "
                         "plain, host-free (every expert host, no blocker), hand (the same under "
                         "each blocker), fit (prefetch.mode as the policy defaults it: auto), fit-hotset "
                         "(read in place), fit-stream (prefetch.mode stream), fit-late (fit with "
                         "WOFFLOAD_LATE_BIND=1: VMM ranges re-backed at seal), fit-bind (fit with "
                         "WOFFLOAD_FIT_BIND=1: late bound but for the names pinned on the host, yields free "
                         "device memory at once), fit-bind-copies (the same with WOFFLOAD_BIND_COPIES=1: "
                         "yielded experts copied picked, not read in place), fit-auto (fit with reserve: auto, "
                         "run twice: the second reserves the first's high water), "
                         "fit-engine (fit with WOFFLOAD_PICKS_ENGINE=50: picked copies on the copy engine "
                         "from half the experts picked; early copies on, WOFFLOAD_PICKS_EARLY's default), "
                         "fit-engine-late (the same with WOFFLOAD_PICKS_EARLY=0: each tensor's copy queued "
                         "at its own launch), KIND-engine-all and KIND-engine-N for KIND host-free, fit or "
                         "hand (WOFFLOAD_PICKS_ENGINE=1 or N: a step of 8 of 128 top-8 picks about 40%% of "
                         "the experts; a decode of one sequence registers no picks), any of those with "
                         "-lazy (WOFFLOAD_PICKS_LAZY=1, the default: the copy engine under lazy module "
                         "loading) or -eager (WOFFLOAD_PICKS_LAZY=0: eager loading's memory and start-up), "
                         "then -bind (WOFFLOAD_FIT_BIND=1: a yield releases device memory at once, no "
                         "squeeze) and, for fit, -auto (reserve: auto, run twice), hot-free (every expert "
                         "host, half their bytes hot: WOFFLOAD_PICKS_HOT), hand-hot (hand with "
                         "prefetch.hot_experts: auto: the device memory left kept for the most used "
                         "experts), fp8")
    ap.add_argument("--fit-reserves", default="",
                    help="fit rows: comma-separated sizes of fit's reserve (fit: reserve, e.g. 2GiB), "
                         "one more fit row each beside the default's (fit-rSIZE-F): whether the "
                         "engine's memory after seal, past the default 256 MiB, is what slows fit")
    ap.add_argument("--stream-slots", default="",
                    help="fit and fit-stream rows: comma-separated slot counts (prefetch.slots), one row each; "
                         "empty: the policy's default")
    args = ap.parse_args()
    try:
        parse_cpus(args.cpus)
    except ValueError as e:
        ap.error(f"--cpus: {e}")
    for rv in args.fit_reserves.split(","):
        try:
            if rv.strip():
                parse_size(rv.strip())  # a bad size stops here, before any row runs
        except ValueError:
            ap.error(f"--fit-reserves: {rv.strip()!r} is not a size (e.g. 2GiB, 512MiB)")
    if args.worker:
        spec = json.loads(args.worker)
        try:
            res = make(spec) if spec["name"] == "make" else worker(spec)
        except Exception as e:  # the parent reports it
            import traceback
            traceback.print_exc()
            print("BIGLOAD_RESULT " + json.dumps(dict(error=f"{type(e).__name__}: {e}")), flush=True)
            return 1
        print("BIGLOAD_RESULT " + json.dumps(res), flush=True)
        return 0
    os.makedirs(args.out, exist_ok=True)
    moe = args.shape != "dense"
    layers = args.layers or DEFAULT_LAYERS[args.shape]
    ckpt = os.path.join(os.environ.get("BIGLOAD_CKPT_DIR", "/tmp"), f"bigload-ckpt-{args.shape}-{layers}")
    runs = (args.runs or ("plain,host-free,fit,hand" if moe else "plain,fit,fp8")).split(",")
    known = {"plain", "host-free", "fit", "hand", "hand-hot", "fit-late", "fit-bind", "fit-bind-copies",
             "fit-auto", "fit-hotset", "fit-stream", "fit-engine-late", "hot-free", "fp8"}
    # the copy engine's rows, KIND-engine[-all|-N] (KIND host-free, fit or
    # hand): WOFFLOAD_PICKS_ENGINE=N, 50 without a suffix, 1 for -all
    engine_runs = {x: engine_pct(x) for x in runs if engine_pct(x)}
    for x in engine_runs:
        why = engine_suffix_error(x)
        if why:
            ap.error(f"--runs: {x}: {why}")
    unknown = set(runs) - known - set(engine_runs)
    if unknown:
        ap.error(f"--runs {args.runs}: unknown {', '.join(sorted(unknown))} "
                 f"(known: {', '.join(sorted(known))}, and KIND-engine, KIND-engine-all, "
                 f"KIND-engine-N for KIND host-free, fit or hand, N 1 to 100, each with -lazy or -eager, "
                 f"-bind, -auto)")
    mk = run(dict(name="make", shape=args.shape, layers=layers, ckpt=ckpt), args)
    if mk.get("error"):
        return 1
    wb = mk["weight_bytes"]
    batches = [int(x) for x in (args.batches or ("1,8,32" if moe else "1")).split(",") if x]
    base = dict(ckpt=ckpt, shape=args.shape, layers=layers, weight_bytes=wb, new_tokens=args.new_tokens,
                warmup_tokens=args.warmup_tokens, batches=batches, repeats=args.repeats)
    rows: List[Dict[str, Any]] = []
    try:
        prior = prior_rows([x for x in args.with_.split(",") if x], wb, args.shape)
    except (OSError, ValueError) as e:
        print(f"bigload: --with: {e}", file=sys.stderr)
        return 2
    fracs = [float(x) for x in args.fractions.split(",") if x]
    hand = e2e.POLICIES["experts-host-all"]

    modes = args.modes.split(",")
    if not set(modes) <= {"batched", "cb"}:
        ap.error(f"--modes {args.modes}: batched, cb or both")

    def both(spec: Dict[str, Any]) -> None:
        """A row in each mode: decode at the batches, continuous batching (NAME-cb)."""
        if "batched" in modes:
            rows.append(run(spec, args))
        if "cb" in modes:
            rows.append(run(dict(spec, name=spec["name"] + "-cb", cb=True, distinct=False), args))

    have_plain = any(r["name"] == "plain" and not r.get("error") for r in prior)
    if "plain" in runs or (any(x.startswith("fit") for x in runs) and not have_plain):
        both(dict(base, name="plain", distinct=moe))
    if "host-free" in runs:
        both(dict(base, name="host-free", shim=True, policy=hand))
    # issue 42's rows on the engine's own load path (from_pretrained: the
    # host experts announced and served pinned, so the copy engine reads
    # them): every expert host with the copy engine, and half the experts'
    # bytes kept hot (WOFFLOAD_PICKS_HOT; the kernels copy a tensor with hot
    # experts), both with no blocker
    for x in engine_runs:
        if x.startswith("host-free"):
            both(dict(base, name=x, shim=True, policy=hand, env=engine_env(x)))
    if "hot-free" in runs:
        hot_mib = experts_bytes(rows + prior, wb) // 2 // 2**20
        both(dict(base, name="hot-free", shim=True, policy=hand,
                  env={"WOFFLOAD_PICKS_HOT": str(hot_mib)}))
    fitkey = f"version: 1\nfit: {{device: 100%, keep_free: {args.keep_free}}}\n"
    reserves = [x.strip() for x in args.fit_reserves.split(",") if x.strip()]
    nslots = [x for x in args.stream_slots.split(",") if x] or [""]
    def fit_auto(name: str, f: float, env: Dict[str, str]) -> None:
        """Rows NAME1-F and NAME2-F: fit with `reserve: auto`, twice. The
        first run keeps the engine's high water after seal in a memo file,
        the second reserves it, so that no weight yields (docs/policy.md,
        fit); each row in its own process."""
        pol = f"version: 1\nfit: {{device: 100%, keep_free: {args.keep_free}, reserve: auto}}\n"
        memo = os.path.abspath(os.path.join(args.out, f"fit-memo-{name}-{f}"))
        if os.path.exists(memo):
            os.unlink(memo)
        for k in (1, 2):
            both(dict(base, name=f"{name}{k}-{f}", fraction=f, shim=True, policy=pol,
                      env=dict(env, WOFFLOAD_FIT_MEMO=memo)))

    for f in fracs:
        # fit as users run it (prefetch.mode auto under fit: each off-device
        # range streamed or read in place as measured), then fit in place
        # (hot-set: the default before), then fit streaming everything
        if "fit" in runs:
            for n in nslots:
                pol = fitkey + (f"prefetch: {{slots: {int(n)}}}\n" if n else "")
                both(dict(base, name=f"fit{'-s' + n if n else ''}-{f}", fraction=f, shim=True, policy=pol))
            for rv in reserves:
                pol = f"version: 1\nfit: {{device: 100%, keep_free: {args.keep_free}, reserve: {rv}}}\n"
                both(dict(base, name=f"fit-r{rv}-{f}", fraction=f, shim=True, policy=pol))
        if "hand" in runs:
            both(dict(base, name=f"hand-{f}", fraction=f, shim=True, policy=hand))
        if "hand-hot" in runs:
            # every expert host, and the device memory the blocker and the
            # engine leave (less the managed cap's margin) kept for the
            # experts the copies move most: residency at expert grain and by
            # use, against fit's whole tensors chosen by class
            both(dict(base, name=f"hand-hot-{f}", fraction=f, shim=True,
                      policy=hand.replace("version: 1\n", "version: 1\nprefetch: {hot_experts: auto}\n", 1)))
        # fit's picked copies on the copy engine (issue 42: the kernels'
        # copies ran at 37-50 GB/s, the link's 55), and the hand policy with
        # it: fit against a hand policy that has every mechanism fit has
        for x in engine_runs:
            if x.startswith("host-free"):
                continue
            if x.startswith("fit") and x.endswith("-auto"):
                fit_auto(x, f, engine_env(x))
                continue
            both(dict(base, name=f"{x}-{f}", fraction=f, shim=True,
                      policy=fitkey if x.startswith("fit") else hand, env=engine_env(x)))
        if "fit-late" in runs:
            # the same policy as fit, every placeable allocation late bound
            both(dict(base, name=f"fit-late-{f}", fraction=f, shim=True, policy=fitkey,
                      env={"WOFFLOAD_LATE_BIND": "1"}))
        if "fit-bind" in runs:
            both(dict(base, name=f"fit-bind-{f}", fraction=f, shim=True, policy=fitkey,
                      env={"WOFFLOAD_FIT_BIND": "1"}))
        if "fit-engine-late" in runs:
            both(dict(base, name=f"fit-engine-late-{f}", fraction=f, shim=True, policy=fitkey,
                      env={"WOFFLOAD_PICKS_ENGINE": "50", "WOFFLOAD_PICKS_EARLY": "0"}))
        if "fit-auto" in runs:
            fit_auto("fit-auto", f, {})
        if "fit-bind-copies" in runs:
            # the same, the experts that yield copied picked from their bound
            # range rather than read in place (WOFFLOAD_BIND_COPIES=1)
            both(dict(base, name=f"fit-bind-copies-{f}", fraction=f, shim=True, policy=fitkey,
                      env={"WOFFLOAD_FIT_BIND": "1", "WOFFLOAD_BIND_COPIES": "1"}))
        if "fit-hotset" in runs:
            both(dict(base, name=f"fit-hotset-{f}", fraction=f, shim=True,
                      policy=fitkey + "prefetch: {mode: hot-set}\n"))
        if "fit-stream" in runs:
            for n in nslots:
                slots = f", slots: {int(n)}" if n else ""
                pol = fitkey + f"prefetch: {{mode: stream{slots}}}\n"
                both(dict(base, name=f"fit-stream{'-s' + n if n else ''}-{f}", fraction=f, shim=True,
                          policy=pol))
    if "fp8" in runs and not moe:
        rows.append(run(dict(base, name="fp8-plain", fp8=True), args))
        for f in [float(x) for x in args.fp8_fractions.split(",") if x]:
            rows.append(run(dict(base, name=f"fp8-{f}", fraction=f, fp8=True, shim=True,
                                 policy="version: 1\ndefault: host\n"), args))
    ran = {r["name"] for r in rows}
    rows += [r for r in prior if r["name"] not in ran]
    rows.sort(key=lambda r: r["name"] != "plain")  # the reference first (a stable sort)
    allf = fracs + [float(x) for x in args.fp8_fractions.split(",") if x]
    for r in rows:
        if not (r.get("prior") and r.get("fraction")):  # an earlier call's keeps its own
            r["fraction"] = next((f for f in allf if r["name"].removesuffix("-cb").endswith(f"-{f}")), 1.0)
    if moe:
        _, cfg = shape_config(args.shape, layers)
        md = moe_tables(rows, cfg["num_experts"], parse_size(args.keep_free))
    else:
        md = table(rows, dict(bf16="plain", fp8="fp8-plain"))
    warmed = [r for r in rows if (r.get("cache_warm") or {}).get("files")]
    if warmed:
        md += ("\n\nPage cache before each row's load: the checkpoint read once ("
               + f"{warmed[0]['cache_warm']['bytes'] / 2**30:.2f} GiB) in "
               + ", ".join(f"{r['name']} {r['cache_warm']['s']:.1f} s"
                           f" ({r['cache_warm']['bytes'] / max(r['cache_warm']['s'], 1e-9) / 1e9:.1f} GB/s)"
                           for r in warmed)
               + ": at memory's rate the checkpoint was cached before the row, at the disk's it was not")
    for r in rows:
        st, fit = r.get("stream") or {}, r.get("fit") or {}
        lc = load_line(r)
        if lc:
            md += f"\n\n{r['name']}: {lc}"
        if fit.get("budget"):
            md += (f"\n\n{r['name']}: fit budget {fit['budget'] / 2**20:.0f} MiB: weights "
                   f"{fit.get('device_bytes', 0) / 2**20:.0f} MiB, staging slots "
                   f"{fit.get('staging_bytes', 0) / 2**20:.0f} MiB, kept for what the engine allocates "
                   f"after seal {fit.get('reserve_bytes', 0) / 2**20:.0f} MiB, picked copies' "
                   f"buffers {fit.get('picks_bytes', 0) / 2**20:.0f} MiB, the engine's bytes no "
                   f"name covers {fit.get('untagged_bytes', 0) / 2**20:.0f} MiB; "
                   f"{fit.get('yielded_bytes', 0) / 2**20:.0f} MiB yielded in {fit.get('yields', 0)} "
                   f"yields; the engine's allocations after seal peaked at "
                   f"{fit.get('engine_peak_bytes', 0) / 2**20:.0f} MiB")
        if r.get("peak_by_phase"):
            md += (f"\n\n{r['name']}: device peak in phase '{r.get('peak_phase')}' "
                   f"({r.get('peak_at_s', 0):.0f} s in); by phase (GiB above the blocker): "
                   + ", ".join(f"{ph} {v / 2**30:.2f}" for ph, v in r["peak_by_phase"].items()))
            near = r.get("peak_near")
            if near:
                md += f"; within 2% of the peak first at {near[0]:.1f} s, in phase '{near[1]}'"
        if st.get("staged") or st.get("auto_tries"):
            md += ("; " if fit.get("budget") else f"\n\n{r['name']}: ")
            md += (f"streaming: {st.get('redirected')} launches redirected, read in place: "
                   f"{st.get('inplace_no_slot')} no slot ready, {st.get('inplace_other')} other; "
                   f"{st.get('awaited', 0)} waited for their copy ({st.get('await_ms', 0):.1f} ms in all, "
                   f"{st.get('await_timeouts', 0)} ran out); "
                   f"{st.get('staged')} staging copies ({st.get('staged_bytes', 0) / 2**30:.1f} GiB) over "
                   f"{st.get('steps')} steps; slots {st.get('slot_bytes', 0) / 2**20:.0f} MiB; "
                   f"auto by step time: {st.get('auto_tries', 0)} tries, {st.get('auto_kept', 0)} kept, "
                   f"{st.get('auto_backs', 0)} back in place, {st.get('auto_rechecks', 0)} rechecked")
    what = "Llama shape" if not moe else f"bench/e2e.py's {args.shape} shape"
    head = (f"weights {wb / 2**30:.2f} GiB bf16 ({layers} layers, {what}), "
            f"checkpoint written with save_pretrained and read with from_pretrained; "
            f"keep_free {args.keep_free}; {args.repeats} timed generates a batch (the median); "
            + (f"every row on cores {args.cpus}; " if args.cpus else "")
            + f"PCIe bound = offloaded bytes (embedding rows aside) once a token at {PCIE_GBS:.0f} GB/s"
            + (", an expert tensor at its layer's distinct share of the experts (the routers' picks "
               "in plain at that batch)" if moe else "") + "\n\n")
    with open(os.path.join(args.out, "bigload.md"), "w") as f:
        f.write(head + md + "\n")
    with open(os.path.join(args.out, "bigload.json"), "w") as f:
        json.dump(dict(make=mk, rows=rows), f, indent=1)
    print(head + md)
    return 0 if all(not r.get("error") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
