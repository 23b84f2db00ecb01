#!/usr/bin/env python3
"""Tests of bench/serve.py (issue 20), the open-loop load generator, against
a small OpenAI-compatible SSE server written here: it admits at most SLOTS
requests at once (the others wait: the running batch of a continuous-
batching server), answers the first token PREFILL seconds after a request
gets its slot and each next one ITL seconds later, streams deterministic
tokens (a function of the prompt only), refuses invalid parameters with a
400, and counts clients that went away mid-stream. It also serves /stats:
a JSON with the keys of the shim's stats (uvm/stats.c) whose counters move
with every token it sends, so serve.py's deltas can be checked exactly.

    python3 tests/test-serve.py

No GPU, no build products, no network beyond loopback. About 60 s.

TestRates runs --rates (phases on one server) and --drain-timeout;
TestInProcess the in-process driver (bench/serve_engine.py) against a
fake of transformers' continuous-batching manager; TestSoakVerdict and
TestRowsModes bench/serve-rows.py's --soak and --faults verdicts, on
synthetic interval lines and on reports of in-process runs against the
fake manager.
"""
import json
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import types
import unittest
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SERVE = os.path.join(SRC, "bench", "serve.py")
sys.path.insert(0, os.path.join(SRC, "bench"))
import serve  # noqa: E402

SLOTS = 4
PREFILL = 0.040
ITL = 0.020
OUT = 8  # tokens a request (fixed:8): e2e = PREFILL + 7 ITL = 0.18 s in a slot
CAPACITY = SLOTS / (PREFILL + (OUT - 1) * ITL)  # 22.2 requests/s


def token(prompt: str, i: int) -> str:
    h = 0
    for c in prompt + f"#{i}":
        h = (h * 131 + ord(c)) % 1000003
    return f" t{h % 997}"


class State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.slots = threading.Semaphore(SLOTS)
        self.running = 0
        self.max_running = 0
        self.waiting = 0       # requests waiting for a slot
        self.busy = 0.0        # slot-seconds: the integral of the running count
        self.served = 0
        self.rejected = 0
        self.disconnects = 0
        # the server's own clock of each request it served to the end:
        # (ttft, e2e, gaps between its token writes), from its arrival
        self.timings = []
        # shim-like counters, with a history before the run that only a
        # delta removes: hit rate 0 so far, then 3 hits and 1 miss a token
        self.hits, self.misses, self.steps, self.touched, self.dropped = 0, 5000, 100, 0, 7

    def token_sent(self) -> None:
        with self.lock:
            self.steps += 1
            self.hits += 3
            self.misses += 1
            self.touched += 1000

    def stats_json(self) -> dict:
        with self.lock:
            return {
                "launches": {"seen": self.steps * 10, "hits": self.steps * 4},
                "ring": {"pushed": self.steps * 10, "dropped": self.dropped, "dropped_watched": 0},
                "names": [{"name": "model.layers.0.mlp.experts.gate_up_proj", "placement": "host",
                           "touched_bytes": self.touched}],
                "prefetch": {"steps": self.steps, "errors": 0,
                             "names": {"experts": {"hits": self.hits, "misses": self.misses,
                                                   "hit_bytes": self.hits * 10, "miss_bytes": 0,
                                                   "prefetched": 0}},
                             "per_step": {"steps": self.steps, "in_bytes": 0.0}},
                "stream": {"steps": 0, "staged_bytes": 0, "redirected": 0, "inplace_captured": 0,
                           "names": {"x": {"read_multiplicity": 2.5, "bytes": 100}}},
                "allocations": {"live": 12, "placement_errors": 0},
                "placements": {"host": {"bytes": 1 << 20}},
            }


STATE = State()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a) -> None:  # quiet
        pass

    def send_json(self, code: int, obj: dict) -> None:
        b = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(b)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(b)

    def do_GET(self) -> None:
        if self.path == "/stats":
            self.send_json(200, STATE.stats_json())
        elif self.path == "/server":
            with STATE.lock:
                self.send_json(200, {"max_running": STATE.max_running, "busy": STATE.busy,
                                     "served": STATE.served, "rejected": STATE.rejected,
                                     "disconnects": STATE.disconnects})
        else:
            self.send_json(404, {"error": "no such path"})

    def chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def do_POST(self) -> None:
        n = int(self.headers.get("Content-Length", "0"))
        try:
            body = json.loads(self.rfile.read(n))
        except ValueError:
            body = None
        chat = self.path == "/v1/chat/completions"
        if self.path not in ("/v1/chat/completions", "/v1/completions"):
            self.send_json(404, {"error": "no such endpoint"})
            return
        mt = body.get("max_tokens") if isinstance(body, dict) else None
        temp = body.get("temperature", 0) if isinstance(body, dict) else None
        if (not isinstance(mt, int) or mt < 1 or not isinstance(temp, (int, float)) or temp < 0
                or body.get("stream") is not True):
            with STATE.lock:
                STATE.rejected += 1
            self.send_json(400, {"error": {"message": "invalid parameters", "type": "invalid_request_error"}})
            return
        prompt = body["messages"][-1]["content"] if chat else body["prompt"]
        t_arrive = time.perf_counter()
        writes = []
        with STATE.lock:
            STATE.waiting += 1
        STATE.slots.acquire()  # the queue in front of the running batch
        t0 = time.perf_counter()
        with STATE.lock:
            STATE.waiting -= 1
            STATE.running += 1
            STATE.max_running = max(STATE.max_running, STATE.running)
        gone = False
        try:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Connection", "close")
            self.end_headers()

            def event(obj: dict) -> None:
                self.chunk(b"data: " + json.dumps(obj).encode() + b"\n\n")

            if chat:
                event({"choices": [{"index": 0, "delta": {"role": "assistant"}}]})
            time.sleep(PREFILL)
            for i in range(mt):
                if i:
                    time.sleep(ITL)
                t = token(prompt, i)
                event({"choices": [{"index": 0, "delta": {"content": t}}]} if chat else
                      {"choices": [{"index": 0, "text": t}]})
                writes.append(time.perf_counter())
                STATE.token_sent()
            event({"choices": [{"index": 0, "finish_reason": "length", **({"delta": {}} if chat else {"text": ""})}],
                   "usage": {"prompt_tokens": len(prompt.split()), "completion_tokens": mt}})
            if not chat:  # the chat path ends the body without [DONE], as transformers serve does
                self.chunk(b"data: [DONE]\n\n")
            self.chunk(b"")
            with STATE.lock:
                STATE.timings.append((writes[0] - t_arrive, time.perf_counter() - t_arrive,
                                      [b - a for a, b in zip(writes, writes[1:])]))
        except (BrokenPipeError, ConnectionResetError):
            gone = True
        finally:
            with STATE.lock:
                STATE.running -= 1
                STATE.busy += time.perf_counter() - t0
                if gone:
                    STATE.disconnects += 1
                else:
                    STATE.served += 1
            STATE.slots.release()
        self.close_connection = True


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256


def start_server():
    httpd = Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, httpd.server_address[1]


def wait_idle(timeout: float = 20.0) -> None:
    """Until the server holds no request: requests a client closed while
    they waited for a slot still take one (the server notices the closed
    socket only when it writes), and their tokens would land in the next
    run's counters."""
    t_end = time.time() + timeout
    while time.time() < t_end:
        with STATE.lock:
            if STATE.waiting == 0 and STATE.running == 0:
                return
        time.sleep(0.05)
    raise AssertionError("the test server did not become idle")


def server_info(port: int) -> dict:
    import urllib.request
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/server", timeout=5) as f:
        return json.loads(f.read())


def run_serve(port: int, *args: str, expect_rc: int = 0) -> dict:
    fd, out = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        r = subprocess.run([sys.executable, SERVE, "--url", f"http://127.0.0.1:{port}", "--out", out,
                            "--output-len", f"fixed:{OUT}", "--prompt-len", "uniform:8:32", *args],
                           capture_output=True, text=True, timeout=90)
        if r.returncode != expect_rc:
            raise AssertionError(f"serve.py exit {r.returncode} (expected {expect_rc})\n{r.stdout}\n{r.stderr}")
        with open(out) as f:
            rep = json.load(f)
        rep["_stdout"] = r.stdout
        return rep
    finally:
        os.unlink(out)


