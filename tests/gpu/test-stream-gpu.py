#!/usr/bin/env python3
"""gpu suite: the streaming executor on the real driver (issue 18).

    python3 tests/gpu/test-stream-gpu.py BUILD/tools/woffload-run [CASE...]

Small models built from configs (seeded, random weights, bf16) decode
greedily at batch 1 and 8 without the shim (the reference tokens) and under
woffload-run with the automatic hook and a policy that streams:

  moe-host-stream    Qwen3-MoE shape, every expert `host`, prefetch.mode
                     stream, transformers' default experts backend
  dense-host-stream  Llama shape, every MLP weight `host`, mode stream
  moe-host-auto      the MoE, every expert `host`, mode auto: streamed when
                     a step's period says it pays (uvm/stream-auto.h), and
                     back in place when not; the row prints how often
  moe-managed-auto   the MoE, experts `managed` within half their bytes,
                     mode auto
  moe-host-write     moe-host-stream, and after each of the first two calls
                     the engine writes one layer's experts in place (an RL
                     trainer's weight sync): the reference run writes the
                     same; the write checks (uvm/stream-check.h) must keep
                     every write
  moe-host-picks     the MoE, experts `host`, default mode, picked staging
                     (uvm/picks.h: the hook hands each experts module's
                     router ids to the shim; only picked rows are copied)
  moe-managed-picks  the same, experts `managed` within half their bytes
  moe-host-write-picks  moe-host-write with picked staging
  moe128-host-picks  a fine-grained MoE (128 experts, top-8), experts `host`,
                     picked staging
  moe128-host-picks-engine  the same with every name announced before its
                     bytes (woffload.expect_module on a meta-device copy,
                     as from_pretrained's hook does: the host experts are
                     served pinned) and WOFFLOAD_PICKS_ENGINE=1: the picked
                     copies on the copy engine, under the eager module
                     loading of WOFFLOAD_PICKS_LAZY=0; on the H200 transformers
                     under fit stopped so in its first step (bench/results,
                     picks-engine-stall-20261203-h200)
  moe128-host-picks-engine-lazy  the same under CUDA's lazy module loading,
                     the default (WOFFLOAD_PICKS_LAZY=1, CUDA_MODULE_LOADING=LAZY): each
                     kernel's first launch behind the copy engine's gate
                     (preload/first-launch.h), a stall the gate misses
                     rescued; tokens identical and to the end, its stalls
                     and rescues said
  moe128-host-picks-engine-q1  the same with CUDA_DEVICE_MAX_CONNECTIONS=1:
                     every stream in one of the driver's work queues, where
                     a job's wait would hold its own copies; the shim's
                     probe (uvm/queue-probe.h) must find that and leave the
                     copies to the kernels, tokens identical (on the H200
                     the first probe did: bench/results,
                     engine-queues-20261203-h200.txt)
  moe128-hot-picks-engine  moe128-host-picks-engine with 256 MiB of hot
                     experts (prefetch.hot_experts): each picked copy split,
                     the hot rows by the kernels from the device, the others
                     on the copy engine; rows from the hot sets and copies on
                     the copy engine both counted
  moe128-host-picks-cb   the same under transformers' continuous batching
                     (generate_batch, paged attention: its steps run on
                     several streams, which share one pool of buffers), two
                     passes over 32 requests
  moe128-half-picks-cb   the same with the first half of the layers' experts
                     on the device and the rest `host`, as fit mixes them:
                     on the H200, fit's continuous batching with picked
                     copies gave other tokens (bench/results,
                     picks-stray-20261202-ad6185f-h200)

The rows named for the streaming executor run with WOFFLOAD_PICKS=0 (the
hook would otherwise take the experts from it); the -picks rows check that
picked copies were made and none failed, and print the bytes they moved
against whole tensors'.

Checks: tokens identical to the reference in every call, whether or not
a range was streamed; for moe-host-stream, launches were redirected into
the slots and staging copies were made (stats "stream"); no CUDA error. The
dense row prints its counters only: on the lent H100 (2026-11-25) the
executor's stepper never found this small model's decode step (0 steps over
9,163 launches), so it read everything in place; the 16-layer Llama of
bench/bigload.py streams (docs/history/prefetch.md, Streaming); it still found none
on 42e905b, after launches outside a weight's tags stopped keying the step.
The rows run WO_STREAM_JOBS processes at a time (3; 1: one after the
other). WO_STREAM_TRACE_DIR=D records each row's trace to D/ROW.wot (woffload-run
--trace) for the replay tools. WO_STREAM_DEBUG=1 reruns a failing row with
CUDA_LAUNCH_BLOCKING=1 and, where it exists, compute-sanitizer, and prints
what they say (the first faulting kernel). Exit 77 without torch,
transformers or a GPU.
"""
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import tempfile

