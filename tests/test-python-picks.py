#!/usr/bin/env python3
"""The python hook's picked-staging side (woffload.hook_experts, moe_picks)
under the preloaded shim and the fake driver, with stand-ins for torch's
tensors and modules (CI has no torch): which modules it hooks, which
argument it hands the shim, and what the shim then counts.

    python3 tests/test-python-picks.py LIBWOFFLOAD FAKE_DIR

It re-runs itself under LD_PRELOAD with a policy that puts the experts on
the host, with WOFFLOAD_PICKS unset, with WOFFLOAD_PICKS=0, and with hot
experts on (WOFFLOAD_PICKS_HOT=1, or the policy's hot_experts: auto: a
forward of one token then registers its picks too, their hot rows copied
from the device), with the copy engine from 23% (one token's 2 ids of 8
experts: the shim's share, 23%: registered), from 24% (not), and kept off
(not); then through the automatic hook's own choice
(_auto._hook_experts): the modules off the device under that policy, and
every experts module under `fit:` (fit's device weights may yield to the
host after seal).
"""
import ctypes
import json
import os
import sys
import tempfile

import fakectx

SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
E, ROW = 8, 4096


class T:
    """A tensor stand-in over a fake-device pointer."""

    def __init__(self, ptr, shape, elem=2, floating=True, cuda=True, contiguous=True):
        self.ptr, self.shape, self.elem = ptr, tuple(shape), elem
        self.floating, self.is_cuda, self.contiguous = floating, cuda, contiguous

    def data_ptr(self):
        return self.ptr

    def numel(self):
        n = 1
        for s in self.shape:
            n *= s
        return n

    def element_size(self):
        return self.elem

    def dim(self):
        return len(self.shape)

    def is_contiguous(self):
        return self.contiguous

    def is_floating_point(self):
        return self.floating

    def is_complex(self):
        return False


class Module:
    """What hook_experts uses of torch.nn.Module."""

    def __init__(self, params=None, children=None):
        self._params = params or {}
        self._children = children or {}
        self.pre, self.post = [], []

    def named_modules(self, prefix=""):
        yield prefix, self
        for n, c in self._children.items():
            yield from c.named_modules(f"{prefix}.{n}" if prefix else n)

    def parameters(self, recurse=True):
        return list(self._params.values())

    def named_parameters(self, prefix="", recurse=True):
        for n, p in self._params.items():
            yield (f"{prefix}.{n}" if prefix else n), p

    def register_forward_pre_hook(self, fn, with_kwargs=False):
        assert with_kwargs
        self.pre.append(fn)

    def register_forward_hook(self, fn, with_kwargs=False, always_call=False):
        assert with_kwargs and always_call
        self.post.append(fn)

    def call(self, *args, **kwargs):
        for f in self.pre:
            f(self, args, kwargs)
        for f in self.post:
            f(self, args, kwargs, None)


class Experts(Module):
    def forward(self, hidden_states, top_k_index, top_k_weights):
        pass


class WrappedExperts(Module):
    """transformers' dispatch wrapper without functools.wraps"""

    def forward(self, *args, **kwargs):
        pass


class NotExperts(Module):
    def forward(self, x, position_ids):
        pass


