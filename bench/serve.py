#!/usr/bin/env python3
"""bench/serve.py: an open-loop load generator for an OpenAI-compatible
server (issue 20), standard library only.

    python3 bench/serve.py --url http://127.0.0.1:8000 --model M --rate 4 --duration 120 \\
        [--endpoint chat|completions] [--prompt-len uniform:64:512] [--output-len fixed:128] \\
        [--out results.json] [--stats-file S.json] [--pid PID] [fault options]
    python3 bench/serve.py --inprocess e2e:moe ...   (transformers' continuous batching
        driven in this process: bench/serve_engine.py, needs torch)
    python3 bench/serve.py --server-kind llamacpp --endpoint completions --url http://127.0.0.1:8080 \
        --rates 2,4,8 --ignore-eos --pid PID ...   (llama.cpp's llama-server, issue 40)

Arrivals are Poisson at --rate requests/s (open loop: a request is sent at
its time whether or not earlier ones finished), for --duration seconds or
--requests N. Every request streams (SSE); the client counts a content
chunk as a token (transformers serve, vLLM and SGLang send one token a
chunk; the final usage block, where the server sends one, gives the exact
count). Reported: throughput (requests/s, output tokens/s; over the whole
run and over the steady window), TTFT, inter-token latency (ITL), time per
output token and end-to-end latency at p50/p99/mean, errors by kind, the
mean concurrency (Little's law: completed rate x mean latency; and the
in-flight count sampled every 100 ms, split into requests that have their
first token, the server's running batch below saturation, and those
still waiting for it), and the shim's stats over the run.

The arrival schedule (times, lengths, prompts, which requests disconnect)
depends only on --seed and the options, never on the server's speed.

--server-kind llamacpp (llama.cpp's llama-server, read at 34af94cd): every
streamed chunk of a partial result carries exactly one sampled token, and
its text may be empty (a token that ends inside a UTF-8 character, or
that may start a stop string, is held back and sent with a later one), so
tokens are counted by the chunks' token ids, not by their text. The ids
come with every chunk of the native /completion ("tokens": [id]); on
/v1/completions and /v1/chat/completions only in the "__verbose" object,
which a request's "verbose": true turns on (the OpenAI-shaped logprobs
would carry them too, but cost a sort of the vocabulary a token), so this
kind sends it. The greedy checks then compare token ids, not text.
/v1/completions is the default endpoint of the kind: its stream ends with
`data: [DONE]` as OpenAI's does; /completion ends the body instead.

With --pid, the server's RSS (/proc/PID/status) and device memory (NVML
through pynvml when importable, else nvidia-smi, else none: the report
says which) are sampled every --sample-every seconds (default 1) into the
report's "memory"; bench/serve-plot.py draws them.
"""
from __future__ import annotations

import argparse
import asyncio
import copy
import datetime
import itertools
import json
import math
import os
import platform
import random
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

# ----------------------------------------------------------------------------
# prompts: bench/words.py's words (serve.WORDS: the same list)

from words import WORDS  # noqa: E402


def prompt_text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(max(1, n)))


# ----------------------------------------------------------------------------
# length distributions


@dataclass
class Dist:
    spec: str
    draw: Callable[[random.Random], int]
    mean: float


def parse_dist(spec: str) -> Dist:
    """fixed:N, uniform:A:B (inclusive), lognormal:MEAN:SIGMA[:MIN:MAX]
    (MEAN of the distribution itself, SIGMA of the underlying normal;
    clipped to [MIN, MAX], by default [1, 16 x MEAN])."""
    p = spec.split(":")
    try:
        if p[0] == "fixed" and len(p) == 2:
            n = int(p[1])
            if n < 1:
                raise ValueError
            return Dist(spec, lambda r: n, float(n))
        if p[0] == "uniform" and len(p) == 3:
            a, b = int(p[1]), int(p[2])
            if not 1 <= a <= b:
                raise ValueError
            return Dist(spec, lambda r: r.randint(a, b), (a + b) / 2)
        if p[0] == "lognormal" and len(p) in (3, 5):
            mean, sigma = float(p[1]), float(p[2])
            lo, hi = (int(p[3]), int(p[4])) if len(p) == 5 else (1, int(16 * mean))
            if mean <= 0 or sigma < 0 or not 1 <= lo <= hi:
                raise ValueError
            mu = math.log(mean) - sigma * sigma / 2
            return Dist(spec, lambda r: min(hi, max(lo, int(round(r.lognormvariate(mu, sigma))))), mean)
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(
        f"{spec!r}: expected fixed:N, uniform:A:B or lognormal:MEAN:SIGMA[:MIN:MAX] (positive integers)")


@dataclass(frozen=True)
class Closed:
    """A phase of --rates written cN: a closed loop, N requests in flight
    for --duration seconds (each that ends is followed at once by the next),
    in place of Poisson arrivals: the server's throughput at N concurrent
    requests, with no queue building up past its slots."""
    n: int

    def __str__(self) -> str:
        return f"c{self.n}"


Phase = Any  # a phase of --rates: a float (requests/s, open loop) or a Closed


def parse_rates(spec: str) -> List[Phase]:
    """R1,R2,...: positive request rates (open loop) or cN (a closed loop of
    N requests in flight), in the order the phases run."""
    out: List[Phase] = []
    try:
        for x in spec.split(","):
            x = x.strip()
            if x[:1] in ("c", "C"):
                n = int(x[1:])
                if n <= 0:
                    raise ValueError
                out.append(Closed(n))
            else:
                r = float(x)
                if r <= 0:
                    raise ValueError
                out.append(r)
        return out
    except ValueError:
        raise argparse.ArgumentTypeError(f"{spec!r}: expected positive rates or cN (N requests in flight) "
                                         f"separated by commas, e.g. 1,3,10,c32")


def parse_burst(spec: str) -> Tuple[float, float, float]:
    """MULTx@T:D -> (mult, start, length)."""
    try:
        mult, rest = spec.split("x@")
        t, d = rest.split(":")
        m, t0, dur = float(mult), float(t), float(d)
        if m <= 0 or t0 < 0 or dur <= 0:
            raise ValueError
        return m, t0, dur
    except ValueError:
        raise argparse.ArgumentTypeError(f"{spec!r}: expected MULTx@T:D, e.g. 4x@60:10")


# ----------------------------------------------------------------------------
# the schedule


@dataclass
class Req:
    idx: int
    t: float                       # arrival, seconds after the start
    prompt_len: int
    output_len: int
    kind: str = "normal"           # normal, disconnect, long, bad, greedy, warmup
    prompt: str = ""
    ids: Optional[List[int]] = None  # in-process driver: token ids instead of text
    disconnect_after: int = 0      # tokens to read before closing (kind disconnect)
    # filled in by the run
    sent: float = 0.0
    first: Optional[float] = None
    token_times: List[float] = field(default_factory=list)
    done: Optional[float] = None
    status: Optional[int] = None
    error: Optional[str] = None
    error_msg: Optional[str] = None  # the exception's text, for the report's examples
    text: Any = None               # streamed output (text, or token ids in-process)
    tok_ids: Optional[List[int]] = None  # the server's token ids, where it sends them (llamacpp)
    usage: Optional[Dict[str, Any]] = None


GREEDY_PROMPT_LEN = 48
GREEDY_OUTPUT_LEN = 24


def greedy_prompts(n: int) -> List[str]:
    """A fixed set, independent of --seed and the other options, so a file
    recorded in one run checks another."""
    r = random.Random(20)
    return [prompt_text(r, GREEDY_PROMPT_LEN) for _ in range(n)]


def rate_at(args: argparse.Namespace, t: float) -> float:
    if args.burst:
        m, t0, d = args.burst
        if t0 <= t < t0 + d:
            return args.rate * m
    return args.rate


