"""What the gpu suite's Python tests share (tests/gpu/*.py): the check for
torch, transformers and a GPU, and reading a child's result."""
import glob
import json
import os
import subprocess
import sys
import tempfile

# bench/stall-stacks.sh: every thread's stack of a process the shim reports stuck
STALL_STACKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench",
                            "stall-stacks.sh")


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


def run_watched(cmd: list, env, timeout: float, kill: bool = True) -> subprocess.CompletedProcess:
    """subprocess.run, with bench/stall-stacks.sh watching the child's stderr:
    when the shim says the copy engine looks stuck (or, with kill, 20 s
    before the timeout, the child still running), every thread's stack is
    taken twice, 2 s apart, and the stacks follow its stderr. With kill the
    child is then killed (a hang ends early and says where each thread
    was: a stall on the H200 came once in eleven runs, with no stacks);
    without, it goes on (the shim's rescue of the stalled jobs may end the
    stall: whether it did, and with which tokens, is the child's result)."""
    with tempfile.TemporaryDirectory() as tmp:
        err_path = os.path.join(tmp, "stderr.txt")
        watcher = None
        with open(err_path, "w") as err:
            child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
            if os.path.exists(STALL_STACKS):
                watcher = subprocess.Popen(
                    ["bash", STALL_STACKS, err_path, tmp, "looks stuck", str(max(10, int(timeout) - 20))],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                    env=dict(os.environ, STALL_KILL="1" if kill else "0",
                             STALL_AT_END="1" if kill else "0"))
            try:
                out, _ = child.communicate(timeout=timeout)
            except subprocess.TimeoutExpired as e:
                child.kill()
                child.communicate()
                if watcher:
                    watcher.kill()
                    watcher.wait()
                    watcher = None
                # the stacks a stall report took come with the hang's tail:
                # they say where each thread was (the H100's lazy-loading
                # row, 2026-12-05, timed out after one with none kept)
                e.stderr = with_stacks(err_path, tmp)
                raise
            finally:
                if watcher:
                    watcher.kill()
                    watcher.wait()
        stderr = with_stacks(err_path, tmp)
    return subprocess.CompletedProcess(cmd, child.returncode, out, stderr)


def with_stacks(err_path: str, tmp: str) -> str:
    """The child's stderr, then each stacks-*.txt bench/stall-stacks.sh wrote."""
    with open(err_path, errors="replace") as f:
        stderr = f.read()
    for path in sorted(glob.glob(os.path.join(tmp, "stacks-*.txt"))):
        with open(path, errors="replace") as f:
            stderr += f"\n######## {os.path.basename(path)} (bench/stall-stacks.sh)\n" + f.read()
    return stderr


def result(cmd: list, env=None, must: bool = True, timeout: float = 600,
           stacks: bool = False, kill_on_stall: bool = True) -> dict:
    """Runs a child that prints one line `RESULT <json>` and returns that
    object, the child's stderr under "stderr". Without such a line: with
    must, the test fails here (the child's output tails on stderr);
    otherwise an object with "error" and those tails. stacks: a stall
    takes the child's stacks (run_watched), and with kill_on_stall ends
    it; they follow its stderr, whole."""
    try:
        if stacks:
            p = run_watched(cmd, env, timeout, kill_on_stall)
        else:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as e:
        # a hang (the child is killed): what it said so far
        def text(b):
            return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")
        err = text(e.stderr)
        at = err.find("\n######## stacks-")
        tail = text(e.stdout)[-3000:] + (err[max(0, at - 5000):] if at >= 0 else err[-5000:])
        if must:
            sys.stderr.write(tail)
            raise SystemExit(f"FAIL: {' '.join(cmd)}: still running after {timeout:.0f} s")
        return {"error": f"still running after {timeout:.0f} s (killed)", "stderr": tail}
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            r = json.loads(line[7:])
            r["stderr"] = p.stderr
            return r
    stacks_at = p.stderr.find("\n######## stacks-")
    tail = p.stdout[-3000:] + (p.stderr[max(0, stacks_at - 5000):] if stacks_at >= 0
                               else p.stderr[-5000:])
    if must:
        sys.stderr.write(tail)
        raise SystemExit(f"FAIL: {' '.join(cmd)}: exit {p.returncode}, no result")
    return {"error": f"exit {p.returncode}, no result", "stderr": tail}
