#!/usr/bin/env python3
"""Tests of bench/serve.py --server-kind llamacpp, bench/serve-faults.py and
bench/serve-plot.py (issue 40) against a fake of llama.cpp's llama-server
written here, run as a process of its own (the fault checks signal it and
start it again):

    python3 tests/test-serve-llamacpp.py                 (the tests, ~40 s)
    python3 tests/test-serve-llamacpp.py --fake PORT [--slots N] [--leak] [--bad-status S]
        [--term-delay S] [--salt X] [--load-s S] [--stream-error-every N]
    [--term-waits-for-clients] [--need-body-key K] [--metrics]   (the fake alone)

The fake follows llama-server at 34af94cd (tools/server/server-context.cpp,
server-task.cpp): --slots requests decode at once, the others wait; each
sampled token is one SSE event `data: {...}\\n\\n` in a chunked body; on
/v1/completions a partial is {"choices": [{"text", "index", "logprobs",
"finish_reason": null}], "object": "text_completion", ...} with
"__verbose": {"content", "tokens": [id], "stop": false, ...} when the
request asked "verbose": true; the final event carries finish_reason and
"usage", then `data: [DONE]`; the native /completion sends
{"content", "tokens": [id], "stop": false, "id_slot"} a token and a final
{"stop": true, "tokens": []} with no [DONE]. Every fifth token's text is
empty (llama-server holds back a token that ends inside a UTF-8 character
or may start a stop string). Invalid parameters (a max_tokens below -1, a
non-number temperature) get 400 {"error": {"code": 400, "message",
"type": "invalid_request_error"}}; GET /health is 503 while "loading"
(--load-s), then 200; GET /slots lists {"id", "is_processing"}. A client
that goes away frees its slot at the next token it would have been sent
(--leak: never, the bug the disconnect check is there to see). With
--stream-error-every N every Nth request gets, after two tokens, an event
{"error": {"code": 500, "message", "type"}} and the end of the body (a
200 stream that fails, as llama-server reports a task's failure). SIGTERM:
stops accepting, exits after --term-delay seconds (default 0.2); with
--term-waits-for-clients it stops sending tokens and exits only once every
open stream's client has closed it (llama-server at 34af94cd: SIGTERM ends
its decode loop, but each open stream's handler polls its connection until
the client goes; server.cpp, server-queue.cpp). --need-body-key K answers
400 to a body without K (a setting that must reach every request).
--metrics serves GET /metrics as llama-server --metrics does (Prometheus
text, `llamacpp:` counters: prompt tokens counted once a prompt is
processed, generated tokens once a request ends, a "decode" for each
prefill and each token sent, and the mean busy slots a decode); without
it /metrics is llama-server's 501.
Tokens are a function of the prompt, the index and --salt only.
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(SRC, "bench")
PREFILL = 0.030
ITL = 0.008
SLOTS = 4


# ----------------------------------------------------------------------------
# the fake llama-server


class Fake:
    def __init__(self, slots: int, leak: bool, bad_status: int, salt: str, load_s: float) -> None:
        self.lock = threading.Lock()
        self.free = list(range(slots))
        self.busy = [False] * slots
        self.cv = threading.Condition(self.lock)
        self.leak, self.bad_status, self.salt = leak, bad_status, salt
        self.ready_at = time.monotonic() + load_s
        self.error_every, self.served = 0, 0  # --stream-error-every: a streamed error every Nth request
        # --term-waits-for-clients: at SIGTERM decoding stops, but the process
        # exits only once no stream is open (llama-server at 34af94cd)
        self.wait_clients, self.terminating, self.open = False, False, 0
        self.need_key = ""  # --need-body-key: a 400 for a body without it
        self.metrics = False  # --metrics: GET /metrics
        self.n_prompt, self.n_predicted, self.n_decode, self.n_busy = 0, 0, 0, 0
        self.waiting = 0  # requests with no slot yet (llama-server's deferred tasks)

    def decoded(self) -> None:
        """One "llama_decode" (caller holds the lock): a prefill or a token."""
        self.n_decode += 1
        self.n_busy += sum(self.busy)

    def prometheus(self) -> str:
        with self.lock:
            counters = [("prompt_tokens_total", self.n_prompt), ("tokens_predicted_total", self.n_predicted),
                        ("n_decode_total", self.n_decode)]
            gauges = [("n_busy_slots_per_decode", self.n_busy / max(self.n_decode, 1)),
                      ("requests_processing", sum(self.busy)), ("requests_deferred", self.waiting)]
        out = []
        for kind, items in (("counter", counters), ("gauge", gauges)):
            for name, v in items:
                out += [f"# HELP llamacpp:{name} fake", f"# TYPE llamacpp:{name} {kind}",
                        f"llamacpp:{name} {float(v):g}"]
        return "\n".join(out) + "\n"

    def token(self, prompt: str, i: int) -> int:
        h = 7
        for ch in self.salt + prompt + f"#{i}":
            h = (h * 131 + ord(ch)) % 1000003
        return h % 32000

    def take(self) -> int:
        with self.cv:
            self.waiting += 1
            while not self.free:
                self.cv.wait()
            self.waiting -= 1
            s = self.free.pop(0)
            self.busy[s] = True
            return s

    def give(self, s: int) -> None:
        with self.cv:
            self.busy[s] = False
            self.free.append(s)
            self.cv.notify()


FAKE: Fake = None  # type: ignore


def bad_params(body: dict) -> str:
    mt = body.get("max_tokens", body.get("n_predict"))
    if mt is not None and (not isinstance(mt, int) or isinstance(mt, bool) or mt < -1):
        return f"Field 'n_predict': Value must be between -1 <= value <= 2147483647, but got {mt}"
    t = body.get("temperature")
    if t is not None and (not isinstance(t, (int, float)) or isinstance(t, bool)):
        return "Field 'temperature': type must be number, but is string"
    if not isinstance(body.get("prompt"), str):
        return '"prompt" is required'
    return ""


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a) -> None:
        pass

    def send_json(self, code: int, obj) -> None:
        b = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)

    def do_GET(self) -> None:
        if time.monotonic() < FAKE.ready_at and self.path == "/health":
            self.send_json(503, {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}})
        elif self.path == "/health":
            self.send_json(200, {"status": "ok"})
        elif self.path == "/metrics" and FAKE.metrics:
            b = FAKE.prometheus().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(b)))
            self.end_headers()
            self.wfile.write(b)
        elif self.path == "/metrics":
            self.send_json(501, {"error": {"code": 501, "type": "not_supported_error",
                                           "message": "This server does not support metrics endpoint. "
                                                      "Start it with `--metrics`"}})
        elif self.path == "/slots":
            with FAKE.lock:
                self.send_json(200, [{"id": i, "n_ctx": 4096, "is_processing": b} for i, b in enumerate(FAKE.busy)])
        else:
            self.send_json(404, {"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}})

    def event(self, obj) -> None:
        data = b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def do_POST(self) -> None:
        n = int(self.headers.get("Content-Length", "0"))
        raw = self.rfile.read(n)
        if self.path not in ("/v1/completions", "/completion", "/completions"):
            self.send_json(404, {"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}})
            return
        try:
            body = json.loads(raw)
        except ValueError as e:  # llama-server: json::parse throws, not an invalid_argument: a 500
            self.send_json(500, {"error": {"code": 500, "message": str(e), "type": "server_error"}})
            return
        why = bad_params(body) if isinstance(body, dict) else '"prompt" is required'
        if not why and FAKE.need_key and FAKE.need_key not in body:
            why = f"this fake wants \"{FAKE.need_key}\" in every body (--need-body-key)"
        if why:
            code = FAKE.bad_status
            self.send_json(code, {"error": {"code": code, "message": why,
                                            "type": "invalid_request_error" if code < 500 else "server_error"}})
            return
        oai = self.path == "/v1/completions"
        n_out = body.get("max_tokens", body.get("n_predict", 16))
        n_out = 16 if n_out in (None, -1) else n_out
        verbose = bool(body.get("verbose"))
        prompt = body["prompt"]
        slot = FAKE.take()
        with FAKE.lock:
            FAKE.open += 1
            FAKE.served += 1
            fail_at = 2 if FAKE.error_every and FAKE.served % FAKE.error_every == 0 else -1
        freed, sent = False, 0
        try:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.wfile.flush()
            time.sleep(PREFILL)
            with FAKE.lock:
                FAKE.n_prompt += len(prompt.split())
                FAKE.decoded()
            failed = False
            for i in range(n_out):
                if i:
                    time.sleep(ITL)
                while FAKE.terminating and FAKE.wait_clients:  # no more tokens; the stream stays open
                    if client_gone(self.connection):
                        raise ConnectionResetError("the client left")
                    time.sleep(0.05)
                if i == fail_at:  # an error inside the 200 stream, as llama-server sends one
                    self.event({"error": {"code": 500, "message": f"fake stream failure at token {i}",
                                          "type": "server_error"}})
                    failed = True
                    break
                tok = FAKE.token(prompt, i)
                with FAKE.lock:
                    FAKE.decoded()
                sent += 1
                text = "" if i % 5 == 4 else f" w{tok}"
                native = {"index": 0, "content": text, "tokens": [tok], "stop": False, "id_slot": slot,
                          "tokens_predicted": i + 1, "tokens_evaluated": len(prompt.split())}
                if oai:
                    ev = {"choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": None}],
                          "created": int(time.time()), "model": "fake", "system_fingerprint": "b0-fake",
                          "object": "text_completion", "id": "cmpl-fake"}
                    if verbose:
                        ev["__verbose"] = native
                    self.event(ev)
                else:
                    self.event(native)
            if failed:
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
                return
            final = {"index": 0, "content": "", "tokens": [], "id_slot": slot, "stop": True,
                     "tokens_predicted": n_out, "tokens_evaluated": len(prompt.split()), "stop_type": "limit"}
            if oai:
                ev = {"choices": [{"text": "", "index": 0, "logprobs": None, "finish_reason": "length"}],
                      "object": "text_completion", "id": "cmpl-fake", "model": "fake",
                      "usage": {"completion_tokens": n_out, "prompt_tokens": len(prompt.split()),
                                "total_tokens": n_out + len(prompt.split())}}
                if verbose:
                    ev["__verbose"] = final
                self.event(ev)
                d = b"data: [DONE]\n\n"
                self.wfile.write(b"%x\r\n%s\r\n" % (len(d), d))
            else:
                self.event(final)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            if FAKE.leak:
                freed = True  # the bug: the slot stays busy
        finally:
            if not freed:
                FAKE.give(slot)
            with FAKE.lock:
                FAKE.open -= 1
                FAKE.n_predicted += sent  # llama-server: at the slot's reset, the request's end
        self.close_connection = True


def client_gone(sock) -> bool:
    """The peer closed its end: readable, and a peek reads nothing."""
    import select
    try:
        r, _, _ = select.select([sock], [], [], 0)
        return bool(r) and sock.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def run_fake(argv) -> int:
    global FAKE
    import argparse
    p = argparse.ArgumentParser()
    p.add_argument("--fake", type=int, required=True, metavar="PORT")
    p.add_argument("--slots", type=int, default=SLOTS)
    p.add_argument("--leak", action="store_true")
    p.add_argument("--bad-status", type=int, default=400)
    p.add_argument("--term-delay", type=float, default=0.2)
    p.add_argument("--salt", default="")
    p.add_argument("--load-s", type=float, default=0.3)
    p.add_argument("--stream-error-every", type=int, default=0)
    p.add_argument("--term-waits-for-clients", action="store_true")
    p.add_argument("--need-body-key", default="")
    p.add_argument("--metrics", action="store_true")
    a = p.parse_args(argv)
    FAKE = Fake(a.slots, a.leak, a.bad_status, a.salt, a.load_s)
    FAKE.error_every = a.stream_error_every
    FAKE.wait_clients = a.term_waits_for_clients
    FAKE.need_key = a.need_body_key
    FAKE.metrics = a.metrics
    srv = Server(("127.0.0.1", a.fake), Handler)

    def on_term(*_):
        FAKE.terminating = True
        threading.Thread(target=srv.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, on_term)
    srv.serve_forever(poll_interval=0.05)
    while FAKE.wait_clients and FAKE.open > 0:
        time.sleep(0.02)
    time.sleep(a.term_delay)  # llama-server's own stop: slots cancelled, the stats written
    os._exit(0)


# ----------------------------------------------------------------------------
# the tests


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def fake_cmd(port: int, *opts: str) -> list:
    return [sys.executable, os.path.abspath(__file__), "--fake", str(port), *opts]


def fake_server_bin(bindir: str) -> None:
    """bindir/llama-server: the fake, taking llama-server's --port and
    --parallel (and --version), its own options from $FAKE_OPTS."""
    os.makedirs(bindir, exist_ok=True)
    path = os.path.join(bindir, "llama-server")
    with open(path, "w") as f:
        f.write("#!/bin/sh\nport=8080; par=4\n"
                "while [ $# -gt 0 ]; do case \"$1\" in --port) port=$2; shift;; --parallel) par=$2; shift;;"
                " --metrics) FAKE_OPTS=\"$FAKE_OPTS --metrics\";;"
                " --version) echo 'version: 0 (fake)'; exit 0;; esac; shift; done\n"
                f"exec {sys.executable} {os.path.abspath(__file__)} --fake $port --slots $par $FAKE_OPTS\n")
    os.chmod(path, 0o755)


def start_fake(port: int, *opts: str) -> subprocess.Popen:
    # no inherited stdout: a fake left behind must not hold the test's pipe open
    proc = subprocess.Popen(fake_cmd(port, *opts), start_new_session=True, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 15:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("the fake did not start")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def py(script: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, os.path.join(BENCH, script), *args], capture_output=True, text=True,
                          timeout=timeout)


class TestLoad(unittest.TestCase):
    """serve.py against the fake: tokens counted by ids (empty texts too),
    a two-rate sweep, the memory samples of the server's pid, greedy ids
    recorded and checked, the 400 of --bad-request."""

    @classmethod
    def setUpClass(cls) -> None:
        cls.tmp = tempfile.mkdtemp(prefix="test-serve-llamacpp-")
        cls.port = free_port()
        cls.proc = start_fake(cls.port, "--metrics")
        cls.addClassCleanup(stop, cls.proc)  # also when the rest of setUpClass fails
        cls.ref = os.path.join(cls.tmp, "greedy.json")
        cls.out = os.path.join(cls.tmp, "sweep.json")
        cls.res = py("serve.py", "--url", f"http://127.0.0.1:{cls.port}", "--server-kind", "llamacpp",
                     "--rates", "5,40", "--duration", "3", "--output-len", "fixed:10", "--prompt-len",
                     "uniform:8:32", "--ignore-eos", "--pid", str(cls.proc.pid), "--sample-every", "0.5",
                     "--record-greedy", cls.ref, "--greedy-n", "3", "--bad-request", "--report-every", "1",
                     "--metrics-url", f"http://127.0.0.1:{cls.port}/metrics", "--out", cls.out)
        if cls.res.returncode != 0 or not os.path.exists(cls.out):
            raise AssertionError("serve.py failed:\n" + cls.res.stdout[-3000:] + cls.res.stderr[-3000:])
        with open(cls.out) as f:
            cls.rep = json.load(f)

    def test_runs(self) -> None:
        self.assertEqual(self.res.returncode, 0, self.res.stdout + self.res.stderr)
        self.assertEqual(len(self.rep["phases"]), 2)

    def test_tokens_counted_by_ids(self) -> None:
        # every fifth token has no text: counted by text, a request would have 8
        for ph in self.rep["phases"]:
            s = ph["summary"]
            self.assertEqual(s["lengths"]["output_tokens_mean"], 10.0, s["lengths"])
            self.assertEqual(s["lengths"]["usage_completion_tokens_mean"], 10.0)
            self.assertEqual(s["errors"], {})

    def test_latencies(self) -> None:
        s = self.rep["phases"][0]["summary"]  # 5 req/s: well below the 4 slots' ~36 req/s
        self.assertGreater(s["ttft_ms"]["p50"], PREFILL * 1e3 * 0.8)
        # upper bounds with room for a loaded CI machine (the server's sleeps run late)
        self.assertLess(s["ttft_ms"]["p50"], PREFILL * 1e3 + 100)
        self.assertGreater(s["itl_ms"]["p50"], ITL * 1e3 * 0.5)
        self.assertLess(s["itl_ms"]["p50"], ITL * 1e3 + 30)
        self.assertTrue(s["steady"]["output_tok_s"] > 0)

    def test_saturation_queues(self) -> None:
        lo, hi = (ph["summary"] for ph in self.rep["phases"])
        self.assertGreater(hi["ttft_ms"]["p99"], lo["ttft_ms"]["p99"])
        self.assertLessEqual(hi["concurrency"]["sampled_max"], 200)

    def test_bad_request_is_4xx(self) -> None:
        for ph in self.rep["phases"]:
            b = ph["summary"]["bad_request"]
            self.assertEqual(b["status"], 400)
            self.assertGreater(b["completed_after"], 0)

    def test_memory_samples(self) -> None:
        m = self.rep["phases"][0]["memory"]
        self.assertEqual(m["pid"], self.proc.pid)
        self.assertEqual(m["columns"], ["t", "rss_kib", "gpu_pid_mib", "gpu_all_mib", "gpu_dev_mib"])
        self.assertGreaterEqual(len(m["samples"]), 5)  # 0.5 s over ~3 s
        self.assertTrue(all(s[1] and s[1] > 1000 for s in m["samples"]))
        ts = [s[0] for s in m["samples"]]
        # fixed ticks: one late sample does not shift the others, so the
        # mean spacing is the period even when a CI machine delays one
        self.assertTrue(all(b > a for a, b in zip(ts, ts[1:])), ts)
        self.assertAlmostEqual((ts[-1] - ts[0]) / (len(ts) - 1), 0.5, delta=0.15)
        self.assertIn(m["gpu_source"], ("none", "nvml", "nvidia-smi"))
        self.assertIn("spread", m["rss_kib"])

    def test_device_memory_by_nvidia_smi(self) -> None:
        """Without pynvml, nvidia-smi gives the process's figure and the
        device's used memory (where the shim's managed memory counts): a
        stand-in nvidia-smi on PATH, two processes on two GPUs."""
        d = tempfile.mkdtemp(prefix="test-serve-smi-", dir=self.tmp)
        with open(os.path.join(d, "nvidia-smi"), "w") as f:
            f.write('#!/bin/sh\ncase "$1" in\n'
                    '  --query-compute-apps=*) echo "4242, 1330"; echo "77, 500" ;;\n'
                    '  --query-gpu=memory.used) echo "3003"; echo "10" ;;\n'
                    '  *) exit 9 ;;\nesac\n')
        os.chmod(os.path.join(d, "nvidia-smi"), 0o755)
        code = ("import sys; sys.path.insert(0, sys.argv[1]); import serve; serve._NVML = False; "
                "print(serve.gpu_used_mib(4242)); print(serve.gpu_used_mib(None))")
        env = dict(os.environ, PATH=d + os.pathsep + os.environ.get("PATH", ""))
        r = subprocess.run([sys.executable, "-c", code, BENCH], capture_output=True, text=True, env=env,
                           timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        mine, anyone = r.stdout.splitlines()
        self.assertEqual(mine, str({"pid": 1330, "all": 1830, "device": 3013, "source": "nvidia-smi"}))
        self.assertEqual(anyone, str({"pid": None, "all": 1830, "device": 3013, "source": "nvidia-smi"}))

    def test_greedy_ids_recorded_and_checked(self) -> None:
        with open(self.ref) as f:
            ref = json.load(f)
        outs = ref["alone"]
        self.assertEqual(len(outs), 3)
        self.assertTrue(all(isinstance(v, list) and len(v) == 24 and all(isinstance(t, int) for t in v)
                            for v in outs.values()), outs)
        r = py("serve.py", "--url", f"http://127.0.0.1:{self.port}", "--server-kind", "llamacpp",
               "--rate", "5", "--duration", "1", "--output-len", "fixed:4", "--ignore-eos",
               "--greedy-check", self.ref, "--greedy-n", "3", "--greedy-load-check", "report")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("3 of 3 identical", r.stdout)
        # one id changed in the reference: the check fails
        ref["alone"]["1"][5] += 1
        bad = os.path.join(self.tmp, "greedy-doctored.json")
        with open(bad, "w") as f:
            json.dump(ref, f)
        r = py("serve.py", "--url", f"http://127.0.0.1:{self.port}", "--server-kind", "llamacpp",
               "--rate", "5", "--duration", "1", "--output-len", "fixed:4", "--ignore-eos",
               "--greedy-check", bad, "--greedy-n", "3", "--greedy-load-check", "report")
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)

    def test_server_counters(self) -> None:
        """--metrics-url: the server's decodes, step period and processed
        tokens over the steady window, from its own counters (the fake: a
        decode a prefill and a token sent; generated tokens counted as each
        request ends, as llama-server does)."""
        for ph in self.rep["phases"]:
            m, st = ph["server"], ph["summary"]["steady"]
            self.assertNotIn("error", m, m)
            self.assertGreaterEqual(m["samples"], 3)
            lo, hi = m["window_s"]
            self.assertGreaterEqual(lo, st["window_s"][0])
            self.assertLessEqual(hi, st["window_s"][1])
            # every token the client saw in the window was a decode of the
            # server's (the window's edges are whole seconds off the steady one)
            toks = st["output_tok_s"] * (st["window_s"][1] - st["window_s"][0])
            self.assertGreater(m["decodes"], 0.3 * toks, (m, st))
            self.assertAlmostEqual(m["step_ms"], (hi - lo) * 1e3 / m["decodes"], delta=0.01)
            self.assertAlmostEqual(m["processed_tok_s"], m["prompt_tok_s"] + m["predicted_tok_s"], delta=0.01)
            self.assertGreater(m["predicted_tok_s"], 0)
            self.assertGreater(m["prompt_tok_s"], 0)
            self.assertGreater(m["busy_slots_per_decode"], 0)
            self.assertLessEqual(m["busy_slots_per_decode"], SLOTS)
        # saturated (40 req/s against ~36): more slots busy a decode than at 5 req/s
        lo_m, hi_m = (ph["server"] for ph in self.rep["phases"])
        self.assertGreater(hi_m["busy_slots_per_decode"], lo_m["busy_slots_per_decode"])
        self.assertRegex(self.res.stdout, r"server \(llama-server /metrics over .*\): \d+ decode calls, step ")

    def test_server_without_metrics(self) -> None:
        """A llama-server started without --metrics answers 501: one line says
        so, and the run is not failed for it."""
        port = free_port()
        proc = start_fake(port)
        self.addCleanup(stop, proc)
        out = os.path.join(self.tmp, "nometrics.json")
        r = py("serve.py", "--url", f"http://127.0.0.1:{port}", "--server-kind", "llamacpp", "--requests", "4",
               "--rate", "20", "--output-len", "fixed:4", "--ignore-eos",
               "--metrics-url", f"http://127.0.0.1:{port}/metrics", "--out", out)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("server counters: none (HTTP 501", r.stdout)
        with open(out) as f:
            self.assertIn("needs --metrics", json.load(f)["server"]["error"])

    def test_native_endpoint(self) -> None:
        out = os.path.join(self.tmp, "native.json")
        r = py("serve.py", "--url", f"http://127.0.0.1:{self.port}", "--server-kind", "llamacpp",
               "--endpoint", "native", "--requests", "6", "--rate", "20", "--output-len", "fixed:7",
               "--ignore-eos", "--out", out)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        with open(out) as f:
            s = json.load(f)["summary"]
        self.assertEqual(s["requests"]["completed"], 6)
        self.assertEqual(s["lengths"]["output_tokens_mean"], 7.0)

    def test_plot(self) -> None:
        png = os.path.join(self.tmp, "sweep.png")
        r = py("serve-plot.py", self.out, "--out", png, "--phase", "2")
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            self.assertEqual(r.returncode, 3, r.stdout + r.stderr)
            self.assertIn("matplotlib is not importable", r.stderr)
            return
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        with open(png, "rb") as f:
            self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")

    def test_plot_without_samples(self) -> None:
        path = os.path.join(self.tmp, "empty.json")
        with open(path, "w") as f:
            json.dump({"summary": {}}, f)
        self.assertEqual(py("serve-plot.py", path).returncode, 2)


class TestClosedAndIdle(unittest.TestCase):
    """--rates cN (a closed loop) and --idle-wait against a one-slot fake:
    a phase past saturation leaves a backlog that the drain timeout closes
    on the client's side only (the fake, as llama-server, still takes each
    closed request and runs its prefill), the next phase waits for the
    server to be idle, then N requests stay in flight."""

    @classmethod
    def setUpClass(cls) -> None:
        cls.tmp = tempfile.mkdtemp(prefix="test-serve-closed-")
        cls.port = free_port()
        cls.proc = start_fake(cls.port, "--metrics", "--slots", "1")
        cls.addClassCleanup(stop, cls.proc)
        cls.ref = os.path.join(cls.tmp, "greedy.json")
        cls.out = os.path.join(cls.tmp, "closed.json")
        # one slot: ~9 requests/s of 10 tokens; 40/s for 2 s leaves ~60
        # closed requests queued, ~2 s of prefills after the drain timeout
        cls.res = py("serve.py", "--url", f"http://127.0.0.1:{cls.port}", "--server-kind", "llamacpp",
                     "--rates", "40,c2", "--duration", "2", "--drain-timeout", "0.3", "--idle-wait", "30",
                     "--output-len", "fixed:10", "--prompt-len", "uniform:8:32", "--ignore-eos",
                     "--record-greedy", cls.ref, "--greedy-n", "2", "--save-requests",
                     "--metrics-url", f"http://127.0.0.1:{cls.port}/metrics", "--out", cls.out)
        if cls.res.returncode != 0 or not os.path.exists(cls.out):
            raise AssertionError("serve.py failed:\n" + cls.res.stdout[-3000:] + cls.res.stderr[-3000:])
        with open(cls.out) as f:
            cls.rep = json.load(f)

    def test_idle_before_the_next_phase(self) -> None:
        first, second = self.rep["phases"]
        self.assertGreater(first["summary"]["requests"]["cut"], 20, first["summary"]["requests"])
        idle = second["idle_before"]
        self.assertTrue(idle["idle"], idle)
        # the backlog's prefills (~2 s) and a quiet second: without the wait
        # the closed loop would start behind them
        self.assertGreater(idle["waited_s"], 1.5, idle)
        self.assertIn("server idle after", self.res.stdout)
        self.assertTrue(self.rep["greedy_alone"]["idle_before"]["idle"])

    def test_closed_loop_keeps_n_in_flight(self) -> None:
        ph = self.rep["phases"][1]
        self.assertEqual(ph["closed"], 2)
        self.assertIsNone(ph["rate"])
        self.assertIn("2 requests in flight (closed loop)", self.res.stdout)
        s = ph["summary"]
        self.assertEqual(s["errors"], {})
        # two clients, and the greedy requests beside them for a moment
        self.assertLessEqual(s["concurrency"]["sampled_max"], 4)
        self.assertGreater(s["concurrency"]["sampled_in_flight"], 1.5, s["concurrency"])
        # one slot serves ~9 a second: two in flight keep it busy
        self.assertGreater(s["requests"]["completed"], 8, s["requests"])
        self.assertIn("c2", json.load(open(self.ref))["by_rate"])

    def test_closed_loop_sends_the_seeds_sequence(self) -> None:
        sys.path.insert(0, BENCH)
        import serve  # noqa: E402
        a = serve.parse_args(["--prompt-len", "uniform:8:32", "--output-len", "fixed:10", "--seed", "1000"])
        rng = __import__("random").Random(1000)
        sent = sorted((r for r in self.rep["phases"][1]["requests"] if r["kind"] == "normal"), key=lambda r: r["i"])
        want = [serve.draw_request(a, rng, i, 0.0).prompt_len for i in range(len(sent))]
        self.assertEqual([r["prompt_len"] for r in sent], want)
        # sent in index order: the i-th request out is the seed's i-th draw
        self.assertEqual([r["i"] for r in sorted(sent, key=lambda r: r["sent"])], [r["i"] for r in sent])

    def test_idle_wait_needs_metrics(self) -> None:
        r = py("serve.py", "--url", f"http://127.0.0.1:{self.port}", "--idle-wait", "5")
        self.assertEqual(r.returncode, 2)
        self.assertIn("--idle-wait reads the server's gauges: it needs --metrics-url", r.stderr)

    def test_bad_phase_spec(self) -> None:
        r = py("serve.py", "--rates", "4,c0")
        self.assertEqual(r.returncode, 2)
        self.assertIn("expected positive rates or cN", r.stderr)


def faults(port: int, *opts: str, fake_opts=(), checks="disconnect,bad,sigterm,restart", tmp=".") -> tuple:
    out = os.path.join(tmp, f"faults-{port}.json")
    cmd = " ".join(fake_cmd(port, *fake_opts))
    r = py("serve-faults.py", "--url", f"http://127.0.0.1:{port}", "--server-cmd", cmd, "--start",
           "--parallel", str(SLOTS), "--long-tokens", "60", "--greedy-n", "3", "--checks", checks,
           "--load-timeout", "20", "--log-dir", tmp, "--out", out, *opts)
    with open(out) as f:
        return r, json.load(f)


class TestStreamError(unittest.TestCase):
    """A 200 stream that carries an error event is a stream_error, and the
    report keeps what the server said (up to three messages a kind)."""

    def test_examples(self) -> None:
        port = free_port()
        proc = start_fake(port, "--stream-error-every", "3")
        self.addCleanup(stop, proc)
        out = os.path.join(tempfile.mkdtemp(prefix="test-serve-llamacpp-err-"), "r.json")
        res = py("serve.py", "--url", f"http://127.0.0.1:{port}", "--server-kind", "llamacpp", "--requests", "9",
                 "--rate", "20", "--output-len", "fixed:6", "--prompt-len", "uniform:8:16", "--ignore-eos",
                 "--warmup-requests", "0", "--greedy-n", "0", "--out", out)
        with open(out) as f:
            s = json.load(f)["summary"]
        self.assertEqual(s["errors"], {"stream_error": 3}, res.stdout + res.stderr)
        ex = s["error_examples"]["stream_error"]
        self.assertEqual(len(ex), 1)
        self.assertIn("fake stream failure at token 2", ex[0])
        self.assertIn("  example stream_error: stream error: {", res.stdout)


class TestFaults(unittest.TestCase):
    """serve-faults.py against the fake; and each check made to fail by a
    fake with the fault it is there to see."""

    def setUp(self) -> None:
        self.tmp = tempfile.mkdtemp(prefix="test-serve-faults-")

    def test_all_pass(self) -> None:
        r, rep = faults(free_port(), tmp=self.tmp)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        c = rep["checks"]
        self.assertEqual(c["disconnect"]["observed"]["closed_mid_stream"], SLOTS)
        self.assertEqual(c["disconnect"]["observed"]["slots_busy_after"], 0)
        self.assertEqual([a["status"] for a in c["bad"]["observed"]["answers"]], [400, 400])
        self.assertTrue(c["bad"]["observed"]["greedy_same"])
        self.assertGreater(c["sigterm"]["observed"]["in_flight_at_signal"], 0)
        self.assertLess(c["sigterm"]["observed"]["exit_s"], 10)
        self.assertEqual(c["restart"]["observed"]["identical"], 3)
        self.assertTrue(c["restart"]["observed"]["ids"])
        for k in ("disconnect", "bad", "sigterm", "restart"):
            self.assertIn("expected", c[k])

    def test_leaked_slot_fails_disconnect(self) -> None:
        r, rep = faults(free_port(), "--slot-timeout", "1", "--request-timeout", "3", fake_opts=("--leak",),
                        checks="disconnect", tmp=self.tmp)
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertFalse(rep["checks"]["disconnect"]["ok"])
        self.assertEqual(rep["checks"]["disconnect"]["observed"]["slots_busy_after"], SLOTS)

    def test_500_fails_bad(self) -> None:
        r, rep = faults(free_port(), fake_opts=("--bad-status", "500"), checks="bad", tmp=self.tmp)
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertEqual([a["status"] for a in rep["checks"]["bad"]["observed"]["answers"]], [500, 500])

    def test_slow_exit_fails_sigterm(self) -> None:
        r, rep = faults(free_port(), "--term-limit", "0.5", fake_opts=("--term-delay", "1.5"),
                        checks="sigterm", tmp=self.tmp)
        self.assertEqual(r.returncode, 1, r.stdout)
        o = rep["checks"]["sigterm"]["observed"]
        self.assertGreater(o["exit_s"], 1.0)
        self.assertFalse(o["within_limit"])

    def test_extra_body_reaches_every_request(self) -> None:
        """--extra-body goes into each check's requests (the rows' byte-token
        ban): a fake that wants it answers 400 to every body without it."""
        r, rep = faults(free_port(), "--extra-body", '{"logit_bias": [[3, false]]}',
                        fake_opts=("--need-body-key", "logit_bias"), checks="disconnect,bad,sigterm,restart",
                        tmp=self.tmp)
        self.assertEqual(r.returncode, 0, r.stdout)
        r, rep = faults(free_port(), fake_opts=("--need-body-key", "logit_bias"), checks="disconnect", tmp=self.tmp)
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertFalse(rep["checks"]["disconnect"]["ok"])

    def test_server_waiting_for_its_clients(self) -> None:
        """llama-server's way: decoding stops at SIGTERM, the process stays
        while streams are open. The check fails (the limit is the limit),
        and says that the exit followed the clients' leaving."""
        r, rep = faults(free_port(), "--term-limit", "1", fake_opts=("--term-waits-for-clients",),
                        checks="sigterm", tmp=self.tmp)
        self.assertEqual(r.returncode, 1, r.stdout)
        o = rep["checks"]["sigterm"]["observed"]
        self.assertFalse(o["within_limit"])
        self.assertFalse(o["killed"])
        self.assertGreater(o["streams_open_at_limit"], 0)
        self.assertLess(o["exit_after_clients_left_s"], 1.0)
        self.assertTrue(o["waits_for_clients"])
        self.assertGreater(o["clients_ended"].get("left at the limit", 0), 0)

    def test_against_plain_that_waits_too(self) -> None:
        """--against: a server that waits for its clients after SIGTERM,
        plain and under test alike, fails the limit in both; against the
        plain report the row passes, the failure the server's own. A row
        whose teardown is slow instead (not waiting for its clients) still
        fails against it, and so does a row against a plain that passed."""
        r, plain = faults(free_port(), "--term-limit", "1", fake_opts=("--term-waits-for-clients",),
                          checks="sigterm", tmp=self.tmp)
        self.assertEqual(r.returncode, 1, r.stdout)
        path = os.path.join(self.tmp, "plain.json")
        with open(path, "w") as f:
            json.dump(plain, f)
        r, rep = faults(free_port(), "--term-limit", "1", "--against", path,
                        fake_opts=("--term-waits-for-clients",), checks="sigterm", tmp=self.tmp)
        self.assertEqual(r.returncode, 0, r.stdout)
        own = rep["checks"]["sigterm"]["server_own"]
        self.assertTrue(own["no_worse"])
        self.assertFalse(rep["checks"]["sigterm"]["ok"])
        self.assertIn("the server's own failure, as plain's and no worse: sigterm", r.stdout)
        r, rep = faults(free_port(), "--term-limit", "0.5", "--against", path,
                        fake_opts=("--term-delay", "2.5"), checks="sigterm", tmp=self.tmp)
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertFalse(rep["checks"]["sigterm"]["server_own"]["no_worse"])
        r, good = faults(free_port(), checks="sigterm", tmp=self.tmp)
        with open(path, "w") as f:
            json.dump(good, f)
        r, rep = faults(free_port(), "--term-limit", "1", "--against", path,
                        fake_opts=("--term-waits-for-clients",), checks="sigterm", tmp=self.tmp)
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertNotIn("server_own", rep["checks"]["sigterm"])

    def test_slow_teardown_is_not_waiting_for_clients(self) -> None:
        r, rep = faults(free_port(), "--term-limit", "0.5", fake_opts=("--term-delay", "2.5"),
                        checks="sigterm", tmp=self.tmp)
        o = rep["checks"]["sigterm"]["observed"]
        self.assertFalse(o["within_limit"])
        self.assertGreater(o["exit_after_clients_left_s"], 0.5)
        self.assertFalse(o["waits_for_clients"])

    def test_other_tokens_fail_restart(self) -> None:
        # the restarted fake draws other tokens: a salt from the environment
        # that the first start does not see
        port = free_port()
        cmd = f"env SALT_FILE={self.tmp}/salt {sys.executable} {os.path.abspath(__file__)} --fake {port} --salt-file"
        out = os.path.join(self.tmp, "restart.json")
        r = subprocess.run([sys.executable, os.path.join(BENCH, "serve-faults.py"), "--url",
                            f"http://127.0.0.1:{port}", "--server-cmd", cmd, "--start", "--parallel", str(SLOTS),
                            "--greedy-n", "2", "--checks", "sigterm,restart", "--long-tokens", "40",
                            "--log-dir", self.tmp, "--out", out], capture_output=True, text=True, timeout=120)
        with open(out) as f:
            rep = json.load(f)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertTrue(rep["checks"]["sigterm"]["ok"])
        self.assertEqual(rep["checks"]["restart"]["observed"]["identical"], 0)

    def test_no_server_cmd_skips_restart(self) -> None:
        port = free_port()
        proc = start_fake(port)
        try:
            out = os.path.join(self.tmp, "skip.json")
            r = py("serve-faults.py", "--url", f"http://127.0.0.1:{port}", "--checks", "bad,restart",
                   "--out", out)
            with open(out) as f:
                rep = json.load(f)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn("skipped", rep["checks"]["restart"])
        finally:
            stop(proc)


