#!/usr/bin/env python3
"""tests/gpu/test-interpose-torch.py: PyTorch under the shim on a real GPU.

Runs the same work twice in fresh processes, without and with
LD_PRELOAD=libwoffload.so (and PyTorch's expandable segments, so its VMM
calls go through cudaGetDriverEntryPointByVersion):
  - a cuBLAS matmul (fp32 and bf16),
  - a Triton kernel,
  - a torch.compile(mode="reduce-overhead") function (CUDA graphs: capture,
    instantiate, replay),
  - a 1-rank NCCL all-reduce (SUM, and AVG, which launches a kernel).
The shim runs twice: with no policy (what an empty policy does: count every
call per API and per calling library, forward it, scan nothing) and with
WOFFLOAD_OBSERVE=1 (launch parameters scanned, events consumed). Checks that
every result is bit-identical to the run without the shim in both; that the
shim's counters (woffload_stats, read in-process through ctypes) show
launches from cuBLAS, Triton, NCCL and PyTorch, allocations from NCCL and
PyTorch's VMM calls, and resolver substitution at work in both; that the
pass-through run scanned no launch; and that the observing run attributed
launches to tracked ranges and tied graph launches to their capture.

usage: test-interpose-torch.py SHIM.so        (suite 'gpu'; exit 77 = skipped)
       test-interpose-torch.py --work OUT      (internal: one run)
"""
import ctypes
import json
import os
import socket
import subprocess
import sys
import tempfile

SKIP = 77


def shim_stats():
    """The shim's stats as a dict, or None when it is not preloaded."""
    try:
        f = ctypes.CDLL(None).woffload_stats
    except AttributeError:
        return None
    f.restype = ctypes.c_long
    f.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    n = f(None, 0)
    buf = ctypes.create_string_buffer(n + 65536)
    f(buf, n + 65536)
    return json.loads(buf.value.decode())


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def work(out):
    import torch
    import torch.distributed as dist
    import triton
    import triton.language as tl

    @triton.jit
    def axpb_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask)
        y = tl.load(y_ptr + offs, mask=mask)
        tl.store(out_ptr + offs, x * 3.0 + y, mask=mask)

    torch.manual_seed(0)
    dev = "cuda"
    res = {}

    a = torch.randn(1024, 1024, device=dev)
    b = torch.randn(1024, 1024, device=dev)
    res["matmul_fp32"] = a @ b
    res["matmul_bf16"] = a.bfloat16() @ b.bfloat16()

    x = torch.randn(100_003, device=dev)
    y = torch.randn(100_003, device=dev)
    out_t = torch.empty_like(x)
    axpb_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, out_t, x.numel(), BLOCK=1024)
    res["triton"] = out_t

    def f(x, w):
        return torch.nn.functional.gelu(x @ w) * 2.0 + 1.0

    cf = torch.compile(f, mode="reduce-overhead")
    xs = torch.randn(64, 256, device=dev)
    w = torch.randn(256, 256, device=dev)
    for _ in range(6):  # warm-up, record, then replays of the CUDA graph
        r = cf(xs, w)
    res["compiled"] = r.clone()

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device(dev, 0))
    t = torch.arange(4096, device=dev, dtype=torch.float32)
    dist.all_reduce(t)
    # With one rank a SUM is a copy at most; AVG makes NCCL launch its
    # one-rank reduction kernel.
    u = torch.arange(4096, device=dev, dtype=torch.float32) * 3.0
    dist.all_reduce(u, op=dist.ReduceOp.AVG)
    torch.cuda.synchronize()
    res["allreduce"] = t
    res["allreduce_avg"] = u
    dist.destroy_process_group()

    torch.cuda.synchronize()
    torch.save({k: v.cpu() for k, v in res.items()}, out)
    stats = shim_stats()
    if stats is not None:
        with open(out + ".stats.json", "w") as fh:
            json.dump(stats, fh)
    return 0


def run(out, env):
    p = subprocess.run([sys.executable, __file__, "--work", out], env=env, text=True,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=900)
    if p.returncode != 0:
        print(p.stdout[-6000:])
        raise SystemExit("run failed (%s): exit %d" % ("shim" if "LD_PRELOAD" in env else "plain",
                                                       p.returncode))
    return p.stdout


