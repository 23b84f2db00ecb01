#!/usr/bin/env python3
"""bench/pcie-interference.py: does traffic over PCIe slow the engine's host?

An engine whose weights are read over PCIe decodes with the host issuing
~2,100 launches and ~340 waits a step (transformers' eager MoE loop). The
replay (tools/replay-sim.c) charges the host's own work as the all-GPU run
recorded it. This probe measures whether that work gets slower while the
GPU pulls host memory, in one process, alternating:

  none  nothing else runs
  dma   a second stream copies 1 GiB pinned host -> device in a loop (the
        copy engine: what prefetches do)
  zc    a second stream runs a kernel on 16 SMs reading 2 GiB of pinned
        host memory in place (zero-copy: what the host placement does)

and for each, two host workloads:

  launch  a launch-bound loop shaped like a decode step: 2,100 small
          kernels, a wait (.item()) every 6 launches
  enqueue the same 2,100 launches without waits, timed to the last
          launch's return: the host's launch path alone
  cpu     pure Python work touching host memory (no CUDA call): the host's
          own speed, apart from the driver

and, with no traffic, the host's own time for the launches of a loop whose
waits are short (~1 us) or long (~130 us, what a host-placed expert's read
makes the host wait): whether waiting long slows the work after the wait.

Prints the median time of each (5 rounds, modes alternating) and its ratio
to `none`. usage: python3 bench/pcie-interference.py [--rounds N]
"""
import argparse
import statistics
import threading
import time
from typing import Any, Dict, List


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()

    import torch

    from hostview import cuda_view  # bench/hostview.py

    dev = torch.device("cuda")
    GiB = 1 << 30
    host = torch.empty(2 * GiB, dtype=torch.uint8, pin_memory=True)
    host.fill_(1)
    dbuf = torch.empty(GiB, dtype=torch.uint8, device=dev)

    zc = cuda_view(torch, host).view(torch.float16)  # 2 GiB read in place

    # A reader of host memory in place that leaves most SMs free (a torch
    # reduction would take every SM and queue the foreground's kernels
    # behind it): 16 blocks streaming 16-byte loads, compiled here.
    from torch.utils.cpp_extension import load_inline
    zcmod = load_inline(
        name="wo_zc_reader",
        cpp_sources="void zc_read(torch::Tensor t, int64_t blocks);",
        cuda_sources=r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
__global__ void rd(const int4 *p, long long n, int *sink)
{
    int4 acc = make_int4(0, 0, 0, 0);
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        int4 v = p[i];
        acc.x ^= v.x; acc.y ^= v.y; acc.z ^= v.z; acc.w ^= v.w;
    }
    if ((acc.x ^ acc.y ^ acc.z ^ acc.w) == 0x7fffffff)
        *sink = 1;
}
void zc_read(torch::Tensor t, int64_t blocks)
{
    static int *sink;
    if (!sink)
        cudaMalloc(&sink, sizeof(int));
    rd<<<(int)blocks, 1024, 0, at::cuda::getCurrentCUDAStream()>>>(
        (const int4 *)t.data_ptr(), t.numel() * t.element_size() / 16, sink);
}
""",
        functions=["zc_read"], extra_cuda_cflags=["-O2"], verbose=False)

    stop = threading.Event()
    side = torch.cuda.Stream()  # non-blocking: no implicit sync with the default stream
    moved = {"bytes": 0, "s": 0.0}

    def background(mode: str) -> None:
        # four operations queued, then polled with sleeps: a blocking
        # synchronize could hold the GIL for its whole wait and stall the
        # foreground thread for reasons that have nothing to do with PCIe
        t0 = time.perf_counter()
        done = torch.cuda.Event()
        with torch.cuda.stream(side):
            while not stop.is_set():
                for _ in range(4):
                    if mode == "dma":
                        dbuf.copy_(host[:GiB], non_blocking=True)
                        moved["bytes"] += GiB
                    else:
                        zcmod.zc_read(zc, 16)
                        moved["bytes"] += 2 * GiB
                done.record(side)
                while not done.query():
                    time.sleep(0.002)
        moved["s"] += time.perf_counter() - t0

    x = torch.ones(1024, device=dev)

    def launch_step() -> float:
        t0 = time.perf_counter()
        y = x
        for i in range(2100):
            y = y * 1.0001
            if i % 6 == 5:
                y[0].item()
        torch.cuda.current_stream().synchronize()
        return time.perf_counter() - t0

    def launch_only() -> float:
        t0 = time.perf_counter()
        y = x
        for _ in range(2100):
            y = y * 1.0001
        t1 = time.perf_counter()
        torch.cuda.current_stream().synchronize()
        return t1 - t0

    def own_after_waits(cycles: int) -> float:
        """The host's own time for 2,100 launches, a wait every 6 on a GPU
        kernel spinning `cycles` clocks first: only the launches are timed,
        so a longer wait changes nothing but how long the host waited."""
        own = 0.0
        y = x
        for i in range(350):
            t0 = time.perf_counter()
            for _ in range(6):
                y = y * 1.0001
            own += time.perf_counter() - t0
            torch.cuda._sleep(cycles)
            y[0].item()
        return own

    data = list(range(1 << 20))

    def cpu_step() -> float:
        t0 = time.perf_counter()
        s = 0
        for v in data[::3]:
            s += v
        return time.perf_counter() - t0

    works = {"launch": launch_step, "enqueue": launch_only, "cpu": cpu_step}
    for _ in range(3):  # warm up
        for w in works.values():
            w()
    res: Dict[str, Dict[str, List[float]]] = {m: {w: [] for w in works} for m in ("none", "dma", "zc")}
    rates: Dict[str, List[float]] = {"dma": [], "zc": []}
    for _ in range(args.rounds):
        for mode in ("none", "dma", "none", "zc"):
            th = None
            if mode != "none":
                stop.clear()
                moved.update(bytes=0, s=0.0)
                th = threading.Thread(target=background, args=(mode,))
                th.start()
                time.sleep(0.2)
            for _ in range(3):
                for w, fn in works.items():
                    res[mode][w].append(fn())
            if th is not None:
                stop.set()
                th.join()
                rates[mode].append(moved["bytes"] / moved["s"] / 1e9)
            print("round: %s launch %.2f ms" % (mode, res[mode]["launch"][-1] * 1e3), flush=True)
    # the engine's pattern: a kernel reads one expert (25 MB) over PCIe,
    # the host launches 6 more kernels (timed: "during"), waits; or it waits
    # first and then launches (timed: "after"); the same reading device
    # memory as the reference
    expert = zc[: 25 * (1 << 20) // 2]
    expert_dev = torch.empty_like(expert, device=dev)

    def pattern(src: Any, during: bool) -> float:
        own = 0.0
        y = x
        for _ in range(128):
            zcmod.zc_read(src, 132)
            if not during:
                y[0].item()
            t0 = time.perf_counter()
            for _ in range(6):
                y = y * 1.0001
            own += time.perf_counter() - t0
            y[0].item()
        return own

    pat: Dict[str, List[float]] = {k: [] for k in ("dev-during", "host-during", "dev-after", "host-after")}
    for _ in range(args.rounds * 3):
        for k in pat:
            pat[k].append(pattern(expert if k.startswith("host") else expert_dev, k.endswith("during")))

    # does waiting long make the host's next work slower? (no PCIe traffic)
    waits: Dict[str, List[float]] = {"short": [], "long": []}
    for _ in range(args.rounds * 3):
        waits["short"].append(own_after_waits(2000))       # ~1 us on the GPU
        waits["long"].append(own_after_waits(260000))      # ~130 us: a host-placed expert's read
    print(f"GPU: {torch.cuda.get_device_name()}; torch {torch.__version__}; rounds {args.rounds}")
    pm = {k: statistics.median(v) * 1e3 for k, v in pat.items()}
    print("own time of 768 launches, 6 after each 25 MB read by a kernel: while the read runs "
          "%.2f ms (host memory) vs %.2f (device memory) = %.2fx; after it finished %.2f vs %.2f = %.2fx"
          % (pm["host-during"], pm["dev-during"], pm["host-during"] / pm["dev-during"], pm["host-after"],
             pm["dev-after"], pm["host-after"] / pm["dev-after"]))
    ws, wl = statistics.median(waits["short"]), statistics.median(waits["long"])
    print("own launch time of 2,100 launches, a wait every 6: after ~1 us waits %.2f ms, after ~130 us "
          "waits %.2f ms (%.2fx)" % (ws * 1e3, wl * 1e3, wl / ws))
    print("background traffic: dma %.1f GB/s, zc %.1f GB/s (median over rounds, with the foreground running)"
          % (statistics.median(rates["dma"]), statistics.median(rates["zc"])))
    base = {w: statistics.median(res["none"][w]) for w in works}
    print("median ms (x none): launch = 2,100 launches + 350 waits; enqueue = 2,100 launches, "
          "no wait (host time only); cpu = Python alone")
    print("%-6s %20s %20s %20s" % ("mode", "launch", "enqueue", "cpu"))
    for mode in ("none", "dma", "zc"):
        cells = []
        for w in works:
            v = statistics.median(res[mode][w])
            cells.append("%9.2f (%.2fx)" % (v * 1e3, v / base[w]))
        print("%-6s %20s %20s %20s" % (mode, *cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
