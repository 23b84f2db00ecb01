#!/usr/bin/env python3
"""bench/module-loading.py: what CUDA's eager module loading costs PyTorch,
the loading the shim asks for when the copy engine is on
(WOFFLOAD_PICKS_ENGINE; docs/picks.md, "Module loading"): start-up time and the device
memory the process holds after its first GEMM, under CUDA_MODULE_LOADING
LAZY and EAGER, each in a fresh process, RUNS times (the median).

    python3 bench/module-loading.py [RUNS]   (on the GPU machine)
"""
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import json, time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
x = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
y = (x @ x).float().softmax(-1).sum()
torch.cuda.synchronize()
t2 = time.perf_counter()
free, total = torch.cuda.mem_get_info()
print(json.dumps({"import_s": t1 - t0, "first_gemm_s": t2 - t1,
                  "device_used_mib": (total - free) / 2**20}))
"""


def main():
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    print("| CUDA_MODULE_LOADING | import torch s | CUDA init + first GEMM s | device used MiB |")
    print("|---|---|---|---|")
    for mode in ("LAZY", "EAGER"):
        env = dict(os.environ, CUDA_MODULE_LOADING=mode)
        rows = [json.loads(subprocess.run([sys.executable, "-c", CHILD], env=env, check=True,
                                          capture_output=True, text=True).stdout.splitlines()[-1])
                for _ in range(runs)]
        med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        print(f"| {mode} | {med['import_s']:.2f} | {med['first_gemm_s']:.2f} | "
              f"{med['device_used_mib']:.0f} |")


if __name__ == "__main__":
    main()
