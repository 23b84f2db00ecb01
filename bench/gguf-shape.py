#!/usr/bin/env python3
"""Write a random Qwen3-MoE GGUF of a named shape with the peers kit's gen_gguf.py.

    python3 bench/gguf-shape.py SHAPE OUT.gguf   [PEERS: the peers kit folder; GGUF_PY: llama.cpp's gguf-py]

SHAPE:
  moe32   the kit's own shape: hidden 4096, 16 layers, 32 experts top-4, expert FFN 1536
          (19.75 GiB bf16, 18.0 GiB of experts)
  moe128  a fine-grained shape, Qwen3-30B-A3B's layer (hidden 2048, 32 heads / 4 KV heads,
          128 experts top-8, expert FFN 768) with 16 layers instead of 48
          (18.8 GiB bf16, 18.0 GiB of experts)

The kit's generator reads its shape from module globals when it runs, so this sets them and
calls it: the writer, the init and the routing spread are the kit's, only the sizes change.
"""
import os
import sys

SHAPES = {
    "moe32": {},
    "moe128": dict(D=2048, NH=32, NKV=4, HD=128, E=128, K=8, FF=768),
}


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in SHAPES:
        print(f"usage: {sys.argv[0]} {{{'|'.join(SHAPES)}}} OUT.gguf", file=sys.stderr)
        return 2
    peers = os.environ.get("PEERS", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".peers", "llamacpp"))
    sys.path.insert(0, peers)
    try:
        import gen_gguf
    except ImportError as e:
        print(f"{sys.argv[0]}: cannot import gen_gguf.py from {peers} (PEERS): {e}", file=sys.stderr)
        return 1
    for k, v in SHAPES[sys.argv[1]].items():
        setattr(gen_gguf, k, v)
    sys.argv = [sys.argv[0], sys.argv[2]]
    gen_gguf.main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
