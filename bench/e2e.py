#!/usr/bin/env python3
"""End-to-end benchmark: transformers decode and prefill with weights placed
by libwoffload, against the other ways of offloading the same tensors.

    python3 bench/e2e.py [--build build] [--out bench/results] [--only moe,dense,fit]
                         [--scenarios NAME,...] [--commit C]

Models are built from configs with random weights (no downloads): a
Qwen3-MoE shape (that of ../shared/guide/device-facts.md: 16 layers, 32
experts, top-4, 19.7 GiB in bf16) and a dense Llama shape. Every scenario
runs in its own process (python3 bench/e2e.py --worker SPEC), the shim ones
under build/tools/woffload-run with the automatic hook, so the engine code
(the worker) is the same with and without the shim. The driver itself never
touches CUDA.

Per scenario: greedy tokens (compared with the all-GPU run), decode tok/s
(median over REPEATS generate calls after a warm-up call of the same shape;
each call's rate from per-step timestamps), prefill time of 1024 tokens
(median of 5 after a warm-up), and the PCIe bound for the bytes that must
cross per token. The MoE router and embeddings are re-drawn at std 1.0 so
routing spreads over the experts; the expert-usage histogram is printed.
Results: one Markdown file and one JSON file per run under --out.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
GiB = 2**30
PCIE_BPS = 55e9  # pinned H2D on the lent H100 (device-facts.md)

# ----------------------------------------------------------------------------
# models

MODELS: Dict[str, Dict[str, Any]] = {
    "moe": dict(arch="Qwen3MoeConfig", cfg=dict(
        vocab_size=32000, hidden_size=4096, intermediate_size=8192, moe_intermediate_size=1536,
        num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
        num_experts=32, num_experts_per_tok=4, max_position_embeddings=4096,
        decoder_sparse_step=1, mlp_only_layers=[])),
    # Mixtral's MoE shape (8 experts, top-2, expert width 5632) at 12 layers:
    # 12.4 GiB of experts (issues 18 and 22)
    "moe8": dict(arch="Qwen3MoeConfig", cfg=dict(
        vocab_size=32000, hidden_size=4096, intermediate_size=14336, moe_intermediate_size=5632,
        num_hidden_layers=12, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
        num_experts=8, num_experts_per_tok=2, max_position_embeddings=4096,
        decoder_sparse_step=1, mlp_only_layers=[])),
    # issue 42: a fine-grained MoE, Qwen3-30B-A3B's layer shape (128 experts,
    # top-8, expert width 768, hidden 2048) at 24 of its 48 layers: 27 GiB
    # of experts, 1.13 GiB a layer
    "moe128": dict(arch="Qwen3MoeConfig", cfg=dict(
        vocab_size=32000, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
        num_hidden_layers=24, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
        num_experts=128, num_experts_per_tok=8, max_position_embeddings=4096,
        decoder_sparse_step=1, mlp_only_layers=[])),
    "dense": dict(arch="LlamaConfig", cfg=dict(
        vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=16,
        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=4096)),
}

# ----------------------------------------------------------------------------
# policies (docs/policy.md). Written next to the results so a run is
# reproducible from its own files.

# A policy that names no prefetch.mode runs the default (docs/policy.md,
# "Why `auto` is the default"): `hot-set` before 01c82cc, `auto` from
# 01c82cc to 1078979 (the evening of 2026-11-26), `hot-set` again from
# 1078979 to d52ebb0, `auto` since d52ebb0. Results files name their
# commit: read a row of a policy without a mode by it.
POLICIES: Dict[str, str] = {
    "empty": """\
# No rule: the shim passes every allocation through (examples/empty.yaml).
version: 1
rules: []
""",
    "experts-host-l0-3": """\
# MoE experts of layers 0-3 in host memory, read in place over PCIe.
version: 1
default: device
rules:
  - name: experts-0-3
    match: experts
    layers: 0-3
    place: host
""",
    "experts-host-all": """\
# Every MoE expert in host memory (vLLM --cpu-offload-params experts,
# llama.cpp -ot exps=CPU), the default prefetch mode: auto since d52ebb0
# (read in place, or staged once a step where that pays), hot-set before.
version: 1
default: device
rules:
  - name: experts
    match: experts
    place: host
""",
    "experts-host-stream": """\
# Every MoE expert in host memory, staged once a step into device slots
# ahead of the launches that read it (issue 18, docs/prefetch.md Streaming):
# the default experts backend reads a stacked expert tensor once per token.
version: 1
default: device
prefetch:
  mode: stream
rules:
  - name: experts
    match: experts
    place: host
""",
    "experts-host-stream-s3": """\
# experts-host-stream with three device staging slots instead of four
# (each slot holds one stacked expert tensor: a slot less is 805 MiB more
# for the engine on the Qwen3 shape)
version: 1
default: device
prefetch:
  mode: stream
  slots: 3
rules:
  - name: experts
    match: experts
    place: host
""",
    "experts-host-auto": """\
# Every MoE expert in host memory; the streaming executor decides by the
# step's measured period whether staging them once a step into device slots
# beats reading them in place (prefetch.mode auto, uvm/stream-auto.h).
version: 1
default: device
prefetch:
  mode: auto
rules:
  - name: experts
    match: experts
    place: host
""",
    "experts-managed-half-auto": """\
# Every expert managed within half the experts' bytes (9 GiB of 18), the
# streaming executor deciding per range from measured read multiplicity:
# a tensor read >= 1.5x its bytes a step is staged into device slots (their
# bytes come out of the budget), the others keep the hot set (issue 18).
version: 1
default: device
device_budget: 9GiB
prefetch:
  mode: auto
rules:
  - name: experts
    match: experts
    place: managed
""",
    "layers-host-l0-3": """\
# Non-selective: whole decoder layers 0-3 on host (attention, norms, router, experts).
version: 1
default: device
rules:
  - name: layers-0-3
    layers: 0-3
    place: host
""",
    "experts-managed-half": """\
# Every expert managed: host-resident, prefetched within a device budget of
# half the experts' bytes (9 GiB of 18).
version: 1
default: device
device_budget: 9GiB
prefetch:
  enabled: true
rules:
  - name: experts
    match: experts
    place: managed
""",
    "experts-managed-6g": """\
# Every expert managed within a device budget of half the experts' bytes of
# the 8-expert shape (6 GiB of 12.4).
version: 1
default: device
device_budget: 6GiB
prefetch:
  enabled: true
rules:
  - name: experts
    match: experts
    place: managed
""",
    "experts-managed-6g-auto": """\
# The same 6 GiB budget, the streaming executor deciding per range from
# measured read multiplicity (issue 18): a range read >= 1.5x its bytes a
# step is staged into device slots (their bytes out of the budget), the
# others keep the hot set.
version: 1
default: device
device_budget: 6GiB
prefetch:
  mode: auto
rules:
  - name: experts
    match: experts
    place: managed
""",
    "experts-managed-noprefetch": """\
# Every expert managed, the prefetcher off: every read goes over PCIe in
# place (what managed memory costs against pinned host memory).
version: 1
default: device
prefetch:
  enabled: false
rules:
  - name: experts
    match: experts
    place: managed
""",
    "experts-managed-full": """\
# Every expert managed, a device budget that holds them all (19 GiB, below
# the free memory): what residency costs against device memory.
version: 1
default: device
device_budget: 19GiB
prefetch:
  enabled: true
rules:
  - name: experts
    match: experts
    place: managed
""",
    "experts-device": """\
# Every MoE expert named and kept on the GPU (all-GPU, with the launches
# attributed to names: what an all-GPU trace needs).
version: 1
default: device
rules:
  - name: experts
    match: experts
    place: device
""",
    "dense-host-l0-7": """\
# Dense model: decoder layers 0-7 (of 16) on host.
version: 1
default: device
rules:
  - name: layers-0-7
    layers: 0-7
    place: host
""",
}

# llama.cpp's --n-cpu-moe split from outside the engine (issue 18's managed
# target rows): the experts of the later half of the layers on the host,
# staged once a step into device slots, the others on the GPU: the GPU
# expert bytes of experts-managed-half (Qwen3 shape, layers 8-15 of 16;
# llama.cpp -ncmoe 8) and of experts-managed-6g (Mixtral shape, 6-11 of 12).
for _name, _layers in (("experts-split-half-stream", "8-15"), ("experts-split-6g-stream", "6-11")):
    POLICIES[_name] = f"""\
# Experts of layers {_layers} on the host, streamed; the others on the GPU
version: 1
default: device
prefetch:
  mode: stream
rules:
  - name: experts-late
    match: experts
    layers: '{_layers}'
    place: host
"""

# The staging source (issue 18): the same policies with prefetch.pinned_copies
# off (-nopin), every staging copy of a managed range made by the shim's copy
# kernel, beside the default (auto: each streamed managed range copied once
# into pinned memory and staged from there by the copy engine,
# uvm/stream-pin.h). The -pin rows of e2e-20261126-121326/121704, measured
# when the default was off, set auto: they are the default rows now.
for _p in ("experts-host-stream", "experts-managed-half-auto", "experts-managed-6g-auto"):
    POLICIES[_p + "-nopin"] = (
        f"# {_p} with prefetch.pinned_copies off\n"
        + POLICIES[_p].replace("  mode: ", "  pinned_copies: off\n  mode: ", 1))

# The same policies with the prefetch mode the default was before d52ebb0
# (hot-set: read in place, the hot set resident), to compare in one lease
POLICIES["experts-host-all-hotset"] = POLICIES["experts-host-all"].replace(
    "rules:\n", "prefetch: {mode: hot-set}\nrules:\n", 1)
# hot experts sized by the shim: the device memory free when the first set
# is made, less the managed margin (docs/picks.md, "Hot experts")
POLICIES["experts-host-all-hotauto"] = POLICIES["experts-host-all"].replace(
    "rules:\n", "prefetch: {hot_experts: auto}\nrules:\n", 1)
POLICIES["experts-managed-13g"] = POLICIES["experts-managed-half"].replace(
    "half the experts' bytes (9 GiB of 18)", "half the experts' bytes of the 128-expert\n# shape (13.5 GiB of 27)").replace(
    "device_budget: 9GiB", "device_budget: 13.5GiB")
POLICIES["experts-managed-half-hotset"] = POLICIES["experts-managed-half"].replace(
    "  enabled: true\n", "  enabled: true\n  mode: hot-set\n", 1)

# The managed row with every eviction a collapse of a read-mostly duplicate
# (no PCIe traffic for the drop), where `auto` chose copy-backs: 32 of the
# row's 50 evictions on the H100 (bench/results/e2e-20261127-010529-debug-
# managed-h100)
POLICIES["experts-managed-half-rm"] = POLICIES["experts-managed-half"].replace(
    "  enabled: true\n", "  enabled: true\n  eviction: read-mostly\n", 1)

# Fewer staging slots (issue 18's managed target): under a device budget the
# slots come out of the hot set's room, so each slot less leaves one more
# range resident
for _n in (2, 3):
    POLICIES[f"experts-managed-half-auto-slots{_n}"] = (
        f"# experts-managed-half-auto with {_n} staging slots\n"
        + POLICIES["experts-managed-half-auto"].replace("  mode: auto\n", f"  mode: auto\n  slots: {_n}\n", 1))

# ----------------------------------------------------------------------------
# scenarios
# swap: how the tensors are moved without the shim: ("pinned", selector) or
# ("accelerate", selector); selector: "experts:A-B", "experts:all", "layers:A-B".

def policy_text(policy: str) -> str:
    """A scenario's policy: a POLICIES name, or file:PATH (from the source root)."""
    if policy.startswith("file:"):
        with open(os.path.join(ROOT, policy[5:])) as f:
            return f.read()
    return POLICIES[policy]


def S(name: str, model: str, **kw: Any) -> Dict[str, Any]:
    d = dict(name=name, model=model, policy=None, swap=None, new_tokens=17, repeats=5, batches=None,
             batch_new_tokens=17,
             batch=1, prompt=32, prefill=1024, workload="decode", offload=None, ref=None)
    d.update(kw)
    return d