class TestScript(unittest.TestCase):
    """bench/llamacpp-serve.sh end to end, with a llama-server that is the
    fake (a wrapper taking llama-server's --port and --parallel) under a
    SHIM_CMD prefix: every step passes, the markdown has a row a rate
    and a line a fault check, no server is left running."""

    def run_script(self, **over) -> tuple:
        tmp = tempfile.mkdtemp(prefix="test-llamacpp-serve-")
        bindir = os.path.join(tmp, "bin")
        fake_server_bin(bindir)
        out = os.path.join(tmp, "out")
        env = dict(os.environ, LLAMA_BIN=bindir, OUT=out, PARALLEL=str(SLOTS), RATES="5,30", DURATION="2",
                   DRAIN="3", OUTPUT_LEN="fixed:16", PROMPT_LEN="uniform:8:32", PORT=str(free_port()),
                   LOAD_TIMEOUT="20", DEADLINE="400", SHIM_CMD="env WO_TEST_PREFIX=1", PYTHON=sys.executable,
                   **over)
        r = subprocess.run(["bash", os.path.join(BENCH, "llamacpp-serve.sh"), os.path.join(tmp, "m.gguf")],
                           env=env, capture_output=True, text=True, timeout=200)
        return r, out

    def test_soak(self) -> None:
        r, out = self.run_script(SOAK_MINUTES="0.1", SOAK_RATE="10")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        with open(os.path.join(out, "soak.json")) as f:
            rep = json.load(f)
        self.assertGreaterEqual(len(rep["memory"]["samples"]), 5)
        self.assertFalse(os.path.exists(os.path.join(out, "faults.json")))
        with open(os.path.join(out, "stop.json")) as f:
            stop = json.loads(f.readline())
        self.assertTrue(stop["within_10s"], stop)

    def test_script(self) -> None:
        r, out = self.run_script()
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        with open(os.path.join(out, "llamacpp-serve.md")) as f:
            md = f.read()
        rows = [x for x in md.splitlines() if x.startswith("| 5 |") or x.startswith("| 30 |")]
        self.assertEqual(len(rows), 2, md)
        self.assertIn("| server step ms | server tok/s (prompt + generated) |", md)
        for x in rows:  # the server's counters (the script starts it with --metrics): numbers, not "-"
            step, tok = x.split(" | ")[6:8]
            self.assertGreater(float(step), 0, x)
            self.assertGreater(float(tok), 0, x)
        for k in ("disconnect", "bad", "sigterm", "restart"):
            self.assertRegex(md, rf"\| {k} \| .* \| yes \|")
        self.assertIn("under load (sigterm check)", md)
        self.assertIn("env WO_TEST_PREFIX=1", md)
        with open(os.path.join(out, "faults.json")) as f:
            self.assertTrue(json.load(f)["ok"])
        with open(os.path.join(out, "restart.pid")) as f:
            rpid = int(f.read())
        self.assertFalse(os.path.exists(f"/proc/{rpid}"), "the restarted fake is still running")
        self.assertRegex(r.stdout, r"\[ *[0-9.]+s\] sweep: done")


