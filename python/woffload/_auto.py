"""The automatic hook: names a PyTorch model's weights with no change to the
engine's code. woffload-run puts python/site on PYTHONPATH; its
sitecustomize.py calls install() in every Python process it starts.

What it does, in order:
1. The weights the engine allocates while it loads must be placeable: the
   policy's window opens at start by default (`window: {open: at-start}`)
   and this hook relies on that. When the library is already initialised
   with the window closed (`open: api`), the hook opens it at interpreter
   start and again at torch import; otherwise call woffload.window_open()
   yourself. Nothing is imported beyond the standard library.
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

4. transformers' loader pre-grows PyTorch's caching allocator with one
   allocation the size of every weight (caching_allocator_warmup): the
   shim then sees one allocation for the whole model and can place it only
   as a whole (measured on the H100: a 7.5 GB checkpoint arrived as one
   cudaMalloc; past the managed cap all of it went to pinned host memory,
   bench/results/bigload-*). While the policy places something and the
   window is open, the hook makes that warm-up a no-op when
   transformers.modeling_utils is imported, so each weight is its own
   allocation. WOFFLOAD_KEEP_WARMUP=1 keeps transformers' behaviour.
   The warm-up is handed the model built on the meta device, before any
   weight is loaded: the hook announces every weight there by name and
   size (woffload.expect_module, woffload_expect), so the shim places each
   allocation by the name it will have, not by the order it arrives in
   (docs/placement.md, "Names before bytes"). Until seal PyTorch's caching
   allocator then splits no cached block over 21 MiB (the loader's
   temporaries, freed into its cache, would hold the next weights wherever
   the shim served them); at seal the cache goes back and the setting too.

5. transformers' continuous batching sizes its paged cache from the device
   memory as PyTorch counts it (PagedAttentionMemoryHandler.get_available_
   memory). Under the shim PyTorch's reserved bytes include every weight the
   shim serves from host memory, and transformers 5.17 subtracts them from
   a figure that already leaves them out: beside a process that holds most
   of the device it raised "MemoryError: ... available memory -13695300403"
   with 4.70 GiB free (the H200, bench/results/bigload-20261202-0944-*).
   While the policy places something, the hook makes that figure the
   driver's free memory (after PyTorch's cache goes back) times the
   engine's max_memory_percent (0.9 when none is given), when
   transformers.generation.continuous_batching.cache is imported.

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
# PyTorch's allocator setting to put back once the weights are loaded
# (_limit_splits), None when the hook changed nothing
_splits_back: Optional[str] = None
# While the weights load, no cached block larger than this is split for a
# smaller tensor (PyTorch's least: above its 20 MiB large-buffer size)
LOAD_SPLIT_MB = 21


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
    if _done or woffload._compiling() or not _owns_cuda_parameters(module):
        return
    with _state_lock:
        if _done:
            return
        _done = True
        if _handle is not None:
            _handle.remove()
            _handle = None
    try:
        try:
            st = woffload.stats() or {}
        except (OSError, ValueError):
            st = {}
        if st.get("state", {}).get("sealed"):
            # The engine sealed itself (it tagged and placed its weights
            # through the API, then quantized or replaced them): its names
            # stand, and tagging the new tensors would only report them as
            # unplaceable.
            _log(f"{type(module).__name__}: sealed by the engine already; the hook does nothing",
                 "info")
            return
        _end_load(sys.modules.get("torch"))
        rep = woffload.tag_module(module)
        r = woffload.seal()
    except Exception as e:  # never break the engine
        _log(f"tagging {type(module).__name__} failed: {type(e).__name__}: {e}", "error")
        return
    _log(f"{type(module).__name__}: {rep}; seal: {'ok' if r == 0 else os.strerror(-r)}",
         "info" if r == 0 and not rep.errors else "warn")
    if r == 0:
        _hook_experts(module)
    if rep.errors:
        for name, err in list(rep.errors.items())[:5]:
            _log(f"  tag {name}: {os.strerror(-err)}", "warn")


def _hook_experts(module: Any) -> None:
    """Stacked expert tensors the policy put off the device are read as the
    router picked them (woffload.hook_experts: only the picked rows cross
    PCIe). Under fit every expert module is hooked: fit's device weights may
    yield to the host after seal (the engine's own memory past fit's
    reserve), and an expert tensor that did is then copied as picked, not
    read whole over PCIe (the shim leaves a registration on the device be).
    WOFFLOAD_PICKS=0 leaves them to the streaming executor."""
    try:
        st = woffload.stats() or {}
        if not st.get("picks", {}).get("enabled", False):
            return
        fit = st.get("fit") is not None
        off = [n["name"] for n in st.get("names", [])
               if n.get("placement") in ("host", "managed")]
        n = woffload.hook_experts(module, None if fit else off) if (off or fit) else 0
    except Exception as e:  # never break the engine
        _log(f"expert picks hooks failed: {type(e).__name__}: {e}", "error")
        return
    if n:
        _log(f"{n} expert modules hand their router's picks to the shim", "info")


def _on_torch_imported(torch: Any) -> None:
    global _handle
    if _done or _handle is not None:
        return
    _ensure_window()
    # While dynamo traces a forward the hook does nothing (woffload._compiling):
    # it must run eagerly (torch.compile(model) still calls the wrapper
    # module's hooks eagerly).
    _handle = torch.nn.modules.module.register_module_forward_pre_hook(_pre_hook)


def _limit_splits(torch: Any) -> None:
    """While the weights load, PyTorch's caching allocator splits no cached
    block larger than LOAD_SPLIT_MB for a smaller tensor.

    The shim serves each allocation by the name announced for its size, and
    one served as pinned host memory stays there. The loader's temporaries
    (transformers builds each stacked expert tensor from its experts, an
    allocation the size of a whole expert tensor) claim such a name, go
    back to PyTorch's cache when freed, and the cache then cut the next
    weights out of them: on the H200's 128-expert shape, 29 attention
    weights of a model whose policy keeps them on the device read over PCIe
    from inside expert-sized pinned blocks (expect.missed_tags;
    bench/results/bigload-20261202-0120-moe128-h200). Unsplit, a cached
    block serves only a tensor of about its own size. _end_load gives the
    cache back and puts the setting back before seal.
    """
    global _splits_back
    mem = getattr(getattr(torch, "cuda", None), "memory", None)
    setter = getattr(mem, "_set_allocator_settings", None)
    if setter is None:
        _log("PyTorch has no allocator settings to change: the loader's cached blocks may "
             "hold weights of other sizes", "debug")
        return
    conf = ",".join(os.environ.get(k, "") for k in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"))
    mine = None
    for item in conf.split(","):
        key, _, val = item.partition(":")
        if key.strip() == "max_split_size_mb" and val.strip().isdigit():
            mine = int(val.strip())
    if mine is not None and mine <= LOAD_SPLIT_MB:
        return  # the user's own is tighter
    try:
        setter(f"max_split_size_mb:{LOAD_SPLIT_MB}")
    except Exception as e:  # never break the engine
        _log(f"could not limit the allocator's splits while loading: {type(e).__name__}: {e}",
             "warn")
        return
    # unset, PyTorch splits any block: a size no block reaches
    _splits_back = f"max_split_size_mb:{mine if mine is not None else 1 << 40}"
    _log(f"while the weights load, PyTorch's allocator splits no cached block over "
         f"{LOAD_SPLIT_MB} MiB", "debug")


def _end_load(torch: Any) -> None:
    """Before seal: the loader's cached blocks go back to the driver (their
    names' claims with them) and the allocator's setting is put back."""
    global _splits_back
    back, _splits_back = _splits_back, None
    if back is None or torch is None:
        return
    try:
        torch.cuda.empty_cache()
        torch.cuda.memory._set_allocator_settings(back)
    except Exception as e:  # never break the engine
        _log(f"could not put the allocator's setting back: {type(e).__name__}: {e}", "warn")


def _on_modeling_utils_imported(mu: Any) -> None:
    """Turns transformers' caching-allocator warm-up into a no-op (item 4 of
    this module's doc) while the shim places and the window is open."""
    if os.environ.get("WOFFLOAD_KEEP_WARMUP", "0").strip().lower() in ("1", "yes", "true", "on"):
        return
    try:
        st = woffload.stats() or {}
    except (OSError, ValueError):
        return
    if not st.get("policy", {}).get("placing") or st.get("state", {}).get("sealed"):
        return
    orig = getattr(mu, "caching_allocator_warmup", None)
    if orig is None or getattr(orig, "_woffload", False):
        return

    def no_warmup(*args: Any, **kwargs: Any) -> None:
        # The model is built on the meta device by now, and nothing is
        # loaded: every weight's name and size is known before its first
        # byte (woffload_expect: the shim places them by name, not by the
        # order the bytes arrive in).
        model = args[0] if args else kwargs.get("model_to_load", kwargs.get("model"))
        dmap = args[1] if len(args) > 1 else kwargs.get("expanded_device_map")
        keep = None
        if isinstance(dmap, dict) and dmap:
            # only what the loader puts on a GPU (accelerate's device_map may
            # leave some on the CPU or the disk)
            def keep(name: str) -> bool:
                return str(dmap.get(name, "cuda")) not in ("cpu", "disk", "meta")
        if model is not None and hasattr(model, "named_parameters"):
            try:
                n, nbytes = woffload.expect_module(model, keep=keep)
            except Exception as e:  # never break the engine
                _log(f"announcing the weights failed: {type(e).__name__}: {e}", "warn")
            else:
                if n:
                    _log(f"{n} weights announced before loading ({nbytes / 2**30:.2f} GiB)",
                         "info")
                    _limit_splits(sys.modules.get("torch"))
        return None

    no_warmup._woffload = True  # type: ignore[attr-defined]
    mu.caching_allocator_warmup = no_warmup
    _log("transformers' caching_allocator_warmup is off: each weight is its own allocation",
         "info")