# issue 22: transformers' continuous batching (generate_batch, paged
# attention, its default experts backend): `requests` prompts of 16-128
# tokens, `new` tokens each, at most `max_batch_tokens` tokens a step
CB = dict(cb=dict(requests=64, new=32, max_batch_tokens=512, num_blocks=512), prefill=0, repeats=3)


def cb_rows(model: str, tag: str, managed: str, skew: Optional[Dict[str, Any]]) -> List[Dict[str, Any]]:
    ref = f"cb-{tag}-gpu"
    kw: Dict[str, Any] = dict(CB, skew=skew) if skew else dict(CB)
    return [S(ref, model, **kw),
            S(f"cb-{tag}-shim-experts-host-all", model, policy="experts-host-all", offload="experts:all",
              ref=ref, **kw),
            S(f"cb-{tag}-shim-experts-managed-half", model, policy=managed, offload="experts:all",
              ref=ref, **kw)]


# issue 6: the biased router: `hot` experts a layer (drawn per layer) get
# `sigma` standard deviations of that token's router logits added
SKEW = dict(hot=8, sigma=2.5, seed=99)
# the 128-expert shape's skewed router: 16 experts a layer favoured
SKEW128 = dict(hot=16, sigma=2.5, seed=99)
# batched rows: fewer and shorter calls (batch 32 reads every expert each step)
BATCH = dict(batch_new_tokens=9, repeats=3)


def batch_rows(model: str, tag: str, policies: List[str]) -> List[Dict[str, Any]]:
    """Batched decode at batch 1, 8 and 32 with transformers' default experts
    backend: the all-GPU reference batchdef-TAG-gpu, then one row a policy
    (every expert placed by it), batchdef-TAG-shim-POLICY."""
    ref = f"batchdef-{tag}-gpu"
    kw = dict(batches=[1, 8, 32], prefill=0, **BATCH)
    return [S(ref, model, **kw)] + [S(f"batchdef-{tag}-shim-{p}", model, policy=p, offload="experts:all",
                                      ref=ref, **kw) for p in policies]


SCENARIOS: List[Dict[str, Any]] = [
    S("moe-gpu", "moe"),
    S("moe-shim-empty", "moe", policy="empty", ref="moe-gpu"),
    S("moe-shim-experts-host-l0-3", "moe", policy="experts-host-l0-3", offload="experts:0-3", ref="moe-gpu"),
    S("moe-pinned-experts-l0-3", "moe", swap=["pinned", "experts:0-3"], offload="experts:0-3", ref="moe-gpu"),
    S("moe-shim-layers-host-l0-3", "moe", policy="layers-host-l0-3", offload="layers:0-3", ref="moe-gpu"),
    S("moe-accelerate-experts-l0-3", "moe", swap=["accelerate", "experts:0-3"], offload="experts:0-3",
      new_tokens=6, ref="moe-gpu"),
    S("moe-shim-experts-host-all", "moe", policy="experts-host-all", offload="experts:all", ref="moe-gpu"),
    S("moe-pinned-experts-all", "moe", swap=["pinned", "experts:all"], offload="experts:all", ref="moe-gpu"),
    S("moe-shim-experts-managed-half", "moe", policy="experts-managed-half", offload="experts:all",
      ref="moe-gpu"),
    # transformers' eager experts backend (a loop over the experts the router
    # picked, each launch handed that expert's slice of the stacked tensor):
    # the shim sees which experts a step reads. The default backend switches
    # to batched_mm for decode, which gathers the picked experts' weights per
    # token inside one kernel handed the whole tensor (docs/prefetch.md).
    S("eager-moe-gpu", "moe", experts_impl="eager"),
    S("eager-moe-shim-experts-host-all", "moe", experts_impl="eager", policy="experts-host-all",
      offload="experts:all", ref="eager-moe-gpu"),
    S("eager-moe-pinned-experts-all", "moe", experts_impl="eager", swap=["pinned", "experts:all"],
      offload="experts:all", ref="eager-moe-gpu"),
    S("eager-moe-shim-experts-managed-half", "moe", experts_impl="eager", policy="experts-managed-half",
      offload="experts:all", new_tokens=33, ref="eager-moe-gpu"),
    # issue 7: traces of the three placements, same engine, for the replay check
    S("trace-eager-gpu", "moe", experts_impl="eager", policy="experts-device", new_tokens=9, repeats=1,
      prefill=0, env={"WOFFLOAD_TRACE": "/tmp/wo-trace-eager-gpu.wotrace"}, ref="eager-moe-gpu"),
    S("trace-eager-host-all", "moe", experts_impl="eager", policy="experts-host-all", offload="experts:all",
      new_tokens=9, repeats=1, prefill=0, env={"WOFFLOAD_TRACE": "/tmp/wo-trace-eager-host-all.wotrace"},
      ref="eager-moe-gpu"),
    S("trace-eager-managed-half", "moe", experts_impl="eager", policy="experts-managed-half",
      offload="experts:all", new_tokens=17, repeats=1, prefill=0,
      env={"WOFFLOAD_TRACE": "/tmp/wo-trace-eager-managed-half.wotrace"}, ref="eager-moe-gpu"),
    # issue 7: where managed time goes (no prefetch; everything resident), and
    # traces that hold the prefetcher's actions
    S("eager-moe-shim-experts-managed-noprefetch", "moe", experts_impl="eager",
      policy="experts-managed-noprefetch", offload="experts:all", prefill=0, ref="eager-moe-gpu"),
    S("eager-moe-shim-experts-managed-full", "moe", experts_impl="eager", policy="experts-managed-full",
      offload="experts:all", new_tokens=33, prefill=0, ref="eager-moe-gpu"),
    S("trace-eager-managed-half-2", "moe", experts_impl="eager", policy="experts-managed-half",
      offload="experts:all", new_tokens=17, repeats=1, prefill=0,
      env={"WOFFLOAD_TRACE": "/tmp/wo-trace-eager-managed-half-2.wotrace"}, ref="eager-moe-gpu"),
    S("trace-skew-managed-half", "moe", experts_impl="eager", skew=SKEW, policy="experts-managed-half",
      offload="experts:all", new_tokens=17, repeats=1, prefill=0,
      env={"WOFFLOAD_TRACE": "/tmp/wo-trace-skew-managed-half.wotrace"}, ref="skew-moe-gpu"),
    S("trace-skew-gpu", "moe", experts_impl="eager", skew=SKEW, policy="experts-device", new_tokens=17,
      repeats=1, prefill=0, env={"WOFFLOAD_TRACE": "/tmp/wo-trace-skew-gpu.wotrace"}, ref="skew-moe-gpu"),
    # issue 6: a router biased toward 8 experts a layer (a hot set of a
    # quarter of the experts' bytes); managed with a budget of half of them
    S("skew-moe-gpu", "moe", experts_impl="eager", skew=SKEW, new_tokens=33),
    S("skew-moe-shim-experts-host-all", "moe", experts_impl="eager", skew=SKEW, new_tokens=33,
      policy="experts-host-all", offload="experts:all", ref="skew-moe-gpu"),
    S("skew-moe-shim-experts-managed-half", "moe", experts_impl="eager", skew=SKEW, new_tokens=33,
      policy="experts-managed-half", offload="experts:all", ref="skew-moe-gpu"),
    # the same after 4 warm-up calls (128 decode steps): the planner's steady state
    S("skew-moe-shim-experts-managed-half-warm", "moe", experts_impl="eager", skew=SKEW, new_tokens=33,
      warmups=4, prefill=0, policy="experts-managed-half", offload="experts:all", ref="skew-moe-gpu"),
    S("skew-moe-gpu-b", "moe", experts_impl="eager", skew=SKEW, new_tokens=33, prefill=0, ref="skew-moe-gpu"),
    S("skew-moe-shim-experts-host-all-b", "moe", experts_impl="eager", skew=SKEW, new_tokens=33, prefill=0,
      policy="experts-host-all", offload="experts:all", ref="skew-moe-gpu"),
    # the empty-policy overhead, alternating runs pinned to the same cores
    S("ovh-moe-gpu-a", "moe", prefill=0, new_tokens=33, ref="ovh-moe-gpu-a"),
    S("ovh-moe-shim-empty-a", "moe", prefill=0, new_tokens=33, policy="empty", ref="ovh-moe-gpu-a"),
    S("ovh-moe-gpu-b", "moe", prefill=0, new_tokens=33, ref="ovh-moe-gpu-a"),
    S("ovh-moe-shim-empty-b", "moe", prefill=0, new_tokens=33, policy="empty", ref="ovh-moe-gpu-a"),
    S("ovh-moe-gpu-c", "moe", prefill=0, new_tokens=33, ref="ovh-moe-gpu-a"),
    S("ovh-moe-shim-empty-c", "moe", prefill=0, new_tokens=33, policy="empty", ref="ovh-moe-gpu-a"),
    # batched decode with transformers' default experts backend (what users
    # run): decode gathers each picked expert per token from the whole
    # stacked tensor, so reads multiply with the batch (issues 18, 21)
    # (issue 18: host-stream, the streaming executor; managed-half-auto, it
    # deciding per range)
    *batch_rows("moe", "moe", ["experts-host-all", "experts-managed-half", "experts-host-stream",
                               "experts-managed-half-auto", "experts-host-all-hotset",
                               "experts-managed-half-hotset", "experts-managed-half-rm"]),
    # issue 42: picked staging (the hook hands the router's ids to the shim,
    # only the picked experts cross PCIe; the default) beside the same rows
    # with it off (WOFFLOAD_PICKS=0: the streaming executor's `auto`), on the
    # 128-expert shape
    *batch_rows("moe128", "moe128", ["experts-host-all", "experts-managed-13g"]),
    S("batchdef-moe128-shim-experts-host-all-nopicks", "moe128", batches=[1, 8, 32], prefill=0,
      **BATCH, policy="experts-host-all", offload="experts:all", ref="batchdef-moe128-gpu",
      env={"WOFFLOAD_PICKS": "0"}),
    S("batchdef-moe128-shim-experts-managed-13g-nopicks", "moe128", batches=[1, 8, 32], prefill=0,
      **BATCH, policy="experts-managed-13g", offload="experts:all", ref="batchdef-moe128-gpu",
      env={"WOFFLOAD_PICKS": "0"}),
    # ... on the copy engine (WOFFLOAD_PICKS_ENGINE=50) with its early copies
    # (a layer's down copied behind gate_up), and without them
    S("batchdef-moe128-shim-experts-host-all-engine", "moe128", batches=[1, 8, 32], prefill=0,
      **BATCH, policy="experts-host-all", offload="experts:all", ref="batchdef-moe128-gpu",
      env={"WOFFLOAD_PICKS_ENGINE": "50"}),
    S("batchdef-moe128-shim-experts-host-all-engine-late", "moe128", batches=[1, 8, 32],
      prefill=0, **BATCH, policy="experts-host-all", offload="experts:all",
      ref="batchdef-moe128-gpu", env={"WOFFLOAD_PICKS_ENGINE": "50", "WOFFLOAD_PICKS_EARLY": "0"}),
    # hot experts (WOFFLOAD_PICKS_HOT, docs/picks.md "Hot experts"): the
    # picked copies take the rows of each layer's most picked experts from
    # the device; half the experts' bytes for them (13 GiB, the managed
    # row's budget), beside the same policy without, with the uniform router
    # and a skewed one (SKEW128)
    S("batchdef-moe128-shim-experts-host-all-hot13g", "moe128", batches=[1, 8, 32], prefill=0,
      **BATCH, policy="experts-host-all", offload="experts:all", ref="batchdef-moe128-gpu",
      env={"WOFFLOAD_PICKS_HOT": "13312"}),
    # traces of the picks at batch 8, without and with hot experts: the
    # replay's model of picked staging held against the measured step
    # (docs/replay.md, "Picked experts"; test-replay-accuracy once recorded)
    S("trace-moe128-picks-b8", "moe128", batches=[8], prefill=0, **BATCH,
      policy="experts-host-all", offload="experts:all", ref="batchdef-moe128-gpu",
      env={"WOFFLOAD_TRACE": "/tmp/wo-trace-moe128-picks-b8.wotrace"}),
    S("trace-moe128-picks-hot13g-b8", "moe128", batches=[8], prefill=0, **BATCH,
      policy="experts-host-all", offload="experts:all", ref="batchdef-moe128-gpu",
      env={"WOFFLOAD_TRACE": "/tmp/wo-trace-moe128-picks-hot13g-b8.wotrace",
           "WOFFLOAD_PICKS_HOT": "13312"}),
    # ... and the same two with the copies on the copy engine (the PICKS
    # records' engine rows, booked on the copy engine by the replay)
    S("trace-moe128-picks-engine-b8", "moe128", batches=[8], prefill=0, **BATCH,
      policy="experts-host-all", offload="experts:all", ref="batchdef-moe128-gpu",
      env={"WOFFLOAD_TRACE": "/tmp/wo-trace-moe128-picks-engine-b8.wotrace",
           "WOFFLOAD_PICKS_ENGINE": "50"}),
    S("trace-moe128-picks-hot13g-engine-b8", "moe128", batches=[8], prefill=0, **BATCH,
      policy="experts-host-all", offload="experts:all", ref="batchdef-moe128-gpu",
      env={"WOFFLOAD_TRACE": "/tmp/wo-trace-moe128-picks-hot13g-engine-b8.wotrace",
           "WOFFLOAD_PICKS_HOT": "13312", "WOFFLOAD_PICKS_ENGINE": "50"}),
    # ... and with hot_experts: auto (on an unconstrained GPU: every expert
    # hot once picked, the rows copied from the device)
    S("batchdef-moe128-shim-experts-host-all-hotauto", "moe128", batches=[1, 8, 32], prefill=0,
      **BATCH, policy="experts-host-all-hotauto", offload="experts:all",
      ref="batchdef-moe128-gpu"),
    S("batchdef-moe128skew-gpu", "moe128", batches=[1, 8, 32], prefill=0, skew=SKEW128, **BATCH),
    S("batchdef-moe128skew-shim-experts-host-all", "moe128", batches=[1, 8, 32], prefill=0,
      skew=SKEW128, **BATCH, policy="experts-host-all", offload="experts:all",
      ref="batchdef-moe128skew-gpu"),
    S("batchdef-moe128skew-shim-experts-host-all-hot13g", "moe128", batches=[1, 8, 32], prefill=0,
      skew=SKEW128, **BATCH, policy="experts-host-all", offload="experts:all",
      ref="batchdef-moe128skew-gpu", env={"WOFFLOAD_PICKS_HOT": "13312"}),
    # ... and a 1024-token prefill, where every expert is picked and picked
    # staging cannot overlap a layer's copy with its compute (the streaming
    # executor copies ahead)
    S("moe128-gpu", "moe128"),
    S("moe128-shim-experts-host-all", "moe128", policy="experts-host-all", offload="experts:all",
      ref="moe128-gpu"),
    S("moe128-shim-experts-host-all-nopicks", "moe128", policy="experts-host-all",
      offload="experts:all", ref="moe128-gpu", env={"WOFFLOAD_PICKS": "0"}),
    S("batchdef-moe-shim-experts-host-stream-s3", "moe", batches=[1, 8, 32], prefill=0, **BATCH,
      policy="experts-host-stream-s3", offload="experts:all", ref="batchdef-moe-gpu"),
    # auto decides after the stepper found the step (~26 steps of this
    # model) and 19 measured steps: longer calls than the other rows', and
    # a reference of the same length (every token compared)
    S("batchdef-moe-gpu-long", "moe", batches=[1, 8, 32], prefill=0,
      **dict(BATCH, batch_new_tokens=32, repeats=2)),
    S("batchdef-moe-shim-experts-host-auto", "moe", batches=[1, 8, 32], prefill=0,
      **dict(BATCH, batch_new_tokens=32, repeats=2),
      policy="experts-host-auto", offload="experts:all", ref="batchdef-moe-gpu-long"),
    # issue 11: batched decode, aggregate tok/s at batch 1, 8 and 32, eager
    # experts (a step reads each picked expert once, whatever the batch)
    S("batch-moe-gpu", "moe", batches=[1, 8, 32], prefill=0, experts_impl="eager", **BATCH),
    S("batch-moe-shim-experts-host-all", "moe", batches=[1, 8, 32], prefill=0, experts_impl="eager", **BATCH, policy="experts-host-all",
      offload="experts:all", ref="batch-moe-gpu"),
    S("batch-moe-pinned-experts-all", "moe", batches=[1, 8, 32], prefill=0, experts_impl="eager", **BATCH, swap=["pinned", "experts:all"],
      offload="experts:all", ref="batch-moe-gpu"),
    S("batch-moe-shim-experts-host-l0-3", "moe", batches=[1, 8, 32], prefill=0, experts_impl="eager", **BATCH, policy="experts-host-l0-3",
      offload="experts:0-3", ref="batch-moe-gpu"),
    S("batch-moe-shim-experts-managed-half", "moe", batches=[1, 8, 32], prefill=0, experts_impl="eager", **BATCH,
      policy="experts-managed-half", offload="experts:all", ref="batch-moe-gpu"),
    S("batch-moe-accelerate-experts-l0-3", "moe", batches=[1, 8, 32], prefill=0, batch_new_tokens=5,
      repeats=2, experts_impl="eager",
      swap=["accelerate", "experts:0-3"], offload="experts:0-3", ref="batch-moe-gpu"),
    # where the empty policy's cost comes from: the library loaded but intercepting
    # nothing, and launches intercepted but their parameters not scanned
    S("overhead-moe-shim-disabled", "moe", policy="empty", env={"WOFFLOAD_DISABLE": "1"}, prefill=0,
      ref="moe-gpu"),
    S("overhead-moe-shim-empty-noscan", "moe", policy="empty", env={"WOFFLOAD_SCAN_WORDS": "0"}, prefill=0,
      ref="moe-gpu"),
    # the empty-policy overhead again, interleaved with a second all-GPU run:
    # the launch-bound decode rate moves by several percent between processes
    S("moe-gpu-2", "moe", prefill=0, ref="moe-gpu"),
    S("moe-shim-empty-2", "moe", policy="empty", prefill=0, ref="moe-gpu"),
    # short recorded traces for tests/traces (replay tests in CI): the same
    # engine and shapes, few steps so the files stay small
    S("trace-moe-decode", "moe", policy="experts-managed-half", offload="experts:all", new_tokens=8,
      repeats=1, prefill=0, env={"WOFFLOAD_TRACE": "/tmp/wo-trace-moe-decode.wotrace"}, ref="moe-gpu"),
    S("trace-moe-prefill", "moe", policy="experts-host-all", offload="experts:all", new_tokens=2,
      repeats=1, prefill=1024, env={"WOFFLOAD_TRACE": "/tmp/wo-trace-moe-prefill.wotrace"}, ref="moe-gpu"),
    S("trace-dense-decode", "dense", policy="dense-host-l0-7", offload="layers:0-7", new_tokens=8,
      repeats=1, prefill=0, env={"WOFFLOAD_TRACE": "/tmp/wo-trace-dense-decode.wotrace"}, ref="dense-gpu"),
    S("dense-gpu", "dense"),
    S("dense-shim-empty", "dense", policy="empty", ref="dense-gpu"),
    S("dense-shim-host-l0-7", "dense", policy="dense-host-l0-7", offload="layers:0-7", ref="dense-gpu"),
    S("dense-pinned-l0-7", "dense", swap=["pinned", "layers:0-7"], offload="layers:0-7", ref="dense-gpu"),
    # Runs only because of the shim: a blocker allocation leaves the weights
    # plus half of what the workload needs beyond them; managed memory stays
    # below the free memory (safety rule). fit-gpu measures that need.
    # issue 11: dense decode with a static KV cache, compiled by transformers
    # (torch.compile mode reduce-overhead: CUDA graphs), layers 0-7 on host
    S("graph-dense-gpu", "dense", static_cache=True, prefill=0),
    S("graph-dense-shim-empty", "dense", static_cache=True, prefill=0, policy="empty", ref="graph-dense-gpu"),
    S("graph-dense-shim-host-l0-7", "dense", static_cache=True, prefill=0, policy="dense-host-l0-7",
      offload="layers:0-7", ref="graph-dense-gpu"),
    S("graph-dense-gpu-2", "dense", static_cache=True, prefill=0, ref="graph-dense-gpu"),
    S("graph-dense-shim-empty-2", "dense", static_cache=True, prefill=0, policy="empty", ref="graph-dense-gpu"),
    S("fit-gpu", "moe", workload="fit", batch=16, prompt=2048, new_tokens=8, repeats=1, prefill=0),
    S("fit-blocked-noshim", "moe", workload="fit", batch=16, prompt=2048, new_tokens=8, repeats=1,
      prefill=0, blocker=True, ref="fit-gpu"),
    S("fit-blocked-shim-experts-host-all", "moe", workload="fit", batch=16, prompt=2048, new_tokens=8,
      repeats=1, prefill=0, blocker=True, policy="experts-host-all", offload="experts:all", ref="fit-gpu"),
]

