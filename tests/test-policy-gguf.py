#!/usr/bin/env python3
"""tests/test-policy-gguf.py WOFFLOAD_POLICY SRCROOT: `woffload-policy gguf`
on GGUF files written here (the header as ggml's gguf writer lays it out; the
data section sparse, so the 6.3 GiB model takes no disk).

Checks, each against figures computed here from the shape:
- a Qwen3-MoE-like file (128 experts top-8, quantized and bf16 tensors,
  metadata with a string array as a tokenizer's): the bytes of each
  placement under examples/llamacpp-ot-exps-cpu.yaml and
  examples/llamacpp-n-cpu-moe.yaml, the staging a run would add (slots of
  the largest off-device tensor), the bytes a decode step reads off the
  device at batch 1, 8 and 32, and the names --list prints;
- no policy: everything on the device, nothing read off it;
- fit: (examples/llamacpp-fit.yaml with --gpu): what fit puts on the device
  stays within its budget, routed experts go last, and without --gpu it asks
  for it;
- bad files: each gets exit 2 and a message naming the file, the byte and
  what was expected: not GGUF, version 1, a key length past any sane size,
  more tensors than the bytes left can describe, a tensor of an unknown
  type, a file cut short of its data, a row not a whole number of blocks;
  bad options the same.
"""
import os
import re
import struct
import subprocess
import sys
import tempfile

TOOL, SRC = sys.argv[1], sys.argv[2]
fails = []

# ggml types used here: id, elements a block, bytes a block
F32, BF16, Q4_K, Q8_0 = (0, 1, 4), (30, 1, 2), (12, 256, 144), (8, 32, 34)


def s(b):
    b = b.encode() if isinstance(b, str) else b
    return struct.pack("<Q", len(b)) + b


def kv_str(k, v):
    return s(k) + struct.pack("<I", 8) + s(v)


def kv_u32(k, v):
    return s(k) + struct.pack("<II", 4, v)


def kv_str_array(k, vals):
    return s(k) + struct.pack("<IIQ", 9, 8, len(vals)) + b"".join(s(v) for v in vals)


def nbytes(ne, t):
    n = 1
    for d in ne:
        n *= d
    return n // t[1] * t[2]


