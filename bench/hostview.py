"""bench/hostview.py: a CUDA tensor that reads pinned host memory in place.

The mechanism of vLLM's UVA CPU offload, shared by bench/e2e.py (the pinned
swap baseline), bench/zc-gemv.py, bench/link-share.py and
bench/pcie-interference.py: the device pointer of a pinned host tensor
(cudaHostGetDevicePointer, from the libcudart that PyTorch loaded) wrapped
as a CUDA tensor through the CUDA array interface. Kernels given it read
host memory over PCIe. Also the probes' timer (timed).
"""
import ctypes
from typing import Any, Optional

_cudart: Optional[ctypes.CDLL] = None


def _libcudart() -> Optional[ctypes.CDLL]:
    global _cudart
    if _cudart is None:
        with open("/proc/self/maps") as f:
            for line in f:
                if "libcudart.so" in line:
                    _cudart = ctypes.CDLL(line.split()[-1])
                    break
    return _cudart


def cuda_view(torch: Any, host: Any) -> Any:
    """A CUDA uint8 tensor over the bytes of `host` (a pinned CPU tensor,
    contiguous), read in place. Without a libcudart in the process the host
    pointer is used as is (unified addressing makes it the device pointer)."""
    ptr = host.data_ptr()
    n = host.numel() * host.element_size()
    lib = _libcudart()
    if lib is not None:
        dptr = ctypes.c_void_p()
        r = lib.cudaHostGetDevicePointer(ctypes.byref(dptr), ctypes.c_void_p(ptr), 0)
        if r != 0:
            raise RuntimeError(f"cudaHostGetDevicePointer: error {r}")
        ptr = dptr.value

    class View:
        def __init__(self) -> None:
            self.__cuda_array_interface__ = dict(shape=(n,), typestr="|u1", data=(ptr, False),
                                                 version=3, strides=None)

    return torch.as_tensor(View(), device="cuda")


def timed(torch: Any, fn: Any, reps: int = 7) -> float:
    """The median wall time of fn() over reps calls after one warm-up, the
    device synchronised around each (the probes' way to time GPU work)."""
    import statistics
    import time

    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)
