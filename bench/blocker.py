#!/usr/bin/env python3
"""bench/blocker.py: another process holding device memory, so that a model
is larger than what is left free (issue 41), and watching what the others
use meanwhile.

    python3 bench/blocker.py --leave BYTES [--device 0] [--every-ms 5]

Allocates ordinary device memory (torch) until BYTES stay free, prints one
line `holds H MiB, F MiB free after it` (wait for it before starting the
engine), then samples the device's free memory every --every-ms until it is
sent SIGTERM or SIGINT, and prints, last:

    blocker: free at start F B, least free L B, peak used by others P B

`peak used by others` is F - L: the most device memory every other process
together held above what was in use when the blocker was ready (the
engine's whole process, context included, when it starts after that line).
Exit 0; 2 when the device cannot leave BYTES free (less is free already).
"""
import argparse
import signal
import sys
import threading


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--leave", type=int, required=True, help="bytes to leave free")
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--every-ms", type=float, default=5.0)
    args = ap.parse_args()
    import torch

    torch.cuda.set_device(args.device)
    free, _ = torch.cuda.mem_get_info()
    if free < args.leave:
        print(f"blocker: only {free >> 20} MiB free, cannot leave {args.leave >> 20} MiB", flush=True)
        return 2
    x = torch.empty(free - args.leave, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    start = torch.cuda.mem_get_info()[0]
    print(f"holds {x.numel() >> 20} MiB, {start >> 20} MiB free after it", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    least = start
    while not stop.wait(args.every_ms / 1000.0):
        least = min(least, torch.cuda.mem_get_info()[0])
    print(f"blocker: free at start {start} B, least free {least} B, peak used by others {start - least} B",
          flush=True)
    del x
    return 0


if __name__ == "__main__":
    sys.exit(main())