_CB_CACHE = "transformers.generation.continuous_batching.cache"


def _on_cb_cache_imported(mod: Any) -> None:
    """Continuous batching's memory figure from the driver (item 5 of this
    module's doc), while the policy places something."""
    try:
        st = woffload.stats() or {}
    except (OSError, ValueError):
        return
    if not st.get("policy", {}).get("placing"):
        return
    cls = getattr(mod, "PagedAttentionMemoryHandler", None)
    orig = vars(cls).get("get_available_memory") if isinstance(cls, type) else None
    if orig is None or getattr(getattr(orig, "__func__", orig), "_woffload", False):
        return

    def available(*args: Any, **kwargs: Any) -> int:
        torch = sys.modules.get("torch")
        pct = kwargs.get("max_memory_percent")
        for x in args:
            if pct is None and isinstance(x, (int, float)) and not isinstance(x, bool):
                pct = x
            elif pct is None and hasattr(x, "cb_config"):
                pct = getattr(x.cb_config, "max_memory_percent", None)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        return int(torch.cuda.mem_get_info()[0] * (0.9 if pct is None else pct))

    available._woffload = True  # type: ignore[attr-defined]
    setattr(cls, "get_available_memory",
            staticmethod(available) if isinstance(orig, staticmethod) else available)
    _log("transformers' continuous batching reads the free memory from the driver "
         "(PyTorch's reserved bytes include the weights served from host memory)", "info")