import gpucheck

MODELS = {
    "moe": ("Qwen3MoeConfig", dict(
        vocab_size=4096, hidden_size=1024, intermediate_size=2048, moe_intermediate_size=1024,
        num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4, head_dim=128,
        num_experts=8, num_experts_per_tok=2, max_position_embeddings=1024,
        decoder_sparse_step=1, mlp_only_layers=[])),
    "moe128": ("Qwen3MoeConfig", dict(
        vocab_size=4096, hidden_size=1024, intermediate_size=2048, moe_intermediate_size=256,
        num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=4, head_dim=128,
        num_experts=128, num_experts_per_tok=8, max_position_embeddings=1024,
        decoder_sparse_step=1, mlp_only_layers=[])),
    "dense": ("LlamaConfig", dict(
        vocab_size=4096, hidden_size=1024, intermediate_size=4096, num_hidden_layers=8,
        num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=1024,
        tie_word_embeddings=False)),
}

STREAM = "prefetch: {mode: stream}\n"
CASES = {
    "moe-host-stream": ("moe", "version: 1\ndefault: device\n" + STREAM +
                        "rules:\n  - {name: experts, match: experts, place: host}\n"),
    "dense-host-stream": ("dense", "version: 1\ndefault: device\n" + STREAM +
                          "rules:\n  - {name: mlp, match: [gate_proj, up_proj, down_proj], place: host}\n"),
    "moe-host-auto": ("moe", "version: 1\ndefault: device\nprefetch: {mode: auto}\n"
                      "rules:\n  - {name: experts, match: experts, place: host}\n"),
    "moe-host-write": ("moe+write", "version: 1\ndefault: device\n" + STREAM +
                       "rules:\n  - {name: experts, match: experts, place: host}\n"),
    "moe-managed-auto": ("moe", "version: 1\ndefault: device\ndevice_budget: 192MiB\n"
                         "prefetch: {mode: auto}\n"
                         "rules:\n  - {name: experts, match: experts, place: managed}\n"),
    "moe-host-picks": ("moe", "version: 1\ndefault: device\n"
                       "rules:\n  - {name: experts, match: experts, place: host}\n"),
    "moe-managed-picks": ("moe", "version: 1\ndefault: device\ndevice_budget: 192MiB\n"
                          "rules:\n  - {name: experts, match: experts, place: managed}\n"),
    "moe-host-write-picks": ("moe+write", "version: 1\ndefault: device\n"
                             "rules:\n  - {name: experts, match: experts, place: host}\n"),
    "moe128-host-picks": ("moe128", "version: 1\ndefault: device\n"
                          "rules:\n  - {name: experts, match: experts, place: host}\n"),
    "moe128-host-picks-engine": ("moe128+engine", "version: 1\ndefault: device\n"
                                 "rules:\n  - {name: experts, match: experts, place: host}\n"),
    "moe128-host-picks-engine-lazy": ("moe128+engine", "version: 1\ndefault: device\n"
                                      "rules:\n  - {name: experts, match: experts, place: host}\n"),
    "moe128-host-picks-engine-q1": ("moe128+engine", "version: 1\ndefault: device\n"
                                    "rules:\n  - {name: experts, match: experts, place: host}\n"),
    "moe128-hot-picks-engine": ("moe128+engine", "version: 1\ndefault: device\n"
                                "prefetch: {hot_experts: 256MiB}\n"
                                "rules:\n  - {name: experts, match: experts, place: host}\n"),
    "moe128-host-picks-cb": ("moe128+cb", "version: 1\ndefault: device\n"
                             "rules:\n  - {name: experts, match: experts, place: host}\n"),
    "moe128-half-picks-cb": ("moe128+cb", "version: 1\ndefault: device\n"
                             "rules:\n  - {name: late, match: [layers.3.mlp.experts, "
                             "layers.4.mlp.experts, layers.5.mlp.experts], place: host}\n"),
}
# (batch, new tokens), one generate call each, in this order: the executor
# learns the step from the launch order first: the prefill's launches come
# first and are never repeated, so the stepper waits 1,024 launches for them
# to come back (40-64 steps of these models), then a period must hold for
# 256 more; it stages after that. The later calls run with the slots in use
# from the first one (the Qwen3 shape's batch-8 calls differed only from
# the second call on, docs/history/prefetch.md), and batch 32 reads every expert.
BATCHES = ((1, 160), (8, 48), (8, 48), (32, 24))
# +cb models: continuous batching instead, CB_PASSES passes over the same
# CB_REQUESTS requests (prompts of 16-64 tokens, CB_NEW new), each its own
# generate_batch (new streams from PyTorch's pool each time)
CB_REQUESTS, CB_NEW, CB_PASSES = 32, 16, 2