def draw_request(args: argparse.Namespace, rng: random.Random, idx: int, t: float) -> Req:
    """The next request of the seed's sequence: lengths, prompt, and whether
    its client disconnects (--disconnect-frac)."""
    p, o = args.prompt_len.draw(rng), args.output_len.draw(rng)
    r = Req(idx, t, p, o, prompt=prompt_text(rng, p))
    if args.disconnect_frac and rng.random() < args.disconnect_frac:
        r.kind = "disconnect"
        r.disconnect_after = rng.randint(1, max(1, o // 2))
    return r


def schedule(args: argparse.Namespace) -> List[Req]:
    """Poisson arrivals (by thinning when a burst changes the rate), lengths
    and prompts, all from --seed; then the fault requests at fixed times."""
    rng = random.Random(args.seed)
    peak = args.rate * (max(1.0, args.burst[0]) if args.burst else 1.0)
    reqs: List[Req] = []
    t = 0.0
    limit = args.duration if args.requests is None else math.inf
    while len(reqs) < (args.requests if args.requests is not None else math.inf):
        t += rng.expovariate(peak)
        if t >= limit:
            break
        if rng.random() * peak > rate_at(args, t):
            continue
        reqs.append(draw_request(args, rng, len(reqs), t))
    span = reqs[-1].t if reqs else 0.0
    reqs = sorted(reqs + extras(args, span), key=lambda r: r.t)
    for i, r in enumerate(reqs):
        r.idx = i
    return reqs


def extras(args: argparse.Namespace, span: float) -> List[Req]:
    """The fault and check requests of a phase whose arrivals span `span`
    seconds, at fixed shares of it: a long prompt, a bad request, the
    greedy prompts."""
    extra: List[Req] = []
    if args.long_prompt:
        rl = random.Random(args.seed + 1)
        extra.append(Req(0, span * 0.5, args.long_prompt, args.output_len.draw(rl), "long",
                         prompt=prompt_text(rl, args.long_prompt)))
    if args.bad_request:
        # early, so that "the server kept serving" has most of the run to show it
        extra.append(Req(0, span * 0.25, 8, 8, "bad", prompt=prompt_text(random.Random(3), 8)))
    if args.greedy_check or args.record_greedy:
        for i, pr in enumerate(greedy_prompts(args.greedy_n)):
            # spread over the run, under whatever load is there
            extra.append(Req(0, span * (i + 0.5) / args.greedy_n, GREEDY_PROMPT_LEN, GREEDY_OUTPUT_LEN,
                             "greedy", prompt=pr))
    return extra


# ----------------------------------------------------------------------------
# HTTP/1.1 over asyncio streams, SSE


class HTTPError(Exception):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:200]}")
        self.status, self.body = status, body


def body_for(args: argparse.Namespace, r: Req) -> Dict[str, Any]:
    body: Dict[str, Any] = {"model": args.model, "max_tokens": r.output_len, "temperature": 0.0,
                            "stream": True}
    if args.server_kind == "llamacpp" and args.endpoint != "native":
        body["verbose"] = True  # token ids in each chunk's __verbose (module docstring)
    if args.endpoint == "chat":
        body["messages"] = [{"role": "user", "content": r.prompt}]
    else:
        body["prompt"] = r.prompt
    if args.min_tokens:
        body["min_tokens"] = r.output_len
    if args.ignore_eos:
        body["ignore_eos"] = True
    if args.include_usage:
        body["stream_options"] = {"include_usage": True}
    body.update(args.extra_body)
    if r.kind == "bad":
        # invalid on every OpenAI-compatible server: a negative token count
        body["max_tokens"] = -5
        body["temperature"] = -1.0
    return body


async def read_headers(reader: asyncio.StreamReader) -> Tuple[int, Dict[str, str]]:
    line = await reader.readline()
    if not line:
        raise ConnectionResetError("connection closed before the status line")
    parts = line.decode("latin-1").split(None, 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/"):
        raise ConnectionError(f"bad status line {line[:80]!r}")
    status = int(parts[1])
    headers: Dict[str, str] = {}
    while True:
        h = await reader.readline()
        if h in (b"\r\n", b"\n", b""):
            break
        k, _, v = h.decode("latin-1").partition(":")
        headers[k.strip().lower()] = v.strip()
    return status, headers


async def body_chunks(reader: asyncio.StreamReader, headers: Dict[str, str]):
    """The response body as it arrives (chunked, Content-Length or to EOF)."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        while True:
            size_line = await reader.readline()
            if not size_line:
                raise ConnectionResetError("connection closed inside a chunked body")
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                await reader.readline()
                return
            data = await reader.readexactly(size)
            await reader.readline()
            yield data
    elif "content-length" in headers:
        left = int(headers["content-length"])
        while left > 0:
            data = await reader.read(min(left, 65536))
            if not data:
                raise ConnectionResetError("connection closed before Content-Length bytes")
            left -= len(data)
            yield data
    else:
        while True:
            data = await reader.read(65536)
            if not data:
                return
            yield data


ENDPOINT_PATH = {"chat": "/v1/chat/completions", "completions": "/v1/completions", "native": "/completion"}


def sse_tokens(obj: Dict[str, Any]) -> Optional[List[int]]:
    """llama-server's token ids in one chunk: the native endpoint's
    "tokens", else "__verbose"'s (a partial result's; the final one has
    stop: true and lists the whole output only with return_tokens), else
    the logprobs' ids. None when the chunk names no ids (another server)."""
    v = obj.get("__verbose") if isinstance(obj.get("__verbose"), dict) else obj
    if "tokens" in v and "stop" in v:
        return [] if v.get("stop") else [int(t) for t in v.get("tokens") or []]
    ch = obj.get("choices") or []
    lp = (ch[0].get("logprobs") if ch and isinstance(ch[0], dict) else None) or {}
    if isinstance(lp, dict) and isinstance(lp.get("content"), list):
        return [int(e["id"]) for e in lp["content"] if isinstance(e, dict) and "id" in e]
    return None


def sse_text(obj: Dict[str, Any]) -> Optional[str]:
    """The content of one streamed chunk (chat delta or completion text);
    None when the chunk carries no content (role, usage, finish)."""
    ch = obj.get("choices") or []
    if not ch and "content" not in obj:
        return None
    c = ch[0] if ch else {}
    if "content" in obj and "choices" not in obj:  # llama-server's native /completion
        s = obj.get("content")
    elif "delta" in c:
        s = (c.get("delta") or {}).get("content")
    else:
        s = c.get("text")
    return s if s else None


async def http_request(args: argparse.Namespace, r: Req, on_token: Callable[[Req], None]) -> None:
    u = args.parsed_url
    path = u.path.rstrip("/") + ENDPOINT_PATH[args.endpoint]
    payload = json.dumps(body_for(args, r)).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: {u.netloc}\r\nContent-Type: application/json\r\n"
            f"Accept: text/event-stream\r\nContent-Length: {len(payload)}\r\nConnection: close\r\n")
    if args.api_key:
        head += f"Authorization: Bearer {args.api_key}\r\n"
    reader, writer = await asyncio.open_connection(u.hostname, u.port or 80)
    try:
        writer.write(head.encode("latin-1") + b"\r\n" + payload)
        await writer.drain()
        status, headers = await read_headers(reader)
        r.status = status
        if status != 200:
            body = b"".join([c async for c in body_chunks(reader, headers)])
            raise HTTPError(status, body.decode("utf-8", "replace"))
        buf = b""
        pieces: List[str] = []
        async for data in body_chunks(reader, headers):
            buf += data
            while b"\n\n" in buf or b"\r\n\r\n" in buf:
                i, j = buf.find(b"\n\n"), buf.find(b"\r\n\r\n")
                cut, sep = (i, 2) if j < 0 or (0 <= i < j) else (j, 4)
                event, buf = buf[:cut], buf[cut + sep:]
                for line in event.splitlines():
                    if not line.startswith(b"data:"):
                        continue
                    d = line[5:].strip()
                    if d == b"[DONE]":
                        r.text = "".join(pieces)
                        return
                    try:
                        obj = json.loads(d)
                    except ValueError:
                        raise ConnectionError(f"bad SSE data {d[:80]!r}")
                    if isinstance(obj, dict) and obj.get("error"):
                        raise RuntimeError(f"stream error: {str(obj['error'])[:200]}")
                    if isinstance(obj, dict) and obj.get("usage"):
                        r.usage = obj["usage"]
                    s = sse_text(obj) if isinstance(obj, dict) else None
                    ids = sse_tokens(obj) if isinstance(obj, dict) and args.server_kind == "llamacpp" else None
                    if ids is not None:
                        # one chunk a sampled token, its text possibly empty (held back)
                        r.tok_ids = (r.tok_ids or []) + ids
                        pieces.append(s or "")
                        for _ in ids:
                            on_token(r)
                    elif s is not None:
                        pieces.append(s)
                        on_token(r)
                    if r.kind == "disconnect" and r.token_times and len(r.token_times) >= r.disconnect_after:
                            r.text = "".join(pieces)
                            writer.transport.abort()  # the client goes away mid-stream
                            return
        r.text = "".join(pieces)  # no [DONE] (transformers serve ends the body instead)
    finally:
        if not writer.transport.is_closing():
            writer.close()


# ----------------------------------------------------------------------------
# the run