# issue 7: managed in its steady state (4 warm-up calls: 128 decode steps), twice
for _n in ("eager-moe-shim-experts-managed-half-warm", "eager-moe-shim-experts-managed-half-warm-b"):
    SCENARIOS.append(dict(next(x for x in SCENARIOS if x["name"] == "eager-moe-shim-experts-managed-half"),
                          name=_n, warmups=4, prefill=0))

# issue 7, the replay check: one all-GPU trace and three placements measured
# with the very same calls (2 warm-up generates of 17 tokens, 3 timed), the
# measured rows alternating so that the lent VM's drifting host speed falls
# on every placement alike; a traced managed row to compare the real
# prefetcher with the simulated one step by step
R7 = dict(experts_impl="eager", new_tokens=17, warmups=2, repeats=3, prefill=0, ref="r7-gpu-a")
SCENARIOS.append(S("r7-trace-gpu", "moe", policy="experts-device",
                   env={"WOFFLOAD_TRACE": "/tmp/wo-trace-r7-gpu.wotrace"}, **R7))
for _x in "abcde":
    SCENARIOS.append(S(f"r7-gpu-{_x}", "moe", **R7))
    SCENARIOS.append(S(f"r7-host-{_x}", "moe", policy="experts-host-all", offload="experts:all", **R7))
    SCENARIOS.append(S(f"r7-managed-{_x}", "moe", policy="experts-managed-half", offload="experts:all",
                       **R7))
# the prefetcher from the engine's context (as before 2026-11-22 21:00) beside
# its own context (the default): bench/prefetch-contention.cu
for _x in "abc":
    SCENARIOS.append(S(f"r7-managed-engctx-{_x}", "moe", policy="experts-managed-half",
                       offload="experts:all", env={"WOFFLOAD_PREFETCH_OWN_CONTEXT": "0"}, **R7))
SCENARIOS.append(dict(next(x for x in SCENARIOS if x["name"] == "skew-moe-shim-experts-managed-half-warm"),
                      name="skew-moe-shim-experts-managed-half-warm-engctx",
                      env={"WOFFLOAD_PREFETCH_OWN_CONTEXT": "0"}))
# issue 7: do the host and managed placements slow the engine's own host
# work? Traced all-GPU, experts-on-host and experts-managed runs, alternating (bench/trace-steps.py splits
# each step into the host's own work and what follows its waits)
for _x in "abcde":
    SCENARIOS.append(S(f"r7h-gpu-{_x}", "moe", policy="experts-device",
                       env={"WOFFLOAD_TRACE": f"/tmp/wo-trace-r7h-gpu-{_x}.wotrace"}, **R7))
    SCENARIOS.append(S(f"r7h-host-{_x}", "moe", policy="experts-host-all", offload="experts:all",
                       env={"WOFFLOAD_TRACE": f"/tmp/wo-trace-r7h-host-{_x}.wotrace"}, **R7))
    SCENARIOS.append(S(f"r7h-managed-{_x}", "moe", policy="experts-managed-half", offload="experts:all",
                       env={"WOFFLOAD_TRACE": f"/tmp/wo-trace-r7h-managed-{_x}.wotrace"}, **R7))