def child(model: str) -> None:
    import torch
    import transformers
    model, _, flag = model.partition("+")
    arch, cfg = MODELS[model]
    attn = dict(attn_implementation="paged|sdpa") if flag == "cb" else {}
    torch.manual_seed(0)
    if flag == "engine":
        # every name announced before its bytes (woffload.expect_module, as
        # transformers' from_pretrained does through the hook): the host
        # experts are served pinned, which the copy engine reads
        try:
            import woffload
            with torch.device("meta"):
                meta = transformers.AutoModelForCausalLM.from_config(
                    getattr(transformers, arch)(**cfg), dtype=torch.bfloat16)
            woffload.expect_module(meta)
            del meta
        except ImportError:  # the reference runs without the shim
            pass
    with torch.device("cuda"):
        m = transformers.AutoModelForCausalLM.from_config(getattr(transformers, arch)(**cfg),
                                                          dtype=torch.bfloat16, **attn)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if p.dim() >= 2:
                # the routers at std 1 spread the tokens over the experts
                p.normal_(0.0, 1.0 if n.endswith("gate.weight") else 0.05)
    m.eval()
    res = {"tokens": {}}
    if flag == "cb":
        from transformers import GenerationConfig
        from transformers.generation import ContinuousBatchingConfig
        g = torch.Generator().manual_seed(7)
        lens = torch.randint(16, 65, (CB_REQUESTS,), generator=g).tolist()
        inputs = [torch.randint(5, cfg["vocab_size"], (n,), generator=g).tolist() for n in lens]
        gc = GenerationConfig(max_new_tokens=CB_NEW, min_new_tokens=CB_NEW, do_sample=False,
                              eos_token_id=None, pad_token_id=0)
        # no CUDA graphs (bench/e2e.py's rows the same): a captured step reads
        # in place, and these rows are for the picked copies
        cbc = ContinuousBatchingConfig(max_batch_tokens=256, num_blocks=256, use_cuda_graph=False)
        for i in range(CB_PASSES):
            with torch.no_grad():
                r = m.generate_batch(inputs=inputs, generation_config=gc,
                                     continuous_batching_config=cbc, progress_bar=False)
            res["tokens"][f"cb pass {i + 1}"] = [list(r[k].generated_tokens) for k in sorted(r)]
    g = torch.Generator(device="cpu").manual_seed(1)
    for i, (b, n) in enumerate(BATCHES if flag != "cb" else ()):
        ids = torch.randint(5, cfg["vocab_size"], (b, 16), generator=g).cuda()
        with torch.no_grad():
            out = m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                             min_new_tokens=n, do_sample=False, pad_token_id=0)
        res["tokens"][f"{i}:{b}"] = out[:, ids.shape[1]:].tolist()
        if flag == "write" and i < 2:
            # between calls, as a weight sync does: an in-place kernel on
            # every expert tensor of layer 2
            with torch.no_grad():
                for n, p in m.named_parameters():
                    if ".layers.2.mlp.experts." in n:
                        p.add_(0.01 * (i + 1))
    torch.cuda.synchronize()
    try:
        import woffload
        res["stats"] = woffload.stats()
    except Exception:  # noqa: BLE001 (the reference runs without the shim)
        pass
    print("RESULT " + json.dumps(res), flush=True)