def write(path, tensors, kvs, version=3, magic=b"GGUF", cut=0, align=32):
    """tensors: (name, ne, type); data laid out in order, each aligned."""
    head = magic + struct.pack("<IQQ", version, len(tensors), len(kvs)) + b"".join(kvs)
    off = 0
    infos = b""
    for name, ne, t in tensors:
        infos += s(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
        infos += struct.pack("<IQ", t[0], off)
        off += (nbytes(ne, t) + align - 1) // align * align
    head += infos
    start = (len(head) + align - 1) // align * align
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(start + off - cut)


def run(*args):
    p = subprocess.run([TOOL, "gguf"] + list(args), capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def check(cond, what):
    if not cond:
        fails.append(what)


def size_of(out, label):
    """bytes of a placement line: '  host   144 tensors   18.00 GiB'"""
    m = re.search(r"^  %s\s+(\d+) tensors\s+([\d.]+) (B|KiB|MiB|GiB|TiB)$" % label, out, re.M)
    if not m:
        return None, None
    mult = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}[m.group(3)]
    return int(m.group(1)), float(m.group(2)) * mult


def close(a, b, rel=0.006):
    return a is not None and abs(a - b) <= rel * max(abs(b), 1)


# A Qwen3-30B-A3B-like layer (hidden 2048, 128 experts top-8, expert FFN 768),
# 16 layers; experts q4_K, attention q8_0, norms f32, embeddings bf16.
D, E, K, FF, L, V = 2048, 128, 8, 768, 16, 151936
tensors = [("token_embd.weight", [D, V], BF16)]
for i in range(L):
    b = "blk.%d." % i
    tensors += [
        (b + "attn_norm.weight", [D], F32),
        (b + "attn_q.weight", [D, 4096], Q8_0),
        (b + "attn_k.weight", [D, 512], Q8_0),
        (b + "attn_v.weight", [D, 512], Q8_0),
        (b + "attn_output.weight", [4096, D], Q8_0),
        (b + "ffn_norm.weight", [D], F32),
        (b + "ffn_gate_inp.weight", [D, E], F32),
        (b + "ffn_gate_exps.weight", [D, FF, E], Q4_K),
        (b + "ffn_up_exps.weight", [D, FF, E], Q4_K),
        (b + "ffn_down_exps.weight", [FF, D, E], Q4_K),
    ]
tensors += [("output_norm.weight", [D], F32), ("output.weight", [D, V], Q8_0)]
kvs = [kv_str("general.architecture", "qwen3moe"), kv_u32("qwen3moe.block_count", L),
       kv_u32("qwen3moe.expert_count", E), kv_u32("qwen3moe.expert_used_count", K),
       kv_str_array("tokenizer.ggml.tokens", ["t%d" % i for i in range(1000)])]

exps = [t for t in tensors if "_exps" in t[0]]
exp_bytes = sum(nbytes(ne, t) for _, ne, t in exps)
emb_bytes = nbytes([D, V], BF16)
# llama.cpp keeps token_embd (its input layer) in a CPU buffer: not in the GPU's
gpu = [t for t in tensors if t[0] != "token_embd.weight"]
all_bytes = sum(nbytes(ne, t) for _, ne, t in gpu)

with tempfile.TemporaryDirectory() as tmp:
    model = os.path.join(tmp, "moe.gguf")
    write(model, tensors, kvs)
    ot = os.path.join(SRC, "examples", "llamacpp-ot-exps-cpu.yaml")

    rc, out, err = run(model, ot, "--batch", "1,8,32", "--list")
    check(rc == 0, "ot: exit %d: %s" % (rc, err))
    check("qwen3moe, 16 layers, 128 experts top-8" in out, "ot: header:\n" + out[:400])
    n, b = size_of(out, "host")
    check(n == len(exps) and close(b, exp_bytes), "ot: host %s %s, expected %d %d" % (n, b, len(exps), exp_bytes))
    n, b = size_of(out, "device")
    check(n == len(gpu) - len(exps) and close(b, all_bytes - exp_bytes), "ot: device %s %s" % (n, b))
    check("in llama.cpp's CPU buffer whatever the policy (its input layer): 1 tensors, %.2f MiB" % (emb_bytes / 2**20) in out,
          "ot: the input layer's line:\n" + out[:600])
    for bsz in (1, 8, 32):
        want = exp_bytes * (1 - (1 - K / E) ** bsz)
        m = re.search(r"^  batch %-5d\s+([\d.]+) (MiB|GiB)\s+([\d.]+) ms" % bsz, out, re.M)
        got = float(m.group(1)) * (1 << (20 if m.group(2) == "MiB" else 30)) if m else None
        check(close(got, want), "ot: batch %d reads %s, expected %.0f" % (bsz, got, want))
        ms = float(m.group(3)) if m else None
        check(ms is not None and abs(ms - want / 55e9 * 1e3) < 0.15, "ot: batch %d %s ms, expected %.1f" % (bsz, ms, want / 55e9 * 1e3))
    largest = max(nbytes(ne, t) for _, ne, t in exps)
    check("up to 4 slots of the largest tensor off the device, %.2f MiB (%.2f MiB in all" % (largest / 2**20, 4 * largest / 2**20) in out,
          "ot: the staging line:\n" + out)
    check(re.search(r"blk\.3\.ffn_down_exps\.weight\s+q4_K\s+%d host\s+rule 1 'exps'" % nbytes([FF, D, E], Q4_K), out),
          "ot: --list line of blk.3.ffn_down_exps")
    check("token_embd.weight" not in out.split("placement:")[1], "ot: token_embd listed as in the GPU's buffer")

    # --n-cpu-moe 8 as a policy: the experts of layers 0-7
    rc, out, err = run(model, os.path.join(SRC, "examples", "llamacpp-n-cpu-moe.yaml"))
    n, b = size_of(out, "host")
    check(rc == 0 and n == len(exps) // 2 and close(b, exp_bytes / 2), "n-cpu-moe: host %s %s: %s" % (n, b, err))

    # no policy: all on the device, nothing read off it
    rc, out, err = run(model, "--batch", "8")
    n, b = size_of(out, "device")
    check(rc == 0 and n == len(gpu) and close(b, all_bytes), "none: device %s %s: %s" % (n, b, err))
    check(re.search(r"^  batch 8\s+0 B\s+0\.0 ms$", out, re.M), "none: nothing read off the device:\n" + out)

    # fit: within its budget, experts last
    fitp = os.path.join(SRC, "examples", "llamacpp-fit.yaml")
    rc, out, err = run(model, fitp)
    check(rc == 2 and "--gpu" in err, "fit without --gpu: exit %d, %s" % (rc, err))
    rc, out, err = run(model, fitp, "--gpu", "8GiB", "--engine", "1GiB", "--list")
    check(rc == 0, "fit: exit %d: %s" % (rc, err))
    m = re.search(r"^fit: ([\d.]+) (MiB|GiB) of weights on the device: the budget ([\d.]+) (MiB|GiB)", out, re.M)
    check(m is not None, "fit: no fit line:\n" + out[:600])
    if m:
        dev = float(m.group(1)) * (1 << (20 if m.group(2) == "MiB" else 30))
        budget = float(m.group(3)) * (1 << (20 if m.group(4) == "MiB" else 30))
        check(0 < dev <= budget * 1.001, "fit: %.0f on the device, budget %.0f" % (dev, budget))
        n, b = size_of(out, "device")
        check(close(b, dev), "fit: placement device %s, fit line %s" % (b, dev))
    # the shim's own split: the staging slots' room inside the budget
    # (slots of the largest tensor off the device), lent to managed weights
    # while the slots are empty; WOFFLOAD_FIT_LEND=0 keeps it empty
    def gib(num, unit):
        return float(num) * {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[unit]

    m = re.search(r"less the reserve ([\d.]+) (B|KiB|MiB|GiB), ([\d.]+) (B|KiB|MiB|GiB) for (\d+) staging slots of "
                  r"([\d.]+) (B|KiB|MiB|GiB) and ([\d.]+) (B|KiB|MiB|GiB) for the picked copies' buffers", out)
    check(m is not None, "fit: no staging room in the fit line:\n" + out[:900])
    rows = re.findall(r"^  (\S+)\s+\S+\s+(\d+) (device|host|managed)\s", out, re.M)
    if m and dev and budget:
        reserve, room, nslots, slot = gib(m.group(1), m.group(2)), gib(m.group(3), m.group(4)), int(m.group(5)), gib(m.group(6), m.group(7))
        off = max(int(b) for _, b, p in rows if p != "device")
        check(nslots >= 2 and close(room, nslots * slot) and close(slot, off),
              "fit: %d slots of %.0f (%.0f in all), the largest off the device %d" % (nslots, slot, room, off))
        check(dev + reserve + room <= budget * 1.001, "fit: %.0f + %.0f + %.0f over the budget %.0f" % (dev, reserve, room, budget))
        nm, bm = size_of(out, "managed")
        check(nm and 0 < bm <= room * 1.001 and "lent to managed weights" in out, "fit: managed %s %s, room %.0f" % (nm, bm, room))
        nh, bh = size_of(out, "host")
        p2 = subprocess.run([TOOL, "gguf", model, fitp, "--gpu", "8GiB", "--engine", "1GiB"], capture_output=True,
                            text=True, env=dict(os.environ, WOFFLOAD_FIT_LEND="0"))
        nh2, bh2 = size_of(p2.stdout, "host")
        check(p2.returncode == 0 and size_of(p2.stdout, "managed")[0] == 0 and nh2 == nh + nm and close(bh2, bh + bm),
              "fit, WOFFLOAD_FIT_LEND=0: host %s %s, lent %s %s + host %s %s" % (nh2, bh2, nm, bm, nh, bh))
    # every non-expert tensor but the embedding went before any expert
    rows = re.findall(r"^  (\S+)\s+\S+\s+\d+ (device|host|managed)\s", out, re.M)
    ondev_exp = [n for n, p in rows if "_exps" in n and p == "device"]
    offdev_other = [n for n, p in rows if "_exps" not in n and p != "device"]
    check(not (ondev_exp and offdev_other), "fit: experts on the device while %s is not" % offdev_other[:1])
    # whole layers off the device (WOFFLOAD_FIT_LAYERS, the default): a
    # layer's expert tensors go together, but for the one the budget's
    # edge cuts; tensor by tensor, layers keep some of theirs
    def partial_layers(text):
        off = {}
        for n, p in re.findall(r"^  (blk\.\d+\.ffn_\w+_exps\.weight)\s+\S+\s+\d+ (device|host|managed)\s", text, re.M):
            k = off.setdefault(int(n.split(".")[1]), [0, 0])
            k[0] += 1
            k[1] += p != "device"
        return [l for l, (n, o) in off.items() if 0 < o < n]
    check(len(partial_layers(out)) <= 1, "fit: layers split by the spread: %s" % partial_layers(out))
    p3 = subprocess.run([TOOL, "gguf", model, fitp, "--gpu", "8GiB", "--engine", "1GiB", "--list"], capture_output=True,
                        text=True, env=dict(os.environ, WOFFLOAD_FIT_LAYERS="0"))
    check(p3.returncode == 0 and len(partial_layers(p3.stdout)) > 1,
          "fit, WOFFLOAD_FIT_LAYERS=0: layers split %s" % partial_layers(p3.stdout))

    # tied embeddings (no output.weight): llama.cpp's output layer on the GPU
    # holds a copy of token_embd.weight under that name, read whole each step;
    # fit keeps it with the heads, before any routed expert
    tied = os.path.join(tmp, "tied.gguf")
    write(tied, [x for x in tensors if x[0] != "output.weight"], kvs)
    rc, out, err = run(tied, fitp, "--gpu", "8GiB", "--engine", "1GiB", "--list", "--batch", "1")
    check(rc == 0 and "tied embeddings (no output.weight)" in out, "tied: %d %s" % (rc, err))
    m = re.search(r"^  token_embd\.weight\s+bf16\s+%d (\w+)" % emb_bytes, out, re.M)
    check(m is not None and m.group(1) == "device", "tied: the head's copy on the device under fit:\n" + out[-900:])
    rc, out, err = run(tied, os.path.join(SRC, "examples", "llamacpp-ot-exps-cpu.yaml"), "--batch", "1")
    n, b = size_of(out, "device")
    check(rc == 0 and n == len(gpu) - len(exps) and close(b, all_bytes - nbytes([D, V], Q8_0) + emb_bytes - exp_bytes),
          "tied: device %s %s" % (n, b))

    # --compare: the policy beside -ot exps=CPU and the fewest --n-cpu-moe layers that fit
    rc, out, err = run(model, fitp, "--gpu", "8GiB", "--engine", "1GiB", "--compare", "--batch", "8")
    check(rc == 0 and re.search(r"^  -ot exps=CPU\s", out, re.M) and re.search(r"^  --n-cpu-moe \d+\s", out, re.M),
          "compare: rows:\n" + out[-600:])
    m = re.search(r"within ([\d.]+) GiB of device memory for weights", out)
    room = float(m.group(1)) * 2**30 if m else 0
    m = re.search(r"^  --n-cpu-moe (\d+)\s+([\d.]+) (MiB|GiB)", out, re.M)
    if m:
        ncm = int(m.group(1))
        dev = all_bytes - sum(nbytes(ne, t) for nm, ne, t in exps if int(nm.split(".")[1]) < ncm)
        fewer = dev + sum(nbytes(ne, t) for nm, ne, t in exps if int(nm.split(".")[1]) == ncm - 1)
        check(dev <= room * 1.001 < fewer, "compare: --n-cpu-moe %d leaves %d on the device, room %d" % (ncm, dev, room))
    rc, out, err = run(model, "--compare")
    check(rc == 2 and "--gpu" in err, "compare without --gpu: %d %s" % (rc, err))

    # hot experts (prefetch.hot_experts): an equal share of the bytes a tensor
    # off the device, its cap the rows that fit beside its map (8 bytes an
    # expert, 256-aligned); the picked rows less cap/E of them cross the
    # link, a single token's too (the ggml hook registers its picks)
    otp = open(ot).read()
    def hot_policy(size):
        path = os.path.join(tmp, "hot-%s.yaml" % size)
        with open(path, "w") as f:
            f.write(otp.replace("default: device\n", "default: device\nprefetch: {hot_experts: %s}\n" % size, 1))
        return path
    mapb = (E * 8 + 255) // 256 * 256
    share = (4 << 30) // len(exps)
    caps = {nm: min(E, (share - mapb) // (nbytes(ne, t) // E)) for nm, ne, t in exps}
    held = sum(mapb + caps[nm] * (nbytes(ne, t) // E) for nm, ne, t in exps)
    rc, out, err = run(model, hot_policy("4GiB"), "--batch", "1,8")
    check(rc == 0, "hot: exit %d: %s" % (rc, err))
    m = re.search(r"^hot experts: 4\.00 GiB asked, ([\d.]+) (MiB|GiB) held by 48 of the 48 expert tensors off the device .*: (\d+)-(\d+) of 128 experts each", out, re.M)
    check(m is not None, "hot: no hot experts line:\n" + out[:1200])
    if m:
        got = float(m.group(1)) * (1 << (20 if m.group(2) == "MiB" else 30))
        check(close(got, held) and int(m.group(3)) == min(caps.values()) and int(m.group(4)) == max(caps.values()),
              "hot: held %s (%s-%s), expected %d (%d-%d)" % (got, m.group(3), m.group(4), held, min(caps.values()), max(caps.values())))
    for bsz in (1, 8):
        share_b = 1 - (1 - K / E) ** bsz
        want = sum(nbytes(ne, t) * share_b * (1 - caps[nm] / E) for nm, ne, t in exps)
        m = re.search(r"^  batch %-5d\s+([\d.]+) (MiB|GiB)" % bsz, out, re.M)
        got = float(m.group(1)) * (1 << (20 if m.group(2) == "MiB" else 30)) if m else None
        check(close(got, want), "hot: batch %d reads %s, expected %.0f" % (bsz, got, want))
    # auto: without --gpu it says what it needs; with it, the GPU less the
    # engine, the weights on the device, two buffers of the largest expert
    # tensor and the 1 GiB margin
    rc, out, err = run(model, hot_policy("auto"), "--batch", "8")
    check(rc == 0 and "hot experts: auto (the device memory free when the first set is made" in out, "hot auto without --gpu:\n" + out[:900])
    rc, out, err = run(model, hot_policy("auto"), "--batch", "8", "--gpu", "6GiB", "--engine", "1GiB", "--compare")
    largest = max(nbytes(ne, t) for _, ne, t in exps)
    want = (6 << 30) - (1 << 30) - (all_bytes - exp_bytes) - 2 * largest - (1 << 30)
    m = re.search(r"^hot experts: ([\d.]+) (MiB|GiB) asked", out, re.M)
    got = float(m.group(1)) * (1 << (20 if m.group(2) == "MiB" else 30)) if m else None
    check(rc == 0 and close(got, want), "hot auto: asked %s, expected %d: %s" % (got, want, err))
    # --compare counts the sets' memory in the policy's row
    m = re.search(r"^  the policy \(hot experts\)\s+([\d.]+) (MiB|GiB)", out, re.M)
    dev = float(m.group(1)) * (1 << (20 if m.group(2) == "MiB" else 30)) if m else None
    check(dev is not None and dev > all_bytes - exp_bytes + want * 0.95, "hot compare: the policy's row %s:\n%s" % (dev, out[-700:]))

    # --compare's own hot row: every expert host, the room less the device
    # weights and two buffers of the largest expert tensor hot (a fixed size:
    # no margin), its device figure all three
    room = (6 << 30) - (1 << 30)
    want = room - (all_bytes - exp_bytes) - 2 * largest
    caps = {nm: min(E, (want // len(exps) - mapb) // (nbytes(ne, t) // E)) for nm, ne, t in exps}
    held = sum(mapb + caps[nm] * (nbytes(ne, t) // E) for nm, ne, t in exps)
    m = re.search(r"^  exps host \+ hot experts\s+([\d.]+) (MiB|GiB)( \(over\))?\s+([\d.]+)$", out, re.M)
    dev = float(m.group(1)) * (1 << (20 if m.group(2) == "MiB" else 30)) if m else None
    check(m is not None and not m.group(3) and close(dev, all_bytes - exp_bytes + held + 2 * largest),
          "compare's hot row: %s, expected %d:\n%s" % (dev, all_bytes - exp_bytes + held + 2 * largest, out[-700:]))
    want8 = sum(nbytes(ne, t) * (1 - (1 - K / E) ** 8) * (1 - caps[nm] / E) for nm, ne, t in exps) / 55e9 * 1e3
    check(m is not None and abs(float(m.group(4)) - want8) < 0.15, "compare's hot row at b8: %s ms, expected %.1f" % (m and m.group(4), want8))

    # bad files and options
    def bad(name, want, **kw):
        p = os.path.join(tmp, name + ".gguf")
        write(p, kw.pop("t", tensors), kw.pop("k", kvs), **kw)
        rc, out, err = run(p)
        check(rc == 2 and p in err and re.search(want, err), "%s: exit %d, %s" % (name, rc, err.strip()))

    bad("magic", r"at byte 0: not a GGUF file", magic=b"GGML")
    bad("v1", r"at byte 8: GGUF version 1, expected 2 or 3", version=1)
    bad("cut", r"tensor 'output\.weight' .*ends past the file's end.*cut short", cut=4096)
    bad("type", r"tensor 'x' has ggml type 4, which this reader does not know", t=[("x", [32], (4, 32, 20))])
    bad("block", r"tensor 'x': 100 elements a row, expected a multiple of its type's block of 256", t=[("x", [100], Q4_K)])
    p = os.path.join(tmp, "key.gguf")
    with open(p, "wb") as f:
        f.write(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 9 << 30) + b"xyz" + bytes(16))
    rc, out, err = run(p)
    check(rc == 2 and re.search(r"at byte 32: a key of 9663676416 bytes, expected at most 65536", err),
          "key: exit %d, %s" % (rc, err.strip()))
    p = os.path.join(tmp, "count.gguf")
    with open(p, "wb") as f:
        f.write(b"GGUF" + struct.pack("<IQQ", 3, 1000, 0) + bytes(64))
    rc, out, err = run(p)
    check(rc == 2 and re.search(r"at byte 24: 0 metadata pairs and 1000 tensors cannot fit in the 64 bytes left", err),
          "count: exit %d, %s" % (rc, err.strip()))
    rc, out, err = run(os.path.join(tmp, "absent.gguf"))
    check(rc == 2 and "absent.gguf" in err and "cannot open" in err, "absent: %s" % err.strip())
    for args, want in ((["--batch", "0"], "--batch '0'"), (["--gpu", "lots"], "--gpu 'lots'"),
                       (["--link", "-3"], "--link '-3'"), ([], "expected MODEL.gguf")):
        rc, out, err = run(*(args + ([model] if args else [])))
        check(rc == 2 and want in err, "option %s: exit %d, %s" % (args, rc, err.strip()))

for f in fails:
    print("test-policy-gguf: FAIL " + f)
print("test-policy-gguf: %s" % ("ok" if not fails else "%d failed" % len(fails)))
sys.exit(1 if fails else 0)
