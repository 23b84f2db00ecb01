"""The automatic hook: names a PyTorch model's weights with no change to the
engine's code. woffload-run puts python/site on PYTHONPATH; its
sitecustomize.py calls install() in every Python process it starts.

What it does, in order:
1. At interpreter start it opens the placeable window (unless the policy
   opened it already), so the weights the engine allocates while it loads are
   placeable. Nothing is imported beyond the standard library.
2. When ``torch`` is imported it registers one global forward pre-hook
   (torch.nn.modules.module.register_module_forward_pre_hook).
3. The rule: at the first forward call of a module that owns at least one
   CUDA parameter (directly or in a submodule), that module is taken as the
   model. Every parameter and buffer it holds is tagged by its full dotted
   name relative to it (``model.layers.0.mlp.experts.gate_up_proj``), then
   woffload_seal() runs: placements take effect and the window closes, before
   that forward computes anything. The hook then removes itself, so the KV
   cache, activations and anything allocated later are ordinary device
   memory, and later forwards pay nothing.
   Forward calls of modules with no CUDA parameters (a CPU tokenizer module,
   a parameter-free wrapper around a model it does not register) are ignored.

Limits, by design: one model per process (a second model loaded after the
first forward is neither placeable nor named); memory the engine allocated
while the window was open but that belongs to no parameter or buffer keeps
the policy's default placement.
"""
from __future__ import annotations

import errno
import os
import sys
import threading
from typing import Any, Optional

import woffload

_state_lock = threading.Lock()
_handle: Optional[Any] = None
_done = False


def _log(msg: str, level: str = "info") -> None:
    levels = {"off": 0, "error": 1, "warn": 2, "warning": 2, "info": 3, "debug": 4, "trace": 5}
    cur = os.environ.get("WOFFLOAD_LOG", "warn").strip().lower()
    cur_n = int(cur) if cur.isdigit() else levels.get(cur, 2)
    if levels[level] <= cur_n:
        sys.stderr.write(f"woffload: python hook: {msg}\n")
        sys.stderr.flush()


def _owns_cuda_parameters(module: Any) -> bool:
    for p in module.parameters():
        if p.is_cuda:
            return True
    return False


def _pre_hook(module: Any, args: Any) -> None:
    global _done, _handle
    if _done or not _owns_cuda_parameters(module):
        return
    with _state_lock:
        if _done:
            return
        _done = True
        if _handle is not None:
            _handle.remove()
            _handle = None
    try:
        rep = woffload.tag_module(module)
        r = woffload.seal()
    except Exception as e:  # never break the engine
        _log(f"tagging {type(module).__name__} failed: {type(e).__name__}: {e}", "error")
        return
    _log(f"{type(module).__name__}: {rep}; seal: {'ok' if r == 0 else os.strerror(-r)}",
         "info" if r == 0 and not rep.errors else "warn")
    if rep.errors:
        for name, err in list(rep.errors.items())[:5]:
            _log(f"  tag {name}: {os.strerror(-err)}", "warn")


def _on_torch_imported(torch: Any) -> None:
    global _handle
    if _done or _handle is not None:
        return
    hook = _pre_hook
    disable = getattr(getattr(torch, "compiler", None), "disable", None)
    if disable is not None:  # never traced by dynamo: it runs once, eagerly
        hook = disable(hook)
    _handle = torch.nn.modules.module.register_module_forward_pre_hook(hook)


class _TorchWatcher:
    """A meta path finder that finds nothing itself: when ``torch`` is about
    to be imported it lets the other finders find it and wraps the loader so
    _on_torch_imported runs right after torch's own module code."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != "torch":
            return None
        import importlib.util
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        orig_exec = loader.exec_module

        def exec_module(module: Any) -> None:
            try:
                orig_exec(module)
            finally:
                try:
                    del loader.exec_module  # back to the class's method
                except AttributeError:
                    pass
            try:
                _on_torch_imported(module)
            except Exception as e:
                _log(f"could not install the forward hook: {type(e).__name__}: {e}", "error")

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install() -> None:
    """Called by sitecustomize.py. Cheap: no torch import here."""
    if not woffload.available():
        _log("libwoffload.so is not preloaded; the automatic hook does nothing", "warn")
        return
    r = woffload.window_open()
    if r not in (0, -errno.EALREADY):
        _log(f"could not open the placeable window: {os.strerror(-r)}", "warn")
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "nn"):
        _on_torch_imported(torch)
    else:
        sys.meta_path.insert(0, _TorchWatcher())  # type: ignore[arg-type]
