#!/usr/bin/env python3
"""tests/ggml/real-llama.py: llama.cpp itself (libllama.so built for the CPU)
in front of the ggml hook and the shim, on the fake CUDA driver, with a GPU
device of the test's (tests/ggml/fake-gpu.c: its memory the fake driver's,
its compute ggml's CPU backend). Greedy token ids of a small Qwen3-MoE GGUF
from bench/llamacpp-tokens.c, every layer offloaded (n_gpu_layers 999):
plain (the fake GPU alone), then under the shim and the hook with llama.cpp's
own loader, GGUF names, model buffer and scheduler. Each case: ids equal to
plain, and what the shim's stats (WO_TOKENS_STATS) and log say.

    real-llama.py BUILD TREE PEERS WORK

BUILD: the shim's build (configured with -Dggml-real=TREE, libllama.so built
beside libggml-base.so); TREE: the llama.cpp tree (its gguf-py writes the
GGUF); PEERS: the peers kit (gen_gguf.py); WORK: a scratch folder.
tests/ggml/real-ggml.sh runs it. Exit 0 when every case passed.

The fake GPU computes each node of llama.cpp's graphs in a kernel launch of
the fake runtime (fake-gpu.c), whose pointers the shim may redirect: the
picked copies and the staging slots are read by llama.cpp's own ops here.
"""
import json
import os
import re
import subprocess
import sys

# small enough for the CPU, large enough that every expert tensor (4 MiB),
# the embedding and the output (4 MiB) pass the hook's 1 MiB split size
SHAPE = dict(VOCAB=4096, D=512, L=4, NH=8, NKV=2, HD=64, E=16, K=4, FF=256)
NPRED = 16
# the streaming executor learns the step's order over its first steps
STREAM_NPRED = 64

failures = 0