SCENARIOS.append(S("r7-trace-managed", "moe", policy="experts-managed-half", offload="experts:all",
                   env={"WOFFLOAD_TRACE": "/tmp/wo-trace-r7-managed.wotrace"}, **R7))

# issue 18: batched decode on the Mixtral shape (8 experts top-2, 12 layers,
# 12.4 GiB of experts), transformers' default experts backend
SCENARIOS += batch_rows("moe8", "moe8", ["experts-host-all", "experts-host-stream", "experts-managed-6g-auto"])
# issue 42's coarse half-resident target with hot experts: every expert host,
# half the experts' bytes hot (the managed rows' budgets: 6 GiB of Mixtral's
# 12.4, 9 GiB of the Qwen3 shape's 18), the picked copies by the kernels and
# on the copy engine (WOFFLOAD_PICKS_ENGINE=50: the kernels copy the hot rows
# from the device, the copy engine the others); the 128-expert shape's
# hot13g row on the copy engine beside them
for _model, _tag, _mib in (("moe8", "moe8", 6144), ("moe", "moe", 9216), ("moe128", "moe128", 13312)):
    for _eng in ((), ("engine",)) if _model != "moe128" else (("engine",),):
        SCENARIOS.append(S("-".join([f"batchdef-{_tag}-shim-experts-host-all-hot{_mib // 1024}g", *_eng]),
                           _model, batches=[1, 8, 32], prefill=0, **BATCH, policy="experts-host-all",
                           offload="experts:all", ref=f"batchdef-{_tag}-gpu",
                           env=dict({"WOFFLOAD_PICKS_HOT": str(_mib)},
                                    **({"WOFFLOAD_PICKS_ENGINE": "50"} if _eng else {}))))
# issue 18: pinned copies as the staging source against the copy kernel, at
# batch 8 and 32 (b1 reads in place under auto; stream at b1 is not a row
# anyone runs), on both shapes
for _model, _pols in (("moe", ["experts-host-stream", "experts-host-stream-nopin",
                               "experts-managed-half-auto", "experts-managed-half-auto-nopin"]),
                      ("moe8", ["experts-host-stream", "experts-host-stream-nopin",
                                "experts-managed-6g-auto", "experts-managed-6g-auto-nopin"])):
    _kw = dict(batches=[8, 32], prefill=0, **BATCH)
    SCENARIOS.append(S(f"pin-{_model}-gpu", _model, **_kw))
    SCENARIOS += [S(f"pin-{_model}-shim-{_p}", _model, policy=_p, offload="experts:all",
                    ref=f"pin-{_model}-gpu", **_kw) for _p in _pols]
SCENARIOS += [S(f"pin-moe-shim-experts-managed-half-auto-slots{_n}", "moe",
                policy=f"experts-managed-half-auto-slots{_n}", offload="experts:all", ref="pin-moe-gpu",
                batches=[8, 32], prefill=0, **BATCH) for _n in (2, 3)]
# issue 18: the static split (half the layers' experts on the GPU, the rest
# streamed), the managed rows' GPU expert bytes, against llama.cpp -ncmoe 8
SCENARIOS += [
    S("split-moe-shim-experts-split-half-stream", "moe", batches=[8, 32], prefill=0,
      policy="experts-split-half-stream", offload="experts:8-15", ref="pin-moe-gpu", **BATCH),
    S("split-moe8-shim-experts-split-6g-stream", "moe8", batches=[8, 32], prefill=0,
      policy="experts-split-6g-stream", offload="experts:6-11", ref="pin-moe8-gpu", **BATCH),
]
# issue 18: what the streaming slots' write checks cost (docs/prefetch.md,
# "Write checks"): the pinned-copy rows above against the same with
# WOFFLOAD_WRITE_CHECKS=0, side by side in one run
SCENARIOS += [S(f"wc-moe-shim-{_p}-nochecks", "moe", policy=_p, offload="experts:all",
                ref="pin-moe-gpu", batches=[8, 32], prefill=0, env={"WOFFLOAD_WRITE_CHECKS": "0"},
                **BATCH)
              for _p in ("experts-host-stream", "experts-managed-half-auto")]
# issue 18, item 3: batch-8 decode with transformers' default experts
# backend, traced (WOFFLOAD_TRACE) for CI's replay-accuracy check: the
# replay under the recorded placements against the run's own step
# (all-GPU through the shim, and the experts managed at half their bytes)
SCENARIOS += [
    S("b8trace-moe-gpu", "moe", batches=[8], prefill=0, policy="experts-device",
      env={"WOFFLOAD_TRACE": "/tmp/wo-trace-b8-gpu.wotrace"}, ref="pin-moe-gpu", **BATCH),
    S("b8trace-moe-managed-half", "moe", batches=[8], prefill=0, policy="experts-managed-half",
      offload="experts:all", env={"WOFFLOAD_TRACE": "/tmp/wo-trace-b8-managed-half.wotrace"},
      ref="pin-moe-gpu", **BATCH),
]
SCENARIOS += cb_rows("moe8", "moe8-uniform", "experts-managed-6g", None)
SCENARIOS += cb_rows("moe8", "moe8-skew", "experts-managed-6g", dict(hot=2, sigma=2.5, seed=99))
SCENARIOS += cb_rows("moe", "moe32-uniform", "experts-managed-half", None)
SCENARIOS += cb_rows("moe", "moe32-skew", "experts-managed-half", SKEW)
# issue 42: continuous batching on the 128-expert shape, uniform and skewed
# routers: experts on host, managed at half their bytes, and on host with
# half their bytes as hot experts (docs/picks.md, "Hot experts")
for _tag, _skew in (("moe128-uniform", None), ("moe128-skew", SKEW128)):
    SCENARIOS += cb_rows("moe128", _tag, "experts-managed-13g", _skew)
    SCENARIOS.append(S(f"cb-{_tag}-shim-experts-host-all-hot13g", "moe128",
                       policy="experts-host-all", offload="experts:all", ref=f"cb-{_tag}-gpu",
                       env={"WOFFLOAD_PICKS_HOT": "13312"},
                       **(dict(CB, skew=_skew) if _skew else dict(CB))))
# issue 19: fit's policy against the three hand-written ones of
# tests/test-fit-tool.sh at the same budget (fit --device 30GiB on the trace
# of cb-moe32-uniform-trace-gpu: 11.65 GiB of weights on the device), on the
# workload that trace recorded; the replay predicted fit within 10% of the
# best. The fit policy is written on the GPU machine first:
#   build-gpu/tools/woffload-policy fit --trace tests/traces/h200-cb-moe32-uniform-gpu.wot.gz \
#       --device 30GiB --model tools/models/h100.model -o build-gpu/fit-p30.yaml
# "file:PATH" policies are read from PATH (relative to the source root).
SCENARIOS += [
    S("fitcmp-fit", "moe", policy="file:build-gpu/fit-p30.yaml", ref="cb-moe32-uniform-gpu", **CB),
    S("fitcmp-hand-experts-host", "moe", policy="file:tests/fit/hand-experts-host.yaml",
      ref="cb-moe32-uniform-gpu", **CB),
    S("fitcmp-hand-late-layers-host", "moe", policy="file:tests/fit/hand-late-layers-host.yaml",
      ref="cb-moe32-uniform-gpu", **CB),
    S("fitcmp-hand-experts-managed", "moe", policy="file:tests/fit/hand-experts-managed.yaml",
      ref="cb-moe32-uniform-gpu", env={"WO_FIT_EXPERT_BUDGET": "9.9GiB"}, **CB),
]
# a trace of a continuous-batching run, experts named and on the GPU, for the
# replay's what-if checks (tests/traces, issue 22)
SCENARIOS.append(S("cb-moe32-uniform-trace-gpu", "moe", policy="experts-device",
                   env={"WOFFLOAD_TRACE": "/tmp/wo-trace-cb-moe32-uniform-gpu.wotrace"},
                   ref="cb-moe32-uniform-gpu", **dict(CB, repeats=1)))

# issue 7: a second pass of the eager rows in the same run (processes on the
# lent VM differ by up to 1.5x in host speed: the replay's what-if
# predictions are compared with the median of both passes)
for _n in ("trace-eager-gpu", "eager-moe-gpu", "eager-moe-shim-experts-host-all",
           "eager-moe-shim-experts-managed-half"):
    _s = dict(next(x for x in SCENARIOS if x["name"] == _n), name=_n + "-b", prefill=0)
    if _s.get("env", {}).get("WOFFLOAD_TRACE"):
        _s["env"] = {"WOFFLOAD_TRACE": _s["env"]["WOFFLOAD_TRACE"].replace(".wotrace", "-b.wotrace")}
    if _s.get("ref"):
        _s["ref"] = "eager-moe-gpu"
    SCENARIOS.append(_s)

# ----------------------------------------------------------------------------
# the worker: one scenario in this process

def layer_of(name: str) -> int:
    parts = name.split(".")
    for i, p in enumerate(parts[:-1]):
        if p == "layers" and parts[i + 1].isdigit():
            return int(parts[i + 1])
    return -1


def selected(selector: str, name: str) -> bool:
    what, _, rng = selector.partition(":")
    li = layer_of(name)
    if rng == "all":
        in_range = li >= 0
    else:
        a, _, b = rng.partition("-")
        in_range = int(a) <= li <= int(b or a)
    if what == "experts":
        return in_range and ".experts." in f".{name}."
    if what == "layers":
        return in_range
    raise ValueError(selector)