class _Watcher:
    """A meta path finder that finds nothing itself: when module `name` is
    about to be imported it lets the other finders find it and wraps the
    loader so `then(module)` runs right after the module's own code."""

    def __init__(self, name: str, then: Any) -> None:
        self.name, self.then = name, then

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        import importlib.util
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
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
                self.then(module)
            except Exception as e:
                _log(f"after importing {self.name}: {type(e).__name__}: {e}", "error")

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _ensure_window() -> None:
    """Opens the window when the library is initialised, places something,
    and left the window closed (policy `window: {open: api}`). Before the
    library's lazy init (the usual case at interpreter start) the policy's
    own setting decides: at-start, the default, opens it at init. Asking
    earlier would need a call with side effects (a warning when the window
    is open already), so the hook does not."""
    try:
        st = woffload.stats() or {}
    except (OSError, ValueError):
        return
    state, policy = st.get("state", {}), st.get("policy", {})
    if not state.get("initialised") or not policy.get("placing"):
        return
    if not state.get("window_open") and not state.get("sealed"):
        r = woffload.window_open()
        if r not in (0, -errno.EALREADY):
            _log(f"could not open the placeable window: {os.strerror(-r)}", "warn")


def install() -> None:
    """Called by sitecustomize.py. Cheap: no torch import here."""
    if not woffload.available():
        _log("libwoffload.so is not preloaded; the automatic hook does nothing", "warn")
        return
    _ensure_window()
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "nn"):
        _on_torch_imported(torch)
    else:
        sys.meta_path.insert(0, _Watcher("torch", _on_torch_imported))  # type: ignore[arg-type]
    cb = sys.modules.get(_CB_CACHE)
    if cb is not None:
        _on_cb_cache_imported(cb)
    else:
        sys.meta_path.insert(0, _Watcher(_CB_CACHE, _on_cb_cache_imported))  # type: ignore[arg-type]
    mu = sys.modules.get("transformers.modeling_utils")
    if mu is not None:
        _on_modeling_utils_imported(mu)
    else:
        sys.meta_path.insert(0, _Watcher("transformers.modeling_utils",  # type: ignore[arg-type]
                                         _on_modeling_utils_imported))
