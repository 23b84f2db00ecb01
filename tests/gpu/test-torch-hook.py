#!/usr/bin/env python3
"""gpu suite: the automatic PyTorch hook under woffload-run, end to end.

    python3 tests/gpu/test-torch-hook.py BUILD/tools/woffload-run

A small Qwen3-MoE (random weights from a config, expert tensors of 8 MiB so
they are placeable) generates 16 greedy tokens three times: without the
shim, under woffload-run with the experts on host, and with them managed.
The tokens must be identical, the hook must have tagged every parameter and
sealed, and the stats must show the experts' bytes in the placement asked
for. Exit 77 (skipped) without torch, transformers or a GPU.
"""
import json
import os
import sys
import tempfile

import gpucheck

POLICIES = {
    "host": "version: 1\nrules:\n  - name: experts\n    match: experts\n    place: host\n",
    "managed": "version: 1\ndevice_budget: 16MiB\nrules:\n  - name: experts\n    match: experts\n"
               "    place: managed\n",
}


def child() -> None:
    import torch
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig
    cfg = Qwen3MoeConfig(vocab_size=1024, hidden_size=512, intermediate_size=1024, moe_intermediate_size=512,
                         num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4, head_dim=64,
                         num_experts=8, num_experts_per_tok=2, max_position_embeddings=512,
                         decoder_sparse_step=1, mlp_only_layers=[])
    torch.manual_seed(0)
    with torch.device("cuda"):
        m = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    m.eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("mlp.gate.weight") or name.endswith("embed_tokens.weight"):
                p.normal_(0.0, 1.0)
    ids = torch.randint(0, 1024, (2, 16), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    with torch.no_grad():
        out = m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, min_new_tokens=16,
                         do_sample=False, pad_token_id=0)
    res = {"tokens": out[:, 16:].tolist(),
           "experts_bytes": sum(p.numel() * p.element_size() for n, p in m.named_parameters() if ".experts." in n),
           "nparams": len(list(m.named_parameters()))}
    if "woffload" in sys.modules or os.environ.get("WOFFLOAD_POLICY"):
        import woffload
        res["stats"] = woffload.stats()
    print("RESULT " + json.dumps(res), flush=True)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child()
        return 0
    torch = gpucheck.torch_on_gpu()
    if torch is None:
        return 77
    launcher = sys.argv[1]
    me = [sys.executable, os.path.abspath(__file__), "--child"]
    ref = gpucheck.result(me)
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        for place, text in POLICIES.items():
            pol = os.path.join(tmp, f"{place}.yaml")
            with open(pol, "w") as f:
                f.write(text)
            got = gpucheck.result([launcher, "--policy", pol, "--log", "info", "--"] + me)
            st = got.get("stats") or {}
            names = st.get("names", [])
            placed = st.get("placements", {}).get(place, {})
            checks = {
                "tokens identical to the run without the shim": got["tokens"] == ref["tokens"],
                "sealed": st.get("state", {}).get("sealed") is True,
                f"every parameter tagged ({len(names)} names, {ref['nparams']} parameters)":
                    len(names) >= ref["nparams"],
                f"experts' bytes placed {place} ({placed.get('bytes')} of {ref['experts_bytes']})":
                    placed.get("bytes") == ref["experts_bytes"],
            }
            for what, ok in checks.items():
                print(f"{'ok' if ok else 'FAIL'}: {place}: {what}")
                if not ok:
                    failures.append(f"{place}: {what}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