def debug(cmd: list, env: dict) -> None:
    """What CUDA_LAUNCH_BLOCKING and compute-sanitizer say about a failed row."""
    e = dict(env, CUDA_LAUNCH_BLOCKING="1")
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=e)
    print("--- CUDA_LAUNCH_BLOCKING=1: exit", p.returncode)
    print(p.stderr[-5000:])
    san = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
    if os.path.exists(san):
        e = dict(env)
        p = subprocess.run([san, "--tool", "memcheck", "--print-limit", "8", "--target-processes", "all"] + cmd,
                           capture_output=True, text=True, timeout=240, env=e)
        print("--- compute-sanitizer memcheck: exit", p.returncode)
        out = p.stdout + p.stderr
        first = out.find("========= ")
        print(out[max(first, 0):max(first, 0) + 8000])


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2])
        return 0
    torch = gpucheck.torch_on_gpu()
    if torch is None:
        return 77
    launcher = sys.argv[1]
    cases = sys.argv[2:] or list(CASES)
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:False")
    me = [sys.executable, os.path.abspath(__file__), "--child"]
    failures = []
    # The rows run WO_STREAM_JOBS at a time (3 by default; 1: one after the
    # other): each is a process of its own on a small model, and what they
    # check (tokens, counts of copies and redirected launches) does not
    # depend on the others' timing; one after the other they took 458 s of
    # the gpu suite on the H200. Their reports print in the cases' order.
    jobs = max(1, int(os.environ.get("WO_STREAM_JOBS", "3")))
    with tempfile.TemporaryDirectory() as tmp, \
            concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        models = sorted({CASES[c][0] for c in cases})
        refs = dict(zip(models, pool.map(lambda m: gpucheck.result(me + [m], env, must=False), models)))
        for model, ref in refs.items():
            if "error" in ref:
                print(ref["stderr"])
                raise SystemExit(f"FAIL: the reference run of {model}: {ref['error']}")
        cmds = {}
        for case in cases:
            model, text = CASES[case]
            pol = os.path.join(tmp, f"{case}.yaml")
            with open(pol, "w") as f:
                f.write(text)
            cmd = [launcher, "--policy", pol, "--log", "info"]
            if os.environ.get("WO_STREAM_TRACE_DIR"):
                # a row's event stream, for the replay tools (why a stepper
                # found no step: the dense row on the H100 found none)
                cmd += ["--trace", os.path.join(os.environ["WO_STREAM_TRACE_DIR"], f"{case}.wot")]
            cmds[case] = cmd + ["--"] + me + [model]
        # the -engine rows put every picked copy on the copy engine, and a
        # stall there would hang the row: 300 s, not 600 (WO_STREAM_ROW_S:
        # every row's, for a row run alone again and again)
        row_s = float(os.environ.get("WO_STREAM_ROW_S", "0") or 0)
        runs = {case: pool.submit(gpucheck.result, cmds[case],
                                  dict(env, WOFFLOAD_PICKS="1" if "picks" in case else "0",
                                       **({"WOFFLOAD_PICKS_ENGINE": "1"}
                                          if "-engine" in case else {}),
                                       **({"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
                                          if case.endswith("-q1") else {}),
                                       # -lazy: the default, CUDA's lazy loading said;
                                       # the other -engine rows eager (LAZY=0)
                                       **({"WOFFLOAD_PICKS_LAZY": "1", "CUDA_MODULE_LOADING": "LAZY"}
                                          if case.endswith("-lazy") else
                                          {"WOFFLOAD_PICKS_LAZY": "0"} if "-engine" in case else {})),
                                  must=False,
                                  timeout=row_s or (300 if "-engine" in case else 600),
                                  stacks="-engine" in case, kill_on_stall=False)
                for case in cases}
        for case in cases:
            cmd, ref = cmds[case], refs[CASES[case][0]]
            got = runs[case].result()
            st = (got.get("stats") or {}).get("stream") or {}
            pk = (got.get("stats") or {}).get("picks") or {}
            checks = {"ran to the end": "error" not in got}
            for key, want in ref["tokens"].items():
                mine = got.get("tokens", {}).get(key)
                i, _, b = key.partition(":")
                what = (f"call {int(i) + 1} (batch {b})" if b else key) + ": tokens identical"
                if mine and mine != want:
                    # the first differing position per sequence: early in
                    # most sequences is wrong data, late in few is rounding
                    firsts = [next(j for j in range(len(x)) if x[j] != y[j])
                              for x, y in zip(mine, want) if x != y]
                    what += f" (differ in {len(firsts)}/{len(want)} sequences, first at {min(firsts)})"
                checks[what] = mine == want
            if st.get("checked"):
                checks[f"WOFFLOAD_STREAM_CHECK: every slot held its range's bytes ({st.get('checked')} "
                       f"compared, {st.get('check_mismatch')} differed)"] = not st.get("check_mismatch")
            if case == "moe-host-write":
                print(f"    write checks: {st.get('write_checks')} slots checked, "
                      f"{st.get('written_back')} written back")
            if case in ("moe-host-stream", "moe-host-write"):
                checks[f"launches redirected into slots ({st.get('redirected')}; in place: "
                       f"{st.get('inplace_no_slot')} no slot, {st.get('inplace_other')} other; "
                       f"{st.get('awaited', 0)} waited, {st.get('await_timeouts', 0)} ran out)"] = \
                    st.get("redirected", 0) > 0
                checks[f"staging copies ({st.get('staged')}, {st.get('staged_bytes')} B)"] = \
                    st.get("staged", 0) > 0
            if "-picks" in case:
                checks[f"picked copies ({pk.get('staged')} made, {pk.get('reused')} reused, "
                       f"{pk.get('captured')} captured launches in place)"] = pk.get("staged", 0) > 0
                checks[f"no picked copy failed ({pk.get('failed')})"] = pk.get("failed", 1) == 0
                print(f"    picks: {pk.get('bytes_copied', 0) / 1e9:.3f} GB moved against "
                      f"{pk.get('whole_bytes', 0) / 1e9:.3f} GB of whole tensors, "
                      f"{pk.get('buffer_bytes', 0) >> 20} MiB of buffers")
            if "-engine" in case:
                eng = pk.get("engine") or {}
                if case.endswith("-q1"):
                    checks[f"every engine stream shares the copy stream's work queue "
                           f"({eng.get('shared_queues')} of {eng.get('probes')} probed), so the "
                           f"kernels copied ({eng.get('copies')} copy engine jobs)"] = \
                        eng.get("shared_queues", 0) >= 1 and \
                        eng.get("shared_queues") == eng.get("probes") and eng.get("copies", 1) == 0
                else:
                    checks[f"picked copies on the copy engine ({eng.get('copies')} jobs, "
                           f"{eng.get('bytes', 0) / 1e9:.3f} GB; {eng.get('kernel_fallbacks')} by "
                           f"the kernels instead; {eng.get('shared_queues')} of "
                           f"{eng.get('probes')} streams probed share the copy stream's work "
                           f"queue): the announced host experts are pinned"] = \
                        eng.get("copies", 0) > 0
                if case.endswith("-lazy"):
                    # a load the gate does not see is a stall the rescue
                    # ends: said, not failed (tokens and the end are checked)
                    ip = (got.get("stats") or {}).get("interpose") or {}
                    checks[f"first launches behind the gate under lazy loading "
                           f"({ip.get('gated_first_launches')})"] = ip.get("gated_first_launches", 0) > 0
                    print(f"    lazy loading: {eng.get('stalls')} stalls, {eng.get('rescues')} jobs "
                          f"rescued, {eng.get('quiesce_timeouts')} gates ran out; "
                          f"{eng.get('stall_report') or 'no stall report'}")
                else:
                    checks[f"the copy engine never stalled ({eng.get('stalls')}; "
                           f"{eng.get('stall_report') or 'no report'}; {eng.get('rescues')} jobs "
                           f"rescued) and no gate ran out ({eng.get('quiesce_timeouts')})"] = \
                        eng.get("stalls", 1) == 0 and eng.get("quiesce_timeouts", 1) == 0
            if "-hot-" in case:
                checks[f"rows from the hot sets ({pk.get('hot_rows')} of {pk.get('rows')}, "
                       f"{pk.get('hot_bytes', 0) >> 20} MiB hot)"] = pk.get("hot_rows", 0) > 0
                # a tensor's first 2 registrations come before its set: the
                # copy engine must have copied after the sets were made too
                eng = pk.get("engine") or {}
                checks[f"copies on the copy engine with the hot sets made ({eng.get('copies')}, "
                       f"more than 8 for each of {pk.get('tensors')} tensors)"] = \
                    eng.get("copies", 0) > 8 * pk.get("tensors", 1 << 30)
            if case.endswith("-auto"):
                print(f"    auto by step time: {st.get('auto_tries')} tries, {st.get('auto_kept')} kept "
                      f"streamed, {st.get('auto_backs')} back in place, {st.get('auto_rechecks')} rechecked; "
                      f"{st.get('redirected')} launches "
                      f"redirected, {st.get('staged')} staging copies")
            for what, ok in checks.items():
                print(f"{'ok' if ok else 'FAIL'}: {case}: {what}")
                if not ok:
                    failures.append(f"{case}: {what}")
            lines = got["stderr"].splitlines()
            tail = [ln for ln in lines if ("stream" in ln or "picks" in ln or "rror" in ln) and "stream check" not in ln]
            print("\n".join("    " + ln for ln in tail[-12:]))
            print("\n".join("    " + ln for ln in [ln for ln in lines if "stream check" in ln][:40]))
            if not all(checks.values()):
                # the stall's stacks whole, when a stall took them (gpucheck.run_watched)
                at = got["stderr"].find("\n######## stacks-")
                sys.stderr.write(got["stderr"][max(0, at - 4000):] if at >= 0 else got["stderr"][-4000:])
                if os.environ.get("WO_STREAM_DEBUG") == "1":
                    debug(cmd, env)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