class TestRows(unittest.TestCase):
    """bench/llamacpp-serve-rows.sh: a run a row, each in its own folder,
    the shim's rows under woffload-run (here a stand-in that runs the
    command after `--`), later rows checked against plain's greedy ids, an
    unknown row named and skipped; and what the server streamed as an error
    is in the row's markdown."""

    def test_rows(self) -> None:
        tmp = tempfile.mkdtemp(prefix="test-llamacpp-rows-")
        bindir, tools = os.path.join(tmp, "bin"), os.path.join(tmp, "shim", "tools")
        fake_server_bin(bindir)
        os.makedirs(tools)
        with open(os.path.join(tools, "woffload-run"), "w") as f:
            f.write("#!/bin/sh\nwhile [ $# -gt 0 ] && [ \"$1\" != -- ]; do shift; done\nshift\n"
                    "echo \"$@\" > \"$(dirname \"$0\")/ran\"\n"
                    "echo \"PICKS_FROM=${WOFFLOAD_GGML_PICKS_FROM-unset} LEND=${WOFFLOAD_FIT_LEND-unset} $@\""
                    " >> \"$(dirname \"$0\")/runs\"\n"
                    "exec \"$@\"\n")
        os.chmod(os.path.join(tools, "woffload-run"), 0o755)
        out, done = os.path.join(tmp, "out"), os.path.join(tmp, "done")
        os.makedirs(done)
        # a row measured before (a peer's, 7481 MiB at its peak) for the
        # --fit row at its device memory (FIT=from:peer)
        os.makedirs(os.path.join(out, "p4-peer"))
        with open(os.path.join(out, "p4-peer", "sweep.json"), "w") as f:
            json.dump({"phases": [{"rate": 5, "memory": {"gpu_pid_mib": {"max": m}},
                                   "summary": {"steady": {}, "itl_ms": {}, "ttft_ms": {}, "errors": {}}}
                                  for m in (7421, 7481.0)]}, f)
        env = dict(os.environ, LLAMA_BIN=bindir, GGUF=os.path.join(tmp, "m.gguf"), OUTROOT=out, PARALLEL="4",
                   ROWS="plain shim-exps bogus llama-ot shim-exps-slots3-nopicks plain.2 shim-fit shim-ncmoe10",
                   R_FAST="5,c4",
                   R_SLOW="5", R_MID="5", FIT="from:peer", DURATION="2", DRAIN="3",
                   DURATION_SLOW="3", DRAIN_SLOW="4",
                   OUTPUT_LEN="fixed:8", PROMPT_LEN="uniform:8:16", PORT=str(free_port()), LOAD_TIMEOUT="20",
                   SHIM_BUILD=os.path.join(tmp, "shim"), ROW_DONE=done,
                   FAKE_OPTS="--stream-error-every 4 --need-body-key logit_bias",
                   PYTHON=sys.executable)
        r = subprocess.run(["bash", os.path.join(BENCH, "llamacpp-serve-rows.sh")], env=env, capture_output=True,
                           text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("bogus: unknown row", r.stdout)
        for row in ("plain", "shim-exps", "llama-ot", "shim-exps-slots3-nopicks"):
            with open(os.path.join(out, f"p4-{row}", "llamacpp-serve.md")) as f:
                md = f.read()
            self.assertEqual(len([x for x in md.splitlines() if x.startswith("| 5 |")]), 1, md)
            self.assertIn("- stream_error: `stream error: {", md)
            with open(os.path.join(out, f"p4-{row}", "sweep.json")) as f:
                cfg = json.load(f)["config"]
            self.assertEqual(cfg["greedy_check"] is None, row == "plain", cfg)
            # the experts-host rows' phases their own (DURATION_SLOW, DRAIN_SLOW)
            slow = row != "plain"
            self.assertEqual((cfg["duration"], cfg["drain_timeout"]), (3, 4) if slow else (2, 3), row)
            # the synthetic vocabulary's byte tokens banned in every request: no 400 but the bad one
            self.assertEqual(cfg["extra_body"]["logit_bias"][0], [3, False])
            self.assertEqual(len(cfg["extra_body"]["logit_bias"]), 256)
            self.assertNotIn("http_400", md)
        self.assertIn("woffload-run --policy", open(os.path.join(out, "p4-shim-exps", "machine.txt")).read())
        self.assertIn("llama-server -m", open(os.path.join(tools, "ran")).read())
        self.assertIn("--cache-ram 0 -ot exps=CPU -lm none", open(os.path.join(out, "p4-llama-ot", "machine.txt")).read())
        self.assertIn("--cache-ram 0", open(os.path.join(out, "p4-plain", "machine.txt")).read())
        self.assertFalse(os.path.exists(os.path.join(out, "p4-bogus")))
        # ROW_DONE: each row copied as it ended (a device call cut at its
        # limit keeps them), the same files, nothing nested
        self.assertEqual(sorted(os.listdir(done)),
                         sorted(f"p4-{r}" for r in ("plain", "shim-exps", "llama-ot", "shim-exps-slots3-nopicks",
                                                    "plain.2", "shim-fit", "shim-ncmoe10")))
        self.assertEqual(sorted(os.listdir(os.path.join(done, "p4-plain"))),
                         sorted(os.listdir(os.path.join(out, "p4-plain"))))
        # the equal-memory row: the experts-host policy with three staging slots (shim-exps-slotsN)
        pol = os.path.join(out, "llamacpp-ot-exps-cpu-slots3.yaml")
        # -nopicks: WOFFLOAD_GGML_PICKS_FROM=0 for that row alone (the shim's
        # rows in order: shim-exps, shim-exps-slots3-nopicks, shim-fit)
        with open(os.path.join(tools, "runs")) as f:
            runs = [x.split()[:2] for x in f.read().splitlines()]
        self.assertEqual([r[0] for r in runs], ["PICKS_FROM=unset", "PICKS_FROM=0", "PICKS_FROM=unset", "PICKS_FROM=unset"])
        self.assertEqual([r[1] for r in runs], ["LEND=unset"] * 4)
        # shim-ncmoe10: llama.cpp's --n-cpu-moe rule for layers 0-9
        with open(os.path.join(out, "llamacpp-n-cpu-moe10.yaml")) as f:
            self.assertIn("  - name: experts-of-layers-0-9\n"
                          "    regex: '^blk\\.(0|1|2|3|4|5|6|7|8|9)\\.ffn_(up|down|gate|gate_up)_(ch|)exps'\n", f.read())
        self.assertIn(f"woffload-run --policy {pol}", open(os.path.join(out, "p4-shim-exps-slots3-nopicks", "machine.txt")).read())
        with open(pol) as f:
            self.assertIn("default: device\nprefetch:\n  slots: 3\nrules:", f.read())
        # plain again, in a folder of its own, checked against the first plain
        with open(os.path.join(out, "p4-plain.2", "sweep.json")) as f:
            rep = json.load(f)
        self.assertTrue(rep["config"]["greedy_check"].endswith("p4-plain/greedy.json"))
        self.assertEqual([ph.get("closed") for ph in rep["phases"]], [None, 4])
        # side by side: a table a phase, plain's two runs as one row
        with open(os.path.join(out, "rows.md")) as f:
            md = f.read()
        self.assertIn("### --parallel 4, phase c4 (closed loop: 4 requests in flight)", md)
        self.assertIn("### --parallel 4, phase 5 req/s (Poisson arrivals)", md)
        self.assertRegex(md, r"\n\| plain \| 2 \| [^|]+ \| 1\.000 \|")
        self.assertRegex(md, r"\n\| shim-exps \| 1 \| [0-9.]+ \| [0-9.]+ \|")
        self.assertIn("side by side: " + os.path.join(out, "rows.md"), r.stdout)
        # the --fit row at the peer's measured device memory
        self.assertIn("shim-fit: FIT=from:peer: --fit 7481MiB", r.stdout)
        with open(os.path.join(out, "p4-shim-fit", "machine.txt")) as f:
            self.assertIn("woffload-run --fit 7481MiB --stats", f.read())


class TestRowsDry(unittest.TestCase):
    """bench/llamacpp-serve-rows.sh with DRY_RUN=1: each row's policy
    written and what it would run printed, nothing run: the rows' suffixes
    in any order and the settings each sets, the generated policies."""

    def test_dry_run(self) -> None:
        out = tempfile.mkdtemp(prefix="test-llamacpp-rows-dry-")
        os.makedirs(os.path.join(out, "p4-peer"))
        # llama.cpp's own row run before: the shim rows' greedy ids are checked against it
        os.makedirs(os.path.join(out, "p4-llama-ncmoe8"))
        with open(os.path.join(out, "p4-llama-ncmoe8", "greedy.json"), "w") as f:
            json.dump({"alone": {}}, f)
        with open(os.path.join(out, "p4-peer", "sweep.json"), "w") as f:
            json.dump({"phases": [{"rate": 5, "memory": {"gpu_pid_mib": {"max": 7481}},
                                   "summary": {"steady": {}, "itl_ms": {}, "ttft_ms": {}, "errors": {}}}]}, f)
        env = dict(os.environ, DRY_RUN="1", LLAMA_BIN=os.path.join(out, "none"), GGUF=os.path.join(out, "m.gguf"),
                   OUTROOT=out, PARALLEL="4", FIT="from:peer", SHIM_BUILD=os.path.join(out, "shim"),
                   ROWS="shim-fit-nopicks-slots2 shim-ncmoe-odd shim-spread9 shim-fit-nolend shim-fit-inorder "
                        "shim-exps-slots2-late llama-ncmoe8 shim-fit-reserve64-nopicks shim-fit-band shim-fit-nolend-bylayer "
                        "shim-fit-bytensor shim-fit-full shim-exps-full shim-exps-split shim-fit-one bogus",
                   PYTHON=sys.executable)
        env.pop("WOFFLOAD_FIT_LEND", None)
        env.pop("WOFFLOAD_FIT_LAYERS", None)
        r = subprocess.run(["bash", os.path.join(BENCH, "llamacpp-serve-rows.sh")], env=env, capture_output=True,
                           text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        lines = {m.group(1): m.group(2) for m in re.finditer(r"\[serve-rows\] (\S+): would run: (.*)", r.stdout)}
        self.assertEqual(len(lines), 14, r.stdout)
        self.assertIn("bogus: unknown row", r.stdout)
        # -full: a blocker leaves the fit size and the slack free; a row with
        # no fit size needs FULL_LEAVE_MIB
        self.assertIn("[serve-rows] shim-fit-full: a blocker leaves 7737 MiB free (bench/gpu-blocker.py)",
                      r.stdout)
        self.assertNotIn("shim-exps-full", lines)
        self.assertRegex(r.stdout, r"shim-exps-full: -full needs a fit size in MiB or FULL_LEAVE_MIB")
        run = os.path.join(out, "shim", "tools", "woffload-run")
        # fit keeps free only the slack the blocker left (not 2 GiB)
        self.assertTrue(lines["shim-fit-full"].startswith(f"{run} --fit 7481MiB --keep-free 256MiB --stats"),
                        lines["shim-fit-full"])
        # fit with two slots and no picks: --fit, a policy of that key alone
        fpol = os.path.join(out, "fit-slots2.yaml")
        with open(fpol) as f:
            self.assertEqual(f.read(), "version: 1\ndefault: device\nprefetch:\n  slots: 2\n")
        self.assertTrue(lines["shim-fit-nopicks-slots2"].startswith(f"{run} --fit 7481MiB --policy {fpol} --stats"))
        self.assertTrue(lines["shim-fit-nopicks-slots2"].endswith("WOFFLOAD_GGML_PICKS_FROM=0"))
        self.assertTrue(lines["shim-fit-nolend"].endswith("WOFFLOAD_FIT_LEND=0"))
        # the model buffer split by tensor under a hand policy; one under fit
        self.assertTrue(lines["shim-exps-split"].endswith("WOFFLOAD_GGML_SPLIT=2"), lines["shim-exps-split"])
        self.assertTrue(lines["shim-fit-one"].endswith("WOFFLOAD_GGML_SPLIT=0"), lines["shim-fit-one"])
        self.assertNotIn("WOFFLOAD_GGML_SPLIT", lines["shim-exps-slots2-late"])
        # the hook's picks band given (off under fit unless given)
        self.assertTrue(lines["shim-fit-band"].endswith("WOFFLOAD_GGML_PICKS_FROM=80"))
        # fit's after-seal reserve, in MiB
        self.assertTrue(lines["shim-fit-reserve64-nopicks"].startswith(f"{run} --fit 7481MiB --reserve 64MiB --stats"))
        self.assertTrue(lines["shim-fit-reserve64-nopicks"].endswith("WOFFLOAD_GGML_PICKS_FROM=0"))
        self.assertTrue(lines["shim-fit-inorder"].endswith("WOFFLOAD_FIT_SPREAD=0"))
        # whole layers off the device, the room kept empty
        self.assertTrue(lines["shim-fit-nolend-bylayer"].endswith("WOFFLOAD_FIT_LAYERS=1 WOFFLOAD_FIT_LEND=0"))
        # tensor by tensor, against the default whole layers
        self.assertTrue(lines["shim-fit-bytensor"].endswith("WOFFLOAD_FIT_LAYERS=0"))
        self.assertTrue(lines["shim-exps-slots2-late"].endswith("WOFFLOAD_LATE_BIND=1"))
        with open(os.path.join(out, "llamacpp-ot-exps-cpu-slots2.yaml")) as f:
            self.assertIn("default: device\nprefetch:\n  slots: 2\nrules:", f.read())
        self.assertIn("--n-cpu-moe 8 -lm none;", lines["llama-ncmoe8"])
        self.assertNotIn("woffload-run", lines["llama-ncmoe8"])
        # the odd layers, and nine of sixteen spread evenly
        with open(os.path.join(out, "llamacpp-n-cpu-moe-odd.yaml")) as f:
            self.assertIn("  - name: experts-of-the-odd-layers\n"
                          "    regex: '^blk\\.[0-9]*[13579]\\.ffn_(up|down|gate|gate_up)_(ch|)exps'\n", f.read())
        with open(os.path.join(out, "llamacpp-spread9.yaml")) as f:
            self.assertIn("  - name: experts-of-9-layers-spread\n"
                          "    regex: '^blk\\.(0|2|4|6|8|9|11|13|15)\\.ffn_(up|down|gate|gate_up)_(ch|)exps'\n",
                          f.read())
        # a fit row takes the rates of its class (half resident: R_MID's default)
        self.assertIn("[serve-rows] shim-fit-bytensor: rates 1.5,3,c4, 40 s a phase", r.stdout)
        # the greedy ids of every other row against llama.cpp's row run before; not its own
        greedy = dict(re.findall(r"\[serve-rows\] (\S+): greedy ids against (\S+)", r.stdout))
        ref = os.path.join(out, "p4-llama-ncmoe8", "greedy.json")
        self.assertEqual(greedy.get("shim-fit-band"), ref)
        self.assertEqual(greedy.get("shim-spread9"), ref)
        self.assertNotIn("llama-ncmoe8", greedy)
        # nothing ran: no row's folder, no table
        self.assertEqual(sorted(x for x in os.listdir(out) if x.startswith("p4-")),
                         ["p4-llama-ncmoe8", "p4-peer"])
        self.assertFalse(os.path.exists(os.path.join(out, "rows.md")))
        # at an experts-host row's memory (FIT=from:llama-ot), that row's rates and
        # phases; -lag2: departure fences one range after the engine left
        os.makedirs(os.path.join(out, "p4-llama-ot"))
        with open(os.path.join(out, "p4-llama-ot", "sweep.json"), "w") as f:
            json.dump({"phases": [{"rate": "c4", "memory": {"gpu_pid_mib": {"max": 4816}},
                                   "summary": {"steady": {}, "itl_ms": {}, "ttft_ms": {}, "errors": {}}}]}, f)
        r2 = subprocess.run(["bash", os.path.join(BENCH, "llamacpp-serve-rows.sh")],
                            env=dict(env, ROWS="shim-fit-lag2", FIT="from:llama-ot"), capture_output=True,
                            text=True, timeout=60)
        self.assertEqual(r2.returncode, 0, r2.stdout + r2.stderr)
        self.assertIn("[serve-rows] shim-fit-lag2: rates c4, 120 s a phase (+ drain <= 60 s)", r2.stdout)
        self.assertRegex(r2.stdout, r"shim-fit-lag2: would run: \S+ --fit 4816MiB .*WOFFLOAD_DEPARTURE_LAG=2")


class TestServeTableMemory(unittest.TestCase):
    """bench/llamacpp-serve-table.py's device memory: the devices' used
    memory less what they used before the server started (gpu-idle-mib),
    which counts managed memory resident on the device, where the
    per-process figure does not; a row without gpu-idle-mib gives the
    per-process figure, marked."""

    def test_device_less_idle(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            for row, pid, dev, idle in (("ref", 1000, 1500, 500), ("shim", 300, 1700, 500),
                                        ("old", 900, 2000, None)):
                d = os.path.join(out, f"p4-{row}")
                os.makedirs(d)
                with open(os.path.join(d, "sweep.json"), "w") as f:
                    json.dump({"phases": [{"closed": 4, "memory": {"gpu_pid_mib": {"max": pid},
                                                                   "gpu_dev_mib": {"max": dev}},
                                           "summary": {"steady": {"output_tok_s": 10.0}, "itl_ms": {},
                                                       "ttft_ms": {}, "errors": {}}}]}, f)
                if idle is not None:
                    with open(os.path.join(d, "gpu-idle-mib"), "w") as f:
                        f.write(f"{idle}\n")
            r = py("llamacpp-serve-table.py", out, "--ref", "ref")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertRegex(r.stdout, r"\n\| ref \|[^\n]*\| 1000 \| 1\.000 \|")
            self.assertRegex(r.stdout, r"\n\| shim \|[^\n]*\| 1200 \| 1\.200 \|")
            self.assertRegex(r.stdout, r"\n\| old \|[^\n]*\| 900\* \| 0\.900 \|")
            self.assertIn("`*`: the server process's own device memory", r.stdout)
            r = py("llamacpp-serve-table.py", "--peak-mib", os.path.join(out, "p4-shim"))
            self.assertEqual((r.returncode, r.stdout.strip()), (0, "1200"), r.stderr)

    def test_books(self) -> None:
        """The shim's books: one line for each run that left its stats (as
        written, or gzipped as the results keep them), none for the others."""
        import gzip
        with tempfile.TemporaryDirectory() as out:
            for row in ("ref", "shim-fit", "shim-exps"):
                d = os.path.join(out, f"p4-{row}")
                os.makedirs(d)
                with open(os.path.join(d, "sweep.json"), "w") as f:
                    json.dump({"phases": [{"closed": 4, "memory": {"gpu_pid_mib": {"max": 100}},
                                           "summary": {"steady": {"output_tok_s": 10.0}, "itl_ms": {},
                                                       "ttft_ms": {}, "errors": {}}}]}, f)
            st = {"fit": {"budget": 100 << 20, "device_bytes": 60 << 20, "staging_bytes": 16 << 20,
                          "lent_bytes": 16 << 20, "picks_bytes": 0, "reserve_bytes": 8 << 20,
                          "context_bytes": 12 << 20},
                  "stream": {"staged": 42, "claim_unselects": 9, "claim_unselects_staged": 3,
                             "staging_steps": 4, "staging_step_ms": 181.66,
                             "staged_bytes": 4 * (3 << 30), "copies_busy_gbs": 54.23},
                  "picks": {"staged": 7},
                  # the live names and those the server freed before exit
                  "names": [{"name": "blk.3.ffn_up_exps.weight", "placement": "managed",
                             "bytes": 1 << 30}],
                  "released_names": [
                      {"name": "blk.0.ffn_up_exps.weight", "placement": "host", "peak_bytes": 1 << 30},
                      {"name": "blk.2.ffn_up_exps.weight", "placement": "host", "peak_bytes": 1 << 30},
                      {"name": "blk.2.ffn_down_exps.weight", "placement": "host",
                       "peak_bytes": 1 << 29},
                      {"name": "blk.1.attn_q.weight", "placement": "device", "peak_bytes": 1 << 20}]}
            with gzip.open(os.path.join(out, "p4-shim-fit", "stats.json.gz"), "wt") as f:
                json.dump(st, f)
            with open(os.path.join(out, "p4-shim-exps", "stats.json"), "w") as f:
                json.dump({"stream": {"staged": 5}, "picks": {"staged": 0}}, f)
            r = py("llamacpp-serve-table.py", out, "--ref", "ref")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("### The shim's books", r.stdout)
            self.assertIn("| p4-shim-fit | 100 | 60 | 16 (16) | 0 | 8 | 12 | 42 | 7 | 9 (3) "
                          "| 181.7, 3.00 | 54.23 |", r.stdout)
            # stats from before the counters: "-"
            self.assertIn("| p4-shim-exps | - | - | - | - | - | - | 5 | 0 | - | - | - |", r.stdout)
            self.assertNotIn("| p4-ref |", r.stdout.split("### The shim's books")[1])
            # where fit put the weights off the device, by layer
            self.assertIn("- p4-shim-fit: host: layers 0|2 (2.50 GiB in 3 names); "
                          "managed: layers 3 (1.00 GiB in 1 names)", r.stdout)
            self.assertIn("- p4-shim-exps: not recorded", r.stdout)


def salted(argv) -> list:
    """--salt-file: the fake's salt is a count of its starts kept in
    $SALT_FILE (the restart test's server that changes its tokens)."""
    if "--salt-file" not in argv:
        return argv
    argv = [a for a in argv if a != "--salt-file"]
    path = os.environ["SALT_FILE"]
    n = int(open(path).read()) if os.path.exists(path) else 0
    with open(path, "w") as f:
        f.write(str(n + 1))
    return argv + ["--salt", str(n)]


if __name__ == "__main__":
    if "--fake" in sys.argv:
        sys.exit(run_fake(salted(sys.argv[1:])))
    unittest.main(verbosity=2)