def check(ok, what):
    global failures
    print(("ok " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures += 1
    return ok


def make_gguf(tree, peers, out):
    if os.path.exists(out):
        return
    code = (
        "import sys\n"
        f"sys.path.insert(0, {peers!r})\n"
        "import gen_gguf\n"
        + "".join(f"gen_gguf.{k} = {v!r}\n" for k, v in SHAPE.items())
        + f"sys.argv = ['gen_gguf', {out + '.tmp'!r}]\n"
        "gen_gguf.main()\n"
    )
    env = dict(os.environ, GGUF_PY=os.path.join(tree, "gguf-py"))
    # the Debian python3 has numpy (python3-numpy), a pyenv one may not
    for py in (sys.executable, "/usr/bin/python3"):
        r = subprocess.run([py, "-c", code], env=env, capture_output=True, text=True)
        if r.returncode == 0:
            os.replace(out + ".tmp", out)
            return
    sys.exit(f"real-llama: writing the GGUF failed (numpy and {tree}/gguf-py needed):\n{r.stderr[-2000:]}")


def run(b, gguf, work, name, preload, env_extra, seqs=1, npred=NPRED):
    stats = os.path.join(work, name + ".json")
    if os.path.exists(stats):
        os.unlink(stats)
    env = dict(os.environ)
    env.update({
        "LD_PRELOAD": ":".join(preload),
        "LD_LIBRARY_PATH": ":".join([b["fake"], b["lib"]]),
        "WOFAKE_TOTAL_MEM": "4G",  # past the managed cap's 1 GiB margin and the model
        "WO_TOKENS_STATS": stats,
        "WOFFLOAD_LOG": "info",
    })
    env.update(env_extra)
    r = subprocess.run([b["tokens"], gguf, str(npred), "mmap", str(seqs)], env=env,
                       capture_output=True, text=True, timeout=300)
    m = re.search(r"^tokens:(.*)$", r.stdout, re.M)
    ids = m.group(1).split() if m else None
    st = None
    if os.path.exists(stats):
        try:
            st = json.load(open(stats))
        except ValueError:
            st = None
    with open(os.path.join(work, name + ".log"), "w") as f:
        f.write(r.stdout + r.stderr)
    if not check(r.returncode == 0 and ids, f"{name}: ran (exit {r.returncode}), {len(ids or [])} ids"):
        print(r.stderr[-3000:])
    return ids, st, r.stderr


def real_lib(build):
    """The folder of the real libggml-base.so and libllama.so: the build's
    ggml-real-lib option, or GGML-REAL/build/bin (tests/ggml/meson.build)."""
    r = subprocess.run(["meson", "introspect", "--buildoptions", build], capture_output=True, text=True)
    opts = {o["name"]: o["value"] for o in json.loads(r.stdout or "[]")}
    return opts.get("ggml-real-lib") or os.path.join(opts.get("ggml-real", ""), "build", "bin")


def names(st):
    return {n["name"]: n for n in (st or {}).get("names", [])}


def main():
    if len(sys.argv) != 5:
        print(__doc__, file=sys.stderr)
        return 2
    build, tree, peers, work = sys.argv[1:]
    os.makedirs(work, exist_ok=True)
    b = {
        "tokens": os.path.join(build, "tests", "ggml", "llamacpp-tokens-real"),
        "gpu": os.path.join(build, "tests", "ggml", "libwofake-ggml-gpu.so"),
        "shim": os.path.join(build, "preload", "libwoffload.so"),
        "hook": os.path.join(build, "ggml", "libwoffload-ggml.so"),
        "fake": os.path.join(build, "tests", "fake"),
        "lib": real_lib(build),
    }
    for k in ("tokens", "gpu", "shim", "hook"):
        if not os.path.exists(b[k]):
            print(f"real-llama: no {b[k]} (configure with -Dggml-real and build libllama.so)", file=sys.stderr)
            return 2
    src = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ex = os.path.join(src, "examples")
    tg = os.path.join(src, "tests", "ggml")
    gguf = os.path.join(work, "small-moe.gguf")
    make_gguf(tree, peers, gguf)
    size = os.path.getsize(gguf)
    print(f"GGUF {gguf}: {size / 2**20:.1f} MiB, {SHAPE}", flush=True)

    plain, _, _ = run(b, gguf, work, "plain", [b["gpu"]], {})
    plain4, _, _ = run(b, gguf, work, "plain-b4", [b["gpu"]], {}, seqs=4)
    plain64, _, _ = run(b, gguf, work, "plain-64", [b["gpu"]], {}, npred=STREAM_NPRED)
    if not plain or not plain4 or not plain64:
        return 1
    shim = [b["shim"], b["hook"], b["gpu"]]
    exps = re.compile(r"\.ffn_.*_exps\.")

    # experts host (llama.cpp's -ot exps=CPU by name), one buffer
    ids, st, err = run(b, gguf, work, "exps-host", shim,
                       {"WOFFLOAD_POLICY": os.path.join(ex, "llamacpp-ot-exps-cpu.yaml")})
    check(ids == plain, "exps-host: ids equal to plain")
    nm = names(st)
    ex_names = [n for n in nm if exps.search(n)]
    check(len(ex_names) == 3 * SHAPE["L"] and all(nm[n]["placement"] == "host" for n in ex_names),
          f"exps-host: the {3 * SHAPE['L']} expert tensors named by their GGUF names, on the host "
          f"({len(ex_names)} named)")
    # llama.cpp keeps the input layer (token_embd) on the CPU: not named
    check(all(nm[n]["placement"] == "device" for n in nm if not exps.search(n)) and
          "output.weight" in nm and "token_embd.weight" not in nm,
          "exps-host: every other weight of the device's buffer named, on the device")
    check("model buffer split by tensor" not in err and "in 1 model buffers (0 split by tensor)" in err,
          "exps-host: one model buffer (nothing asks the split)")

    # the same policy, the buffer split by tensor (asked)
    ids, st, err = run(b, gguf, work, "split-hand", shim,
                       {"WOFFLOAD_POLICY": os.path.join(ex, "llamacpp-ot-exps-cpu.yaml"),
                        "WOFFLOAD_GGML_SPLIT": "2"})
    check(ids == plain, "split-hand: ids equal to plain")
    check("model buffer split by tensor" in err, "split-hand: the hook split the model buffer by tensor")
    x = (st or {}).get("expect") or {}
    check(x.get("names", 0) >= 3 * SHAPE["L"] + 1 and x.get("matched") == x.get("names"),
          f"split-hand: every tensor of 1 MiB or more announced and matched "
          f"({x.get('names')} announced, {x.get('matched')} matched)")
    nm = names(st)
    check(all(nm[n]["placement"] == "host" for n in nm if exps.search(n)) and
          nm.get("output.weight", {}).get("placement") == "device",
          "split-hand: the experts on the host, the output on the device")

    # fit on a device smaller than the model: split by default, the cap pins
    # nothing, fit places weights on the device
    ids, st, err = run(b, gguf, work, "fit-full", shim,
                       {"WOFFLOAD_POLICY": os.path.join(tg, "fit-exps-host.yaml"),
                        "WOFAKE_TOTAL_MEM": str(int(size * 0.6)), "WOFFLOAD_MANAGED_MARGIN": "0"})
    check(ids == plain, f"fit-full: ids equal to plain on a device of {0.6 * size / 2**20:.1f} MiB")
    check("model buffer split by tensor" in err, "fit-full: the hook split the model buffer by tensor")
    cap, fit = (st or {}).get("managed_cap") or {}, (st or {}).get("fit") or {}
    check(cap.get("pinned_bytes", -1) == 0, f"fit-full: the managed cap pinned nothing ({cap.get('pinned_bytes')} B)")
    check(fit.get("device_bytes", 0) > 0,
          f"fit-full: fit placed weights on the device ({fit.get('device_bytes')} B of its budget "
          f"{fit.get('budget')} B)")

    # the same with one buffer (WOFFLOAD_GGML_SPLIT=0): the cap serves it
    # whole as pinned host memory, the tokens still equal
    ids, st, err = run(b, gguf, work, "fit-one", shim,
                       {"WOFFLOAD_POLICY": os.path.join(tg, "fit-exps-host.yaml"),
                        "WOFAKE_TOTAL_MEM": str(int(size * 0.6)), "WOFFLOAD_MANAGED_MARGIN": "0",
                        "WOFFLOAD_GGML_SPLIT": "0"})
    check(ids == plain, "fit-one: ids equal to plain")
    cap = (st or {}).get("managed_cap") or {}
    check(cap.get("pinned_bytes", 0) > 0, f"fit-one: one buffer, pinned whole by the cap ({cap.get('pinned_bytes')} B)")

    # the router's picks read from llama.cpp's own graph (ffn_moe_topk-L, a
    # view of the argsort; E from ffn_moe_probs-L): every layer of every
    # compute registered for its three expert tensors (WOFFLOAD_GGML_PICKS=100)
    ids, st, err = run(b, gguf, work, "picks", shim,
                      {"WOFFLOAD_POLICY": os.path.join(ex, "llamacpp-ot-exps-cpu.yaml"),
                       "WOFFLOAD_GGML_PICKS": "100"})
    check(ids == plain, "picks: ids equal to plain")
    pk = (st or {}).get("picks") or {}
    check(pk.get("staged", 0) > 0 and pk.get("failed") == 0,
          f"picks: the expert launches read picked copies ({pk.get('staged')} staged, "
          f"{pk.get('failed')} failed)")
    m = re.search(r"picks: (\d+) graph computes; (\d+) layer computes registered "
                  r"\((\d+) expert tensor registrations\), (\d+) not", err)
    n = [int(g) for g in m.groups()] if m else None
    check(n and n[0] > 0 and n[1] == n[0] * SHAPE["L"] and n[2] == 3 * n[1] and n[3] == 0,
          f"picks: every MoE layer of every compute registered for its 3 expert tensors "
          f"({m.group(0) if m else 'no picks line from the hook'})")

    # the host experts staged into slots every step (mode: stream; the hook's
    # claims off, WOFFLOAD_GGML_STREAM=0, as the gpu suite's exps-stream): the
    # launches that read them redirected into the slots
    ids, st, _ = run(b, gguf, work, "exps-stream", shim,
                     {"WOFFLOAD_POLICY": os.path.join(ex, "llamacpp-exps-stream.yaml"),
                      "WOFFLOAD_GGML_STREAM": "0"}, npred=STREAM_NPRED)
    check(ids == plain64, f"exps-stream: {STREAM_NPRED} ids equal to plain")
    sx = (st or {}).get("stream") or {}
    check(sx.get("redirected", 0) > 0 and sx.get("staged", 0) > 0,
          f"exps-stream: launches redirected into the slots ({sx.get('redirected')} redirected, "
          f"{sx.get('staged')} staging copies)")

    # hot experts (the most picked rows kept on the device, WOFFLOAD_PICKS_HOT
    # MiB: every compute's picks registered), the picked copies on the copy
    # engine (WOFFLOAD_PICKS_ENGINE: a copy thread and stream waits), and both
    for name, extra in (("picks-hot", {"WOFFLOAD_PICKS_HOT": "8"}),
                        ("picks-engine", {"WOFFLOAD_GGML_PICKS": "100", "WOFFLOAD_PICKS_ENGINE": "1"}),
                        ("picks-hot-engine", {"WOFFLOAD_PICKS_HOT": "8", "WOFFLOAD_PICKS_ENGINE": "1"})):
        ids, st, _ = run(b, gguf, work, name, shim,
                         dict({"WOFFLOAD_POLICY": os.path.join(ex, "llamacpp-ot-exps-cpu.yaml")}, **extra),
                         npred=STREAM_NPRED)
        check(ids == plain64, f"{name}: {STREAM_NPRED} ids equal to plain")
        pk = (st or {}).get("picks") or {}
        eng = pk.get("engine") or {}
        hot_ok = "HOT" not in str(extra) or pk.get("hot_rows", 0) > 0
        eng_ok = "ENGINE" not in str(extra) or (eng.get("copies", 0) > 0 and eng.get("kernel_fallbacks") == 0)
        check(pk.get("staged", 0) > 0 and pk.get("failed") == 0 and hot_ok and eng_ok,
              f"{name}: {pk.get('staged')} picked copies, {pk.get('hot_rows')} rows from the hot set, "
              f"{eng.get('copies')} on the copy engine ({eng.get('kernel_fallbacks')} kernel fallbacks, "
              f"{eng.get('stalls')} stalls)")

    # late binding: the one model buffer a VMM range, each tensor backed
    # where its placement says
    ids, st, _ = run(b, gguf, work, "exps-host-late", shim,
                     {"WOFFLOAD_POLICY": os.path.join(ex, "llamacpp-ot-exps-cpu.yaml"),
                      "WOFFLOAD_LATE_BIND": "1"})
    check(ids == plain, "exps-host-late: ids equal to plain")
    lb = (st or {}).get("late_bind") or {}
    check(lb.get("enabled") is True and lb.get("ranges", 0) >= 1,
          f"exps-host-late: the model buffer late bound ({lb.get('ranges')} ranges)")

    # late binding with its copies (WOFFLOAD_BIND_COPIES=1, experimental):
    # the bound range's host experts staged, and copied picked, from the
    # range itself (the combinations that failed on the H200: on this fake,
    # whose memory is host memory, they read right)
    for name, pol, extra, key in (
            ("late-stream-copies", "llamacpp-exps-stream.yaml", {"WOFFLOAD_GGML_STREAM": "0"}, "stream"),
            ("late-picks-copies", "llamacpp-ot-exps-cpu.yaml", {"WOFFLOAD_GGML_PICKS": "100"}, "picks")):
        ids, st, _ = run(b, gguf, work, name, shim,
                         dict({"WOFFLOAD_POLICY": os.path.join(ex, pol), "WOFFLOAD_LATE_BIND": "1",
                               "WOFFLOAD_BIND_COPIES": "1"}, **extra), npred=STREAM_NPRED)
        check(ids == plain64, f"{name}: {STREAM_NPRED} ids equal to plain")
        got = ((st or {}).get(key) or {}).get("staged", 0)
        check(got > 0 and ((st or {}).get("late_bind") or {}).get("ranges", 0) >= 1,
              f"{name}: late bound, {got} {key} copies from the bound range")

    # --n-cpu-moe 1 by name; the empty policy; four sequences a step
    ids, st, _ = run(b, gguf, work, "ncmoe1", shim, {"WOFFLOAD_POLICY": os.path.join(tg, "ncmoe1.yaml")})
    check(ids == plain, "ncmoe1: ids equal to plain")
    nm = names(st)
    check(all((nm[n]["placement"] == "host") == n.startswith("blk.0.") for n in nm if exps.search(n)),
          "ncmoe1: layer 0's experts on the host, the others on the device")
    ids, st, _ = run(b, gguf, work, "empty", shim, {"WOFFLOAD_POLICY": os.path.join(ex, "empty.yaml")})
    check(ids == plain, "empty: ids equal to plain")
    ids, _, _ = run(b, gguf, work, "exps-host-b4", shim,
                    {"WOFFLOAD_POLICY": os.path.join(ex, "llamacpp-ot-exps-cpu.yaml"),
                     "WOFFLOAD_GGML_SPLIT": "2"}, seqs=4)
    check(ids == plain4, "exps-host-b4 (split): four sequences' ids equal to plain")
    print("PASSED" if not failures else f"FAILED ({failures})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