def child():
    sys.path.insert(0, os.path.join(SRC, "python"))
    import woffload

    cu = fakectx.context()

    def alloc(name, size):
        p = ctypes.c_uint64()
        if name:
            assert woffload.tag_push(name) == 0
        assert cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(size)) == 0
        if name:
            assert woffload.tag_pop() == 0
        return p.value

    base = "model.layers.0.mlp.experts."
    gu = T(alloc(base + "gate_up_proj", E * ROW), (E, ROW // 4, 2))
    dn = T(alloc(base + "down_proj", E * ROW), (E, 2, ROW // 4))
    other = T(alloc("model.layers.0.other.stacked", E * ROW), (E, ROW // 4, 2))
    ondev = T(alloc("model.layers.1.mlp.experts.gate_up_proj", E * ROW), (E, ROW // 4, 2))
    wr = T(alloc("model.layers.0.mlp2.experts.gate_up_proj", E * ROW), (E, ROW // 4, 2))
    ids = T(alloc(None, 64), (4, 2), elem=8, floating=False)
    assert woffload.seal() == 0

    experts = Experts({"gate_up_proj": gu, "down_proj": dn})
    wrong = NotExperts({"stacked": other})
    resident = Experts({"gate_up_proj": ondev})
    wrapped = WrappedExperts({"gate_up_proj": wr})
    model = Module(children={"model": Module(children={"layers": Module(children={
        "0": Module(children={"mlp": Module(children={"experts": experts}),
                              "mlp2": Module(children={"experts": wrapped}),
                              "other": wrong}),
        "1": Module(children={"mlp": Module(children={"experts": resident})})})})})
    st = woffload.stats()
    off = [n["name"] for n in st["names"] if n["placement"] in ("host", "managed")]
    if os.environ.get("WO_TEST_AUTO"):
        # the automatic hook's choice after seal (_auto._hook_experts)
        from woffload import _auto
        _auto._hook_experts(model)
        hooked = sum(len(m.pre) for m in (experts, wrong, resident, wrapped))
    else:
        hooked = woffload.hook_experts(model, off)
    experts.call(T(0, (4, 16)), ids, T(0, (4, 2)))            # positional
    experts.call(T(0, (4, 16)), top_k_index=ids, top_k_weights=T(0, (4, 2)))  # keyword
    experts.call(T(0, (4, 16)), T(ids.ptr, (4, 2)), T(0, (4, 2)))  # float picks: none
    experts.call(T(0, (1, 16)), T(ids.ptr, (1, 2), elem=8, floating=False),
                 T(0, (1, 2)))                                 # one token: in place
    wrapped.call(T(0, (4, 16)), ids, T(0, (4, 2)))             # the positional convention
    wrapped.call(T(0, (4, 16)), ids, T(0, (4, 3)))             # shapes that say otherwise
    wrapped.call(T(0, (3, 16)), ids, T(0, (4, 2)))
    st = woffload.stats()
    pk = st["picks"]
    print("RESULT " + json.dumps({
        "off": sorted(off), "hooked": hooked,
        "enabled": pk["enabled"], "hot_experts": pk["hot_experts"],
        "hot_experts_auto": pk["hot_experts_auto"],
        "engine_on": pk["engine"]["on"],
        "hooks": [len(experts.pre), len(wrong.pre), len(resident.pre), len(wrapped.pre)],
        "regs": {k: v["registrations"] for k, v in pk["names"].items()},
        "regs_total": pk.get("registrations"),
        "misuse": woffload.moe_picks(T(0x10, (E, 2, 2)), ids)}), flush=True)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child()
        return 0
    lib, fake = sys.argv[1], sys.argv[2]
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        pol = os.path.join(tmp, "p.yaml")
        with open(pol, "w") as f:
            f.write("version: 1\ndefault: device\nrules:\n"
                    "  - {name: experts, match: [layers.0], place: host}\n")
        pol_auto = os.path.join(tmp, "auto.yaml")
        with open(pol_auto, "w") as f:
            f.write("version: 1\ndefault: device\nprefetch: {hot_experts: auto}\nrules:\n"
                    "  - {name: experts, match: [layers.0], place: host}\n")
        pol_fit = os.path.join(tmp, "fit.yaml")
        with open(pol_fit, "w") as f:
            f.write("version: 1\nfit: {device: 100%, keep_free: 1MiB}\n")
        # engine23: the copy engine from 23%, one row's 2 ids of 8 experts
        # (the shim's share: 1 - (7/8)^2, 23%, so the copy engine would take
        # it): the one token's call still registers nothing (its copy made
        # batch 1 slower than the kernels' reads in place, measured);
        # engine24: neither; engine23off: the copy engine kept off (eager
        # loading asked for, CUDA told LAZY): neither
        for picks in ("1", "0", "hot", "hotauto", "auto", "fit", "engine23", "engine24", "engine23off"):
            env = dict(os.environ, LD_PRELOAD=lib, LD_LIBRARY_PATH=fake,
                       WOFFLOAD_POLICY={"hotauto": pol_auto, "fit": pol_fit}.get(picks, pol),
                       WOFFLOAD_LOG="info", WOFFLOAD_PICKS="0" if picks == "0" else "1",
                       WOFFLOAD_PICKS_HOT="1" if picks == "hot" else "0",
                       ASAN_OPTIONS="detect_leaks=0:verify_asan_link_order=0")
            if picks in ("auto", "fit"):
                env["WO_TEST_AUTO"] = "1"
            if picks.startswith("engine"):
                env["WOFFLOAD_PICKS_ENGINE"] = picks[6:8]
                if picks.endswith("off"):
                    env.update(WOFFLOAD_PICKS_LAZY="0", CUDA_MODULE_LOADING="LAZY")
            p, r = fakectx.child(__file__, env)
            if r is None:
                print(p.stdout + p.stderr)
                print(f"FAIL: WOFFLOAD_PICKS={picks}: the child exited {p.returncode}")
                failures += 1
                continue
            on, hot, auto = picks != "0", picks.startswith("hot"), picks == "hotauto"
            one = hot  # the one token's call registers
            g, d = "model.layers.0.mlp.experts.gate_up_proj", "model.layers.0.mlp.experts.down_proj"
            w = "model.layers.0.mlp2.experts.gate_up_proj"
            if picks == "fit":
                # fit keeps everything on the device here, and the automatic
                # hook still hooks every experts module, the one on the
                # device too: fit's weights may yield to the host after seal
                checks = {
                    "nothing off the device": r["off"] == [],
                    "every experts module hooked": r["hooked"] == 3 and r["hooks"] == [1, 0, 1, 1],
                    # the five calls with picks registered, and no tensor on
                    # the device is a picked one (picks.names) until copied
                    "registrations made, no tensor on the device reported as picked":
                        r["regs_total"] == 5 and r["regs"] == {},
                }
                for what, ok in checks.items():
                    print(f"{'ok' if ok else 'FAIL'}: fit: {what}")
                    if not ok:
                        print(f"    got {r}")
                        failures += 1
                continue
            checks = {
                "the host-placed tensors are the ones off the device":
                    r["off"] == sorted([g, d, w, "model.layers.0.other.stacked"]),
                "picks.enabled follows WOFFLOAD_PICKS": r["enabled"] == on,
                # the experts modules only: the other one's forward names no
                # picks, the third's tensor is on the device; the wrapped
                # one by transformers' positional convention
                "two modules hooked": r["hooked"] == 2 and r["hooks"] == [1, 0, 0, 1],
                # two calls with picks (a clear after each is no
                # registration), one with float "picks" (nothing); the
                # wrapped one's call whose shapes fit the convention, not
                # the two that do not; none when off; and the one token's
                # call with hot experts
                "registrations per tensor":
                    r["regs"] == ({g: 3 if one else 2, d: 3 if one else 2, w: 1} if on else {}),
                "picks.engine.on says whether the copy engine may run":
                    r["engine_on"] == (picks in ("engine23", "engine24")),
                # auto: no bytes until a tensor's first set (8 registrations),
                # the stats say auto, and one token registers already
                "picks.hot_experts says the bytes for hot experts":
                    r["hot_experts"] == (1 << 20 if hot and not auto else 0),
                "picks.hot_experts_auto says auto": r["hot_experts_auto"] == auto,
                "an unknown pointer: -ENOENT (picks on), 0 (off)":
                    r["misuse"] == (-2 if on else 0),
            }
            for what, ok in checks.items():
                print(f"{'ok' if ok else 'FAIL'}: WOFFLOAD_PICKS={picks}: {what}")
                if not ok:
                    print(f"    got {r}")
                    failures += 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