def worker(spec: Dict[str, Any]) -> Dict[str, Any]:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, LogitsProcessor, LogitsProcessorList

    res: Dict[str, Any] = dict(name=spec["name"], torch=torch.__version__,
                               transformers=transformers.__version__)
    wo = None
    if spec.get("policy"):
        import woffload as wo  # on PYTHONPATH through woffload-run
        res["woffload"] = wo.version()
        if not wo.available():
            raise RuntimeError("scenario needs the shim but libwoffload is not preloaded")

    mi = MODELS[spec["model"]]
    cfg = getattr(transformers, mi["arch"])(**mi["cfg"])
    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    weight_bytes = sum(p.numel() * p.element_size() for p in meta.parameters())
    res["weight_bytes"] = weight_bytes
    res["offload_bytes"] = sum(p.numel() * p.element_size() for n, p in meta.named_parameters()
                               if spec["offload"] and selected(spec["offload"], n))
    del meta

    blocker = None
    if spec.get("blocker"):
        free, total = torch.cuda.mem_get_info()
        leave = weight_bytes + int(spec["fit_extra"])
        size = free - leave
        res["blocker"] = dict(free_before=free, total=total, leave=leave, size=size)
        if wo is not None:
            with wo.window_closed():  # the blocker is ordinary device memory
                blocker = torch.empty(size, dtype=torch.uint8, device="cuda")
        else:
            blocker = torch.empty(size, dtype=torch.uint8, device="cuda")
        res["blocker"]["free_after"] = torch.cuda.mem_get_info()[0]

    torch.manual_seed(0)
    t0 = time.perf_counter()
    with torch.device("cuda"):
        attn = dict(attn_implementation="paged|sdpa") if spec.get("cb") else {}
        m = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, **attn)
    m.eval()
    if spec.get("experts_impl"):
        if not hasattr(m, "set_experts_implementation"):
            raise RuntimeError("this transformers has no set_experts_implementation()")
        m.set_experts_implementation(spec["experts_impl"])
    if hasattr(m, "get_experts_implementation"):
        res["experts_impl"] = str(m.get_experts_implementation())
    g = torch.Generator("cuda").manual_seed(1234)
    with torch.no_grad():  # routing spreads over the experts (device-facts.md)
        m.get_input_embeddings().weight.normal_(0.0, 1.0, generator=g)
        for name, p in m.named_parameters():
            if name.endswith("mlp.gate.weight"):
                p.normal_(0.0, 1.0, generator=g)
    torch.cuda.synchronize()
    res["build_s"] = time.perf_counter() - t0
    if spec.get("skew"):
        res["hot_experts"] = install_skew(torch, m, mi["cfg"], **spec["skew"])

    keep: List[Any] = []
    if spec.get("swap"):
        how, sel = spec["swap"]
        if how == "pinned":
            res["moved_bytes"] = pinned_swap(torch, m, sel, keep)
        elif how == "accelerate":
            res["moved_bytes"] = accelerate_offload(torch, m, sel, mi["cfg"]["num_hidden_layers"])
        torch.cuda.empty_cache()

    gen = torch.Generator("cuda").manual_seed(1)
    V = mi["cfg"]["vocab_size"]
    ids = torch.randint(0, V, (spec["batch"], spec["prompt"]), device="cuda", generator=gen)

    class StepClock(LogitsProcessor):
        def __init__(self) -> None:
            self.t: List[float] = []

        def __call__(self, input_ids: Any, scores: Any) -> Any:
            torch.cuda.synchronize()
            self.t.append(time.perf_counter())
            return scores

    def generate(ids: Any, n: int) -> Any:
        clock = StepClock()
        with torch.no_grad():
            # static cache: transformers compiles the decode step (mode reduce-overhead: CUDA graphs)
            extra = dict(cache_implementation="static") if spec.get("static_cache") else {}
            out = m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                             min_new_tokens=n, do_sample=False, pad_token_id=0,
                             logits_processor=LogitsProcessorList([clock]), **extra)
        return out[:, ids.shape[1]:], clock.t

    def touched() -> Dict[str, int]:
        """The shim's own count of bytes launches touched, by placement
        (woffload.stats() names[].touched_bytes, each hit one slice extent),
        and under "managed_pcie" what crossed PCIe for managed names: bytes
        read in place (misses) plus bytes prefetched (prefetch.names, which
        the consumer thread publishes every 100 ms: hence the sleep, which
        also lets it drain the event ring)."""
        time.sleep(0.15)
        acc: Dict[str, int] = {}
        st = wo.stats() or {}
        for nm in st.get("names", []):
            acc[nm.get("placement", "?")] = acc.get(nm.get("placement", "?"), 0) + nm.get("touched_bytes", 0)
        pf = (st.get("prefetch") or {}).get("names") or {}
        # plus the staging copies of streamed ranges (a managed range auto
        # streams has left the planner, and its prefetch.names figures
        # with it: a difference that comes out negative is not reported)
        acc["managed_pcie"] = (sum(v.get("miss_bytes", 0) + v.get("prefetched", 0) for v in pf.values())
                               + (st.get("stream") or {}).get("staged_bytes", 0))
        return acc

    def measure(ids: Any, n: int, repeats: int) -> Dict[str, Any]:
        """A warm-up generate with the very shape timed (it seals under the
        shim), then `repeats` timed ones; rate = steps / time between the
        first and last step's logits (prefill excluded). Under the shim, the
        bytes a decode step touched per placement: (a generate of n tokens
        minus a generate of 1, the prefill alone) / (n - 1)."""
        t0 = time.perf_counter()
        toks, _ = generate(ids, n)
        out: Dict[str, Any] = dict(first_generate_s=time.perf_counter() - t0)
        # more warm-up calls where the prefetcher must learn first (its
        # frequencies average over ~64 steps, a swap pays back over 128)
        for _ in range(spec.get("warmups", 1) - 1):
            generate(ids, n)
        rates: List[float] = []
        steps_ms: List[float] = []  # each timed decode step (logits to logits), for the replay check
        for i in range(repeats):
            if wo is not None and i == 0:
                a = touched()
            toks2, ts = generate(ids, n)
            if wo is not None and i == 0:
                b = touched()
                generate(ids, 1)
                c = touched()
                out["shim_step_bytes"] = {
                    k: ((b.get(k, 0) - a.get(k, 0)) - (c.get(k, 0) - b.get(k, 0))) / max(1, n - 1)
                    for k in b}
                if out["shim_step_bytes"].get("managed_pcie", 0) < 0:
                    del out["shim_step_bytes"]["managed_pcie"]
            if len(ts) > 1:
                rates.append((len(ts) - 1) / (ts[-1] - ts[0]))
                steps_ms.extend(round((b - a) * 1e3, 3) for a, b in zip(ts, ts[1:]))
            if not torch.equal(toks, toks2):
                out["nondeterministic"] = True
                # where: per sequence that differs, the first position (a late
                # one in few sequences is rounding, e.g. another kernel for
                # another pointer alignment; early in all of them, wrong data)
                a, b2 = toks.tolist(), toks2.tolist()
                out.setdefault("calls_differ", []).append(
                    [[i, next(j for j in range(len(x)) if x[j] != y[j])]
                     for i, (x, y) in enumerate(zip(a, b2)) if x != y])
        out.update(tokens=toks.tolist(), decode_rates=rates, step_ms=steps_ms,
                   decode_tok_s=statistics.median(rates) * ids.shape[0] if rates else None)
        return out

    if spec.get("cb"):
        res.update(continuous_batching(torch, m, spec, wo, V))
        res["peak_allocated"] = torch.cuda.max_memory_allocated()
        if wo is not None:
            res["stats"] = wo.stats()
        return res
    if not spec.get("batches"):
        res.update(measure(ids, spec["new_tokens"], spec["repeats"]))
    else:  # issue 11: aggregate tok/s at several batch sizes, same prompts
        pg = torch.Generator("cuda").manual_seed(2)
        prompts = torch.randint(0, V, (max(spec["batches"]), spec["prompt"]), device="cuda", generator=pg)
        res["batched"] = {}
        for b in spec["batches"]:
            r = measure(prompts[:b], spec["batch_new_tokens"], spec["repeats"])
            if "num_experts" in mi["cfg"] and spec["name"].endswith("-gpu"):
                r["distinct_experts"] = distinct_experts(torch, m, prompts[:b], mi["cfg"])
            res["batched"][str(b)] = r
    res["peak_allocated"] = torch.cuda.max_memory_allocated()

    if spec["prefill"]:
        long = torch.randint(0, V, (1, spec["prefill"]), device="cuda", generator=gen)
        times = []
        with torch.no_grad():
            for i in range(6):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                m(long, use_cache=False, logits_to_keep=1)
                torch.cuda.synchronize()
                if i:
                    times.append(time.perf_counter() - t0)
        res["prefill_ms"] = statistics.median(times) * 1e3
        res["prefill_all_ms"] = [t * 1e3 for t in times]
        if spec["model"] == "moe" and spec["name"].endswith("-gpu"):
            res["histogram"] = expert_histogram(torch, m, long, ids, mi["cfg"])
    free, total = torch.cuda.mem_get_info()
    res["mem"] = dict(allocated=torch.cuda.memory_allocated(), free=free, total=total)
    if wo is not None:
        res["stats"] = wo.stats()
    del blocker
    return res


def continuous_batching(torch: Any, m: Any, spec: Dict[str, Any], wo: Any, V: int) -> Dict[str, Any]:
    """transformers' continuous batching (generate_batch, paged attention):
    one warm-up pass over the same requests (under the shim it seals, and
    the prefetcher learns), then `repeats` timed passes. Throughput: the
    generated tokens over the wall time of a pass. Under the shim, the
    bytes the prefetcher moved and read in place during the timed passes
    (woffload.stats(): prefetch totals, sampled before and after), per
    forward step (the steps counted by the stepper, prefetch.steps)."""
    from transformers import GenerationConfig
    from transformers.generation import ContinuousBatchingConfig

    c = spec["cb"]
    g = torch.Generator().manual_seed(7)
    lens = torch.randint(16, 129, (c["requests"],), generator=g).tolist()
    inputs = [torch.randint(0, V, (n,), generator=g).tolist() for n in lens]
    gc = GenerationConfig(max_new_tokens=c["new"], min_new_tokens=c["new"], do_sample=False,
                          eos_token_id=None, pad_token_id=0)
    cbc = ContinuousBatchingConfig(max_batch_tokens=c["max_batch_tokens"], num_blocks=c["num_blocks"],
                                   use_cuda_graph=bool(c.get("graphs", False)))

    def one() -> Any:
        return m.generate_batch(inputs=inputs, generation_config=gc, continuous_batching_config=cbc,
                                progress_bar=False)

    def pf() -> Dict[str, float]:
        time.sleep(0.15)  # the consumer publishes prefetch stats every 100 ms
        st = (wo.stats() or {}) if wo is not None else {}
        p = st.get("prefetch") or {}
        names = p.get("names") or {}
        return dict(steps=float(p.get("steps", 0) or 0),
                    moved_in=float(sum(v.get("prefetched", 0) for v in names.values())),
                    evicted=float(sum(v.get("evicted", 0) for v in names.values())),
                    miss=float(sum(v.get("miss_bytes", 0) for v in names.values())))

    out: Dict[str, Any] = {}
    t0 = time.perf_counter()
    with torch.no_grad():
        one()
    out["first_pass_s"] = time.perf_counter() - t0
    rates, toks = [], None
    a = pf()
    for _ in range(spec.get("repeats", 3)):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            r = one()
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        gen = {k: list(v.generated_tokens) for k, v in r.items()}
        rates.append(sum(len(v) for v in gen.values()) / dt)
        if toks is None:
            toks = [gen[k] for k in sorted(gen)]
    b = pf()
    out.update(cb_tok_s=statistics.median(rates), cb_rates=rates, tokens=toks, requests=c["requests"],
               new_tokens=c["new"], max_batch_tokens=c["max_batch_tokens"])
    if wo is not None:
        steps = max(1.0, b["steps"] - a["steps"])
        out["cb_shim"] = {k: b[k] - a[k] for k in b}
        out["cb_step_bytes"] = {k: (b[k] - a[k]) / steps for k in ("moved_in", "evicted", "miss")}
    return out


def pinned_swap(torch: Any, m: Any, sel: str, keep: List[Any]) -> int:
    """The mechanism of vLLM's UVA CPU offload: each selected parameter's data
    becomes a pinned host tensor, seen by kernels through its device pointer
    (cudaHostGetDevicePointer), with the parameter object unchanged."""
    from hostview import cuda_view  # bench/hostview.py

    moved = 0
    for name, p in list(m.named_parameters()):
        if not selected(sel, name):
            continue
        src = p.data.contiguous()
        nbytes = src.numel() * src.element_size()
        host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        host.copy_(src.view(-1).view(torch.uint8))
        p.data = cuda_view(torch, host).view(src.dtype).view(src.shape)
        keep.append(host)
        moved += nbytes
    import gc
    gc.collect()
    torch.cuda.synchronize()
    return moved


def accelerate_offload(torch: Any, m: Any, sel: str, nlayers: int) -> int:
    """accelerate's dispatch_model with the selected modules on "cpu": their
    weights are copied to the GPU at every forward (the usual CPU offload)."""
    from accelerate import dispatch_model
    what, _, rng = sel.partition(":")
    a, _, b = rng.partition("-")
    lo, hi = (0, nlayers - 1) if rng == "all" else (int(a), int(b or a))
    dm: Dict[str, Any] = {"model.embed_tokens": 0, "model.norm": 0, "lm_head": 0, "model.rotary_emb": 0}
    moved = 0
    for i in range(nlayers):
        layer = m.model.layers[i]
        off = lo <= i <= hi
        if what == "layers":
            dm[f"model.layers.{i}"] = "cpu" if off else 0
            if off:
                moved += sum(p.numel() * p.element_size() for p in layer.parameters())
                layer.to("cpu")
            continue
        for cname, _ in layer.named_children():
            if cname == "mlp":
                for mname, _ in layer.mlp.named_children():
                    cpu = off and mname == "experts"
                    dm[f"model.layers.{i}.mlp.{mname}"] = "cpu" if cpu else 0
                    if cpu:
                        e = layer.mlp.experts
                        moved += sum(p.numel() * p.element_size() for p in e.parameters())
                        e.to("cpu")
            else:
                dm[f"model.layers.{i}.{cname}"] = 0
    dispatch_model(m, device_map=dm, main_device=0)
    return moved


