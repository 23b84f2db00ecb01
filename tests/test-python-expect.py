#!/usr/bin/env python3
"""The Python hook's names before bytes (woffload.expect_module, and the
transformers allocator warm-up it replaces) under the preloaded shim and the
fake driver, with stand-ins for torch's tensors and modules (CI has no
torch).

    python3 tests/test-python-expect.py LIBWOFFLOAD FAKE_DIR

A child process stands in for transformers' from_pretrained: a model whose
tensors have no bytes yet (the meta device) is handed to the allocator
warm-up, which the hook replaced; then the weights are allocated without
names, experts first, tagged and sealed under the hand policy `experts:
host`. The hook must announce every weight the device map puts on a GPU,
once per tensor (a tied one once), and the shim must serve each expert as
pinned host memory as it arrives and keep attention movable. A second run
with WOFFLOAD_KEEP_WARMUP=1 announces nothing. In both, transformers'
continuous batching reads the free memory from the driver (a stand-in
PagedAttentionMemoryHandler whose figure was negative). While the weights load the
hook keeps PyTorch's caching allocator from splitting cached blocks over 21
MiB, and before seal gives the cache back and puts the setting back (a
stand-in torch records the calls).
"""
import ctypes
import json
import os
import sys
import tempfile
import types

import fakectx

SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MiB = 1 << 20
LAYERS = 4


class T:
    """A tensor stand-in with no bytes (the meta device)."""

    is_meta, is_cuda = True, False

    def __init__(self, shape, elem=2):
        self.shape, self.elem = tuple(shape), elem

    def numel(self):
        n = 1
        for s in self.shape:
            n *= s
        return n

    def element_size(self):
        return self.elem


class Model:
    """What expect_module uses of torch.nn.Module."""

    def __init__(self, params):
        self._params = params

    def named_parameters(self, prefix="", remove_duplicate=True):
        for n, p in self._params:
            yield (f"{prefix}.{n}" if prefix else n), p

    def named_buffers(self, prefix="", remove_duplicate=True):
        return iter(())


def names():
    """(name, bytes, expert) in the model's order: each layer's attention
    (2 MiB) then its experts (8 MiB)."""
    out = []
    for i in range(LAYERS):
        out.append((f"model.layers.{i}.self_attn.q_proj.weight", 2 * MiB, False))
        out.append((f"model.layers.{i}.mlp.experts.gate_up_proj", 8 * MiB, True))
    return out


