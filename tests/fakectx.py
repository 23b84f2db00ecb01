"""What the Python hook's tests under the fake driver share
(test-python-expect.py, test-python-picks.py): a current context on the
fake, and a re-run of the test itself as the preloaded child whose last
word is a RESULT line of JSON."""
import ctypes
import json
import os
import subprocess
import sys
from typing import Any, Dict, Optional, Tuple


def context() -> ctypes.CDLL:
    """The driver (libcuda.so.1: the fake, by LD_LIBRARY_PATH) with device
    0's primary context current."""
    cu = ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_GLOBAL)
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    assert cu.cuInit(0) == 0
    assert cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
    assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
    assert cu.cuCtxSetCurrent(ctx) == 0
    return cu


def child(script: str, env: Dict[str, str],
          timeout: float = 120) -> Tuple[subprocess.CompletedProcess, Optional[Dict[str, Any]]]:
    """Runs `script --child` under env: the process, and its RESULT line's
    object (None when it failed or printed none)."""
    p = subprocess.run([sys.executable, os.path.abspath(script), "--child"],
                       capture_output=True, text=True, env=env, timeout=timeout)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    return p, (json.loads(lines[0][7:]) if p.returncode == 0 and lines else None)
