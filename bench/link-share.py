#!/usr/bin/env python3
"""bench/link-share.py: can the copy engine and in-place reads share PCIe?

    python3 bench/link-share.py [--layers 8] [--reps 5]

Batch-1 dense decode reads every offloaded weight once a token. Read in
place (pinned host memory through its UVA pointer: the shim's `host`
placement), the engine's GEMV reaches ~47 GB/s; copied by the copy engine
into a device slot first and read there (the streaming executor), ~53-55
GB/s, but every slot is device memory that no longer holds a weight. This
probe measures, on the weights of Llama-shaped layers (hidden 4096, MLP
14336, GQA 32/8, bf16) in pinned host memory, one GEMV a weight in layer
order, the effective rate (host bytes / time) of:

  inplace      every weight read in place
  stream-S     every weight copied into one of S device slots on a copy
               stream (ordered with events, as uvm/stream.c does), the
               GEMV reading the slot
  mix-K-S      every K-th weight streamed through S slots, the others read
               in place while the copies run: both use the link at once
  largest-S    only the MLP weights (gate, up, down) streamed, attention
               weights in place

and, raw: the copy engine alone, a streaming-read kernel alone, and both at
once on two streams (the link's share). Each figure is the median of REPS
timed passes after a warm-up pass.
"""
import argparse
from typing import List, Tuple

import torch

import hostview  # bench/hostview.py

GB = 1e9
H, I, KV = 4096, 14336, 1024


def weights(layers: int) -> List[Tuple[torch.Tensor, torch.Tensor, int]]:
    """(host tensor, its UVA view as a CUDA bf16 matrix, input width) per
    weight, in a decoder's order: q k v o gate up down."""
    shapes = [(H, H), (KV, H), (KV, H), (H, H), (I, H), (I, H), (H, I)]
    out = []
    for _ in range(layers):
        for (o, i) in shapes:
            host = torch.empty(o * i * 2, dtype=torch.uint8, pin_memory=True)
            view = hostview.cuda_view(torch, host).view(torch.bfloat16).view(o, i)
            view.normal_(0, 0.02)
            out.append((host, view, i))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    torch.manual_seed(0)
    ws = weights(a.layers)
    total = sum(h.numel() for h, _, _ in ws)
    xs = {H: torch.randn(1, H, device="cuda", dtype=torch.bfloat16),
          I: torch.randn(1, I, device="cuda", dtype=torch.bfloat16)}
    big = max(h.numel() for h, _, _ in ws)
    copy_s = torch.cuda.Stream()
    main_s = torch.cuda.current_stream()
    slots = [torch.empty(big, dtype=torch.uint8, device="cuda") for _ in range(4)]

    def run(streamed: List[bool], nslots: int) -> None:
        """Streamed weights go through the slot ring on copy_s, ahead of
        the GEMVs: copy m (into slot m % S) is issued once the GEMV of
        streamed weight m - S, the slot's previous reader, is enqueued, and
        waits for it on the device."""
        order = [k for k in range(len(ws)) if streamed[k]]
        copied = {}
        read_done: List = [None] * nslots

        def issue(m: int) -> None:
            if m >= len(order):
                return
            s, j = m % nslots, order[m]
            with torch.cuda.stream(copy_s):
                if read_done[s] is not None:
                    copy_s.wait_event(read_done[s])
                h = ws[j][0]
                slots[s][:h.numel()].copy_(h, non_blocking=True)
                ev = torch.cuda.Event()
                ev.record(copy_s)
                copied[j] = (ev, s, m)

        for m in range(nslots):
            issue(m)
        for k, (h, view, i) in enumerate(ws):
            if not streamed[k]:
                torch.nn.functional.linear(xs[i], view)
                continue
            ev, s, m = copied[k]
            main_s.wait_event(ev)
            w = slots[s][:h.numel()].view(torch.bfloat16).view(view.shape)
            torch.nn.functional.linear(xs[i], w)
            rd = torch.cuda.Event()
            rd.record(main_s)
            read_done[s] = rd
            issue(m + nslots)

    n = len(ws)
    rows = []

    def row(name: str, streamed: List[bool], nslots: int) -> None:
        t = hostview.timed(torch, lambda: run(streamed, nslots), a.reps)
        sb = sum(ws[k][0].numel() for k in range(n) if streamed[k])
        rows.append((name, total / t / GB, t * 1e3, sb / total))

    row("inplace", [False] * n, 1)
    for s in (2, 3, 4):
        row(f"stream-{s}", [True] * n, s)
    for kk in (2, 3):
        for s in (1, 2):
            row(f"mix-{kk}-{s}", [k % kk == kk - 1 for k in range(n)], s)
    for s in (1, 2):
        row(f"largest-{s}", [k % 7 >= 4 for k in range(n)], s)
    row("mix-2of3-2", [k % 3 != 0 for k in range(n)], 2)

    # raw link figures
    src = ws[4][0]
    dst = torch.empty(src.numel(), dtype=torch.uint8, device="cuda")
    zc = ws[5][1]

    def copy_only() -> None:
        with torch.cuda.stream(copy_s):
            for _ in range(8):
                dst.copy_(src, non_blocking=True)
        main_s.wait_stream(copy_s)

    def read_only() -> None:
        for _ in range(8):
            zc.sum(dtype=torch.float32)

    def both() -> None:
        with torch.cuda.stream(copy_s):
            for _ in range(8):
                dst.copy_(src, non_blocking=True)
        for _ in range(8):
            zc.sum(dtype=torch.float32)
        main_s.wait_stream(copy_s)

    tc, tr, tb = (hostview.timed(torch, f, a.reps) for f in (copy_only, read_only, both))
    nb = 8 * src.numel()
    print(f"GPU: {torch.cuda.get_device_name()}; {a.layers} Llama-shaped layers, {total / GB:.2f} GB of bf16 "
          f"weights in pinned host memory, one GEMV (batch 1) per weight in layer order")
    print(f"raw: copy engine alone {nb / tc / GB:.1f} GB/s; streaming-read kernel alone {nb / tr / GB:.1f} GB/s; "
          f"both at once {2 * nb / tb / GB:.1f} GB/s together")
    print("| schedule | GB/s (host bytes / time) | ms a pass | streamed fraction |")
    print("|---|---|---|---|")
    for name, gbs, ms, frac in rows:
        print(f"| {name} | {gbs:.1f} | {ms:.1f} | {frac:.2f} |")


if __name__ == "__main__":
    main()
