#!/usr/bin/env python3
"""How fast the engine's own kernels read weights in place over PCIe.

    python3 bench/zc-gemv.py

Pinned host memory seen by the GPU through its UVA pointer (the shim's
`host` placement and vLLM's UVA offload): a batch-1 decode reads each expert
of a Qwen3-MoE layer with two GEMVs (gate_up 3072 x 4096, down 4096 x 1536,
bf16). Prints the read rate of those GEMVs, of an elementwise sum over the
same bytes, and of a copy engine transfer, beside each other. The replay's
device model (tools/models/*.model, zc_gbs) is the streaming rate; this
says how much of it an engine's GEMV reaches (docs/prefetch.md)."""
import torch

import hostview  # bench/hostview.py

GiB = 2**30
H, I, E = 4096, 1536, 32


def cuda_view(host: torch.Tensor, shape, dtype) -> torch.Tensor:
    return hostview.cuda_view(torch, host).view(dtype).view(shape)


def main() -> None:
    torch.manual_seed(0)
    gu_host = torch.empty(E * 2 * I * H * 2, dtype=torch.uint8, pin_memory=True)
    dn_host = torch.empty(E * H * I * 2, dtype=torch.uint8, pin_memory=True)
    gu = cuda_view(gu_host, (E, 2 * I, H), torch.bfloat16)
    dn = cuda_view(dn_host, (E, H, I), torch.bfloat16)
    gu.normal_()
    dn.normal_()
    gu_d, dn_d = gu.clone(), dn.clone()
    x = torch.randn(1, H, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(1, I, device="cuda", dtype=torch.bfloat16)
    nbytes = gu.numel() * 2 + dn.numel() * 2

    def experts(a, b):
        def f():
            for e in range(E):
                torch.nn.functional.linear(x, a[e])
                torch.nn.functional.linear(y, b[e])
        return f

    t_host = hostview.timed(torch, experts(gu, dn))
    t_dev = hostview.timed(torch, experts(gu_d, dn_d))
    t_sum = hostview.timed(torch, lambda: (gu.sum(dtype=torch.float32), dn.sum(dtype=torch.float32)))
    dst = torch.empty(gu_host.numel(), dtype=torch.uint8, device="cuda")
    t_copy = hostview.timed(torch, lambda: dst.copy_(gu_host, non_blocking=True))
    print(f"GPU: {torch.cuda.get_device_name()}; {nbytes / GiB:.2f} GiB of experts ({E} x gate_up {2 * I}x{H} "
          f"+ down {H}x{I}, bf16)")
    print(f"GEMV per expert, weights on host (zero-copy): {nbytes / t_host / 1e9:6.1f} GB/s "
          f"({t_host * 1e3:.2f} ms for {2 * E} GEMVs)")
    print(f"GEMV per expert, weights on device:           {nbytes / t_dev / 1e9:6.1f} GB/s "
          f"({t_dev * 1e3:.2f} ms)")
    print(f"sum over the same host bytes (streaming):     {nbytes / t_sum / 1e9:6.1f} GB/s")
    print(f"copy engine H2D of the gate_up bytes:         {gu_host.numel() / t_copy / 1e9:6.1f} GB/s")


if __name__ == "__main__":
    main()