def install_skew(torch: Any, m: Any, cfg: Dict[str, Any], hot: int, sigma: float, seed: int) -> Dict[str, List[int]]:
    """A biased router (bench.md, the hot-set case): for each layer, `hot`
    experts drawn with `seed` get `sigma` standard deviations of the token's
    router logits added before the top-k. The gate's forward hook recomputes
    its outputs (probabilities, top-k weights, top-k indices, as transformers'
    Qwen3MoeTopKRouter returns them) with the bias; every scenario of a run
    has the same hooks, so tokens stay comparable."""
    E, k = cfg["num_experts"], cfg["num_experts_per_tok"]
    g = torch.Generator().manual_seed(seed)
    chosen: Dict[str, List[int]] = {}
    for i, layer in enumerate(m.model.layers):
        gate = layer.mlp.gate
        idx = torch.randperm(E, generator=g)[:hot]
        chosen[str(i)] = sorted(idx.tolist())
        bias = torch.zeros(E)
        bias[idx] = 1.0
        bias = bias.to("cuda")
        norm = bool(getattr(gate, "norm_topk_prob", True))

        def hook(mod: Any, args: Any, out: Any, bias: Any = bias, norm: bool = norm) -> Any:
            if not (isinstance(out, tuple) and len(out) == 3):
                raise RuntimeError(f"router output not (probs, weights, indices): {type(out).__name__}")
            x = args[0].reshape(-1, mod.weight.shape[1])
            logits = torch.nn.functional.linear(x, mod.weight).float()
            logits = logits + sigma * logits.std(dim=-1, keepdim=True) * bias
            probs = torch.softmax(logits, dim=-1)
            val, ix = torch.topk(probs, k, dim=-1)
            if norm:
                val = val / val.sum(dim=-1, keepdim=True)
            return (probs.to(out[0].dtype), val.to(out[1].dtype), ix.to(out[2].dtype))
        gate.register_forward_hook(hook)
    return chosen


def router_topk(torch: Any, mod: Any, args: Any, out: Any, k: int) -> Any:
    """The experts a router picked: its output's indices (after any skew
    hook), or recomputed from its input when the output is not a tuple."""
    if isinstance(out, tuple) and len(out) == 3:
        return out[2].reshape(-1, out[2].shape[-1])
    x = args[0].reshape(-1, args[0].shape[-1])
    return torch.topk(x.float() @ mod.weight.float().t(), k, dim=-1).indices


def distinct_experts(torch: Any, m: Any, ids: Any, cfg: Dict[str, Any]) -> List[float]:
    """Mean number of distinct experts each layer's router picks per decode
    step for this batch (the experts a step must read), over 8 steps."""
    E, k = cfg["num_experts"], cfg["num_experts_per_tok"]
    seen: Dict[int, List[int]] = {}
    handles = []
    for i, layer in enumerate(m.model.layers):
        def hook(mod: Any, args: Any, out: Any, i: int = i) -> None:
            top = router_topk(torch, mod, args, out, k)
            if top.shape[0] != ids.shape[0]:
                return  # the prefill
            seen.setdefault(i, []).append(int(torch.unique(top).numel()))
        handles.append(layer.mlp.gate.register_forward_hook(hook))
    try:
        with torch.no_grad():
            m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=9, min_new_tokens=9,
                       do_sample=False, pad_token_id=0)
    finally:
        for h in handles:
            h.remove()
    return [statistics.mean(v) if v else float(E) for _, v in sorted(seen.items())]


def expert_histogram(torch: Any, m: Any, long: Any, ids: Any, cfg: Dict[str, Any]) -> Dict[str, Any]:
    """Top-k choices of every router, recomputed from its input (so it does not
    depend on what the router module returns), over one 1024-token prefill
    and one short greedy decode."""
    E, k = cfg["num_experts"], cfg["num_experts_per_tok"]
    counts: Dict[int, Any] = {}
    handles = []
    for i, layer in enumerate(m.model.layers):
        gate = layer.mlp.gate

        def hook(mod: Any, args: Any, out: Any, i: int = i) -> None:
            top = router_topk(torch, mod, args, out, k)
            c = torch.bincount(top.reshape(-1), minlength=E)
            counts[i] = counts.get(i, 0) + c
        handles.append(gate.register_forward_hook(hook))
    out: Dict[str, Any] = {}
    try:
        for phase in ("prefill", "decode"):
            counts.clear()
            with torch.no_grad():
                if phase == "prefill":
                    m(long, use_cache=False, logits_to_keep=1)
                else:
                    m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16,
                               min_new_tokens=16, do_sample=False, pad_token_id=0)
            out[phase] = {str(i): c.tolist() for i, c in sorted(counts.items())}
    finally:
        for h in handles:
            h.remove()
    return out

# ----------------------------------------------------------------------------
# bounds