def pct(xs: List[float], q: float) -> Optional[float]:
    if not xs:
        return None
    s = sorted(xs)
    k = (len(s) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def dist_summary(xs: List[float], scale: float = 1e3) -> Dict[str, Any]:
    """p50, p99, mean (ms by default) and the count."""
    return {"n": len(xs), "p50": _r(pct(xs, 50), scale), "p99": _r(pct(xs, 99), scale),
            "mean": _r(sum(xs) / len(xs) if xs else None, scale)}


def _r(v: Optional[float], scale: float = 1.0) -> Optional[float]:
    return None if v is None else round(v * scale, 3)


class Run:
    """Everything the load generator measures, fed by either driver."""

    def __init__(self, args: argparse.Namespace, reqs: List[Req]) -> None:
        self.args, self.reqs = args, reqs
        self.t0 = 0.0
        self.inflight = 0
        self.decoding = 0
        # (t, in flight, with a first token, the engine's own active count or None)
        self.samples: List[Tuple[float, int, int, Optional[int]]] = []
        self.intervals: List[Dict[str, Any]] = []

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def on_token(self, r: Req) -> None:
        t = self.now()
        if r.first is None:
            r.first = t
            self.decoding += 1
        r.token_times.append(t)

    def start(self, r: Req) -> None:
        r.sent = self.now()
        self.inflight += 1

    def finish(self, r: Req, error: Optional[str]) -> None:
        r.done = self.now()
        r.error = error
        self.inflight -= 1
        if r.first is not None:
            self.decoding -= 1

    async def sampler(self, stop: asyncio.Event) -> None:
        engine = self.args.engine
        while not stop.is_set():
            active = engine.active() if engine is not None else None
            self.samples.append((self.now(), self.inflight, self.decoding, active))
            try:
                await asyncio.wait_for(stop.wait(), 0.1)
            except asyncio.TimeoutError:
                pass


def error_kind(e: BaseException) -> str:
    if isinstance(e, HTTPError):
        return f"http_{e.status}"
    if isinstance(e, asyncio.TimeoutError):
        return "timeout"
    if isinstance(e, ConnectionRefusedError):
        return "refused"
    if isinstance(e, (ConnectionResetError, asyncio.IncompleteReadError, BrokenPipeError)):
        return "reset"
    if isinstance(e, RuntimeError) and str(e).startswith("stream error"):
        return "stream_error"
    if isinstance(e, OSError):
        return "connect"
    return type(e).__name__


CUT = "cut"  # closed by --drain-timeout: neither served nor failed by the server


async def one(run: Run, r: Req, driver: Any) -> None:
    run.start(r)
    err = None
    try:
        await asyncio.wait_for(driver(run.args, r, run.on_token), run.args.request_timeout)
        if r.kind not in ("disconnect", "bad") and not r.token_times:
            err = "empty"
    except asyncio.CancelledError:
        # only the phase's drain timeout cancels a request task (run_phase):
        # recorded, so that the phase's report goes on without it
        err = CUT
    except Exception as e:  # every failure is a counted result, never a crash
        err = error_kind(e)
        r.error_msg = str(e)[:300]
        if run.args.verbose:
            sys.stderr.write(f"serve.py: request {r.idx} ({r.kind}): {err}: {e}\n")
    run.finish(r, err)


async def warm_up(args: argparse.Namespace, driver: Any) -> List[str]:
    """Sequential requests before the clock starts: the server loads the
    model on its first request (transformers serve), the shim seals at the
    first forward, CUDA graphs are captured."""
    errs = []
    dummy = Run(args, [])
    rng = random.Random(args.seed + 7)
    for i in range(args.warmup_requests):
        p, o = args.prompt_len.draw(rng), args.output_len.draw(rng)
        r = Req(i, 0.0, p, o, "warmup", prompt=prompt_text(rng, p))
        if args.engine is not None:
            args.engine.prepare(r)
        await one(dummy, r, driver)
        if r.error:
            errs.append(r.error)
    return errs


async def greedy_alone(args: argparse.Namespace, driver: Any) -> Tuple[Dict[str, Any], float]:
    """The greedy prompts sent together to an idle server after the last
    phase, nothing else in flight. Under load a greedy request shares its
    steps with whatever arrived at random around it, and a batched bf16
    kernel's sums depend on the batch (tiling, split-K): the same weights
    can pick another token, with or without the shim (plain against plain
    differs too). Sent alone and together, the batch is the same in every
    run, so these outputs must be identical to the reference's: that is the
    check of the shim's correctness; the outputs under load are reported
    beside it. Against llama-server (--server-kind llamacpp) they go one at
    a time: the server batches whatever arrives within one of its steps,
    and HTTP arrivals do not land in the same steps from run to run."""
    dummy = Run(args, [])
    reqs = [Req(i, 0.0, GREEDY_PROMPT_LEN, GREEDY_OUTPUT_LEN, "greedy", prompt=pr)
            for i, pr in enumerate(greedy_prompts(args.greedy_n))]
    for r in reqs:
        if args.engine is not None:
            args.engine.prepare(r)
    if args.server_kind == "llamacpp":
        # one at a time: an HTTP server batches what arrives within one of
        # its steps, so "together" is not the same batch from run to run
        for r in reqs:
            await one(dummy, r, driver)
    else:
        await asyncio.gather(*(one(dummy, r, driver) for r in reqs))
    # the requests' time in the server, summed (what a server-side count of
    # running requests integrates over this pass)
    busy = sum((r.done - r.sent) for r in reqs if r.done is not None and r.sent)
    return {str(i): output_of(r) for i, r in enumerate(reqs)}, busy


def rss_kib(pid: int) -> Optional[int]:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


_NVML: Any = None  # None: not tried yet; False: not importable or no driver


def _nvml() -> Any:
    global _NVML
    if _NVML is None:
        try:
            import pynvml  # type: ignore
            pynvml.nvmlInit()
            _NVML = pynvml
        except Exception:  # not installed, no driver: nvidia-smi instead
            _NVML = False
    return _NVML or None


def gpu_used_nvml(nv: Any, pid: Optional[int]) -> Optional[Dict[str, Any]]:
    try:
        total, mine, dev = 0, None, 0
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            dev += int(nv.nvmlDeviceGetMemoryInfo(h).used) >> 20
            for pr in nv.nvmlDeviceGetComputeRunningProcesses(h):
                m = int(pr.usedGpuMemory or 0) >> 20
                total += m
                if pid is not None and pr.pid == pid:
                    mine = (mine or 0) + m
        return {"pid": mine, "all": total, "device": dev, "source": "nvml"}
    except Exception:
        return None


def _smi(query: str) -> List[str]:
    try:
        return subprocess.run(["nvidia-smi", query, "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=10).stdout.splitlines()
    except (OSError, subprocess.TimeoutExpired):
        return []


def gpu_used_mib(pid: Optional[int]) -> Optional[Dict[str, Any]]:
    """The used device memory (MiB): the pid's own when given, the sum over
    every compute process, and the devices' used memory (`device`: what the
    per-process figures leave out counts there, managed memory resident on
    the device among it, so rows under the shim compare by it); from NVML
    (pynvml) when importable, else nvidia-smi. None with neither."""
    nv = _nvml()
    if nv is not None:
        g = gpu_used_nvml(nv, pid)
        if g is not None:
            return g
    if not shutil.which("nvidia-smi"):
        return None
    total, mine, dev = 0, None, None
    for line in _smi("--query-compute-apps=pid,used_memory"):
        try:
            p, m = (int(x) for x in line.split(","))
        except ValueError:
            continue
        total += m
        if pid is not None and p == pid:
            mine = (mine or 0) + m
    for line in _smi("--query-gpu=memory.used"):
        try:
            dev = (dev or 0) + int(line.strip())
        except ValueError:
            continue
    return {"pid": mine, "all": total, "device": dev, "source": "nvidia-smi"}


class Ticker:
    """sample(t) every `every` seconds on a thread of its own, at fixed
    ticks from t0 so that a slow sample does not shift the next; once more
    when stopped when final."""

    def __init__(self, every: float, t0: float, final: bool = False) -> None:
        self.every, self.t0, self.final = every, t0, final
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def sample(self, t: float) -> None:
        raise NotImplementedError

    def loop(self) -> None:
        k = 0
        while True:
            self.sample(self.now())
            k += 1
            if self.stop.wait(max(0.0, k * self.every - self.now())):
                break
        if self.final:
            self.sample(self.now())

    def start(self) -> None:
        self.thread.start()

    def halt(self) -> None:
        self.stop.set()
        self.thread.join()


class MemSampler(Ticker):
    """The server's RSS and device memory every `every` seconds (on the
    ticker's thread: nvidia-smi blocks for tens of ms)."""

    COLUMNS = ["t", "rss_kib", "gpu_pid_mib", "gpu_all_mib", "gpu_dev_mib"]

    def __init__(self, pid: int, every: float, t0: float) -> None:
        super().__init__(every, t0)
        self.pid = pid
        self.samples: List[List[Any]] = []
        self.source = "none"

    def sample(self, t: float) -> None:
        g = gpu_used_mib(self.pid)
        if g is not None:
            self.source = g["source"]
        self.samples.append([round(t, 2), rss_kib(self.pid), g and g["pid"], g and g["all"],
                             g and g.get("device")])

    def report(self) -> Dict[str, Any]:
        self.halt()
        out: Dict[str, Any] = {"pid": self.pid, "every_s": self.every, "gpu_source": self.source,
                               "columns": self.COLUMNS, "samples": self.samples}
        # issue 40's soak target: RSS and device memory within 2% from
        # minute 1 to the end (the whole run when it is shorter than 2 min)
        t_from = 60.0 if self.samples and self.samples[-1][0] >= 120.0 else 0.0
        for i, name in ((1, "rss_kib"), (2, "gpu_pid_mib"), (3, "gpu_all_mib"), (4, "gpu_dev_mib")):
            xs = [s[i] for s in self.samples if s[0] >= t_from and s[i] is not None]
            if xs:
                out[name] = {"from_s": t_from, "min": min(xs), "max": max(xs), "last": xs[-1],
                             "spread": round((max(xs) - min(xs)) / min(xs), 4) if min(xs) > 0 else None}
        return out


# ----------------------------------------------------------------------------
# the server's own counters (llama-server --metrics: GET /metrics)


def parse_prometheus(text: str) -> Dict[str, float]:
    """Prometheus text exposition: `name value` lines (labels kept in the
    name), comments skipped. llama-server writes its doubles with C++'s
    default stream format (1.23457e+06), which float() reads."""
    out: Dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, _, rest = line.rpartition(" ")
        try:
            out[name.strip()] = float(rest)
        except ValueError:
            continue
    return out


class MetricsSampler(Ticker):
    """GET args.metrics_url every `every` seconds (a Ticker; once more at the
    phase's end). At saturation the output rate a
    client sees depends on how the server shares its steps between prompts
    and decodes; the server's step period (its llama_decode calls) and the
    tokens it processed are the figures that compare rows there."""

    PREFIX = "llamacpp:"

    def __init__(self, url: str, every: float, t0: float) -> None:
        super().__init__(every, t0, final=True)  # a last sample: the end of the phase
        self.url = url
        self.samples: List[Tuple[float, Dict[str, float]]] = []
        self.error: Optional[str] = None

    def get(self) -> Optional[Dict[str, float]]:
        try:
            with urllib.request.urlopen(self.url, timeout=5) as f:
                m = parse_prometheus(f.read().decode("utf-8", "replace"))
        except urllib.error.HTTPError as e:  # llama-server without --metrics: 501
            self.error = f"HTTP {e.code} from {self.url} (llama-server needs --metrics)"
            return None
        except (OSError, ValueError) as e:
            self.error = f"{self.url}: {e}"
            return None
        if not any(k.startswith(self.PREFIX) for k in m):
            self.error = f"{self.url}: no {self.PREFIX} counters"
            return None
        return m

    def sample(self, t: float) -> None:
        m = self.get()
        if m is not None:
            self.samples.append((round(t, 3), m))

    def report(self, window: Optional[List[float]]) -> Dict[str, Any]:
        """Deltas between the first sample at or after the window's start and
        the last one at or before its end (the steady window; the whole phase
        without one)."""
        self.halt()
        out: Dict[str, Any] = {"source": self.url, "samples": len(self.samples)}
        if len(self.samples) < 2:
            out["error"] = self.error or "fewer than 2 samples"
            return out
        lo, hi = (window or [self.samples[0][0], self.samples[-1][0]])[:2]
        a = next((x for x in self.samples if x[0] >= lo), self.samples[0])
        b = next((x for x in reversed(self.samples) if x[0] <= hi), self.samples[-1])
        if b[0] <= a[0]:
            a, b = self.samples[0], self.samples[-1]
        dt = b[0] - a[0]
        d = lambda k: b[1].get(self.PREFIX + k, 0.0) - a[1].get(self.PREFIX + k, 0.0)  # noqa: E731
        decodes = d("n_decode_total")
        prompt, predicted = d("prompt_tokens_total"), d("tokens_predicted_total")
        # the busy-slots gauge is a mean over all decodes so far: its total
        # is the gauge times the decodes, whose delta is the window's
        busy = lambda x: x[1].get(self.PREFIX + "n_busy_slots_per_decode", 0.0) * \
            x[1].get(self.PREFIX + "n_decode_total", 0.0)  # noqa: E731
        out.update({
            "window_s": [a[0], b[0]], "decodes": decodes,
            "step_ms": _r(dt / decodes, 1e3) if decodes > 0 else None,
            "busy_slots_per_decode": _r((busy(b) - busy(a)) / decodes) if decodes > 0 else None,
            "prompt_tokens": prompt, "predicted_tokens": predicted,
            "prompt_tok_s": _r(prompt / dt), "predicted_tok_s": _r(predicted / dt),
            "processed_tok_s": _r((prompt + predicted) / dt),
        })
        return out


def print_server(m: Dict[str, Any]) -> None:
    if "error" in m:
        print(f"server counters: none ({m['error']})", flush=True)
        return
    print(f"server (llama-server /metrics over {m['window_s']} s): {m['decodes']:.0f} decode calls, "
          f"step {m['step_ms']} ms, {m['busy_slots_per_decode']} busy slots a decode; prompt "
          f"{m['prompt_tok_s']} tok/s, generated {m['predicted_tok_s']} tok/s (counted as each request ends), "
          f"processed {m['processed_tok_s']} tok/s", flush=True)


# ----------------------------------------------------------------------------
# the shim's stats (uvm/stats.c, docs/placement.md "Stats")


def read_stats(args: argparse.Namespace) -> Optional[Dict[str, Any]]:
    if args.engine is not None:
        return args.engine.stats()
    try:
        if args.stats_url:
            with urllib.request.urlopen(args.stats_url, timeout=5) as f:
                return json.loads(f.read().decode("utf-8", "replace"))
        if args.stats_file:
            with open(args.stats_file) as f:
                st = json.load(f)
            st["_mtime"] = os.path.getmtime(args.stats_file)
            return st
    except (OSError, ValueError):
        return None
    return None


def _n(d: Any, *path: str) -> float:
    for p in path:
        d = d.get(p) if isinstance(d, dict) else None
    return float(d) if isinstance(d, (int, float)) and not isinstance(d, bool) else 0.0


def stats_figures(st: Dict[str, Any]) -> Dict[str, float]:
    """The cumulative counters a delta makes sense of."""
    pf = st.get("prefetch") or {}
    names = pf.get("names") or {}
    host_touched = sum(float(n.get("touched_bytes", 0)) for n in st.get("names") or []
                       if n.get("placement") == "host")
    per = pf.get("per_step") or {}
    f = {
        "launches": _n(st, "launches", "seen"), "launch_hits": _n(st, "launches", "hits"),
        "ring_pushed": _n(st, "ring", "pushed"), "ring_dropped": _n(st, "ring", "dropped"),
        "ring_dropped_watched": _n(st, "ring", "dropped_watched"),
        "hits": sum(float(v.get("hits", 0)) for v in names.values()),
        "misses": sum(float(v.get("misses", 0)) for v in names.values()),
        "hit_bytes": sum(float(v.get("hit_bytes", 0)) for v in names.values()),
        "miss_bytes": sum(float(v.get("miss_bytes", 0)) for v in names.values()),
        "prefetched_bytes": sum(float(v.get("prefetched", 0)) for v in names.values()),
        "host_touched_bytes": host_touched,
        "prefetch_steps": _n(per, "steps") or _n(pf, "steps"),
        "prefetch_in_bytes": _n(per, "in_bytes") * _n(per, "steps"),  # per_step holds means
        "prefetch_errors": _n(pf, "errors"),
        "stream_steps": _n(st, "stream", "steps"), "stream_staged_bytes": _n(st, "stream", "staged_bytes"),
        "stream_redirected": _n(st, "stream", "redirected"),
        "stream_inplace_captured": _n(st, "stream", "inplace_captured"),
        "placement_errors": _n(st, "allocations", "placement_errors"),
        "allocations_live": _n(st, "allocations", "live"),
    }
    return f


def stats_report(before: Optional[Dict[str, Any]], after: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """Deltas over the run when there is a snapshot before, else the totals
    of the process's life (the WOFFLOAD_STATS file written at exit)."""
    if after is None:
        return None
    a = stats_figures(after)
    same = before is not None and before.get("_mtime") is not None and before.get("_mtime") == after.get("_mtime")
    b = stats_figures(before) if before is not None and not same else {k: 0.0 for k in a}
    d = {k: a[k] - b[k] for k in a}
    steps = d["prefetch_steps"] or d["stream_steps"]
    streams = ((after.get("stream") or {}).get("names")) or {}
    mult = [(float(v.get("read_multiplicity", 0)), float(v.get("bytes", 0))) for v in streams.values()]
    wsum = sum(w for _, w in mult)
    out: Dict[str, Any] = {
        "scope": "delta over the run" if before is not None and not same else
                 ("the file did not change during the run: totals of the process" if same else
                  "totals of the process (no snapshot before the run)"),
        "steps": steps,
        "hit_rate": _r(d["hits"] / (d["hits"] + d["misses"])) if d["hits"] + d["misses"] else None,
        "hit_rate_bytes": _r(d["hit_bytes"] / (d["hit_bytes"] + d["miss_bytes"]))
        if d["hit_bytes"] + d["miss_bytes"] else None,
        # what crossed PCIe a step: host names read in place, managed names
        # read in place (misses) and prefetched, staged copies of streamed ranges
        "pcie_bytes_per_step": _r((d["host_touched_bytes"] + d["miss_bytes"] + d["prefetched_bytes"]
                                   + d["stream_staged_bytes"]) / steps) if steps else None,
        "host_read_bytes_per_step": _r(d["host_touched_bytes"] / steps) if steps else None,
        "managed_in_bytes_per_step": _r((d["miss_bytes"] + d["prefetched_bytes"]) / steps) if steps else None,
        "read_multiplicity_max": _r(max((m for m, _ in mult), default=0.0)) if mult else None,
        "read_multiplicity_mean": _r(sum(m * w for m, w in mult) / wsum) if wsum else None,
        "events_dropped": d["ring_dropped"], "events_dropped_watched": d["ring_dropped_watched"],
        "launches": d["launches"], "prefetch_errors": d["prefetch_errors"],
        "stream_redirected": d["stream_redirected"], "stream_inplace_captured": d["stream_inplace_captured"],
        "placement_errors": d["placement_errors"],
        "placements": {k: v.get("bytes") for k, v in (after.get("placements") or {}).items()
                       if isinstance(v, dict)},
        "managed_cap_peak": _n(after, "managed_cap", "peak") or None,
        "allocations_live": a["allocations_live"],
    }
    return out


# ----------------------------------------------------------------------------
# reporting


def interval_line(run: Run, t_lo: float, t_hi: float, pid: Optional[int]) -> Dict[str, Any]:
    rs = run.reqs
    toks = sum(1 for r in rs for t in r.token_times if t_lo <= t < t_hi)
    done = [r for r in rs if r.done is not None and t_lo <= r.done < t_hi]
    ttft = [r.first - r.sent for r in rs if r.first is not None and t_lo <= r.first < t_hi]
    errs = sum(1 for r in done if r.error and r.error != CUT and r.kind != "bad")
    line: Dict[str, Any] = {"t": round(t_hi, 1), "completed": sum(1 for r in done if not r.error),
                            "tok_s": round(toks / (t_hi - t_lo), 2), "ttft_p99_ms": _r(pct(ttft, 99), 1e3),
                            "errors": errs, "in_flight": run.inflight}
    if pid is not None:
        line["rss_kib"] = rss_kib(pid)
    g = gpu_used_mib(pid)
    if g is not None:
        line["gpu_mib"] = g
    st = read_stats(run.args)
    if st is not None:
        line["shim"] = shim_counters(st)
    return line


def shim_counters(st: Dict[str, Any]) -> Dict[str, float]:
    """The cumulative counters of an interval line's "shim" (and of a
    phase's "interval_base", the same at its start: the first line's
    deltas, e.g. its hit rate, are taken against it)."""
    f = stats_figures(st)
    return {"hits": f["hits"], "misses": f["misses"], "launches": f["launches"],
            "dropped": f["ring_dropped"], "live_allocations": f["allocations_live"],
            "placement_errors": f["placement_errors"]}


def print_interval(line: Dict[str, Any]) -> None:
    s = (f"[{line['t']:8.1f}s] done {line['completed']:5d}  {line['tok_s']:9.1f} tok/s  "
         f"TTFT p99 {line['ttft_p99_ms'] if line['ttft_p99_ms'] is not None else '-':>9} ms  "
         f"errors {line['errors']}  in flight {line['in_flight']}")
    if line.get("rss_kib") is not None:
        s += f"  RSS {line['rss_kib'] / 1024:.1f} MiB"
    if line.get("gpu_mib"):
        g = line["gpu_mib"]
        s += f"  GPU {g['pid'] if g['pid'] is not None else g['all']} MiB"
    if line.get("shim"):
        sh = line["shim"]
        hr = sh["hits"] / (sh["hits"] + sh["misses"]) if sh["hits"] + sh["misses"] else None
        s += f"  shim hit {hr:.3f}" if hr is not None else "  shim"
        s += f" dropped {sh['dropped']:.0f} allocs {sh['live_allocations']:.0f}"
    print(s, flush=True)


async def reporter(run: Run, stop: asyncio.Event) -> None:
    every = run.args.report_every
    k = 1
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), max(0.0, k * every - run.now()))
            return
        except asyncio.TimeoutError:
            pass
        line = await asyncio.get_running_loop().run_in_executor(
            None, interval_line, run, (k - 1) * every, k * every, run.args.pid)
        run.intervals.append(line)
        print_interval(line)
        k += 1


def summarise(run: Run, wall: float) -> Dict[str, Any]:
    args = run.args
    main = [r for r in run.reqs if r.kind in ("normal", "disconnect", "long", "greedy")]
    ok = [r for r in main if not r.error and r.kind != "disconnect"]
    arrivals = [r.t for r in run.reqs if r.kind in ("normal", "disconnect")]
    span = max(arrivals) if arrivals else 0.0
    last_done = max((r.done for r in run.reqs if r.done is not None), default=0.0)
    tokens = sum(len(r.token_times) for r in main)
    # steady window: after the warm-up share, up to the last arrival
    w0 = args.warmup * span if args.warmup < 1 else min(args.warmup, span)
    w1 = span
    steady: Dict[str, Any] = {}
    if w1 > w0:
        stoks = sum(1 for r in main for t in r.token_times if w0 <= t < w1)
        sdone = sum(1 for r in ok if w0 <= (r.done or -1) < w1)
        steady = {"window_s": [round(w0, 2), round(w1, 2)], "requests_s": round(sdone / (w1 - w0), 3),
                  "output_tok_s": round(stoks / (w1 - w0), 2)}
    ttft = [r.first - r.sent for r in ok if r.first is not None]
    e2e = [r.done - r.sent for r in ok if r.done is not None]
    itl = [b - a for r in ok for a, b in zip(r.token_times, r.token_times[1:])]
    tpot = [(r.done - r.first) / (len(r.token_times) - 1) for r in ok
            if r.first is not None and r.done is not None and len(r.token_times) > 1]
    errors: Dict[str, int] = {}
    examples: Dict[str, List[str]] = {}  # up to 3 distinct messages a kind: what the server said
    for r in main:
        if r.error and r.error != CUT:
            errors[r.error] = errors.get(r.error, 0) + 1
            ex = examples.setdefault(r.error, [])
            if r.error_msg and r.error_msg not in ex and len(ex) < 3:
                ex.append(r.error_msg)
    dur = last_done if last_done > 0 else wall
    # Little's law over the whole run: L = (completed / time) x mean time in system
    little = (len(ok) / dur) * (sum(e2e) / len(e2e)) if e2e and dur > 0 else None
    samp = [s for s in run.samples if w0 <= s[0] < w1] or run.samples
    eng = [s[3] for s in samp if s[3] is not None]
    normal = [r for r in ok if r.kind == "normal"]  # the drawn lengths, no fault or greedy request
    out_lens = [len(r.token_times) for r in normal]
    asked = [r.output_len for r in normal]
    usage_out = [r.usage.get("completion_tokens") for r in normal if r.usage and r.usage.get("completion_tokens")]
    usage_in = [(r.usage.get("prompt_tokens"), r.prompt_len) for r in normal
                if r.usage and r.usage.get("prompt_tokens")]
    kinds: Dict[str, Dict[str, int]] = {}
    for r in main:
        k = kinds.setdefault(r.kind, {"scheduled": 0, "ok": 0, "tokens": 0})
        k["scheduled"] += 1
        k["ok"] += 0 if r.error else 1
        k["tokens"] += len(r.token_times)
    s: Dict[str, Any] = {
        "requests": {"scheduled": len(main), "completed": len(ok),
                     "disconnected": sum(1 for r in main if r.kind == "disconnect" and not r.error),
                     "disconnect_scheduled": sum(1 for r in main if r.kind == "disconnect"),
                     "failed": sum(errors.values()), "cut": sum(1 for r in main if r.error == CUT),
                     "by_kind": kinds},
        "offered_rate": round(len(arrivals) / span, 3) if span > 0 else None,
        "duration_s": round(dur, 3),
        "throughput": {"requests_s": round(len(ok) / dur, 3) if dur else None,
                       "output_tok_s": round(tokens / dur, 2) if dur else None, "output_tokens": tokens},
        "steady": steady,
        "ttft_ms": dist_summary(ttft), "itl_ms": dist_summary(itl), "tpot_ms": dist_summary(tpot),
        "e2e_ms": dist_summary(e2e),
        "concurrency": {
            "little": _r(little),
            "sampled_in_flight": _r(sum(x[1] for x in samp) / len(samp)) if samp else None,
            "sampled_decoding": _r(sum(x[2] for x in samp) / len(samp)) if samp else None,
            "sampled_max": max((x[1] for x in samp), default=0), "samples": len(samp),
            # in-process: the engine's scheduler's active requests (its running
            # batch, prefilling or decoding), sampled with the others
            "engine_active": _r(sum(eng) / len(eng)) if eng else None,
        },
        "lengths": {"output_tokens_mean": _r(sum(out_lens) / len(out_lens)) if out_lens else None,
                    "output_asked_mean": _r(sum(asked) / len(asked)) if asked else None,
                    "usage_completion_tokens_mean": _r(sum(usage_out) / len(usage_out)) if usage_out else None,
                    "usage_prompt_tokens_per_asked": _r(sum(a for a, _ in usage_in) / sum(b for _, b in usage_in))
                    if usage_in else None},
        "errors": errors,
        "error_examples": examples,
    }
    bad = [r for r in run.reqs if r.kind == "bad"]
    if bad:
        b = bad[0]
        after = [r for r in ok if r.sent > (b.done or b.sent)]
        s["bad_request"] = {"status": b.status, "error": b.error,
                            "got_4xx": b.status is not None and 400 <= b.status < 500,
                            "completed_after": len(after)}
    longs = [r for r in run.reqs if r.kind == "long"]
    if longs:
        r = longs[0]
        s["long_prompt"] = {"prompt_len": r.prompt_len, "error": r.error, "tokens": len(r.token_times),
                            "ttft_ms": _r(r.first - r.sent, 1e3) if r.first is not None else None,
                            "usage": r.usage}
    return s


def output_of(r: Req) -> Any:
    """What the greedy checks compare: the token ids where the server sent
    them (llamacpp), else the text (or the in-process driver's ids); None
    for a request that failed."""
    if r.error:
        return None
    return r.tok_ids if r.tok_ids is not None else r.text


def greedy_outputs(run: Run) -> Dict[str, Any]:
    g = [r for r in run.reqs if r.kind == "greedy"]
    return {str(i): output_of(r) for i, r in enumerate(g)}


def rate_key(rate: Phase) -> str:
    return str(rate) if isinstance(rate, Closed) else f"{rate:g}"


def greedy_compare(args: argparse.Namespace, got: Dict[str, Any], alone: bool = False) -> Dict[str, Any]:
    """The greedy outputs against the reference file: against its phase of
    the same rate where it has one (a --rates reference), else its outputs;
    alone: against the outputs it sent alone after its last phase."""
    with open(args.greedy_check) as f:
        ref = json.load(f)
    if alone:
        outs = ref.get("alone") or {}
    else:
        key = rate_key(Closed(args.closed) if getattr(args, "closed", 0) else args.rate)
        outs = (ref.get("by_rate") or {}).get(key) or ref.get("outputs", {})
    # a request that failed or was cut, here or in the reference run, has
    # no output to compare: missing, not different
    missing = [k for k in got if got[k] is None or outs.get(k) is None]
    same = [k for k in got if k in outs and got[k] is not None and got[k] == outs[k]]
    diff = [k for k in got if k not in same and k not in missing]
    return {"reference": args.greedy_check, "compared": len(got), "identical": len(same), "different": diff,
            "missing": missing, "endpoint_ok": ref.get("endpoint") == args.endpoint,
            "ok": bool(got) and not diff and not missing and ref.get("endpoint") == args.endpoint}


def print_table(s: Dict[str, Any], st: Optional[Dict[str, Any]]) -> None:
    rq, th = s["requests"], s["throughput"]

    def row(name: str, d: Dict[str, Any]) -> str:
        f = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
        return f"  {name:<10} p50 {f(d['p50']):>9}  p99 {f(d['p99']):>9}  mean {f(d['mean']):>9}  (n={d['n']})"

    print(f"requests: {rq['completed']} completed of {rq['scheduled']}, {rq['disconnected']} disconnected "
          f"on purpose, {rq['failed']} failed" + (f", {rq['cut']} cut at the drain timeout" if rq["cut"] else "")
          + f"; offered {s['offered_rate']} req/s over {s['duration_s']} s")
    print(f"throughput: {th['requests_s']} req/s, {th['output_tok_s']} output tok/s"
          + (f"; steady {s['steady']['requests_s']} req/s, {s['steady']['output_tok_s']} tok/s "
             f"in {s['steady']['window_s']} s" if s["steady"] else ""))
    print("latency (ms):")
    for k in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"):
        print(row(k[:-3].upper(), s[k]))
    c = s["concurrency"]
    print(f"concurrency: Little {c['little']}, sampled in flight {c['sampled_in_flight']} "
          f"(with a first token {c['sampled_decoding']}, max {c['sampled_max']})"
          + (f", engine's active requests {c['engine_active']}" if c.get("engine_active") is not None else ""))
    if s["errors"]:
        print("errors: " + ", ".join(f"{k} {v}" for k, v in sorted(s["errors"].items())))
        for k, ex in sorted(s.get("error_examples", {}).items()):
            for m in ex:
                print(f"  example {k}: {m}")
    if "bad_request" in s:
        b = s["bad_request"]
        print(f"bad request: HTTP {b['status']} ({'4xx as expected' if b['got_4xx'] else 'NOT a 4xx'}), "
              f"{b['completed_after']} requests completed after it")
    if "long_prompt" in s:
        lp = s["long_prompt"]
        print(f"long prompt ({lp['prompt_len']} words): {lp['tokens']} tokens, TTFT {lp['ttft_ms']} ms, "
              f"error {lp['error']}")
    if "greedy" in s and "recorded" in s["greedy"]:
        g = s["greedy"]
        print(f"greedy: {g['compared']} outputs recorded to {g['recorded']}"
              + ("" if g.get("ok") else " (some requests failed)"))
    elif "greedy" in s:
        g = s["greedy"]
        print(f"greedy: {g.get('identical')} of {g.get('compared')} identical to {g.get('reference')}"
              + (f"; DIFFERENT: {g['different']}" if g.get("different") else "")
              + (f"; no output here or in the reference (failed or cut): {g['missing']}"
                 if g.get("missing") else "")
              + ("" if g.get("endpoint_ok", True) else "; the reference is of another endpoint"))
    if st:
        print(f"shim ({st['scope']}): steps {st['steps']:.0f}, hit rate {st['hit_rate']}, PCIe bytes/step "
              f"{st['pcie_bytes_per_step']}, read multiplicity max {st['read_multiplicity_max']}, "
              f"events dropped {st['events_dropped']:.0f} (watched {st['events_dropped_watched']:.0f})")


def machine() -> Dict[str, Any]:
    return {"host": socket.gethostname(), "python": platform.python_version(),
            "date": datetime.datetime.now().isoformat(timespec="seconds")}


# ----------------------------------------------------------------------------


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("target")
    g.add_argument("--url", default="http://127.0.0.1:8000", help="server base URL (default %(default)s)")
    g.add_argument("--model", default="default", help="the request's model field")
    g.add_argument("--endpoint", choices=("chat", "completions", "native"), default=None,
                   help="/v1/chat/completions (default; transformers serve has only this one), /v1/completions "
                        "(the default of --server-kind llamacpp) or llama-server's own /completion (native)")
    g.add_argument("--server-kind", choices=("openai", "llamacpp"), default="openai",
                   help="llamacpp: llama.cpp's llama-server: asks for token ids in every streamed chunk, counts "
                        "tokens by them and compares greedy outputs as ids (module docstring)")
    g.add_argument("--api-key", help="sent as a bearer token")
    g.add_argument("--inprocess", metavar="MODEL_SPEC",
                   help="no server: drive transformers' continuous batching in this process "
                        "(bench/serve_engine.py; e2e:moe, e2e:moe8, e2e:dense or a checkpoint path)")
    g.add_argument("--cb-max-batch-tokens", type=int, default=512, help="--inprocess: max tokens a step")
    g.add_argument("--cb-num-blocks", type=int, default=None, help="--inprocess: paged KV cache blocks")
    g.add_argument("--cb-graphs", choices=("default", "on", "off"), default="default",
                   help="--inprocess: CUDA graphs of the continuous-batching manager")
    g = p.add_argument_group("load")
    g.add_argument("--rate", type=float, default=None, help="Poisson arrivals, requests/s (default 1)")
    g.add_argument("--rates", type=parse_rates, metavar="R1,R2,...",
                   help="phases one after another on the same server or engine (one model load), each "
                        "--duration (or --requests) long at its rate, with its own report and shim-stats "
                        "delta; the JSON holds a list of phase reports. cN is a closed loop: N requests in "
                        "flight for --duration, each that ends followed at once by the next (the "
                        "server's throughput at N concurrent requests)")
    g.add_argument("--duration", type=float, default=60.0, help="seconds of arrivals (a phase's, with --rates)")
    g.add_argument("--requests", type=int, help="this many arrivals instead of --duration")
    g.add_argument("--drain-timeout", type=float, default=0.0, metavar="S",
                   help="after the last arrival wait at most S seconds for requests in flight, then close "
                        "them (counted as cut, not as errors); 0 (default): wait for every request. Past "
                        "saturation the queue an open loop builds takes long to drain: this bounds a phase")
    g.add_argument("--idle-wait", type=float, default=0.0, metavar="S",
                   help="with --metrics-url: before each phase after the first and before the greedy check "
                        "sent alone, wait at most S seconds for the server to be idle (wait_idle: a backlog "
                        "the drain timeout closed is still served); 0 (default): do not wait")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--prompt-len", type=parse_dist, default=parse_dist("uniform:64:512"),
                   help="prompt words (about tokens): fixed:N, uniform:A:B, lognormal:MEAN:SIGMA[:MIN:MAX]")
    g.add_argument("--output-len", type=parse_dist, default=parse_dist("fixed:128"), help="max_tokens, same forms")
    g.add_argument("--min-tokens", action="store_true",
                   help="send min_tokens = max_tokens (vLLM, SGLang; transformers serve refuses unknown keys)")
    g.add_argument("--ignore-eos", action="store_true", help="send ignore_eos: true (vLLM, SGLang)")
    g.add_argument("--include-usage", action="store_true", help="send stream_options.include_usage")
    g.add_argument("--extra-body", type=json.loads, default={}, metavar="JSON", help="merged into every request body")
    g.add_argument("--warmup-requests", type=int, default=2, help="sequential requests before the clock starts")
    g.add_argument("--warmup", type=float, default=0.1,
                   help="steady window starts after this share of the arrival span (<1) or seconds (>=1)")
    g.add_argument("--request-timeout", type=float, default=600.0)
    g = p.add_argument_group("faults (issue 20, soak)")
    g.add_argument("--disconnect-frac", type=float, default=0.0, help="share of clients that close mid-stream")
    g.add_argument("--burst", type=parse_burst, help="MULTx@T:D: MULT times the rate from T for D seconds")
    g.add_argument("--long-prompt", type=int, default=0, metavar="N", help="one request with an N-word prompt")
    g.add_argument("--bad-request", action="store_true", help="one request with invalid parameters (expects a 4xx)")
    g.add_argument("--greedy-n", type=int, default=8, help="greedy prompts of --greedy-check/--record-greedy")
    g.add_argument("--record-greedy", metavar="FILE", help="write the greedy prompts' outputs (reference run)")
    g.add_argument("--greedy-check", metavar="FILE", help="compare the greedy prompts' outputs with FILE")
    g.add_argument("--greedy-load-check", choices=("fail", "report"), default="fail",
                   help="greedy outputs under load that differ: exit 1 (default), or only report them "
                        "(the greedy set sent alone after the last phase still must match)")
    g = p.add_argument_group("soak and stats")
    g.add_argument("--soak-minutes", type=float, help="arrivals for this many minutes (sets --duration)")
    g.add_argument("--report-every", type=float, default=0.0, help="seconds between interval lines (0: none)")
    g.add_argument("--pid", type=int, help="the server's pid: its RSS and GPU memory in the interval lines and "
                                            "in the report's memory samples")
    g.add_argument("--sample-every", type=float, default=None, metavar="S",
                   help="with --pid: RSS and device memory every S seconds into the report (default 1 with --pid; 0: off)")
    g.add_argument("--stats-file", help="the shim's stats JSON (WOFFLOAD_STATS), read before and after")
    g.add_argument("--stats-url", help="a URL serving the shim's stats JSON, read before and after")
    g.add_argument("--metrics-url", metavar="URL",
                   help="the server's Prometheus counters (llama-server --metrics: URL/metrics), sampled each "
                        "second: its step period and processed tokens/s over the steady window")
    g.add_argument("--stats-only", metavar="FILE",
                   help="no load: summarise a stats file (WOFFLOAD_STATS, written when the server exited)")
    g = p.add_argument_group("output")
    g.add_argument("--out", help="write the JSON report here")
    g.add_argument("--save-requests", action="store_true", help="per-request records in the JSON")
    g.add_argument("--verbose", action="store_true")
    a = p.parse_args(argv)
    if a.endpoint is None:
        a.endpoint = "completions" if a.server_kind == "llamacpp" else "chat"
    if a.endpoint == "native" and a.server_kind != "llamacpp":
        p.error("--endpoint native is llama-server's /completion: needs --server-kind llamacpp")
    if a.sample_every is None:  # an explicit --pid only: --inprocess sets its own pid later
        a.sample_every = 1.0 if a.pid else 0.0
    if a.sample_every < 0:
        p.error("--sample-every must be >= 0")
    if a.soak_minutes:
        a.duration = a.soak_minutes * 60.0
    if a.rates is not None and a.rate is not None:
        p.error("--rate and --rates: one or the other")
    if a.rate is None:
        a.rate = next((r for r in a.rates or [] if not isinstance(r, Closed)), 1.0)
    a.closed = 0
    if a.rates and any(isinstance(r, Closed) for r in a.rates):
        if a.burst or a.requests is not None:
            p.error("--rates cN (a closed loop) runs for --duration: no --burst or --requests with it")
        if a.inprocess:
            p.error("--rates cN (a closed loop) needs a server")
    if a.rate <= 0:
        p.error("--rate must be > 0")
    if a.drain_timeout < 0:
        p.error("--drain-timeout must be >= 0")
    if a.idle_wait < 0:
        p.error("--idle-wait must be >= 0")
    if a.idle_wait and not a.metrics_url:
        p.error("--idle-wait reads the server's gauges: it needs --metrics-url")
    if not 0 <= a.disconnect_frac <= 1:
        p.error("--disconnect-frac is a share in [0, 1]")
    if a.greedy_check and a.record_greedy:
        p.error("--greedy-check and --record-greedy: one or the other")
    if a.inprocess and a.bad_request:
        p.error("--bad-request needs a server (--inprocess has no HTTP to reject a request)")
    a.parsed_url = urllib.parse.urlsplit(a.url)
    if not a.inprocess and (a.parsed_url.scheme != "http" or not a.parsed_url.hostname):
        p.error(f"--url {a.url}: expected http://HOST[:PORT]")
    a.engine = None
    a.engine_factory = None  # tests: an engine around a fake manager (serve_engine.Engine.around)
    return a


def phase_args(args: argparse.Namespace, k: int, rate: float) -> argparse.Namespace:
    """Phase k's options: its rate, and its own seed (args.seed + 1000 k),
    so that phases do not send the same prompts again (an engine's prefix
    cache would serve them); phase 0 is a single run's schedule."""
    p = copy.copy(args)
    if isinstance(rate, Closed):
        p.closed = rate.n
    else:
        p.rate, p.closed = rate, 0
    p.seed = args.seed + 1000 * k
    return p


async def closed_worker(run: Run, driver: Any, rng: random.Random, idx: Iterator[int]) -> None:
    """One of a closed loop's N clients: sends the seed's next request as
    soon as its last one ended, until --duration. The workers share `rng`,
    so the i-th request sent is the seed's i-th draw whichever worker sends
    it (its arrival time is when it was sent). A drain timeout cancels the
    request in flight (one() records it as cut); the loop then ends."""
    args = run.args
    while run.now() < args.duration:
        r = draw_request(args, rng, next(idx), run.now())
        if args.engine is not None:
            args.engine.prepare(r)
        run.reqs.append(r)
        await one(run, r, driver)


async def wait_idle(args: argparse.Namespace) -> Optional[Dict[str, Any]]:
    """--idle-wait S with --metrics-url (llama-server): wait until the server
    is idle, at most S seconds, before the next phase or the greedy check.
    An open loop past saturation leaves a backlog that a drain timeout
    closes on the client's side only: llama-server still takes the closed
    requests that wait in its accept queue, reads their bodies and runs
    their prompts (it sees the client gone at their first token), so the
    next phase would start behind them and a greedy request "alone" would
    share its steps with them. Idle: no request processing or deferred and
    no decode call for two polls in a row (one second)."""
    if not args.idle_wait or not args.metrics_url:
        return None
    src = MetricsSampler(args.metrics_url, 0.5, 0.0)
    t0 = time.perf_counter()
    quiet, last_dec, m = 0, None, None
    while True:
        m = src.get()
        if m is None:
            return {"idle": None, "waited_s": _r(time.perf_counter() - t0), "error": src.error}
        busy = m.get(src.PREFIX + "requests_processing", 0.0) + m.get(src.PREFIX + "requests_deferred", 0.0)
        dec = m.get(src.PREFIX + "n_decode_total", 0.0)
        quiet = quiet + 1 if busy == 0 and dec == last_dec else 0
        last_dec = dec
        waited = time.perf_counter() - t0
        if quiet >= 2 or waited >= args.idle_wait:
            break
        await asyncio.sleep(0.5)
    out = {"idle": quiet >= 2, "waited_s": _r(waited),
           "processing": m.get(src.PREFIX + "requests_processing"),
           "deferred": m.get(src.PREFIX + "requests_deferred")}
    if out["idle"]:
        print(f"server idle after {out['waited_s']} s", flush=True)
    else:
        print(f"server still busy after {out['waited_s']} s (--idle-wait): {out['processing'] or 0:g} "
              f"processing, {out['deferred'] or 0:g} deferred", flush=True)
    return out


async def run_phase(args: argparse.Namespace, driver: Any) -> Tuple[Dict[str, Any], int]:
    """One schedule at args.rate from start to the last completion (or the
    drain timeout): the report of one run, and its exit status."""
    closed = getattr(args, "closed", 0)
    # a closed loop draws its requests as it sends them; its fault and check
    # requests come at their shares of --duration, as an open loop's do
    reqs = sorted(extras(args, args.duration), key=lambda r: r.t) if closed else schedule(args)
    if args.engine is not None:
        for r in reqs:
            args.engine.prepare(r)
    before = read_stats(args)
    run = Run(args, reqs)
    stop = asyncio.Event()
    run.t0 = time.perf_counter()
    mem = MemSampler(args.pid, args.sample_every, run.t0) if args.pid and args.sample_every > 0 else None
    if mem is not None:
        mem.start()
    met = MetricsSampler(args.metrics_url, 1.0, run.t0) if args.metrics_url and args.engine is None else None
    if met is not None:
        met.start()
    bg = [asyncio.ensure_future(run.sampler(stop))]
    if args.report_every > 0:
        bg.append(asyncio.ensure_future(reporter(run, stop)))
    tasks = []
    if closed:
        rng, idx = random.Random(args.seed), itertools.count(len(reqs))  # shared: one sequence
        tasks = [asyncio.ensure_future(closed_worker(run, driver, rng, idx)) for _ in range(closed)]
    for r in list(reqs):
        delay = r.t - run.now()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(one(run, r, driver)))  # open loop: never awaited here
    if closed:
        await asyncio.sleep(max(0.0, args.duration - run.now()))
    if args.drain_timeout > 0 and tasks:
        _, pending = await asyncio.wait(tasks, timeout=args.drain_timeout)
        for t in pending:
            t.cancel()  # one() records the request as cut
    await asyncio.gather(*tasks)
    wall = run.now()
    stop.set()
    await asyncio.gather(*bg)
    if args.stats_file and not args.engine:
        time.sleep(0.2)
    after = read_stats(args)
    summary = summarise(run, wall)
    shim = stats_report(before, after)
    rc = 0
    if args.record_greedy:
        summary["greedy"] = {"recorded": args.record_greedy, "compared": len(greedy_outputs(run)),
                             "ok": all(v is not None for v in greedy_outputs(run).values())}
    if args.greedy_check:
        g = summary["greedy"] = greedy_compare(args, greedy_outputs(run))
        # tokens differ (a missing output is an error counted above); under
        # load a batched kernel may differ without the shim being at fault
        # (greedy_alone), so --greedy-load-check report leaves it to that check
        if (g["different"] or not g["endpoint_ok"]) and args.greedy_load_check == "fail":
            rc = 1
    if "bad_request" in summary and not (summary["bad_request"]["got_4xx"]
                                         and summary["bad_request"]["completed_after"] > 0):
        rc = 1
    print_table(summary, shim)
    rep: Dict[str, Any] = {"summary": summary, "shim": shim, "intervals": run.intervals,
                           "greedy_outputs": greedy_outputs(run)}
    if mem is not None:
        rep["memory"] = mem.report()
        m = rep["memory"]
        print(f"memory: {len(m['samples'])} samples of pid {m['pid']} every {m['every_s']} s, device memory from "
              f"{m['gpu_source']}" + "".join(f"; {k} {m[k]['min']}-{m[k]['max']} (spread {m[k]['spread']})"
                                             for k in ("rss_kib", "gpu_pid_mib") if k in m), flush=True)
    if met is not None:
        rep["server"] = met.report((summary.get("steady") or {}).get("window_s"))
        print_server(rep["server"])
    if before is not None and run.intervals:
        rep["interval_base"] = shim_counters(before)
    if args.save_requests:
        rep["requests"] = [{"i": r.idx, "kind": r.kind, "t": round(r.t, 4), "prompt_len": r.prompt_len,
                            "max_tokens": r.output_len, "sent": _r(r.sent), "first": _r(r.first),
                            "done": _r(r.done), "tokens": len(r.token_times), "status": r.status,
                            "error": r.error, "usage": r.usage} for r in run.reqs]
    return rep, rc