def module_counts(callers, *parts):
    """Summed per-library counters of every caller whose name has a part."""
    tot = {"alloc": 0, "copy": 0, "launch": 0}
    names = []
    for name, c in callers.items():
        if any(p in name for p in parts):
            names.append(name)
            for k in tot:
                tot[k] += c.get(k, 0)
    return tot, names


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--work":
        return work(sys.argv[2])
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    shim = sys.argv[1]  # an LD_PRELOAD value (a sanitizer runtime may come first)
    try:
        import torch
        import triton  # noqa: F401
    except ImportError as e:
        print("skipped: %s" % e)
        return SKIP
    if not torch.cuda.is_available():
        print("skipped: no CUDA device")
        return SKIP

    failures = []

    def check(cond, what):
        print(("ok   " if cond else "FAIL ") + what)
        if not cond:
            failures.append(what)

    with tempfile.TemporaryDirectory() as tmp:
        base = dict(os.environ)
        base.pop("LD_PRELOAD", None)
        base["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
        base["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(tmp, "inductor")
        base["TRITON_CACHE_DIR"] = os.path.join(tmp, "triton")
        plain_out, shim_out = os.path.join(tmp, "plain.pt"), os.path.join(tmp, "shim.pt")
        run(plain_out, base)
        plain = torch.load(plain_out)
        stats = {}
        for mode, extra in (("pass-through", {}), ("observe", {"WOFFLOAD_OBSERVE": "1"})):
            env = dict(base)
            env.update(extra)
            env["LD_PRELOAD"] = shim
            env.setdefault("WOFFLOAD_LOG", "warn")
            log = run(shim_out, env)
            if log.strip():
                print(log[-3000:])
            shimmed = torch.load(shim_out)
            for k in plain:
                check(torch.equal(plain[k], shimmed[k]),
                      "%s: %s identical with and without the shim" % (mode, k))
            with open(shim_out + ".stats.json") as fh:
                stats[mode] = json.load(fh)

    for mode in ("pass-through", "observe"):
        ip = stats[mode].get("interpose", {})
        callers = ip.get("callers", {})
        print("== %s" % mode)
        print("interpose counters:", json.dumps({k: v for k, v in ip.items()
                                                 if k not in ("calls", "callers")}, indent=None))
        print("callers:", json.dumps(callers, indent=None))
        print("calls:", json.dumps(ip.get("calls", {}), indent=None))
        blas, blas_names = module_counts(callers, "libcublas")
        trit, trit_names = module_counts(callers, "triton", "launcher", "cuda_utils")
        nccl, nccl_names = module_counts(callers, "libnccl")
        print("cuBLAS (%s): %s" % (", ".join(blas_names), blas))
        print("Triton (%s): %s" % (", ".join(trit_names), trit))
        print("NCCL (%s): %s" % (", ".join(nccl_names), nccl))
        check(blas["launch"] > 0, "%s: cuBLAS launches counted (through its static runtime)" % mode)
        check(trit["launch"] > 0, "%s: Triton launches counted" % mode)
        check(nccl["launch"] > 0, "%s: NCCL launches counted" % mode)
        check(nccl["alloc"] > 0, "%s: NCCL allocations counted" % mode)
        check(ip.get("alloc_calls", 0) + ip.get("vmm_map", 0) > 0,
              "%s: PyTorch allocations counted" % mode)
        check(ip.get("vmm_map", 0) > 0,
              "%s: expandable segments (VMM through entry points) counted" % mode)
        torch_rt, _ = module_counts(callers, "libtorch_cuda", "libtorch_python", "libc10_cuda")
        check(torch_rt["launch"] > 0 and ip.get("launch_runtime", 0) > 0,
              "%s: PyTorch's own launches counted through the runtime (__cudaLaunchKernel)" % mode)
        check(ip.get("capture_begin", 0) >= 1 and ip.get("capture_end", 0) >= 1,
              "%s: CUDA graph capture counted" % mode)
        check(ip.get("proc_substituted", 0) > 0 and ip.get("dlsym_substituted", 0) > 0,
              "%s: cuGetProcAddress and dlsym substitution at work" % mode)
        check(ip.get("proc_conflict", 0) == 0, "%s: no wrapper slot conflict" % mode)
        if mode == "pass-through":
            check(ip.get("launch_calls", 0) > 0 and ip.get("launch_scanned", 0) == 0,
                  "pass-through: launches counted and forwarded, none scanned")
        else:
            check(ip.get("launch_scanned", 0) > 0, "observe: launch parameters scanned")
            check(ip.get("launch_with_hits", 0) > 0, "observe: launches attributed to tracked ranges")
            check(ip.get("launch_captured", 0) > 0, "observe: captured launches recorded")
            check(ip.get("graph_launch_attributed", 0) > 0,
                  "observe: graph launches tied to their capture")
    if failures:
        print("%d check(s) failed" % len(failures))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
