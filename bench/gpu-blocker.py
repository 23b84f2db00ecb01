#!/usr/bin/env python3
"""bench/gpu-blocker.py: hold device memory so that a given amount is left
free, as a model larger than the GPU leaves it (the lent GPUs have far more
memory than a row needs, so a process's allocations take free memory where
a full device would make them take back what UVM keeps cached).

    python3 bench/gpu-blocker.py --leave 5072MiB [--device 0]

Through the CUDA driver API (libcuda.so.1 by ctypes: no PyTorch, no
toolkit). Once the memory is held it prints one line,

    gpu-blocker: held N MiB on device D: F MiB free of T MiB

and waits for SIGTERM or SIGINT (with --stdin, also for its stdin to
close), then frees it and exits 0. Exit 1 with a line naming the driver call that failed or why
the amount cannot be left (more than is free); 2 on bad arguments.
bench/llamacpp-serve-rows.sh starts it for a row with the suffix -full.
"""
import argparse
import ctypes
import re
import select
import signal
import sys

MIB = 1 << 20
UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": MIB, "MB": MIB, "MIB": MIB,
         "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30}
CHUNK = 64 * MIB  # what is left over the wanted free memory after the first allocation


def size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in UNITS:
        raise argparse.ArgumentTypeError(f"'{text}' is not a size (a whole number, then B, KiB, MiB or GiB)")
    return int(m.group(1)) * UNITS[m.group(2).upper()]


class Driver:
    def __init__(self) -> None:
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise SystemExit(f"gpu-blocker: libcuda.so.1 cannot be loaded ({e}): no NVIDIA driver here")

    def call(self, name: str, *args) -> None:
        fn = getattr(self.lib, name, None)
        if fn is None:
            raise SystemExit(f"gpu-blocker: the driver has no {name}")
        r = fn(*args)
        if r != 0:
            what = ctypes.c_char_p()
            err = getattr(self.lib, "cuGetErrorName", None)
            if err is not None and err(r, ctypes.byref(what)) == 0 and what.value:
                raise SystemExit(f"gpu-blocker: {name} failed: {what.value.decode()} ({r})")
            raise SystemExit(f"gpu-blocker: {name} failed: CUresult {r}")

    def free_total(self) -> tuple:
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        self.call("cuMemGetInfo_v2", ctypes.byref(free), ctypes.byref(total))
        return free.value, total.value


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--leave", type=size, required=True, help="device memory to leave free (e.g. 5072MiB)")
    ap.add_argument("--device", type=int, default=0, help="the device's ordinal (default 0)")
    ap.add_argument("--stdin", action="store_true", help="also stop when stdin closes")
    a = ap.parse_args()
    d = Driver()
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    d.call("cuInit", 0)
    d.call("cuDeviceGet", ctypes.byref(dev), a.device)
    d.call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
    d.call("cuCtxSetCurrent", ctx)
    free, total = d.free_total()
    if a.leave > free:
        print(f"gpu-blocker: cannot leave {a.leave // MIB} MiB free on device {a.device}: only "
              f"{free // MIB} MiB of {total // MIB} MiB are free", file=sys.stderr)
        return 1
    held = []
    # one allocation of what is over, then chunks while the free memory
    # stays above what is to be left (the driver rounds each one up)
    want = free - a.leave
    while want >= MIB:
        p = ctypes.c_uint64()
        d.call("cuMemAlloc_v2", ctypes.byref(p), ctypes.c_size_t(want))
        held.append((p.value, want))
        free, _ = d.free_total()
        want = min(CHUNK, free - a.leave) if free > a.leave + CHUNK else 0
    stop = []
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, lambda *_: stop.append(1))
    print(f"gpu-blocker: held {sum(n for _, n in held) // MIB} MiB on device {a.device}: "
          f"{free // MIB} MiB free of {total // MIB} MiB", flush=True)
    while not stop:
        try:
            r, _, _ = select.select([sys.stdin] if a.stdin else [], [], [], 1.0)
        except InterruptedError:
            continue
        if r and not sys.stdin.read(1):
            break  # stdin closed: whoever started it is gone
    for p, _ in held:
        d.call("cuMemFree_v2", ctypes.c_uint64(p))
    return 0


if __name__ == "__main__":
    sys.exit(main())