def write_greedy(args: argparse.Namespace, by_rate: Dict[str, Any]) -> None:
    """The reference file: "outputs" is the first phase's (what a single run
    checks against), "by_rate" every phase's."""
    with open(args.record_greedy, "w") as f:
        json.dump({"endpoint": args.endpoint, "model": args.model, "prompt_len": GREEDY_PROMPT_LEN,
                   "max_tokens": GREEDY_OUTPUT_LEN, "outputs": next(iter(by_rate.values())),
                   **({"by_rate": by_rate} if args.rates else {})}, f, indent=1)


async def main_async(args: argparse.Namespace) -> int:
    if args.inprocess:
        if args.pid is None:  # the engine is this process: its RSS in the interval lines
            args.pid = os.getpid()
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import serve_engine  # torch and transformers: only on this path
        args.engine = (args.engine_factory or serve_engine.Engine)(args)
        driver = args.engine.request
    else:
        driver = http_request
    werr = await warm_up(args, driver)
    if werr and len(werr) == args.warmup_requests:
        sys.stderr.write(f"serve.py: every warm-up request failed ({', '.join(werr)}); is the server up at "
                         f"{args.url}?\n")
        if args.engine is not None:
            args.engine.close()
        return 2
    config = {k: (v.spec if isinstance(v, Dist) else v) for k, v in vars(args).items()
              if k not in ("parsed_url", "engine", "engine_factory")}
    if args.rates:
        config["rates"] = [rate_key(r) for r in args.rates]
    report: Dict[str, Any] = {"config": config, "machine": machine()}
    if args.engine is not None:
        report["engine"] = args.engine.describe()
    rc = 0
    phases: List[Dict[str, Any]] = []
    greedy_by_rate: Dict[str, Any] = {}
    for k, rate in enumerate(args.rates or [args.rate]):
        pargs = phase_args(args, k, rate)
        idle = await wait_idle(args) if k > 0 else None
        if args.rates:
            what = f"{rate.n} requests in flight (closed loop)" if isinstance(rate, Closed) else f"{rate:g} requests/s"
            print(f"=== phase {k + 1} of {len(args.rates)}: {what}, seed {pargs.seed}", flush=True)
        rep, prc = await run_phase(pargs, driver)
        if idle is not None:
            rep["idle_before"] = idle
        rc = max(rc, prc)
        outs = rep.pop("greedy_outputs")
        if args.record_greedy:
            greedy_by_rate[rate_key(rate)] = outs
            write_greedy(args, greedy_by_rate)
        if args.rates:
            kind = {"rate": None, "closed": rate.n} if isinstance(rate, Closed) else {"rate": rate}
            phases.append({"phase": k + 1, **kind, "seed": pargs.seed, **rep})
            report["phases"] = phases
        else:
            report.update(rep)
        if args.out:  # after every phase: a run cut off later keeps its finished phases
            with open(args.out, "w") as f:
                json.dump(report, f, indent=1)
    if args.record_greedy or args.greedy_check:
        idle = await wait_idle(args)
        alone, busy = await greedy_alone(args, driver)
        if args.record_greedy:
            with open(args.record_greedy) as f:
                rec = json.load(f)
            rec["alone"] = alone
            with open(args.record_greedy, "w") as f:
                json.dump(rec, f, indent=1)
            report["greedy_alone"] = {"recorded": args.record_greedy, "compared": len(alone),
                                      "ok": all(v is not None for v in alone.values())}
        else:
            report["greedy_alone"] = greedy_compare(args, alone, alone=True)
            if not report["greedy_alone"]["ok"]:
                rc = max(rc, 1)
        g = report["greedy_alone"]
        g["request_s"] = busy
        if idle is not None:
            g["idle_before"] = idle
        how = "one at a time" if args.server_kind == "llamacpp" else "together"
        print(f"greedy alone (the {len(alone)} prompts {how}, nothing else in flight): "
              + (f"recorded to {g['recorded']}" if "recorded" in g
                 else f"{g['identical']} of {g['compared']} identical to {g['reference']}"), flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(report, f, indent=1)
    if args.engine is not None:
        args.engine.close()
    return rc


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    if args.stats_only:
        with open(args.stats_only) as f:
            rep = stats_report(None, json.load(f))
        print(json.dumps(rep, indent=1))
        return 0
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