class TestServe(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.httpd, cls.port = start_server()
        cls.tmp = tempfile.mkdtemp()
        cls.greedy = os.path.join(cls.tmp, "greedy.json")
        # below saturation: 5 req/s against a capacity of 22; faults on
        before = server_info(cls.port)
        STATE.timings = []
        cls.low = run_serve(cls.port, "--rate", "5", "--duration", "5", "--seed", "1", "--bad-request",
                            "--disconnect-frac", "0.3", "--long-prompt", "300", "--record-greedy", cls.greedy,
                            "--greedy-n", "4", "--stats-url", f"http://127.0.0.1:{cls.port}/stats",
                            "--report-every", "2", "--pid", str(os.getpid()))
        after = server_info(cls.port)
        with STATE.lock:
            cls.low_timings = list(STATE.timings)
        cls.low_server = {k: after[k] - before[k] for k in ("busy", "served", "rejected", "disconnects")}
        # past saturation: 40 req/s; the greedy set checked against the file
        # the first run recorded
        STATE.max_running = 0
        before = server_info(cls.port)
        cls.high = run_serve(cls.port, "--rate", "40", "--duration", "3", "--seed", "2",
                             "--greedy-check", cls.greedy, "--greedy-n", "4")
        cls.high_server = server_info(cls.port)
        cls.high_busy = {k: cls.high_server[k] - before[k] for k in ("busy", "served")}

    @classmethod
    def tearDownClass(cls) -> None:
        cls.httpd.shutdown()
        cls.httpd.server_close()

    # --- below saturation ---------------------------------------------------
    def test_low_throughput_follows_rate(self) -> None:
        s = self.low["summary"]
        off = s["offered_rate"]
        self.assertGreater(off, 2.5)
        self.assertLess(off, 10)
        st = s["steady"]
        # open loop below saturation: what comes out is what went in
        self.assertAlmostEqual(st["requests_s"] / off, 1.0, delta=0.35, msg=st)
        # every token streamed counts: normal, long and greedy requests to
        # the end, disconnected ones up to the point they left
        k = s["requests"]["by_kind"]
        self.assertEqual(k["normal"]["tokens"], k["normal"]["ok"] * OUT)
        self.assertEqual(k["greedy"]["tokens"], 4 * serve.GREEDY_OUTPUT_LEN)
        self.assertLess(k["disconnect"]["tokens"], k["disconnect"]["ok"] * OUT)
        self.assertEqual(s["throughput"]["output_tokens"], sum(v["tokens"] for v in k.values()))

    def test_low_latencies_match_server_delays(self) -> None:
        """The client's latencies sit on the server's own clock of the same
        requests: no shorter than the delays the server sleeps, and above
        what the server measured by at most the client's side of the
        socket. The upper bounds follow the server's clock, not the
        nominal delays: on a loaded machine every sleep runs long (a CI
        run saw e2e p50 at 1.5x nominal), and that is no error of the
        client's; the e2e bound also grows with the server's lateness. The lower bounds stay on the nominal delays: the
        server's set is not the client's (it also times the requests that
        left mid-stream without its noticing, in full), and a CI run saw
        the client's e2e p50 at 0.84x the server's. A client that counted
        from the wrong moment, or missed or merged tokens, still lands
        outside."""
        s = self.low["summary"]
        srv = self.low_timings
        self.assertGreater(len(srv), 10)
        srv_ttft = statistics.median(t for t, _, _ in srv)
        srv_e2e = statistics.median(e for _, e, _ in srv)
        srv_itl = statistics.median(g for _, _, gaps in srv for g in gaps)
        srv_tpot = statistics.mean((e - t) / len(gaps) for t, e, gaps in srv if gaps)
        self.assertGreaterEqual(s["ttft_ms"]["p50"], PREFILL * 1e3 * 0.9)
        self.assertLess(s["ttft_ms"]["p50"], srv_ttft * 1e3 + 40)
        self.assertGreaterEqual(s["itl_ms"]["p50"], ITL * 1e3 * 0.9)
        self.assertLess(s["itl_ms"]["p50"], srv_itl * 1e3 + 20)
        self.assertGreaterEqual(s["tpot_ms"]["mean"], ITL * 1e3 * 0.9)
        self.assertLess(s["tpot_ms"]["mean"], srv_tpot * 1e3 + 10)
        e2e = (PREFILL + (OUT - 1) * ITL) * 1e3
        self.assertGreaterEqual(s["e2e_ms"]["p50"], e2e * 0.9)
        # the client's side of a whole request (connect, headers, every
        # token's read, the end of the stream) runs late as the server's
        # sleeps do, on a loaded machine a few times over: 80 ms, and four
        # times the server's own lateness over the nominal delays. A CI run
        # beside four other configurations: client 274.7 ms, server 193.5,
        # nominal 180 (bound 327.5). Here beside one: 188.6 against 187.6
        # (bound 297.8). Unloaded (the server 2-3 ms late) the bound is
        # about 90 ms over the server's, and a client 100 ms long fails;
        # beside a CI's other configurations only an error past 100 ms does
        late = max(0.0, srv_e2e * 1e3 - e2e)
        self.assertLess(s["e2e_ms"]["p50"], srv_e2e * 1e3 + 80 + 4 * late)
        self.assertEqual(s["lengths"]["output_tokens_mean"], OUT)
        self.assertEqual(s["lengths"]["usage_completion_tokens_mean"], OUT)

    def test_low_running_batch(self) -> None:
        s = self.low["summary"]
        c = s["concurrency"]
        expect = s["offered_rate"] * s["e2e_ms"]["mean"] / 1e3  # rate x latency
        self.assertAlmostEqual(c["little"] / expect, 1.0, delta=0.35, msg=c)
        self.assertAlmostEqual(c["sampled_in_flight"] / expect, 1.0, delta=0.5, msg=c)
        # the server's own integral of its running count over the run
        # (less the greedy set sent alone after the run)
        busy = self.low_server["busy"] - self.low["greedy_alone"]["request_s"]
        self.assertAlmostEqual(busy / s["duration_s"] / c["little"], 1.0, delta=0.35)
        self.assertLessEqual(c["sampled_decoding"], c["sampled_in_flight"])
        self.assertGreater(c["samples"], 20)  # every 100 ms

    def test_low_faults(self) -> None:
        s = self.low["summary"]
        b = s["bad_request"]
        self.assertEqual(b["status"], 400)
        self.assertTrue(b["got_4xx"])
        self.assertGreater(b["completed_after"], 0)  # the server kept serving
        self.assertEqual(self.low_server["rejected"], 1)
        self.assertNotIn("http_400", s["errors"])  # expected, so not an error
        rq = s["requests"]
        self.assertGreater(rq["disconnect_scheduled"], 0)
        self.assertEqual(rq["disconnected"], rq["disconnect_scheduled"])
        self.assertEqual(rq["failed"], 0, s["errors"])
        # the server saw the clients go (a disconnect after the last token
        # may land as a served request)
        self.assertGreater(self.low_server["disconnects"], 0)
        self.assertLessEqual(self.low_server["disconnects"], rq["disconnected"])
        lp = s["long_prompt"]
        self.assertIsNone(lp["error"])
        self.assertEqual(lp["tokens"], OUT)
        self.assertEqual(lp["usage"]["prompt_tokens"], 300)

    def test_low_intervals_and_stats(self) -> None:
        iv = self.low["intervals"]
        self.assertGreaterEqual(len(iv), 2)
        self.assertIsNotNone(iv[0]["rss_kib"])  # --pid: this process
        self.assertIn("shim", iv[0])
        self.assertIn("done", self.low["_stdout"])
        sh = self.low["shim"]
        self.assertEqual(sh["scope"], "delta over the run")
        # 3 hits and 1 miss a token; the 5000 misses before the run are not in it
        self.assertAlmostEqual(sh["hit_rate"], 0.75, places=3)
        self.assertAlmostEqual(sh["host_read_bytes_per_step"], 1000, places=1)
        self.assertEqual(sh["events_dropped"], 0)  # 7 before, none during
        self.assertEqual(sh["read_multiplicity_max"], 2.5)

    def test_stats_only(self) -> None:
        """A stats file written at exit, summarised after the fact: totals."""
        st = STATE.stats_json()
        path = os.path.join(self.tmp, "stats.json")
        with open(path, "w") as f:
            json.dump(st, f)
        r = subprocess.run([sys.executable, SERVE, "--stats-only", path], capture_output=True, text=True,
                           timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        rep = json.loads(r.stdout)
        self.assertIn("totals", rep["scope"])
        h, m = st["prefetch"]["names"]["experts"]["hits"], st["prefetch"]["names"]["experts"]["misses"]
        self.assertAlmostEqual(rep["hit_rate"], h / (h + m), places=3)
        self.assertEqual(rep["events_dropped"], 7)

    def test_greedy_recorded(self) -> None:
        with open(self.greedy) as f:
            g = json.load(f)
        self.assertEqual(len(g["outputs"]), 4)
        prompts = serve.greedy_prompts(4)
        for i, p in enumerate(prompts):
            self.assertEqual(g["outputs"][str(i)], "".join(token(p, k) for k in range(serve.GREEDY_OUTPUT_LEN)))

    # --- past saturation ----------------------------------------------------
    def test_high_saturates(self) -> None:
        s = self.high["summary"]
        self.assertGreater(s["offered_rate"], 25)
        # what comes out is the server's capacity, not the offered rate
        self.assertLess(s["throughput"]["requests_s"], 0.8 * s["offered_rate"])
        # the capacity the server had on this machine (its slots over the
        # mean time a request held one, on its own clock), not the nominal
        # one: on a loaded machine its sleeps run long (0.64x nominal here
        # beside six busy loops)
        b = self.high_busy
        capacity = SLOTS * b["served"] / b["busy"]
        self.assertLess(capacity, CAPACITY * 1.05)
        self.assertAlmostEqual(s["throughput"]["requests_s"] / capacity, 1.0, delta=0.3,
                               msg=(s["throughput"], capacity))
        self.assertEqual(self.high_server["max_running"], SLOTS)
        c = s["concurrency"]
        # the queue builds up at the client; the running batch stays at the slots
        self.assertGreater(c["sampled_in_flight"], SLOTS * 1.5, c)
        self.assertLessEqual(c["sampled_decoding"], SLOTS + 0.5, c)
        self.assertGreater(c["sampled_decoding"], SLOTS * 0.6, c)
        self.assertGreater(s["ttft_ms"]["p99"], 3 * PREFILL * 1e3)  # waiting for a slot
        self.assertEqual(s["requests"]["failed"], 0, s["errors"])

    def test_greedy_check_passes(self) -> None:
        g = self.high["summary"]["greedy"]
        self.assertTrue(g["ok"], g)
        self.assertEqual(g["identical"], 4)

    def test_greedy_check_fails_on_doctored_file(self) -> None:
        """One output changed: that one differs, the other three match
        (through the completions endpoint and its [DONE] this time)."""
        with open(self.greedy) as f:
            g = json.load(f)
        g["outputs"]["2"] = g["outputs"]["2"] + " extra"
        g["endpoint"] = "completions"
        bad = os.path.join(self.tmp, "doctored.json")
        with open(bad, "w") as f:
            json.dump(g, f)
        rep = run_serve(self.port, "--rate", "20", "--requests", "4", "--greedy-check", bad, "--greedy-n", "4",
                        "--warmup-requests", "0", "--endpoint", "completions", expect_rc=1)
        gr = rep["summary"]["greedy"]
        self.assertFalse(gr["ok"])
        self.assertEqual(gr["different"], ["2"])
        self.assertEqual(gr["identical"], 3)
        self.assertIn("DIFFERENT", rep["_stdout"])
        # the reference of another endpoint is refused even when every output matches
        g["outputs"]["2"] = g["outputs"]["2"][:-len(" extra")]
        g["endpoint"] = "chat"
        with open(bad, "w") as f:
            json.dump(g, f)
        rep = run_serve(self.port, "--rate", "20", "--requests", "1", "--greedy-check", bad, "--greedy-n", "4",
                        "--warmup-requests", "0", "--endpoint", "completions", expect_rc=1)
        self.assertEqual(rep["summary"]["greedy"]["identical"], 4)
        self.assertFalse(rep["summary"]["greedy"]["ok"])

    def test_greedy_alone(self) -> None:
        """The greedy set sent together to the idle server after the run:
        recorded with the reference and checked against it; with
        --greedy-load-check report, only it decides the exit status."""
        with open(self.greedy) as f:
            g = json.load(f)
        self.assertEqual(sorted(g["alone"]), ["0", "1", "2", "3"])
        self.assertEqual(g["alone"], g["outputs"])  # this server's output is a function of the prompt
        ga = self.high["greedy_alone"]
        self.assertTrue(ga["ok"], ga)
        self.assertEqual(ga["identical"], 4)
        self.assertIn("greedy alone", self.high["_stdout"])
        # an output under load differs, the ones sent alone match: reported, exit 0
        g["outputs"]["1"] = g["outputs"]["1"] + " extra"
        bad = os.path.join(self.tmp, "doctored-load.json")
        with open(bad, "w") as f:
            json.dump(g, f)
        rep = run_serve(self.port, "--rate", "20", "--requests", "2", "--greedy-check", bad, "--greedy-n", "4",
                        "--warmup-requests", "0", "--greedy-load-check", "report")
        self.assertFalse(rep["summary"]["greedy"]["ok"])
        self.assertTrue(rep["greedy_alone"]["ok"])
        # one sent alone differs: exit 1, whatever the load check
        g["alone"]["3"] = g["alone"]["3"] + " extra"
        with open(bad, "w") as f:
            json.dump(g, f)
        rep = run_serve(self.port, "--rate", "20", "--requests", "2", "--greedy-check", bad, "--greedy-n", "4",
                        "--warmup-requests", "0", "--greedy-load-check", "report", expect_rc=1)
        self.assertEqual(rep["greedy_alone"]["different"], ["3"])
        self.assertEqual(rep["greedy_alone"]["identical"], 3)

    def test_server_down_is_refused(self) -> None:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        r = subprocess.run([sys.executable, SERVE, "--url", f"http://127.0.0.1:{port}", "--requests", "2"],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("refused", r.stderr)


class TestRates(unittest.TestCase):
    """--rates: phases one after another against the same server, each with
    its own report, shim-stats delta and greedy outputs."""

    @classmethod
    def setUpClass(cls) -> None:
        cls.httpd, cls.port = start_server()
        cls.tmp = tempfile.mkdtemp()
        cls.greedy = os.path.join(cls.tmp, "greedy-rates.json")
        stats = f"http://127.0.0.1:{cls.port}/stats"
        wait_idle()
        # below saturation, then past it (capacity 22 requests/s)
        cls.two = run_serve(cls.port, "--rates", "5,40", "--duration", "3", "--seed", "3", "--stats-url", stats,
                            "--record-greedy", cls.greedy, "--greedy-n", "4")
        wait_idle()
        cls.check = run_serve(cls.port, "--rates", "5,40", "--duration", "1", "--seed", "4",
                              "--greedy-check", cls.greedy, "--greedy-n", "4", "--warmup-requests", "0")
        wait_idle()
        # far past saturation, the queue cut 0.3 s after the last arrival
        cls.cut = run_serve(cls.port, "--rates", "60", "--duration", "2", "--seed", "5", "--drain-timeout", "0.3",
                            "--warmup-requests", "0", "--greedy-check", cls.greedy, "--greedy-n", "4")
        wait_idle()

    @classmethod
    def tearDownClass(cls) -> None:
        cls.httpd.shutdown()
        cls.httpd.server_close()

    def test_one_report_per_phase(self) -> None:
        ph = self.two["phases"]
        self.assertEqual([p["rate"] for p in ph], [5.0, 40.0])
        self.assertEqual([p["phase"] for p in ph], [1, 2])
        self.assertEqual(ph[1]["seed"] - ph[0]["seed"], 1000)  # each phase its own prompts
        self.assertNotIn("summary", self.two)  # no whole-run summary beside the phases
        for p in ph:  # the fields of a single run
            for k in ("requests", "throughput", "steady", "ttft_ms", "itl_ms", "concurrency", "errors"):
                self.assertIn(k, p["summary"])
            self.assertEqual(p["summary"]["requests"]["failed"], 0, p["summary"]["errors"])
        self.assertEqual(self.two["_stdout"].count("=== phase "), 2)

    def test_each_phase_at_its_rate(self) -> None:
        low, high = (p["summary"] for p in self.two["phases"])
        self.assertAlmostEqual(low["steady"]["requests_s"] / low["offered_rate"], 1.0, delta=0.35)
        self.assertLess(low["offered_rate"], 10)
        self.assertGreater(high["offered_rate"], 25)
        self.assertAlmostEqual(high["throughput"]["requests_s"] / CAPACITY, 1.0, delta=0.3)
        self.assertGreater(high["concurrency"]["sampled_in_flight"],
                           2 * low["concurrency"]["sampled_in_flight"])

    def test_shim_delta_per_phase(self) -> None:
        """The test server moves its counters with every token it sends:
        each phase's delta holds its own tokens, not the run's."""
        for p in self.two["phases"]:
            self.assertEqual(p["shim"]["scope"], "delta over the run")
            self.assertEqual(p["shim"]["steps"], p["summary"]["throughput"]["output_tokens"])
            self.assertAlmostEqual(p["shim"]["hit_rate"], 0.75, places=3)
        a, b = (p["shim"]["steps"] for p in self.two["phases"])
        self.assertNotEqual(a, b)

    def test_greedy_per_rate(self) -> None:
        with open(self.greedy) as f:
            g = json.load(f)
        self.assertEqual(sorted(g["by_rate"]), ["40", "5"])
        self.assertEqual(g["outputs"], g["by_rate"]["5"])  # what a single run checks against
        for p in self.two["phases"]:
            self.assertTrue(p["summary"]["greedy"]["ok"])
        for p in self.check["phases"]:
            gr = p["summary"]["greedy"]
            self.assertTrue(gr["ok"], gr)
            self.assertEqual(gr["identical"], 4)

    def test_drain_timeout_cuts(self) -> None:
        s = self.cut["phases"][0]["summary"]
        rq = s["requests"]
        self.assertGreater(rq["cut"], 10)  # ~120 sent, capacity ~50 in 2.3 s
        self.assertGreater(rq["completed"], 10)
        self.assertEqual(rq["failed"], 0, s["errors"])  # a cut request is not an error
        self.assertNotIn("cut", s["errors"])
        self.assertEqual(rq["completed"] + rq["cut"], rq["scheduled"])
        self.assertLess(s["duration_s"], 2 + 0.3 + 1.0)
        # a greedy request cut has no output: missing, not different (the
        # run exits 0); the reference has no phase at 60/s: its outputs
        g = s["greedy"]
        self.assertEqual(g["different"], [])
        self.assertEqual(g["identical"] + len(g["missing"]), 4)

    def test_rate_options(self) -> None:
        with self.assertRaises(SystemExit):
            serve.parse_args(["--rate", "2", "--rates", "1,3"])
        with self.assertRaises(SystemExit):
            serve.parse_args(["--rates", "1,0"])
        a = serve.parse_args(["--rates", "2,8"])
        self.assertEqual((a.rates, a.rate), ([2.0, 8.0], 2.0))
        self.assertEqual(serve.parse_args([]).rate, 1.0)  # a single run as before
        p = serve.phase_args(a, 1, 8.0)
        self.assertEqual((p.rate, p.seed, a.rate, a.seed), (8.0, 1000, 2.0, 0))


# ----------------------------------------------------------------------------
# the in-process driver (bench/serve_engine.py) against a fake of
# transformers' continuous-batching manager: no torch, no GPU


class Status:
    """transformers' RequestStatus: an enum whose .name the engine reads."""
    def __init__(self, name: str) -> None:
        self.name = name


class Output:
    """transformers' GenerationOutput as streamed: every token so far."""
    def __init__(self, rid: str, toks: list, status: str, error=None) -> None:
        self.request_id, self.generated_tokens, self.status, self.error = rid, list(toks), Status(status), error

    def is_finished(self) -> bool:
        return self.status.name == "FINISHED"


class FakeManager:
    """The manager's surface serve_engine uses (add_request, get_result,
    cancel_request, is_running, start, stop, batch_processor.scheduler.
    active_requests), with its semantics as read in transformers 5.x's
    continuous_api.py: a generation thread admits at most SLOTS requests,
    gives each active request one token a step (STEP s) and streams the
    tokens so far; a cancelled request leaves at the next step; with
    fail=True every request fails with an empty error text; with die=True
    the thread ends at start, serving nothing."""

    STEP = 0.02

    def __init__(self, fail: bool = False, die: bool = False) -> None:
        import queue
        self.fail, self.die = fail, die
        self.inbox: "queue.Queue" = queue.Queue()
        self.results: "queue.Queue" = queue.Queue()
        self.waiting: list = []
        self.batch_processor = types.SimpleNamespace(scheduler=types.SimpleNamespace(active_requests={}))
        self.continuous_batching_config = types.SimpleNamespace(use_cuda_graph=(False, False))
        self.added: list = []
        self.cancelled: set = set()
        self.finished: set = set()
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.max_active = 0

    def start(self) -> None:
        self.thread.start()

    def is_running(self) -> bool:
        return self.thread.is_alive()

    def stop(self, block: bool = True, timeout=None) -> None:
        self.stop_event.set()
        if block:
            self.thread.join(timeout)

    def add_request(self, input_ids, request_id=None, max_new_tokens=None, streaming=False) -> str:
        self.added.append(request_id)
        self.inbox.put((request_id, list(input_ids), max_new_tokens, streaming))
        return request_id

    def cancel_request(self, request_id: str) -> None:
        self.cancelled.add(request_id)

    def get_result(self, request_id=None, timeout=None):
        import queue
        try:
            return self.results.get(timeout=timeout)
        except queue.Empty:
            return None

    def loop(self) -> None:
        import queue
        if self.die:
            return
        active = self.batch_processor.scheduler.active_requests
        while not self.stop_event.is_set():
            while True:
                try:
                    self.waiting.append(self.inbox.get_nowait())
                except queue.Empty:
                    break
            self.waiting = [w for w in self.waiting if w[0] not in self.cancelled]
            for rid in [r for r in active if r in self.cancelled]:
                del active[rid]
            while self.waiting and len(active) < SLOTS:
                rid, ids, n, streaming = self.waiting.pop(0)
                active[rid] = (ids, n, [])
            self.max_active = max(self.max_active, len(active))
            time.sleep(self.STEP)
            for rid, (ids, n, toks) in list(active.items()):
                if self.fail:
                    del active[rid]
                    self.results.put(Output(rid, [], "FAILED", ""))
                    continue
                toks.append((sum(ids) * 31 + len(toks)) % 1000)  # a function of the prompt only
                done = len(toks) >= n
                if done:
                    del active[rid]
                    self.finished.add(rid)
                self.results.put(Output(rid, toks, "FINISHED" if done else "DECODING"))


def run_inprocess(manager: FakeManager, *opts: str):
    """serve.py's in-process path, as main() runs it, with the engine made
    around the fake manager; the report and the exit status."""
    import asyncio
    import serve_engine
    fd, out = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        a = serve.parse_args(["--inprocess", "fake", "--output-len", "fixed:6", "--prompt-len", "uniform:8:32",
                              "--out", out, *opts])
        a.engine_factory = lambda args: serve_engine.Engine.around(args, manager)
        t0 = time.perf_counter()
        rc = asyncio.run(serve.main_async(a))
        wall = time.perf_counter() - t0
        with open(out) as f:
            return json.load(f), rc, wall
    finally:
        os.unlink(out)


class TestInProcess(unittest.TestCase):
    """serve.py --inprocess through bench/serve_engine.py's Engine, the
    manager faked: phases on one engine, streamed tokens, the engine's
    running batch, cancellation of the requests the client closes."""

    def test_phases_on_one_engine(self) -> None:
        m = FakeManager()
        g = os.path.join(tempfile.mkdtemp(), "greedy.json")
        rep, rc, _ = run_inprocess(m, "--rates", "10,80", "--duration", "1.5", "--seed", "7",
                                   "--disconnect-frac", "0.2", "--record-greedy", g, "--greedy-n", "3",
                                   "--warmup-requests", "1")
        self.assertEqual(rc, 0)
        self.assertEqual([p["rate"] for p in rep["phases"]], [10.0, 80.0])
        self.assertEqual(rep["engine"]["use_cuda_graph"], "(False, False)")
        for p in rep["phases"]:
            s = p["summary"]
            self.assertEqual(s["requests"]["failed"], 0, s["errors"])
            k = s["requests"]["by_kind"]
            self.assertEqual(k["normal"]["tokens"], k["normal"]["ok"] * 6)  # each streamed token counted once
            self.assertEqual(s["itl_ms"]["n"], sum(v["ok"] * (6 - 1) for n, v in k.items() if n == "normal")
                             + 3 * (serve.GREEDY_OUTPUT_LEN - 1))
            # the engine's running batch, sampled: never above its slots
            self.assertIsNotNone(s["concurrency"]["engine_active"])
            self.assertLessEqual(s["concurrency"]["engine_active"], SLOTS)
            self.assertGreater(s["concurrency"]["engine_active"], 0)
            self.assertTrue(s["greedy"]["ok"])
        # past the slots (80/s x 6 tokens x 20 ms against 4 slots), the queue
        self.assertGreater(rep["phases"][1]["summary"]["concurrency"]["sampled_in_flight"], SLOTS)
        self.assertEqual(m.max_active, SLOTS)
        # request ids are unique across phases, and every client that went
        # away was cancelled in the engine
        self.assertEqual(len(set(m.added)), len(m.added))
        gone = sum(p["summary"]["requests"]["disconnected"] for p in rep["phases"])
        self.assertGreater(gone, 0)
        self.assertEqual(len(m.cancelled), gone)
        with open(g) as f:
            ref = json.load(f)
        self.assertEqual(sorted(ref["by_rate"]), ["10", "80"])
        self.assertEqual(ref["by_rate"]["10"], ref["by_rate"]["80"])  # greedy: a function of the prompt
        self.assertEqual(len(ref["outputs"]["0"]), serve.GREEDY_OUTPUT_LEN)

    def test_drain_timeout_cancels_in_the_engine(self) -> None:
        m = FakeManager()
        rep, rc, _ = run_inprocess(m, "--rates", "100", "--duration", "1", "--drain-timeout", "0.2",
                                   "--warmup-requests", "0")
        rq = rep["phases"][0]["summary"]["requests"]
        self.assertGreater(rq["cut"], 10)
        self.assertEqual(rq["failed"], 0)
        # the engine stops working on what the client cut: the next phase
        # would otherwise inherit it. Every request the engine was given and
        # did not finish was cancelled; a cut request whose task had not yet
        # reached the engine (cut at once) has nothing to cancel.
        self.assertLessEqual(set(m.added) - m.finished, m.cancelled)
        self.assertLessEqual(m.cancelled, set(m.added))
        self.assertLessEqual(len(m.cancelled), rq["cut"])
        self.assertGreater(len(m.cancelled), 0)
        # what the engine still holds when the run stops it is cancelled: it
        # leaves at the engine's next step, which a stop may come before (a
        # loaded CI machine once stopped the fake's thread first)
        self.assertLessEqual(set(m.batch_processor.scheduler.active_requests), m.cancelled)

    def test_failed_request_with_empty_error(self) -> None:
        """transformers fails a request with status FAILED and str(error),
        which can be empty: an error at once, not a wait for the timeout."""
        rep, rc, wall = run_inprocess(FakeManager(fail=True), "--requests", "3", "--rate", "20",
                                      "--warmup-requests", "0", "--request-timeout", "20")
        s = rep["summary"]
        self.assertEqual(s["errors"], {"stream_error": 3})
        self.assertLess(wall, 10)

    def test_dead_generation_thread(self) -> None:
        """A generation thread that ended serves nothing more: requests fail
        within about a second, not at --request-timeout."""
        rep, rc, wall = run_inprocess(FakeManager(die=True), "--requests", "2", "--rate", "20",
                                      "--warmup-requests", "0", "--request-timeout", "30")
        self.assertEqual(rep["summary"]["errors"], {"stream_error": 2})
        self.assertLess(wall, 10)


# ----------------------------------------------------------------------------
# bench/serve-rows.py's soak and faults verdicts: pure functions of serve.py's
# reports, fed synthetic interval lines and the reports of in-process runs
# against the fake manager (no torch, no GPU, no launcher)


def load_rows():
    import importlib.util
    spec = importlib.util.spec_from_file_location("serve_rows", os.path.join(SRC, "bench", "serve-rows.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class FakeWo:
    """woffload's stats() as the in-process engine reads it: the fake
    manager's tokens so far move the hot set's counters (3 hits and 1 miss
    a token, after a history of 5000 misses only a delta removes)."""

    def __init__(self, manager: FakeManager) -> None:
        self.tokens = 0  # every streamed output is one more token
        put = manager.results.put

        def counted(out, *a, **k):
            self.tokens += 1
            return put(out, *a, **k)
        manager.results.put = counted

    def stats(self) -> dict:
        n = self.tokens
        return {"prefetch": {"names": {"experts": {"hits": 3 * n, "misses": 5000 + n}}},
                "ring": {"dropped": 0}, "allocations": {"live": 100, "placement_errors": 0}}


def soak_intervals(minutes: int = 5, rss=None, gpu=None, hits=None, errors=None, every: float = 60.0) -> list:
    """serve.py's interval lines of a soak, one a minute: RSS (MiB), GPU
    memory (MiB) and the hit rate of each minute given as lists (default
    flat: 15000 MiB, 56000 MiB, 0.457), the counters made cumulative."""
    rss = rss or [15000 + (i % 2) * 20 for i in range(minutes)]       # 0.13%: noise
    gpu = gpu or [56000 + (i % 3) * 100 for i in range(minutes)]      # 0.36%
    hits = hits or [0.457 + (i % 2) * 0.002 for i in range(minutes)]
    errors = errors or [0] * minutes
    out, h, m = [], 0.0, 5000.0  # the counters' history before the phase: interval_base
    for i in range(minutes):
        h += 1000 * hits[i]
        m += 1000 * (1 - hits[i])
        out.append({"t": every * (i + 1), "completed": 180, "tok_s": 96.0, "ttft_p99_ms": 400.0, "errors": errors[i],
                    "in_flight": 30, "rss_kib": int(rss[i] * 1024), "gpu_mib": {"pid": gpu[i], "all": gpu[i]},
                    "shim": {"hits": h, "misses": m, "launches": 1e4 * (i + 1), "dropped": 0.0,
                             "live_allocations": 104.0, "placement_errors": 0.0}})
    return out


BASE = {"hits": 0.0, "misses": 5000.0, "launches": 0.0, "dropped": 0.0, "live_allocations": 102.0,
        "placement_errors": 0.0}


class TestSoakVerdict(unittest.TestCase):
    """serve-rows.py --soak: the table a minute and issue 20's verdict from
    minute 2 on, computed from interval lines."""

    @classmethod
    def setUpClass(cls) -> None:
        cls.rows = load_rows()

    def verdict(self, intervals: list, failed: int = 0, duration: float = 300.0) -> dict:
        lines = self.rows.soak_lines(intervals, BASE, duration)
        return self.rows.soak_verdict(lines, failed)

    def failed_checks(self, v: dict) -> list:
        return [c["check"] for c in v["checks"] if c["ok"] is False]

    def test_flat_run_passes(self) -> None:
        lines = self.rows.soak_lines(soak_intervals(), BASE, 300.0)
        self.assertEqual(len(lines), 5)
        # each minute's hit rate from the deltas; the first against the phase's start
        self.assertAlmostEqual(lines[0]["hit_rate"], 0.457, places=3)
        self.assertAlmostEqual(lines[1]["hit_rate"], 0.459, places=3)
        self.assertEqual((lines[0]["rss_mib"], lines[0]["gpu_mib"]), (15000.0, 56000))
        v = self.rows.soak_verdict(lines, 0)
        self.assertTrue(v["ok"], v["checks"])
        self.assertEqual(v["lines_judged"], 4)  # minutes 2-5
        self.assertEqual(self.failed_checks(v), [])
        md = "\n".join(self.rows.soak_table(lines) + self.rows.verdict_table(v["checks"]))
        self.assertIn("| 5 | 96.0 | 400 | 180 | 0 | 30 | 15000 | 56100 | 0.457 | 10000 | 104 | 0 |", md)
        self.assertNotIn("FAILED", md)

    def test_growing_rss_fails(self) -> None:
        v = self.verdict(soak_intervals(rss=[15000 * (1 + 0.004 * i) for i in range(5)]))  # 1.6% over minutes 2-5
        self.assertFalse(v["ok"])
        self.assertEqual(self.failed_checks(v), ["RSS flat"])
        rss = next(c for c in v["checks"] if c["check"] == "RSS flat")
        self.assertIn("+180 MiB", rss["value"])

    def test_growing_gpu_memory_fails(self) -> None:
        v = self.verdict(soak_intervals(gpu=[56000, 56000, 56300, 56600, 57000]))
        self.assertEqual(self.failed_checks(v), ["GPU memory flat"])

    def test_an_error_fails(self) -> None:
        v = self.verdict(soak_intervals(errors=[0, 0, 1, 0, 0]), failed=1)
        self.assertEqual(self.failed_checks(v), ["errors over the soak"])
        # without the phase's count, the lines' errors
        lines = self.rows.soak_lines(soak_intervals(errors=[1, 0, 0, 0, 0]), BASE, 300.0)
        self.assertFalse(self.rows.soak_verdict(lines)["ok"])  # minute 1 counts for errors

    def test_unsteady_hit_rate_fails(self) -> None:
        v = self.verdict(soak_intervals(hits=[0.45, 0.46, 0.40, 0.46, 0.46]))
        self.assertEqual(self.failed_checks(v), ["hit rate steady"])

    def test_minute_one_and_drain_not_judged(self) -> None:
        # minute 1 holds the warm-up's growth; a line after the last arrival the drain
        iv = soak_intervals(minutes=6, rss=[14000, 15000, 15010, 15000, 15020, 13000],
                            hits=[0.2, 0.457, 0.458, 0.457, 0.458, 0.1])
        v = self.verdict(iv)
        self.assertTrue(v["ok"], v["checks"])
        self.assertEqual(v["lines_judged"], 4)
        lines = self.rows.soak_lines(iv, BASE, 300.0)
        self.assertFalse(lines[-1]["loaded"])
        self.assertIn("(drain)", "\n".join(self.rows.soak_table(lines)))

    def test_host_row_no_hit_rate(self) -> None:
        iv = soak_intervals()
        for ln in iv:  # host: no managed ranges, no hits or misses
            ln["shim"]["hits"], ln["shim"]["misses"] = 0.0, 0.0
        v = self.rows.soak_verdict(self.rows.soak_lines(iv, dict(BASE, misses=0.0), 300.0), 0)
        self.assertTrue(v["ok"], v["checks"])
        hr = next(c for c in v["checks"] if c["check"] == "hit rate steady")
        self.assertIsNone(hr["ok"])
        self.assertFalse(hr["required"])

    def test_too_short_or_unmeasured_fails(self) -> None:
        v = self.verdict(soak_intervals(minutes=1), duration=60.0)
        self.assertFalse(v["ok"])
        self.assertIn("lines from minute 2 on (arrivals throughout)", self.failed_checks(v))
        iv = soak_intervals()
        for ln in iv:
            del ln["gpu_mib"]  # no nvidia-smi
        v = self.verdict(iv)
        self.assertFalse(v["ok"])  # not measured is no pass
        self.assertEqual(self.failed_checks(v), [])
        self.assertIsNone(next(c for c in v["checks"] if c["check"] == "GPU memory flat")["ok"])

    # --soak-baseline, or plain in the same call: RSS judged by its growth
    # beyond plain's (the engine's RSS grows without the shim too)

    def base(self, growth: float) -> dict:
        return {"growth_mib_min": growth, "source": "plain of a test"}

    def rss_check(self, v: dict) -> dict:
        return next(c for c in v["checks"] if c["check"].startswith("RSS"))

    def test_growth_like_plains_passes_against_plain(self) -> None:
        lines = self.rows.soak_lines(soak_intervals(rss=[15000 + 600 * i for i in range(5)]), BASE, 300.0)
        self.assertEqual(self.failed_checks(self.rows.soak_verdict(lines, 0)), ["RSS flat"])  # 11.8%: the flat rule
        v = self.rows.soak_verdict(lines, 0, baseline=self.base(600.0))
        self.assertTrue(v["ok"], v["checks"])
        c = self.rss_check(v)
        self.assertEqual(c["check"], "RSS growth beyond plain's")
        self.assertIn("+600 MiB/min, plain +600 MiB/min (plain of a test)", c["value"])
        self.assertIn("+0 MiB: 0.00% of 15600 MiB", c["value"])
        self.assertEqual(c["target"], "rise beyond plain's growth ≤ 1% of RSS")

    def test_growth_beyond_plains_fails(self) -> None:
        # 100 MiB/min more than plain over minutes 2-5: 300 MiB, 1.9% of 15700
        v = self.verdict_base(soak_intervals(rss=[15000 + 700 * i for i in range(5)]), 600.0)
        self.assertEqual(self.failed_checks(v), ["RSS growth beyond plain's"])
        self.assertIn("largest rise beyond plain's +300 MiB: 1.91% of 15700 MiB", self.rss_check(v)["value"])
        # a jump between two minutes is a rise as well, even where it falls back later
        iv = soak_intervals(rss=[15000, 15000, 15300, 15000, 15000])
        self.assertEqual(self.failed_checks(self.verdict_base(iv, 0.0)), ["RSS growth beyond plain's"])
        self.assertTrue(self.verdict_base(iv, 600.0)["ok"])  # within plain's +600 a minute

    def test_less_growth_than_plain_or_plain_shrinking(self) -> None:
        # a row that grows less than plain (a slower engine steps less) passes
        self.assertTrue(self.verdict_base(soak_intervals(rss=[15000 + 200 * i for i in range(5)]), 600.0)["ok"])
        # a falling RSS is no rise
        self.assertTrue(self.verdict_base(soak_intervals(rss=[15000 - 400 * i for i in range(5)]), 0.0)["ok"])
        # plain shrank: its growth counts as 0, so the row may rise by 1% of its RSS, not more
        self.assertTrue(self.verdict_base(soak_intervals(rss=[15000 + 40 * i for i in range(5)]), -300.0)["ok"])
        v = self.verdict_base(soak_intervals(rss=[15000 + 100 * i for i in range(5)]), -300.0)
        self.assertEqual(self.failed_checks(v), ["RSS growth beyond plain's"])

    def verdict_base(self, intervals: list, growth: float) -> dict:
        return self.rows.soak_verdict(self.rows.soak_lines(intervals, BASE, 300.0), 0, baseline=self.base(growth))

    def report(self, row: str, rss: list) -> dict:
        """A serve-rows result row whose serve.py report holds a soak's lines."""
        return {"row": row, "report": {
            "config": {"duration": 300.0, "inprocess": "e2e:moe8", "rate": 3.0, "prompt_len": "uniform:16:128",
                       "output_len": "fixed:32"},
            "phases": [{"rate": 3.0, "summary": {"requests": {"failed": 0}},
                        "intervals": soak_intervals(len(rss), rss=rss), "interval_base": BASE}]}}

    def test_baseline_from_a_file_or_the_same_call(self) -> None:
        plain = self.report("plain", [14000, 15000, 15600, 16200, 16800])  # +600 a minute from minute 2 on
        base = self.rows.soak_baseline([self.report("host", [15000] * 5), plain], "plain of f.json")
        self.assertAlmostEqual(base["growth_mib_min"], 600.0)
        self.assertEqual(base["load"]["rate"], 3.0)
        self.assertIsNone(self.rows.soak_baseline([self.report("host", [15000] * 5)], "x"))  # no plain
        self.assertIsNone(self.rows.soak_baseline([self.report("plain", [15000])], "x"))  # no line from minute 2 on
        host = self.report("host", [15000 + 650 * i for i in range(5)])
        used = self.rows.judge_soak([host], base)
        self.assertIs(used, base)
        self.assertTrue(host["soak"]["ok"], host["soak"]["checks"])  # 50 a minute beyond plain's: 150 MiB, 0.96%
        self.assertEqual(host["soak"]["baseline"]["source"], "plain of f.json")
        md = "\n".join(self.rows.soak_table(host["soak"]["lines"], host["soak"]["baseline"]))
        self.assertIn("| RSS MiB | RSS growth MiB/min | plain's growth MiB/min | GPU MiB |", md)
        self.assertIn("| 15650 | +650 | +1000 | 56100 |", md)  # minute 2: plain's first minute was +1000
        self.assertIn("| 17600 | +650 | +600 | 56100 |", md)
        # plain in the same call replaces the file's, and keeps the flat rule itself
        same = self.report("plain", [15000 + 450 * i for i in range(5)])
        used = self.rows.judge_soak([host, same], base)
        self.assertEqual(used["source"], "plain of this call")
        self.assertEqual(self.failed_checks(host["soak"]), ["RSS growth beyond plain's"])  # 600 MiB, 3.8%
        self.assertEqual(self.failed_checks(same["soak"]), ["RSS flat"])
        self.assertNotIn("baseline", same["soak"])
        # neither: the flat rule for every row
        self.rows.judge_soak([host], None)
        self.assertEqual(self.failed_checks(host["soak"]), ["RSS flat"])

    def test_recorded_h100_soaks(self) -> None:
        """The H100 soaks whose RSS grew in every row, plain included
        (~680 MiB a minute at 3 req/s): against plain's growth, empty (same
        call) and host (a call of its own) pass, plain fails the flat rule."""
        res = os.path.join(SRC, "bench", "results")
        with open(os.path.join(res, "serve-rows-20261126-010955-soak-plain-empty-h100.json")) as f:
            pe = json.load(f)["rows"]
        with open(os.path.join(res, "serve-rows-20261126-010409-soak-host-h100.json")) as f:
            host = json.load(f)["rows"]
        used = self.rows.judge_soak(pe, None)
        self.assertAlmostEqual(used["growth_mib_min"], 682, delta=1)
        by = {r["row"]: r["soak"] for r in pe}
        self.assertEqual(self.failed_checks(by["plain"]), ["RSS flat"])
        self.assertTrue(by["empty"]["ok"], by["empty"]["checks"])
        self.rows.judge_soak(host, self.rows.soak_baseline(pe, "plain of 010955"))
        self.assertTrue(host[0]["soak"]["ok"], host[0]["soak"]["checks"])
        self.rows.judge_soak(host, None)
        self.assertEqual(self.failed_checks(host[0]["soak"]), ["RSS flat"])  # 4.9% flat: what the report said

    def test_long_prompt_fits_the_positions(self) -> None:
        self.assertEqual(self.rows.long_prompt_len("moe8", "fixed:32"), 4000)
        self.assertEqual(self.rows.dist_max("uniform:16:128"), 128)


class TestRowPolicies(unittest.TestCase):
    """serve-rows.py's rows and the e2e.py policies they run with: every
    row's policy exists, `split` is llama.cpp's --n-cpu-moe at the managed
    row's GPU expert bytes, and a model without one is refused by name."""

    @classmethod
    def setUpClass(cls) -> None:
        cls.rows = load_rows()

    def test_every_shim_row_has_a_policy(self) -> None:
        import e2e
        for model in ("moe8", "moe"):
            for row in self.rows.ROWS:
                pol = self.rows.shim_policy(model, row)
                if row == "plain":
                    self.assertIsNone(pol)
                else:
                    self.assertIn(pol, e2e.POLICIES, f"{model} {row}")

    def test_split_is_half_the_layers_streamed(self) -> None:
        import e2e
        pol = e2e.POLICIES[self.rows.shim_policy("moe8", "split")]
        self.assertIn("mode: stream", pol)
        self.assertIn("layers: '6-11'", pol)  # moe8 has 12: the later half host
        self.assertIn("place: host", pol)
        self.assertIn("layers: '8-15'", e2e.POLICIES[self.rows.shim_policy("moe", "split")])

    def test_targets_put_the_other_rows_beside_host_and_managed(self) -> None:
        def row(name, tok):
            summ = {"throughput": {"output_tok_s": tok}, "ttft_ms": {"p99": 100.0}, "itl_ms": {"p50": 50.0},
                    "concurrency": {"sampled_in_flight": 300, "engine_active": 100}, "requests": {"cut": 0}}
            return {"row": name, "report": {"phases": [{"rate": 30.0, "summary": summ}]}}
        lines = self.rows.targets([row("plain", 800.0), row("host", 250.0), row("managed", 400.0),
                                   row("split", 500.0)])
        text = "\n".join(lines)
        self.assertIn("| managed / host throughput at 30 req/s | 1.60 | ≥ 2 at saturation | NOT met |", text)
        self.assertIn("| split / host throughput at 30 req/s (no target) | 2.00 | | |", text)
        self.assertIn("| split / managed throughput at 30 req/s (no target) | 1.25 | | |", text)
        self.assertNotIn("host-stream /", text)

    def test_split_of_an_unknown_model_is_refused(self) -> None:
        with self.assertRaises(SystemExit) as cm:
            self.rows.shim_policy("dense", "split")
        self.assertIn("no split policy for model 'dense'", str(cm.exception))


class TestRowsModes(unittest.TestCase):
    """serve-rows.py --soak and --faults on real serve.py reports: in-process
    runs against the fake manager (with a fake woffload.stats()), then the
    driver's verdicts and its Markdown and JSON; and --dry-run of both modes."""

    @classmethod
    def setUpClass(cls) -> None:
        import serve_engine
        cls.rows = load_rows()
        cls.tmp = tempfile.mkdtemp()
        cls.greedy = os.path.join(cls.tmp, "greedy.json")

        def with_wo(args, m):
            e = serve_engine.Engine.around(args, m)
            e.wo = FakeWo(m)
            return e

        def run(m, *opts):
            import asyncio
            out = os.path.join(cls.tmp, f"r{len(os.listdir(cls.tmp))}.json")
            a = serve.parse_args(["--inprocess", "fake", "--output-len", "fixed:6", "--prompt-len", "uniform:8:32",
                                  "--out", out, "--warmup-requests", "0", "--greedy-n", "3", *opts])
            a.engine_factory = lambda args: with_wo(args, m)
            rc = asyncio.run(serve.main_async(a))
            with open(out) as f:
                return json.load(f), rc

        # the soak: one phase, a line every 0.5 s (a "minute" of the test)
        cls.soak, _ = run(FakeManager(), "--rates", "20", "--duration", "2", "--report-every", "0.5",
                          "--pid", str(os.getpid()))
        cls.ref, _ = run(FakeManager(), "--rates", "20", "--duration", "0.5", "--record-greedy", cls.greedy)
        cls.faults, cls.faults_rc = run(FakeManager(), "--rates", "20", "--duration", "2.5", "--disconnect-frac", "0.2",
                                        "--burst", "4x@1:0.5", "--long-prompt", "300", "--save-requests",
                                        "--greedy-check", cls.greedy, "--greedy-load-check", "report",
                                        "--drain-timeout", "5")

    def test_soak_lines_from_a_run(self) -> None:
        p = self.soak["phases"][0]
        self.assertEqual(p["interval_base"]["misses"], 5000)  # the counters at the phase's start
        lines = self.rows.soak_lines(p["intervals"], p["interval_base"], 2.0)
        self.assertGreaterEqual(len(lines), 4)
        for ln in lines[:4]:
            self.assertTrue(ln["loaded"])
            self.assertIsNotNone(ln["rss_mib"])
            # 3 hits and 1 miss a token over each interval, the first one's
            # against the phase's start (not the 5000 misses before it)
            self.assertAlmostEqual(ln["hit_rate"], 0.75, places=3)
        # the test's minutes are 0.5 s: from "minute 2" on means t > 60 s, none here
        v = self.rows.soak_verdict(lines, p["summary"]["requests"]["failed"])
        self.assertEqual(v["lines_judged"], 0)
        self.assertFalse(v["ok"])

    def test_faults_verdict_from_a_run(self) -> None:
        self.assertEqual(self.faults_rc, 0)
        v = self.rows.faults_verdict(self.faults)  # the burst's window from the run's config
        by = {c["check"].split(" (")[0]: c for c in v["checks"]}
        self.assertTrue(v["ok"], v["checks"])
        for k in ("errors", "clients that closed mid-stream", "long prompt completed", "burst served",
                  "served after the last fault", "greedy alone identical to plain"):
            self.assertIs(by[k]["ok"], True, by[k])
        self.assertIn("300 tokens in, 6 of 6 out", by["long prompt completed"]["value"])
        self.assertFalse(by["greedy under load"]["required"])
        # a burst arrival that failed, a long prompt that did not finish: FAIL
        bad = json.loads(json.dumps(self.faults))
        p = bad["phases"][0]
        r = next(r for r in p["requests"] if r["kind"] == "normal" and 1 <= r["t"] < 1.5)
        r["error"] = "stream_error"
        p["summary"]["long_prompt"]["error"] = "stream_error"
        p["summary"]["requests"]["failed"] = 2
        v = self.rows.faults_verdict(bad)
        self.assertFalse(v["ok"])
        self.assertEqual([c["check"].split(" (")[0] for c in v["checks"] if c["ok"] is False],
                         ["errors", "long prompt completed", "burst served"])

    def test_markdown_and_json(self) -> None:
        """The files --out gets, for each mode, from the reports above."""
        out = os.path.join(self.tmp, "out")
        for mode, extra, row in (("soak", ["--soak", "5", "--rows", "managed"], "managed"),
                                 ("faults", ["--faults"], "host")):
            a = self.rows.parse_args(["--out", out, "--work", self.tmp] + extra)
            a.machine = {"gpu": "fake", "host": "here"}
            rep = self.soak if mode == "soak" else self.faults
            res = [dict(row=row, policy="experts-host-all", command="x", rc=0, wall_s=3, status="ok", report=rep,
                        failed=False, log=os.path.join(self.tmp, "none.log"))]
            res[0]["soak" if mode == "soak" else "faults"] = (
                self.rows.soak_analysis(rep) if mode == "soak" else self.rows.faults_verdict(rep))
            if mode == "faults":
                res.insert(0, dict(row="plain", policy=None, command="y", rc=1, wall_s=2, status="exit 1",
                                   report=self.ref, failed=True, log=os.path.join(self.tmp, "none.log")))
            os.makedirs(out, exist_ok=True)
            base = os.path.join(out, f"t-{mode}")
            self.rows.write_outputs(a, base, res, "now")
            with open(base + ".md") as f:
                md = f.read()
            with open(base + ".json") as f:
                js = json.load(f)
            self.assertEqual(js["mode"], mode)
            self.assertIn("intervals", js["rows"][-1]["report"]["phases"][0])
            if mode == "soak":
                self.assertIn("## Soak (issue 20)", md)
                self.assertIn("| minute | tok/s |", md)
                self.assertIn("**FAIL**", md)  # 2 s of the test: no line from minute 2 on
            else:
                self.assertIn("## Faults under load (issue 20)", md)
                self.assertIn("Verdict: **PASS**", md)
                self.assertIn("burst served", md)
                self.assertTrue(os.path.exists(base + "-failed.log"))  # plain failed: its log (missing here)
            self.assertNotIn("## Targets", md)

    def test_dry_run_modes(self) -> None:
        script = os.path.join(SRC, "bench", "serve-rows.py")
        out = os.path.join(self.tmp, "dry")
        r = subprocess.run([sys.executable, script, "--out", out, "--dry-run", "--soak", "5", "--build", self.tmp],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("--soak-minutes 5", r.stdout)
        self.assertIn("does not fit --deadline", r.stdout)  # host and managed: one row a call
        self.assertEqual(r.stdout.count("soak 5 min"), 2)
        r = subprocess.run([sys.executable, script, "--out", out, "--dry-run", "--faults", "--rows", "host-stream",
                            "--build", self.tmp], capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("# plain (no shim)", r.stdout)  # the reference first
        self.assertIn("experts-host-stream", r.stdout)
        self.assertIn("--long-prompt 4000", r.stdout)
        self.assertIn("4032 of the model's 4096 positions", r.stdout)
        self.assertFalse(os.path.exists(out))  # a dry run writes nothing
        # --soak-baseline: plain's growth from an earlier soak's JSON
        res = os.path.join(SRC, "bench", "results")
        plain = os.path.join(res, "serve-rows-20261126-010955-soak-plain-empty-h100.json")
        r = subprocess.run([sys.executable, script, "--out", out, "--dry-run", "--soak", "5", "--rows", "host",
                            "--build", self.tmp, "--soak-baseline", plain], capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("# soak baseline: plain of serve-rows-20261126-010955-soak-plain-empty-h100.json, "
                      "RSS +682 MiB/min from minute 2 on\n", r.stdout)
        for extra, why in ((["--soak", "5", "--soak-baseline",
                             os.path.join(res, "serve-rows-20261126-010409-soak-host-h100.json")], "no plain row"),
                           (["--soak-baseline", plain], "goes with --soak"),
                           (["--soak", "5", "--soak-baseline", os.path.join(self.tmp, "none.json")], "none.json")):
            r = subprocess.run([sys.executable, script, "--out", out, "--dry-run", "--build", self.tmp] + extra,
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 2, r.stdout)
            self.assertIn(why, r.stderr)
        # --cb-graphs reaches every row's serve.py (which parses it: dry_check); default passes nothing
        for choice, n in (("on", 2), ("default", 0)):
            r = subprocess.run([sys.executable, script, "--out", out, "--dry-run", "--rows", "plain,managed",
                                "--rates", "10", "--cb-graphs", choice, "--build", self.tmp],
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(sum("serve.py --inprocess" in ln and "--cb-graphs on" in ln
                                 for ln in r.stdout.splitlines()), n, r.stdout)
            self.assertNotIn("--cb-graphs default", r.stdout)


class TestSchedule(unittest.TestCase):
    """The arrival process, without a server."""

    def args(self, *a: str):
        return serve.parse_args(["--url", "http://127.0.0.1:1", *a])

    def test_deterministic_and_poisson(self) -> None:
        a = self.args("--rate", "50", "--duration", "20", "--seed", "5", "--disconnect-frac", "0.2")
        r1, r2 = serve.schedule(a), serve.schedule(a)
        self.assertEqual([(r.t, r.prompt, r.output_len, r.kind) for r in r1],
                         [(r.t, r.prompt, r.output_len, r.kind) for r in r2])
        self.assertAlmostEqual(len(r1) / 1000, 1.0, delta=0.1)  # 50/s x 20 s, sd ~3%
        gaps = [b.t - a.t for a, b in zip(r1, r1[1:])]
        m = sum(gaps) / len(gaps)
        sd = (sum((g - m) ** 2 for g in gaps) / len(gaps)) ** 0.5
        self.assertAlmostEqual(sd / m, 1.0, delta=0.15)  # exponential gaps: cv 1
        frac = sum(r.kind == "disconnect" for r in r1) / len(r1)
        self.assertAlmostEqual(frac, 0.2, delta=0.05)
        other = serve.schedule(self.args("--rate", "50", "--duration", "20", "--seed", "6"))
        self.assertNotEqual([r.t for r in r1[:10]], [r.t for r in other[:10]])

    def test_burst(self) -> None:
        a = self.args("--rate", "50", "--duration", "20", "--burst", "4x@5:5")
        rs = serve.schedule(a)
        inside = sum(1 for r in rs if 5 <= r.t < 10) / 5
        outside = sum(1 for r in rs if r.t < 5 or r.t >= 10) / 15
        self.assertAlmostEqual(inside / outside, 4.0, delta=0.6)

    def test_distributions(self) -> None:
        rng = random.Random(1)
        d = serve.parse_dist("lognormal:200:0.5:16:1000")
        xs = [d.draw(rng) for _ in range(20000)]
        self.assertGreaterEqual(min(xs), 16)
        self.assertLessEqual(max(xs), 1000)
        self.assertAlmostEqual(sum(xs) / len(xs) / 200, 1.0, delta=0.05)
        u = serve.parse_dist("uniform:64:512")
        ys = [u.draw(rng) for _ in range(20000)]
        self.assertEqual((min(ys), max(ys)), (64, 512))
        self.assertEqual(serve.parse_dist("fixed:7").draw(rng), 7)
        for bad in ("fixed:0", "uniform:9:3", "normal:3", "lognormal:-1:1", "fixed:x"):
            with self.assertRaises(Exception, msg=bad):
                serve.parse_dist(bad)

    def test_prompt_words_are_single_tokens_in_word_list(self) -> None:
        rng = random.Random(0)
        p = serve.prompt_text(rng, 123)
        self.assertEqual(len(p.split()), 123)
        self.assertTrue(all(w in serve.WORDS for w in p.split()))

    def test_stats_keys_exist_in_the_shim(self) -> None:
        """Every key serve.py reads from the shim's stats is one uvm/stats.c
        writes (a rename there must fail here)."""
        with open(os.path.join(SRC, "uvm", "stats.c")) as f:
            c = f.read()
        with open(SERVE) as f:
            py = f.read()
        fig = py[py.index("def stats_figures"):py.index("def stats_report")]
        keys = set(re.findall(r'_n\([a-z]+, "([a-z_]+)"(?:, "([a-z_]+)")?\)', fig))
        keys = {k for pair in keys for k in pair if k} | set(re.findall(r'v\.get\("([a-z_]+)"', fig))
        keys |= {"touched_bytes", "placement", "read_multiplicity", "per_step", "in_bytes"}
        self.assertGreater(len(keys), 15)
        for k in sorted(keys):
            self.assertIn(f'\\"{k}\\"', c, f"serve.py reads {k!r}, which uvm/stats.c does not write")


if __name__ == "__main__":
    unittest.main(verbosity=2)
