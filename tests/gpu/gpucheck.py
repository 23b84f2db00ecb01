"""What the gpu suite's Python tests share (tests/gpu/*.py): the check for
torch, transformers and a GPU, and reading a child's result."""
import json
import subprocess
import sys


def torch_on_gpu():
    """torch, when it, transformers and a GPU are all there; otherwise None,
    after saying why (the test then exits 77: meson's skip)."""
    try:
        import torch
        import transformers  # noqa: F401
        if not torch.cuda.is_available():
            raise ImportError("no GPU")
    except ImportError as e:
        print(f"SKIP: {e}")
        return None
    return torch


def result(cmd: list, env=None, must: bool = True, timeout: float = 600) -> dict:
    """Runs a child that prints one line `RESULT <json>` and returns that
    object, the child's stderr under "stderr". Without such a line: with
    must, the test fails here (the child's output tails on stderr);
    otherwise an object with "error" and those tails."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as e:
        # a hang (the child is killed): what it said so far
        def text(b):
            return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")
        tail = text(e.stdout)[-3000:] + text(e.stderr)[-5000:]
        if must:
            sys.stderr.write(tail)
            raise SystemExit(f"FAIL: {' '.join(cmd)}: still running after {timeout:.0f} s")
        return {"error": f"still running after {timeout:.0f} s (killed)", "stderr": tail}
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            r = json.loads(line[7:])
            r["stderr"] = p.stderr
            return r
    tail = p.stdout[-3000:] + p.stderr[-5000:]
    if must:
        sys.stderr.write(tail)
        raise SystemExit(f"FAIL: {' '.join(cmd)}: exit {p.returncode}, no result")
    return {"error": f"exit {p.returncode}, no result", "stderr": tail}