def child():
    sys.path.insert(0, os.path.join(SRC, "python"))
    import woffload
    from woffload import _auto

    cu = fakectx.context()
    # torch's first CUDA allocation (the shim is set up by then)
    scratch = ctypes.c_uint64()
    assert cu.cuMemAlloc_v2(ctypes.byref(scratch), ctypes.c_size_t(4096)) == 0

    params = [(n, T((b // 2,))) for n, b, _ in names()]
    tied = params[0][1]
    params.append(("model.layers.0.self_attn.q_alias", tied))  # tied: announced once
    params.append(("lm_head.weight", T((4 * MiB // 2,))))      # the device map's CPU
    model = Model(params)
    dmap = {n: "cuda:0" for n, _ in params}
    dmap["lm_head.weight"] = "cpu"

    # what the hook uses of torch: the caching allocator's settings
    calls = []
    torch = types.ModuleType("torch")
    torch.cuda = types.SimpleNamespace(
        memory=types.SimpleNamespace(_set_allocator_settings=calls.append),
        empty_cache=lambda: calls.append("empty_cache"),
        synchronize=lambda: None,
        mem_get_info=lambda: (4 << 30, 8 << 30))
    sys.modules["torch"] = torch

    mu = types.ModuleType("transformers.modeling_utils")
    warmed = []
    mu.caching_allocator_warmup = lambda *a, **k: warmed.append(1)
    _auto._on_modeling_utils_imported(mu)
    mu.caching_allocator_warmup(model, dmap, None)

    # the loader: experts first, then attention, no names
    ptr = {}
    order = [x for x in names() if x[2]] + [x for x in names() if not x[2]]
    for n, b, _ in order:
        p = ctypes.c_uint64()
        assert cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(b)) == 0
        ptr[n] = (p.value, b)
    during = list(calls)
    _auto._end_load(torch)  # what the first forward's hook does before seal
    for n, (p, b) in ptr.items():
        assert woffload.tag(p, b, n) == 0
    assert woffload.seal() == 0
    st = woffload.stats()
    after = calls[len(during):]

    # continuous batching's memory figure (item 5 of _auto's doc): a handler
    # as transformers 5.17's, whose figure was negative beside a blocker
    class PagedAttentionMemoryHandler:
        @staticmethod
        def get_available_memory(max_memory_percent=0.9):
            return -13695300403

    cbm = types.ModuleType(_auto._CB_CACHE)
    cbm.PagedAttentionMemoryHandler = PagedAttentionMemoryHandler
    _auto._on_cb_cache_imported(cbm)
    _auto._on_cb_cache_imported(cbm)  # once is enough: a second call changes nothing
    cb = [PagedAttentionMemoryHandler.get_available_memory(max_memory_percent=0.5),
          PagedAttentionMemoryHandler.get_available_memory()]
    print("RESULT " + json.dumps({
        "cb_available": cb,
        "warmed": len(warmed),
        "allocator_during": during,
        "allocator_after": after,
        "expect": st["expect"],
        "placements": {n["name"]: n["placement"] for n in st["names"]},
        "cap_pinned": st["managed_cap"]["pinned"]}), flush=True)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child()
        return 0
    lib, fake = sys.argv[1], sys.argv[2]
    failures = 0

    def check(ok, what):
        nonlocal failures
        if not ok:
            print(f"FAIL: {what}")
            failures += 1

    with tempfile.TemporaryDirectory() as tmp:
        pol = os.path.join(tmp, "p.yaml")
        with open(pol, "w") as f:
            f.write("version: 1\ndefault: device\nrules:\n"
                    "  - {name: experts, match: [experts], place: host}\n")
        for keep in ("0", "1"):
            env = dict(os.environ, LD_PRELOAD=lib, LD_LIBRARY_PATH=fake, WOFFLOAD_POLICY=pol,
                       WOFFLOAD_LOG="info", WOFFLOAD_KEEP_WARMUP=keep,
                       ASAN_OPTIONS="detect_leaks=0:verify_asan_link_order=0")
            p, r = fakectx.child(__file__, env)
            if r is None:
                print(p.stdout + p.stderr)
                check(False, f"WOFFLOAD_KEEP_WARMUP={keep}: the child exited {p.returncode}")
                continue
            x = r["expect"]
            experts = [n for n, _, e in names() if e]
            attn = [n for n, _, e in names() if not e]
            every = all(r["placements"].get(n) == "host" for n in experts) and \
                all(r["placements"].get(n) == "device" for n in attn)
            check(every, f"KEEP_WARMUP={keep}: experts host, attention device: {r['placements']}")
            # the driver's free memory (4 GiB here) times the percent asked
            check(r["cb_available"] == [2 << 30, int((4 << 30) * 0.9)],
                  f"continuous batching's available memory from the driver: {r['cb_available']}")
            if keep == "0":
                check(r["warmed"] == 0, "the warm-up ran though the hook replaced it")
                check(x["names"] == 2 * LAYERS and x["bytes"] == LAYERS * 10 * MiB,
                      f"announced: {x['names']} names, {x['bytes']} bytes "
                      f"(every weight on a GPU once: {2 * LAYERS}, {LAYERS * 10 * MiB})")
                check(x["served_host"] == LAYERS and x["served_host_bytes"] == LAYERS * 8 * MiB,
                      f"experts served as pinned host memory as they came: {x}")
                check(x["matched"] == 2 * LAYERS and x["missed_tags"] == 0, f"matches: {x}")
                pp = x["prepin"]
                # expect_module ends the announcements: a worker pins ahead,
                # and each expert takes a buffer or pins its own, none left over
                check(pp["taken"] + pp["missed"] == LAYERS and pp["wasted"] == 0
                      and pp["made"] == pp["taken"], f"pinned ahead: {pp}")
                check("weights announced before loading" in p.stderr,
                      "the hook's info line on the announced weights")
                # no cached block over 21 MiB split while loading; at seal
                # the cache goes back, then the setting (unset: unlimited)
                check(r["allocator_during"] == ["max_split_size_mb:21"],
                      f"the allocator's splits limited while loading: {r['allocator_during']}")
                check(r["allocator_after"] == ["empty_cache", f"max_split_size_mb:{1 << 40}"],
                      f"the cache given back and the setting put back: {r['allocator_after']}")
            else:
                check(r["warmed"] == 1, "WOFFLOAD_KEEP_WARMUP=1 keeps transformers' warm-up")
                check(x["names"] == 0 and x["served_host"] == 0,
                      f"WOFFLOAD_KEEP_WARMUP=1 announces nothing: {x}")
                check(r["allocator_during"] == [] and r["allocator_after"] == [],
                      f"WOFFLOAD_KEEP_WARMUP=1 leaves the allocator alone: {r}")
            if failures:
                print(p.stderr[-3000:])
    print("ok" if not failures else f"{failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