def bounds(model: str, offload: Optional[str], res: Dict[str, Any], gpu: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """Bytes that must cross PCIe per decode step (batch 1) and per 1024-token
    prefill for the offloaded set, and the rates they allow at 55 GB/s: alone
    (pcie_tok_s) and added to the all-GPU step (bound_tok_s)."""
    if not offload:
        return {}
    cfg = MODELS[model]["cfg"]
    H = cfg["hidden_size"]
    what, _, rng = offload.partition(":")
    L = cfg["num_hidden_layers"]
    nl = L if rng == "all" else int(rng.partition("-")[2] or rng) - int(rng.partition("-")[0]) + 1
    total = res.get("offload_bytes") or 0
    if model == "moe":
        E, k, I = cfg["num_experts"], cfg["num_experts_per_tok"], cfg["moe_intermediate_size"]
        expert = 3 * H * I * 2
        experts_total = nl * E * expert
        step = total - experts_total + nl * k * expert  # non-expert bytes read whole, k experts a layer
        prefill = total  # a spread 1024-token prefill touches every expert
    else:
        step = prefill = total
    out: Dict[str, Any] = dict(step_bytes=step, pcie_tok_s=PCIE_BPS / step if step else None,
                               prefill_bound_ms=prefill / PCIE_BPS * 1e3)
    if gpu and gpu.get("decode_tok_s"):
        out["bound_tok_s"] = 1.0 / (1.0 / gpu["decode_tok_s"] + step / PCIE_BPS)
        if gpu.get("prefill_ms"):
            out["prefill_bound_ms"] = max(gpu["prefill_ms"], out["prefill_bound_ms"])
    return out

# ----------------------------------------------------------------------------
# the driver

def machine() -> Dict[str, str]:
    info = dict(host=platform.node())
    try:
        q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                            "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
        info["gpu"] = q.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        info["gpu"] = "?"
    return info


def run_scenario(spec: Dict[str, Any], args: argparse.Namespace, workdir: str,
                 timeout: float) -> Dict[str, Any]:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(spec)]
    if spec.get("policy"):
        pol = os.path.join(workdir, f"{os.path.basename(spec['policy'])}.yaml")
        with open(pol, "w") as f:
            f.write(policy_text(spec["policy"]))
        launcher = os.path.join(args.build, "tools", "woffload-run")
        cmd = [launcher, "--policy", pol, "--log", args.log, "--"] + cmd
    shown = " ".join(shlex.quote(c) for c in cmd[:-1]) + " '<spec>'"
    print(f"\n=== {spec['name']}: {shown}", flush=True)
    t0 = time.time()
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(spec.get("env") or {}))
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        out, err, rc = p.stdout, p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = (e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")) + "\n(timeout)"
        rc = -1
    res: Dict[str, Any] = dict(name=spec["name"], rc=rc, wall_s=time.time() - t0, command=shown)
    for line in out.splitlines():
        if line.startswith("E2E_RESULT "):
            res.update(json.loads(line[len("E2E_RESULT "):]))
    if "E2E_ERROR" in out:
        res["error"] = out.split("E2E_ERROR ", 1)[1].strip()[:2000]
    elif rc != 0:
        res["error"] = f"exit {rc}"
    res["log_tail"] = (err[-3000:] if err else "")
    with open(os.path.join(args.logs or workdir, f"{spec['name']}.log"), "w") as f:
        f.write(out + "\n--- stderr ---\n" + err)
    print(f"rc {rc} in {res['wall_s']:.0f} s; " + (res.get("error") or
          f"decode {res.get('decode_tok_s')} tok/s prefill {res.get('prefill_ms')} ms"), flush=True)
    if rc != 0 or res.get("error"):
        print(err[-2500:], flush=True)
    return res


def fmt(v: Any, spec: str = ".2f") -> str:
    return "–" if v is None else format(v, spec)


def histogram_text(h: Dict[str, Any]) -> str:
    lines = []
    for phase, layers in h.items():
        lines.append(f"{phase}: per layer, experts used / busiest expert's share of choices")
        row = []
        for i, c in layers.items():
            tot = sum(c) or 1
            row.append(f"L{i}: {sum(1 for x in c if x)}/{len(c)} {100 * max(c) / tot:.0f}%")
        lines.append("  " + ", ".join(row))
        first = next(iter(layers.values()))
        lines.append(f"  layer 0 counts: {first}")
    return "\n".join(lines)


def batched_report(results: List[Dict[str, Any]], by: Dict[str, Any]) -> List[str]:
    """Issue 11: aggregate decode tok/s per batch size, with the bytes a step
    must read over PCIe (distinct experts the routers picked, measured in the
    all-GPU run) and the bounds they imply."""
    rows = []
    for r in results:
        if not r.get("batched"):
            continue
        spec = next(s for s in SCENARIOS if s["name"] == r["name"])
        # one expert's bytes of this row's model (gate, up and down)
        cfg = MODELS[spec["model"]]["cfg"]
        expert = 3 * cfg["hidden_size"] * cfg.get("moe_intermediate_size", 0) * 2
        gpu = by.get(spec.get("ref") or r["name"], {}).get("batched") or {}
        backend = spec.get("experts_impl") or "default"
        for b, m in r["batched"].items():
            g = gpu.get(b, {})
            same = "ref"
            if spec.get("ref"):
                same = "–" if not g.get("tokens") or not m.get("tokens") else same_tokens(g["tokens"], m["tokens"])
            if m.get("nondeterministic"):
                # the timed calls' tokens differed from the first call's
                same += " (calls differ)"
            step = None
            if spec.get("offload") and g.get("distinct_experts"):
                rng = spec["offload"].partition(":")[2]
                lo, hi = (0, cfg["num_hidden_layers"] - 1) if rng == "all" else map(int, rng.split("-"))
                step = sum(d for i, d in enumerate(g["distinct_experts"]) if lo <= i <= hi) * expert
            pcie = int(b) * PCIE_BPS / step if step else None
            serial = (int(b) / (int(b) / g["decode_tok_s"] + step / PCIE_BPS)) if step and g.get("decode_tok_s") else None
            q = (f"{m['decode_tok_s'] / pcie:.2f}× / {m['decode_tok_s'] / serial:.2f}×"
                 if pcie and serial and m.get("decode_tok_s") else "")
            # issue 11's bound, from the shim's own count of the host-placed
            # bytes a step's launches touched
            # host rows: the host-placed bytes touched; managed rows: misses read
            # in place plus prefetches (both from the shim's stats)
            sbd = m.get("shim_step_bytes") or {}
            sb = sbd.get("host") or sbd.get("managed_pcie")
            sbound = (int(b) / (int(b) / g["decode_tok_s"] + sb / PCIE_BPS)) if sb and g.get("decode_tok_s") else None
            sq = f"{m['decode_tok_s'] / sbound:.2f}×" if sbound and m.get("decode_tok_s") else ""
            rows.append(f"| {r['name']} | {backend} | {b} | {fmt(m.get('decode_tok_s'))} | "
                        f"{fmt(step / 1e9 if step else None, '.2f')} | {fmt(pcie)} | {fmt(serial)} | {q} | "
                        f"{fmt(sb / 1e9 if sb else None, '.2f')} | {fmt(sbound)} | {sq} | {same} |")
    if not rows:
        return []
    return ["", "## Batched decode: aggregate tok/s", "",
            "Experts backend: transformers' `experts_implementation` (default: what users run; its "
            "decode gathers each picked expert per token, so in-place reads multiply with the batch; "
            "eager: a loop over the picked experts, each read once a step). The PCIe bound is the "
            "distinct-bytes bound: each expert the routers picked, once a step, at 55 GB/s.", "",
            "Step bytes: distinct experts per layer per step (measured on the all-GPU run's routers) × "
            "one expert's bytes (37.7 MB on the Qwen3 shape, 138.4 MB on the Mixtral shape), over the "
            "offloaded layers. PCIe bound: batch × 55 GB/s / step bytes; serial "
            "estimate: batch / (all-GPU step time + step bytes at 55 GB/s). Shim GB/step: the host-placed "
            "bytes the step's launches touched, from the shim's own stats (woffload.stats() "
            "names[].touched_bytes: a generate of n tokens minus one of 1, over n - 1 steps; for managed "
            "rows the bytes that crossed PCIe: misses read in place plus prefetches, prefetch.names); "
            "issue 11's bound: batch / (all-GPU step time + shim GB/step at 55 GB/s).", "",
            "| scenario | experts backend | batch | tok/s | step GB over PCIe (routers) | PCIe bound | serial estimate | "
            "× bound / × serial | shim GB/step over PCIe | issue-11 bound | × bound | tokens = ref |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"] + rows


def staging_report(results: List[Dict[str, Any]]) -> List[str]:
    """Issue 18: where each streaming row's staging copies came from (the
    shim's stream stats at the end of the run)."""
    rows = []
    for r in results:
        st = (r.get("stats") or {}).get("stream") or {}
        if not st.get("staged"):
            continue
        pc = st.get("pinned_copies") or {}
        kernel, pinned = st.get("staged_by_kernel", 0), st.get("staged_pinned", 0)
        rows.append(f"| {r['name']} | {st['staged']} | {kernel} | {pinned} | "
                    f"{st['staged'] - kernel - pinned} | {pc.get('made', 0)} | "
                    f"{fmt(pc.get('bytes', 0) / 2**30, '.2f')} | "
                    f"{fmt(pc.get('pin_ms', 0) / 1e3, '.1f')} | {pc.get('failed', 0)} |")
    if not rows:
        return []
    return ["", "## Staging source (stream executor)", "",
            "Staging copies by path: the shim's copy kernel (a managed source read in place, 50 GB/s "
            "at most), the copy engine from a pinned copy of a managed range (prefetch.pinned_copies, "
            "uvm/stream-pin.h), the copy engine from pinned memory the engine's allocation already was. "
            "Pinned copies: made over the run, GiB held at the end, the worker's time making them.", "",
            "| scenario | staging copies | by the copy kernel | from pinned copies | from pinned memory | "
            "pinned copies made | GiB held | pin s | pin failures |",
            "|---|---|---|---|---|---|---|---|---|"] + rows


def cb_report(results: List[Dict[str, Any]], by: Dict[str, Any]) -> List[str]:
    """Issue 22: continuous batching, managed against host and all-GPU, with
    what the prefetcher moved per step."""
    rows = []
    for r in results:
        spec = next(s for s in SCENARIOS if s["name"] == r["name"])
        if not spec.get("cb"):
            continue
        ref = by.get(spec.get("ref") or "") or {}
        tag = r["name"].rsplit("-shim-", 1)[0].removesuffix("-gpu")
        host = by.get(f"{tag}-shim-experts-host-all") or {}
        same = "ref"
        if spec.get("ref"):
            if not ref.get("tokens") or not r.get("tokens"):
                same = "–"
            else:
                n = sum(a == b for a, b in zip(ref["tokens"], r["tokens"]))
                same = "yes" if n == len(ref["tokens"]) else f"NO ({n}/{len(ref['tokens'])})"
        t = r.get("cb_tok_s")
        sb = r.get("cb_step_bytes") or {}
        gb = (lambda k: fmt(sb[k] / 1e9, ".2f") if k in sb else "–")
        rows.append(f"| {r['name']} | {spec.get('policy') or 'no shim'} | {'skewed' if spec.get('skew') else 'uniform'} | "
                    f"{'ok' if not r.get('error') else 'FAILED'} | {fmt(t)} | "
                    f"{fmt(t / ref['cb_tok_s'], '.2f') + '×' if t and ref.get('cb_tok_s') else '–'} | "
                    f"{fmt(t / host['cb_tok_s'], '.2f') + '×' if t and host.get('cb_tok_s') and host is not r else '–'} | "
                    f"{gb('moved_in')} | {gb('evicted')} | {gb('miss')} | {same} |")
    if not rows:
        return []
    return ["", "## Continuous batching (generate_batch, paged|sdpa, default experts backend)", "",
            "Tok/s: generated tokens over the wall time of a pass (median of the timed passes after a "
            "warm-up pass of the same requests). GB/step: what the prefetcher moved in, evicted, and "
            "what managed reads missed (read in place), per forward step counted by the shim's stepper "
            "(woffload.stats() prefetch), over the timed passes.", "",
            "| scenario | policy | routing | status | tok/s | × all-GPU | × host | moved in GB/step | "
            "evicted GB/step | missed GB/step | tokens = all-GPU |",
            "|---|---|---|---|---|---|---|---|---|---|---|"] + rows


def same_tokens(a: List[List[int]], b: List[List[int]]) -> str:
    """Greedy tokens equal over the shorter run's length (a row may generate
    fewer tokens than its reference, e.g. accelerate's)."""
    n = min(len(a[0]), len(b[0]))
    return "yes" if [x[:n] for x in a] == [x[:n] for x in b] else "NO"


def shim_bytes(r: Dict[str, Any]) -> str:
    sb = r.get("shim_step_bytes")
    if not sb:
        return "–"
    return f"{sb.get('host', 0) / 1e9:.2f} / {sb.get('managed', 0) / 1e9:.2f}"


def report(results: List[Dict[str, Any]], args: argparse.Namespace, started: str) -> str:
    by = {r["name"]: r for r in results}
    rows = []
    for r in results:
        spec = next(s for s in SCENARIOS if s["name"] == r["name"])
        if spec.get("batches") or spec.get("cb"):
            continue  # batched_report, cb_report
        ref = by.get(spec.get("ref") or "")
        same = "–" if spec.get("ref") else "ref"
        if ref is not None:
            if r.get("tokens") is None or ref.get("tokens") is None:
                same = "–"
            else:
                same = same_tokens(r["tokens"], ref["tokens"])
        gpu_ref = by.get(spec.get("ref") or "") if (spec.get("ref") or "").endswith("-gpu") else None
        b = bounds(spec["model"], spec["offload"], r, gpu_ref or by.get(f"{spec['model']}-gpu"))
        r["bounds"] = b
        ratio = ""
        if b.get("pcie_tok_s") and r.get("decode_tok_s"):
            ratio = f"{r['decode_tok_s'] / b['pcie_tok_s']:.2f}× / {r['decode_tok_s'] / b['bound_tok_s']:.2f}×" \
                if b.get("bound_tok_s") else f"{r['decode_tok_s'] / b['pcie_tok_s']:.2f}×"
        how = ("shim: " + spec["policy"] + "".join(f" {k}={v}" for k, v in (spec.get("env") or {}).items())) \
            if spec.get("policy") else (
            " ".join(spec["swap"]) if spec.get("swap") else "no shim")
        status = "ok" if not r.get("error") else ("OOM" if "OutOfMemory" in (r.get("error") or "") else "FAILED")
        rows.append(
            f"| {r['name']} | {how} | {fmt((r.get('offload_bytes') or 0) / GiB)} | {status} | "
            f"{fmt(r.get('decode_tok_s'))} | {fmt(b.get('pcie_tok_s'))} | {fmt(b.get('bound_tok_s'))} | {ratio} | "
            f"{fmt(r.get('prefill_ms'), '.1f')} | {fmt(b.get('prefill_bound_ms'), '.1f')} | "
            f"{fmt((r.get('peak_allocated') or 0) / GiB)} | {shim_bytes(r)} | {same} |")
    lines = [
        f"# e2e: transformers decode/prefill with offloaded weights ({started})",
        "",
        f"- machine: {args.machine.get('gpu')} ({args.machine.get('host')})",
        f"- date: {started}; git commit: {args.commit}",
        f"- command: `python3 bench/e2e.py {' '.join(shlex.quote(a) for a in sys.argv[1:])}`",
        # the shim's settings exported for the whole run (a row's own env
        # is in its scenario, bench/e2e.py SCENARIOS)
        "- environment: " + ("not recorded" if args.environment is None else
                             ", ".join(f"`{k}={v}`" for k, v in sorted(args.environment.items()))
                             or "no WOFFLOAD_* variable"),
        f"- torch {next((r.get('torch') for r in results if r.get('torch')), '?')}, "
        f"transformers {next((r.get('transformers') for r in results if r.get('transformers')), '?')}, "
        f"libwoffload {next((r.get('woffload') for r in results if r.get('woffload')), '?')}",
        "- models: random weights from configs (bench/e2e.py MODELS), bf16, batch 1 unless said; "
        "MoE router and embeddings re-drawn at std 1.0 (routing spread: histogram below)",
        "- decode tok/s: median over the timed generate calls after one warm-up call of the same shape "
        "(prompt 32 tokens); prefill: 1024 tokens, median of 5 after a warm-up",
        "- PCIe bound: 55 GB/s / the offloaded bytes a decode step must read (non-expert bytes whole, "
        "k experts a layer); serial estimate: 1 / (all-GPU step + those bytes at 55 GB/s), not a bound "
        "(reads overlap compute); prefill bound: max(all-GPU prefill, offloaded bytes at 55 GB/s)",
        "",
        "| scenario | how | offloaded GiB | status | decode tok/s | PCIe bound | serial estimate | "
        "× bound / × serial | prefill ms | prefill bound ms | peak alloc GiB | shim GB/step host/managed | "
        "tokens = ref |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ] + rows
    targets = [  # issue 8: (what, numerator, denominator, target)
        ("experts host l0-3 / pinned swap", "moe-shim-experts-host-l0-3", "moe-pinned-experts-l0-3", 0.95),
        ("experts host all / pinned swap", "moe-shim-experts-host-all", "moe-pinned-experts-all", 0.95),
        ("experts host l0-3 / accelerate", "moe-shim-experts-host-l0-3", "moe-accelerate-experts-l0-3", 20.0),
        ("MoE shim empty policy / no shim", "moe-shim-empty", "moe-gpu", 0.98),
        ("dense shim empty policy / no shim", "dense-shim-empty", "dense-gpu", 0.98),
        ("dense host l0-7 / pinned swap", "dense-shim-host-l0-7", "dense-pinned-l0-7", 0.95),
        ("compiled dense, shim empty / no shim (issue 11)", "graph-dense-shim-empty", "graph-dense-gpu", 0.98),
        ("eager experts: host all / pinned swap", "eager-moe-shim-experts-host-all", "eager-moe-pinned-experts-all", 0.95),
        ("skewed router: managed (budget 1/2) / host (issue 6)", "skew-moe-shim-experts-managed-half",
         "skew-moe-shim-experts-host-all", 1.5),
        ("skewed router: managed after 128 warm-up steps / host (issue 6)",
         "skew-moe-shim-experts-managed-half-warm", "skew-moe-shim-experts-host-all", 1.5),
        ("skewed router, second pass: managed warm / host", "skew-moe-shim-experts-managed-half-warm",
         "skew-moe-shim-experts-host-all-b", 1.5),
    ]
    trows = []
    for what, a, b, target in targets:
        ra, rb = by.get(a, {}).get("decode_tok_s"), by.get(b, {}).get("decode_tok_s")
        if ra and rb:
            trows.append(f"| {what} | {ra / rb:.3f} | ≥ {target} | {'met' if ra / rb >= target else 'NOT met'} |")
    ga = [by[n]["decode_tok_s"] for n in ("ovh-moe-gpu-a", "ovh-moe-gpu-b", "ovh-moe-gpu-c")
          if by.get(n, {}).get("decode_tok_s")]
    sa = [by[n]["decode_tok_s"] for n in ("ovh-moe-shim-empty-a", "ovh-moe-shim-empty-b", "ovh-moe-shim-empty-c")
          if by.get(n, {}).get("decode_tok_s")]
    if ga and sa:
        q = statistics.median(sa) / statistics.median(ga)
        trows.append(f"| MoE shim empty / no shim, median of {len(sa)} vs {len(ga)} alternating processes "
                     f"({', '.join(f'{x:.2f}' for x in sa)} vs {', '.join(f'{x:.2f}' for x in ga)}) | "
                     f"{q:.3f} | ≥ 0.98 | {'met' if q >= 0.98 else 'NOT met'} |")
    ga = [by[n]["decode_tok_s"] for n in ("graph-dense-gpu", "graph-dense-gpu-2") if by.get(n, {}).get("decode_tok_s")]
    sa = [by[n]["decode_tok_s"] for n in ("graph-dense-shim-empty", "graph-dense-shim-empty-2")
          if by.get(n, {}).get("decode_tok_s")]
    if len(ga) > 1 and len(sa) > 1:
        q = statistics.median(sa) / statistics.median(ga)
        trows.append(f"| compiled dense, shim empty / no shim, median of {len(sa)} vs {len(ga)} alternating processes "
                     f"({', '.join(f'{x:.2f}' for x in sa)} vs {', '.join(f'{x:.2f}' for x in ga)}) | "
                     f"{q:.3f} | ≥ 0.98 | {'met' if q >= 0.98 else 'NOT met'} |")
    sg, sm = by.get("skew-moe-gpu", {}), by.get("skew-moe-shim-experts-managed-half", {})
    if sg.get("prefill_ms") and sm.get("prefill_ms") and sm.get("offload_bytes"):
        pb = max(sg["prefill_ms"], sm["offload_bytes"] / 45e9 * 1e3)
        q = sm["prefill_ms"] / pb
        trows.append(f"| skewed router: managed prefill 1024 / max(all-GPU {sg['prefill_ms']:.1f} ms, "
                     f"offloaded bytes at 45 GB/s {sm['offload_bytes'] / 45e6:.1f} ms) (issue 6) | {q:.3f} | "
                     f"≤ 1.3 | {'met' if q <= 1.3 else 'NOT met'} |")
    for name in ("moe-shim-experts-host-l0-3", "moe-shim-experts-host-all", "dense-shim-host-l0-7",
                 "moe-pinned-experts-all", "dense-pinned-l0-7"):
        r = by.get(name, {})
        bb = r.get("bounds") or {}
        if r.get("decode_tok_s") and bb.get("pcie_tok_s"):
            q = r["decode_tok_s"] / bb["pcie_tok_s"]
            trows.append(f"| {name} / PCIe bound | {q:.3f} | ≥ 0.9 | {'met' if q >= 0.9 else 'NOT met'} |")
    if trows:
        lines += ["", "## Targets (decode tok/s ratios, side by side in this run)", "",
                  "| ratio | value | target | |", "|---|---|---|---|"] + trows
    lines += batched_report(results, by)
    lines += staging_report(results)
    lines += cb_report(results, by)
    for r in results:
        if r.get("histogram"):
            lines += ["", f"## Expert usage ({r['name']}; same weights in every MoE scenario)", "```",
                      histogram_text(r["histogram"]), "```"]
    used = []
    for r in results:
        spec = next(s for s in SCENARIOS if s["name"] == r["name"])
        if spec.get("policy") and spec["policy"] not in used:
            used.append(spec["policy"])
    if used:
        lines += ["", "## Policies (the shim rows' --policy files)"]
        for name in used:
            lines += ["", f"`{name}`:", "```yaml", policy_text(name).rstrip(), "```"]
    shim = [r for r in results if isinstance(r.get("stats"), dict)]
    if shim:
        lines += ["", "## Shim stats at the end of each shim run (woffload.stats())", ""]
        for r in shim:
            st = r["stats"]
            short = {k: st.get(k) for k in ("placements", "allocations", "launches", "ring", "budgets",
                                            "interpose") if k in st}
            if (st.get("prefetch") or {}).get("steps"):
                short["prefetch"] = {k: v for k, v in st["prefetch"].items() if k != "names"}
            stream = st.get("stream") or {}
            if stream.get("steps"):
                # the streaming executor (issue 18): redirected launches,
                # bytes staged, and the read multiplicity of the busiest name
                short["stream"] = {k: v for k, v in stream.items() if k != "names"}
                mult = [(v.get("read_multiplicity", 0), n) for n, v in (stream.get("names") or {}).items()]
                if mult:
                    short["stream"]["max_read_multiplicity"] = max(mult)
            lines += [f"- {r['name']}: `{json.dumps(short, separators=(',', ':'))[:2000]}`"]
    fails = [r for r in results if r.get("error")]
    if fails:
        lines += ["", "## Failures"]
        for r in fails:
            lines += [f"### {r['name']}", f"`{r.get('command')}`", "```", (r.get("error") or "")[-1500:],
                      (r.get("log_tail") or "")[-1500:], "```"]
    blk = [r for r in results if r.get("blocker")]
    if blk:
        lines += ["", "## Blocker runs"]
        for r in blk:
            b = r["blocker"]
            lines.append(f"- {r['name']}: free {b['free_before'] / GiB:.1f} GiB, blocker {b['size'] / GiB:.1f} GiB, "
                         f"left {b['free_after'] / GiB:.1f} GiB for weights of {r['weight_bytes'] / GiB:.1f} GiB "
                         f"plus a workload (batch 16 × 2048-token prompts) that needs "
                         f"{r.get('fit_extra_measured', 0) / GiB:.1f} GiB more")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"), help="meson build directory")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--only", default="", help="comma list of scenario name prefixes (moe, dense, fit)")
    ap.add_argument("--scenarios", default="", help="comma list of exact scenario names")
    ap.add_argument("--commit", default=os.environ.get("WO_BENCH_COMMIT", "?"))
    ap.add_argument("--log", default="info", help="WOFFLOAD_LOG for the shim runs")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per scenario")
    ap.add_argument("--logs", default="", help="keep each scenario's full output in this directory")
    ap.add_argument("--deadline", type=float, default=0,
                    help="seconds: start no scenario once fewer than --min-left remain")
    ap.add_argument("--min-left", type=float, default=60)
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--render", metavar="JSON",
                    help="write the Markdown report of a results JSON again (with --commit: set its commit)")
    ap.add_argument("--keep-going", action="store_true",
                    help="run the shim scenarios even after one failed (default: skip them)")
    args = ap.parse_args()
    # the shim's settings exported for the whole run (a row's own are in its
    # scenario's env): said in the report
    args.environment = {k: v for k, v in os.environ.items() if k.startswith("WOFFLOAD_")}

    if args.worker:
        spec = json.loads(args.worker)
        cpus = os.environ.get("E2E_CPUS")
        if cpus:  # every scenario on the same cores (the overhead rows compare processes)
            a, _, b = cpus.partition("-")
            os.sched_setaffinity(0, range(int(a), int(b or a) + 1))
        try:
            res = worker(spec)
        except Exception as e:  # reported, with the type (OutOfMemoryError is a result)
            import traceback
            traceback.print_exc()
            print(f"E2E_ERROR {type(e).__name__}: {str(e)[:1500]}", flush=True)
            return 1
        print("E2E_RESULT " + json.dumps(res), flush=True)
        return 0

    if args.render:
        with open(args.render) as f:
            saved = json.load(f)
        if args.commit != "?":
            saved["commit"] = args.commit
        args.machine, args.commit = saved["machine"], saved["commit"]
        args.environment = saved.get("environment")  # None: not recorded (before 2026-11-26)
        sys.argv = saved["argv"]
        with open(args.render, "w") as f:
            json.dump(saved, f, indent=1)
        with open(args.render[:-5] + ".md", "w") as f:
            f.write(report(saved["results"], args, saved["started"]))
        return 0

    todo = SCENARIOS
    if args.scenarios:
        known = {s["name"]: s for s in SCENARIOS}
        bad = [n for n in args.scenarios.split(",") if n not in known]
        if bad:
            ap.error(f"unknown scenarios: {', '.join(bad)} (see --list)")
        todo = [known[n] for n in args.scenarios.split(",")]  # in the order given
    elif args.only:
        pre = tuple(p + "-" for p in args.only.split(","))
        todo = [s for s in SCENARIOS if s["name"].startswith(pre)]
    if args.list:
        for s in todo:
            print(s["name"])
        return 0
    args.machine = machine()
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
    os.makedirs(args.out, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="e2e-")
    if args.logs:
        os.makedirs(args.logs, exist_ok=True)
    results: List[Dict[str, Any]] = []
    fit_extra: Optional[int] = None
    shim_broken = ""
    t_start = time.time()
    for spec in todo:
        spec = dict(spec)
        left = args.deadline - (time.time() - t_start) if args.deadline else None
        if left is not None and left < args.min_left:
            print(f"=== {spec['name']}: skipped: {left:.0f} s left of --deadline", flush=True)
            results.append(dict(name=spec["name"], error=f"skipped: out of time (--deadline {args.deadline})"))
            continue
        if spec.get("policy") and shim_broken and not args.keep_going:
            print(f"=== {spec['name']}: skipped: {shim_broken}", flush=True)
            results.append(dict(name=spec["name"], error=f"skipped: {shim_broken}"))
            continue
        if spec.get("blocker"):
            if fit_extra is None:
                print(f"=== {spec['name']}: skipped (needs fit-gpu first)")
                continue
            # the weights plus half of what the workload needs beyond them; the
            # half must leave >= 1 GiB above the weights (safety rule: even if
            # every weight were managed memory it stays below the free memory)
            if fit_extra < 2 * GiB:
                print(f"=== {spec['name']}: skipped: the workload needs only {fit_extra / GiB:.1f} GiB "
                      "beyond the weights; too little to block safely", flush=True)
                continue
            spec["fit_extra"] = fit_extra // 2
        r = run_scenario(spec, args, workdir, min(args.timeout, left - 10) if left else args.timeout)
        if spec["name"] == "fit-gpu" and r.get("peak_allocated"):
            fit_extra = r["peak_allocated"] - r["weight_bytes"]
            r["fit_extra_measured"] = fit_extra
        if spec.get("blocker"):
            r["fit_extra_measured"] = fit_extra
        if spec.get("policy") and r.get("error") and "OutOfMemory" not in r["error"]:
            shim_broken = f"{spec['name']} failed under the shim ({r['error'][:200]})"
        results.append(r)
        save(results, args, started, stamp)  # after every scenario: a cut-off run keeps its rows
    text = save(results, args, started, stamp)
    print("\n" + text)
    return 0


def save(results: List[Dict[str, Any]], args: argparse.Namespace, started: str, stamp: str) -> str:
    text = report(results, args, started)
    with open(os.path.join(args.out, f"e2e-{stamp}.md"), "w") as f:
        f.write(text)
    with open(os.path.join(args.out, f"e2e-{stamp}.json"), "w") as f:
        json.dump(dict(machine=args.machine, started=started, commit=args.commit,
                       argv=sys.argv, environment=args.environment, results=results), f, indent=1)
    return text


if __name__ == "__main__":
    sys.exit(main())
