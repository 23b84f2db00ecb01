#!/usr/bin/env python3
"""tests/gpu/tp2.py: transformers tensor parallelism on 2 GPUs (NCCL), the
same greedy decode with and without the shim (issue 10).

    python3 tests/gpu/tp2.py RESULT.json [--policy P --launcher build/tools/woffload-run]

runs `torchrun --nproc_per_node 2 tests/gpu/tp2.py --rank-worker OUT` twice
(plain, then under woffload-run with one policy for both ranks) and compares:
tokens identical, decode tok/s of each, the shim's stats of rank 0. The model
is a random Qwen3-MoE (smaller than device-facts.md's, so saving and loading
its checkpoint stays quick), saved once to /tmp and loaded with
tp_plan="auto" (transformers needs a checkpoint for tensor parallelism).
Exit 0: identical; 1: different; 77: fewer than 2 GPUs."""
import json
import os
import subprocess
import sys
import time

MODEL_DIR = "/tmp/wo-tp2-qwen3moe"
CFG = dict(vocab_size=32000, hidden_size=2048, intermediate_size=4096, moe_intermediate_size=768,
           num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=4, head_dim=128,
           num_experts=32, num_experts_per_tok=4, max_position_embeddings=4096,
           decoder_sparse_step=1, mlp_only_layers=[])


def rank_worker(out: str) -> None:
    import torch
    import torch.distributed as dist
    import transformers
    from transformers import AutoModelForCausalLM

    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl")
    if rank == 0 and not os.path.exists(os.path.join(MODEL_DIR, "config.json")):
        torch.manual_seed(0)
        m = AutoModelForCausalLM.from_config(transformers.Qwen3MoeConfig(**CFG), dtype=torch.bfloat16)
        with torch.no_grad():  # spread routing (bench.md)
            m.get_input_embeddings().weight.normal_(0.0, 1.0)
            for n, p in m.named_parameters():
                if n.endswith("mlp.gate.weight"):
                    p.normal_(0.0, 1.0)
        m.save_pretrained(MODEL_DIR)
        del m
    dist.barrier()
    m = AutoModelForCausalLM.from_pretrained(MODEL_DIR, dtype=torch.bfloat16, tp_plan="auto")
    m.eval()
    ids = torch.randint(0, CFG["vocab_size"], (1, 32), device="cuda",
                        generator=torch.Generator("cuda").manual_seed(1))
    rates, toks = [], None
    with torch.no_grad():
        for i in range(4):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            o = m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=32,
                           min_new_tokens=32, do_sample=False, pad_token_id=0)
            torch.cuda.synchronize()
            if i:
                rates.append(32 / (time.perf_counter() - t0))
            toks = o[0, 32:].tolist()
    res = dict(rank=rank, tokens=toks, tok_s=sorted(rates)[len(rates) // 2])
    try:
        import woffload
        if woffload.available():
            res["stats"] = woffload.stats()
    except ImportError:
        pass
    if rank == 0:
        with open(out, "w") as f:
            json.dump(res, f)
    dist.destroy_process_group()


def run(out: str, launcher=None, policy=None) -> dict:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           os.path.abspath(__file__), "--rank-worker", out]
    if launcher:
        cmd = [launcher, "--policy", policy, "--"] + cmd
    env = dict(os.environ, NCCL_NVLS_ENABLE="0")  # NVLink multicast stays off (device README)
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        sys.stderr.write(p.stdout[-3000:] + p.stderr[-5000:])
        raise SystemExit(f"tp2: {' '.join(cmd[:3])}... exited {p.returncode}")
    with open(out) as f:
        return json.load(f)


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--rank-worker":
        rank_worker(sys.argv[2])
        return 0
    import torch
    if torch.cuda.device_count() < 2:
        print("tp2: fewer than 2 GPUs: skipped")
        return 77
    result = sys.argv[1]
    args = dict(zip(sys.argv[2::2], sys.argv[3::2]))
    plain = run("/tmp/wo-tp2-plain.json")
    shim = run("/tmp/wo-tp2-shim.json", args["--launcher"], args["--policy"])
    same = plain["tokens"] == shim["tokens"]
    rep = dict(plain_tok_s=plain["tok_s"], shim_tok_s=shim["tok_s"], tokens_identical=same,
               tokens=plain["tokens"], shim_stats=shim.get("stats"))
    with open(result, "w") as f:
        json.dump(rep, f, indent=1)
    print(f"tp2: plain {plain['tok_s']:.2f} tok/s, shim {shim['tok_s']:.2f} tok/s, "
          f"tokens identical: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
