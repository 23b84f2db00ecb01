#!/usr/bin/env python3
"""bench/serve-faults.py: issue 40's fault checks against an OpenAI-style
streaming server (llama.cpp's llama-server first), each with its expected
outcome written down beside what was observed. Uses bench/serve.py's client.

    python3 bench/serve-faults.py --url http://127.0.0.1:8080 --pid PID --parallel 8 \\
        [--server-cmd 'woffload-run --policy P -- llama-server ...'] [--stats-file S.json] \\
        [--server-kind llamacpp] [--out faults.json] [--checks disconnect,bad,sigterm,restart]

The checks, in this order (a failed one does not stop the next):

1. disconnect: --parallel clients each close their stream after 2 tokens
   of a long request. Expected: every slot idle again within --slot-timeout
   seconds (10) by GET /slots (where the server has it; else not judged),
   then --parallel requests of 16 tokens all served in full.
2. bad: requests with invalid parameters (max_tokens -5; temperature as a
   string). Expected: each answered with the server's own 4xx and a JSON
   "error"; afterwards /health answers 200, no slot is left busy and the
   greedy reference prompt gives the same token ids as before them.
3. sigterm: SIGTERM to --pid while --parallel x 2 long requests are in
   flight. Expected: the process exits within --term-limit seconds (10);
   with --stats-file, the file is written after the signal. A process
   still there at the limit is told apart: the clients close their streams
   and the seconds to the exit after that are recorded
   (`exit_after_clients_left_s`, `waits_for_clients`: a server that waits
   for its open streams, not one stuck in its teardown); SIGKILL at
   --term-hard (30 s).
4. restart (needs --server-cmd): the server started again with the same
   command (the same policy under SHIM_CMD). Expected: the greedy
   prompts, sent one at a time (batch 1, so the batch does not differ),
   give the same token ids as before the SIGTERM; then SIGTERM again,
   its exit time recorded (idle), within --term-limit.

Exit 0 when every check that ran passed, 1 when one failed. A check that
cannot run (no --pid for sigterm, no --server-cmd for restart) is
"skipped" with the reason, and does not fail the run.

--against PLAIN.json: the same checks' report on the plain server (this
script run first without the shim). llama-server waits for its open streams
after SIGTERM, so its sigterm check fails at any limit its clients outlast,
plain or not (bench/results/serve-faults-20261207-*-cpu). A check that failed
on plain too, and here no worse (sigterm: both waited for their clients, this
row exited at most 1 s later after they left and wrote its stats after the
signal), is reported as the server's own and does not fail the row.
"""
import argparse
import asyncio
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any, Callable, Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve  # noqa: E402

CHECKS = ("disconnect", "bad", "sigterm", "restart")


def http_get(url: str, timeout: float = 5.0):
    """(status, JSON or text); (None, reason) when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as f:
            body = f.read().decode("utf-8", "replace")
            status = f.status
    except urllib.error.HTTPError as e:
        body, status = e.read().decode("utf-8", "replace"), e.code
    except (OSError, ValueError) as e:
        return None, str(e)
    try:
        return status, json.loads(body)
    except ValueError:
        return status, body


def wait_health(url: str, timeout: float, proc: Optional[subprocess.Popen] = None) -> Optional[float]:
    """Seconds until /health answered 200, None past the timeout or when
    proc exited."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc is not None and proc.poll() is not None:
            return None
        st, _ = http_get(url + "/health", 2.0)
        if st == 200:
            return round(time.monotonic() - t0, 2)
        time.sleep(0.25)
    return None


def busy_slots(url: str) -> Optional[int]:
    """Slots processing a request (GET /slots), None without the endpoint."""
    st, body = http_get(url + "/slots")
    if st != 200 or not isinstance(body, list):
        return None
    return sum(1 for s in body if isinstance(s, dict) and s.get("is_processing"))


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")  # a zombie has exited: its parent has not reaped it yet
    except (OSError, IndexError):
        return False


def term_and_wait(pid: int, limit: float, proc: Optional[subprocess.Popen] = None,
                  hard: float = 30.0, at_limit: Optional[Callable[[], Dict[str, Any]]] = None) -> Dict[str, Any]:
    """SIGTERM, then the seconds until the process is gone; SIGKILL after
    `hard` seconds (the run goes on; the check has failed by then). When
    the process is still there at `limit`, at_limit() runs once (the sigterm
    check closes its clients there) and what it returns joins the result,
    with the seconds from then to the exit (`exit_after_clients_left_s`)
    and whether that was within the limit (`waits_for_clients`)."""
    t0 = time.monotonic()
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return {"exit_s": None, "error": "no such process"}
    killed = False
    left = None
    extra: Dict[str, Any] = {}
    while True:
        if proc is not None:
            if proc.poll() is not None:
                break
        elif not alive(pid):
            break
        if at_limit is not None and left is None and time.monotonic() - t0 > limit:
            extra = at_limit()
            left = time.monotonic()
        if time.monotonic() - t0 > hard and not killed:
            os.kill(pid, signal.SIGKILL)
            killed = True
        time.sleep(0.02)
    end = time.monotonic()
    out: Dict[str, Any] = {"exit_s": round(end - t0, 3), "killed": killed,
                           "within_limit": not killed and end - t0 <= limit, **extra}
    if left is not None:
        if not killed:
            out["exit_after_clients_left_s"] = round(end - left, 3)
        # exited within the limit of its last client: it was waiting for them
        out["waits_for_clients"] = not killed and end - left <= limit
    if proc is not None:
        out["returncode"] = proc.returncode
    return out


class Client:
    """bench/serve.py's streaming client with this run's options."""

    def __init__(self, a: argparse.Namespace) -> None:
        opts = ["--url", a.url, "--server-kind", a.server_kind, "--model", a.model, "--ignore-eos"]
        if a.endpoint:
            opts += ["--endpoint", a.endpoint]
        self.args = serve.parse_args(opts)
        self.args.request_timeout = a.request_timeout
        self.args.extra_body = a.extra_body
        self.args.parsed_url = serve.urllib.parse.urlsplit(a.url)

    def req(self, prompt: str, max_tokens: int, kind: str = "normal", after: int = 0) -> serve.Req:
        r = serve.Req(0, 0.0, len(prompt.split()), max_tokens, kind, prompt=prompt)
        r.disconnect_after = after
        return r

    async def send(self, r: serve.Req, body: Optional[Dict[str, Any]] = None) -> serve.Req:
        run = serve.Run(self.args, [r])
        run.t0 = time.perf_counter()
        run.start(r)
        err = None
        try:
            if body is None:
                await asyncio.wait_for(serve.http_request(self.args, r, run.on_token), self.args.request_timeout)
            else:
                await asyncio.wait_for(self.raw(r, body), self.args.request_timeout)
        except Exception as e:
            err = serve.error_kind(e)
            r.text = getattr(e, "body", None)
        run.finish(r, err)
        return r

    async def raw(self, r: serve.Req, body: Dict[str, Any]) -> None:
        """A POST of exactly `body` (the bad requests): the status and the
        body, whatever they are."""
        u = self.args.parsed_url
        payload = json.dumps(body).encode()
        path = u.path.rstrip("/") + serve.ENDPOINT_PATH[self.args.endpoint]
        reader, writer = await asyncio.open_connection(u.hostname, u.port or 80)
        try:
            writer.write((f"POST {path} HTTP/1.1\r\nHost: {u.netloc}\r\nContent-Type: application/json\r\n"
                          f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n").encode() + payload)
            await writer.drain()
            r.status, headers = await serve.read_headers(reader)
            data = b"".join([c async for c in serve.body_chunks(reader, headers)])
            r.text = data.decode("utf-8", "replace")
        finally:
            writer.close()

    async def greedy(self, n: int) -> List[Any]:
        """The greedy prompts one at a time: token ids (text where the server
        sends no ids), None for a failed one."""
        outs = []
        for p in serve.greedy_prompts(n):
            r = await self.send(self.req(p, serve.GREEDY_OUTPUT_LEN, "greedy"))
            outs.append(serve.output_of(r))
        return outs


def prompt(i: int, n: int = 32) -> str:
    return serve.prompt_text(serve.random.Random(4000 + i), n)


async def check_disconnect(a: argparse.Namespace, c: Client) -> Dict[str, Any]:
    expected = (f"after {a.parallel} clients close mid-stream, every slot is idle within {a.slot_timeout:g} s "
                f"(GET /slots) and {a.parallel} requests of 16 tokens are then all served in full")
    gone = await asyncio.gather(*(c.send(c.req(prompt(i), a.long_tokens, "disconnect", 2))
                                  for i in range(a.parallel)))
    cut = sum(1 for r in gone if not r.error and 0 < len(r.token_times) < a.long_tokens)
    t0 = time.monotonic()
    busy = busy_slots(a.url)
    while busy and time.monotonic() - t0 < a.slot_timeout:
        await asyncio.sleep(0.1)
        busy = busy_slots(a.url)
    freed_s = round(time.monotonic() - t0, 2)
    nxt = await asyncio.gather(*(c.send(c.req(prompt(100 + i), 16)) for i in range(a.parallel)))
    served = sum(1 for r in nxt if not r.error and len(r.token_times) == 16)
    ok = cut == a.parallel and busy in (0, None) and served == a.parallel
    return {"expected": expected, "ok": ok,
            "observed": {"closed_mid_stream": cut, "slots_busy_after": busy,
                         "slots_endpoint": busy is not None, "slots_idle_after_s": freed_s if busy == 0 else None,
                         "next_served_in_full": served, "next_errors": [r.error for r in nxt if r.error]}}


BAD_BODIES = [
    ("max_tokens -5", {"max_tokens": -5}),
    ("temperature a string", {"temperature": "hot"}),
]


async def check_bad(a: argparse.Namespace, c: Client) -> Dict[str, Any]:
    expected = ("each invalid request answered by the server's own 4xx with a JSON error; then /health 200, "
                "no slot busy, and the greedy reference prompt's token ids unchanged")
    ref = serve.greedy_prompts(1)[0]
    before = serve.output_of(await c.send(c.req(ref, serve.GREEDY_OUTPUT_LEN, "greedy")))
    answers = []
    for name, extra in BAD_BODIES:
        body = serve.body_for(c.args, c.req(prompt(200), 8))
        body.update(extra)
        r = await c.send(c.req(prompt(200), 8, "bad"), body)
        try:
            err = isinstance(json.loads(r.text or ""), dict) and "error" in json.loads(r.text or "")
        except ValueError:
            err = False
        answers.append({"request": name, "status": r.status, "json_error": err, "client_error": r.error,
                        "body": (r.text or "")[:200]})
    health, _ = http_get(a.url + "/health")
    busy = busy_slots(a.url)
    after = serve.output_of(await c.send(c.req(ref, serve.GREEDY_OUTPUT_LEN, "greedy")))
    ok = (all(x["status"] is not None and 400 <= x["status"] < 500 and x["json_error"] for x in answers)
          and health == 200 and busy in (0, None) and before is not None and before == after)
    return {"expected": expected, "ok": ok,
            "observed": {"answers": answers, "health_after": health, "slots_busy_after": busy,
                         "greedy_same": before is not None and before == after}}


async def check_sigterm(a: argparse.Namespace, c: Client, pid: int,
                        proc: Optional[subprocess.Popen]) -> Dict[str, Any]:
    """SIGTERM under load. When the process is still there at the limit,
    the clients go away (their connections closed) and the seconds from
    then to the exit are recorded too: a server that exits soon after its
    last stream closed waits for its clients (llama-server at 34af94cd
    stops decoding at SIGTERM but keeps each open stream's handler polling
    its connection), one that does not is stuck elsewhere (in its own
    teardown or the shim's). SIGKILL at --term-hard."""
    expected = (f"SIGTERM with {2 * a.parallel} long requests in flight: the process exits within "
                f"{a.term_limit:g} s" + ("; the stats file is written after the signal" if a.stats_file else ""))
    reqs = [c.req(prompt(300 + i), a.long_tokens) for i in range(2 * a.parallel)]
    tasks = [asyncio.ensure_future(c.send(r)) for r in reqs]
    t0 = time.monotonic()
    while not any(r.token_times for r in reqs) and time.monotonic() - t0 < 30:
        await asyncio.sleep(0.05)
    in_flight = sum(1 for r in reqs if r.done is None)
    signalled = time.time()
    loop = asyncio.get_running_loop()

    def cancel_all() -> None:
        for t in tasks:
            t.cancel()

    def clients_leave() -> Dict[str, Any]:  # on term_and_wait's thread
        open_n = sum(1 for t in tasks if not t.done())
        loop.call_soon_threadsafe(cancel_all)
        return {"streams_open_at_limit": open_n}

    term = await loop.run_in_executor(None, term_and_wait, pid, a.term_limit, proc, a.term_hard,
                                      clients_leave)
    if "error" in term:
        cancel_all()
    done = await asyncio.gather(*tasks, return_exceptions=True)
    stats = None
    if a.stats_file:
        stats = {"path": a.stats_file, "exists": os.path.exists(a.stats_file)}
        if stats["exists"]:
            stats["written_after_signal"] = os.path.getmtime(a.stats_file) >= signalled - 0.01
    ok = bool(term.get("within_limit")) and (stats is None or bool(stats.get("written_after_signal")))
    ends: Dict[str, int] = {}
    for r in done:
        k = "left at the limit" if isinstance(r, BaseException) else (r.error or "completed")
        ends[k] = ends.get(k, 0) + 1
    return {"expected": expected, "ok": ok,
            "observed": {"in_flight_at_signal": in_flight, **term, "stats_file": stats,
                         "clients_ended": ends}}


# how much later than plain's a row may exit after its clients left, and
# still be the server's own wait (seconds)
AGAINST_SLACK_S = 1.0


def against_plain(path: str, report: Dict[str, Any]) -> None:
    """--against: a check failed here that failed on the plain server too
    (its report at path, the same script without the shim) is the server's
    own when this row did no worse: for sigterm, both waited for their
    clients (llama-server keeps its open streams after SIGTERM), this one
    exited at most AGAINST_SLACK_S later after its clients left, and wrote
    its stats after the signal when asked. Recorded as `server_own` beside the
    failed check, printed, and not counted against the row; other checks that
    fail on plain too are only recorded."""
    try:
        with open(path) as f:
            plain = json.load(f).get("checks", {})
    except (OSError, ValueError) as e:
        report["against"] = {"path": path, "error": str(e)}
        print(f"serve-faults: --against {path}: {e}", flush=True)
        return
    report["against"] = {"path": path}
    for name, res in report["checks"].items():
        p = plain.get(name)
        if res["ok"] or not p or p.get("ok"):
            continue
        own: Dict[str, Any] = {"plain_observed": p.get("observed"), "no_worse": False}
        if name == "sigterm":
            o, po = res.get("observed") or {}, p.get("observed") or {}
            mine, theirs = o.get("exit_after_clients_left_s"), po.get("exit_after_clients_left_s")
            stats = o.get("stats_file")
            own["no_worse"] = bool(o.get("waits_for_clients") and po.get("waits_for_clients")
                                   and mine is not None and theirs is not None
                                   and mine <= theirs + AGAINST_SLACK_S
                                   and (stats is None or stats.get("written_after_signal")))
            own["why"] = (f"plain waited for its clients too: it exited {theirs} s after they left, this row "
                          f"{mine} s" + ("" if stats is None else
                                         f"; stats written after the signal: {bool(stats.get('written_after_signal'))}"))
        res["server_own"] = own
        print(f"    {name}: failed on the plain server too ({path})"
              + (f": {own['why']}" if "why" in own else "") + (": no worse, the server's own" if own["no_worse"] else ""),
              flush=True)


def start_server(a: argparse.Namespace, tag: str) -> subprocess.Popen:
    log = open(os.path.join(a.log_dir, f"server-{tag}.log"), "ab")
    proc = subprocess.Popen(shlex.split(a.server_cmd), stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    # its pid where a caller cut short can find it (bench/llamacpp-serve.sh stops it)
    with open(os.path.join(a.log_dir, f"{tag}.pid"), "w") as f:
        f.write(f"{proc.pid}\n")
    return proc


async def check_restart(a: argparse.Namespace, c: Client, before: List[Any]) -> Dict[str, Any]:
    expected = ("the server started again with the same command gives the same token ids for the greedy "
                f"prompts sent one at a time; then SIGTERM exits within {a.term_limit:g} s")
    if a.stats_file and os.path.exists(a.stats_file):
        os.rename(a.stats_file, a.stats_file + ".first")
    proc = start_server(a, "restart")
    up = await asyncio.get_running_loop().run_in_executor(None, wait_health, a.url, a.load_timeout, proc)
    if up is None:
        term = term_and_wait(proc.pid, a.term_limit, proc) if proc.poll() is None else {"returncode": proc.returncode}
        return {"expected": expected, "ok": False, "observed": {"health": "never 200", "stop": term}}
    after = await c.greedy(a.greedy_n)
    same = [i for i, (x, y) in enumerate(zip(before, after)) if x is not None and x == y]
    term = await asyncio.get_running_loop().run_in_executor(None, term_and_wait, proc.pid, a.term_limit, proc)
    ok = len(same) == len(before) == a.greedy_n and bool(term.get("within_limit"))
    return {"expected": expected, "ok": ok,
            "observed": {"ready_s": up, "compared": len(before), "identical": len(same),
                         "different": [i for i in range(len(before)) if i not in same],
                         "ids": all(isinstance(x, list) for x in before if x is not None),
                         "stop_idle": term, "pid": proc.pid}}


async def main_async(a: argparse.Namespace) -> int:
    t_start = time.monotonic()
    c = Client(a)
    report: Dict[str, Any] = {"config": {k: v for k, v in vars(a).items()}, "machine": serve.machine(),
                              "checks": {}}
    proc = None
    pid = a.pid
    if pid is None and a.server_cmd and a.start:
        proc = start_server(a, "first")
        pid = proc.pid
        report["first_start"] = {"pid": pid}
    up = await asyncio.get_running_loop().run_in_executor(None, wait_health, a.url, a.load_timeout, proc)
    report["ready_s"] = up
    if up is None:
        print(f"serve-faults: {a.url}/health never answered 200 within {a.load_timeout:g} s", flush=True)
    checks = [x for x in a.checks.split(",") if x]

    def save() -> None:
        report["elapsed_s"] = round(time.monotonic() - t_start, 1)
        if a.out:
            with open(a.out, "w") as f:
                json.dump(report, f, indent=1)

    before: List[Any] = []
    if "restart" in checks and up is not None:
        before = await c.greedy(a.greedy_n)
        report["greedy_before"] = {"n": len(before), "failed": sum(1 for x in before if x is None)}
    for name in checks:
        t0 = time.monotonic()
        try:
            if up is None:
                res = {"ok": False, "skipped": "the server never became ready"}
            elif name == "disconnect":
                res = await check_disconnect(a, c)
            elif name == "bad":
                res = await check_bad(a, c)
            elif name == "sigterm":
                if pid is None:
                    res = {"ok": True, "skipped": "no --pid (or --server-cmd --start)"}
                else:
                    res = await check_sigterm(a, c, pid, proc)
            elif name == "restart":
                if not a.server_cmd:
                    res = {"ok": True, "skipped": "no --server-cmd"}
                elif pid is not None and alive(pid):
                    res = {"ok": False, "skipped": "the first server still runs (the sigterm check did not stop "
                                                   "it): not started twice on one port"}
                else:
                    res = await check_restart(a, c, before)
            else:
                res = {"ok": False, "skipped": f"no such check (one of {', '.join(CHECKS)})"}
        except Exception as e:  # a check that breaks is a failed check; the next one runs
            res = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        res["seconds"] = round(time.monotonic() - t0, 2)
        report["checks"][name] = res
        verdict = "skipped" if "skipped" in res and res["ok"] else ("ok" if res["ok"] else "FAILED")
        print(f"[{time.monotonic() - t_start:7.1f}s] {name}: {verdict}"
              + (f" ({res['skipped']})" if "skipped" in res else "")
              + (f"\n    expected: {res['expected']}\n    observed: {json.dumps(res.get('observed'))}"
                 if "expected" in res else "") + (f"\n    error: {res['error']}" if "error" in res else ""),
              flush=True)
        save()
    if proc is not None and proc.poll() is None:
        report["final_stop"] = term_and_wait(proc.pid, a.term_limit, proc)
    if a.against:
        against_plain(a.against, report)
    report["ok"] = all(r["ok"] or r.get("server_own", {}).get("no_worse") for r in report["checks"].values())
    save()
    own = [k for k, r in report["checks"].items() if not r["ok"] and r.get("server_own", {}).get("no_worse")]
    bad = [k for k, r in report["checks"].items() if not r["ok"] and k not in own]
    verdict = "FAILED: " + ", ".join(bad) if bad else "every check passed"
    if own:
        verdict += f"; the server's own failure, as plain's and no worse: {', '.join(own)}"
    print(f"serve-faults: {verdict} ({report['elapsed_s']} s)", flush=True)
    return 0 if report["ok"] else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8080")
    p.add_argument("--server-kind", choices=("openai", "llamacpp"), default="llamacpp")
    p.add_argument("--endpoint", choices=("chat", "completions", "native"), default=None,
                   help="as serve.py's (default completions for llamacpp)")
    p.add_argument("--model", default="default")
    p.add_argument("--extra-body", type=json.loads, default={}, metavar="JSON",
                   help="merged into every request body but the bad ones' (serve.py --extra-body)")
    p.add_argument("--pid", type=int, help="the running server's pid (the sigterm check signals it)")
    p.add_argument("--server-cmd", help="the command that starts the server (the restart check runs it again; "
                                        "with --start and no --pid, also the first server)")
    p.add_argument("--start", action="store_true", help="start the first server too, with --server-cmd")
    p.add_argument("--parallel", type=int, default=8, help="the server's slots (llama-server --parallel)")
    p.add_argument("--long-tokens", type=int, default=256, help="max_tokens of the long requests")
    p.add_argument("--greedy-n", type=int, default=4, help="greedy prompts compared across the restart")
    p.add_argument("--slot-timeout", type=float, default=10.0)
    p.add_argument("--term-limit", type=float, default=10.0, help="seconds a SIGTERM may take to exit")
    p.add_argument("--term-hard", type=float, default=30.0,
                   help="seconds after the SIGTERM at which the sigterm check sends SIGKILL")
    p.add_argument("--load-timeout", type=float, default=300.0, help="seconds for /health to answer 200")
    p.add_argument("--request-timeout", type=float, default=120.0)
    p.add_argument("--stats-file", help="the shim's WOFFLOAD_STATS file: must be written at the SIGTERM")
    p.add_argument("--checks", default=",".join(CHECKS), help="a comma list of " + ", ".join(CHECKS))
    p.add_argument("--log-dir", default=".", help="where the started servers' logs go")
    p.add_argument("--out", help="the JSON report")
    p.add_argument("--against", metavar="PLAIN.json",
                   help="the report of the same checks on the plain server: a check that fails there too, and "
                        "here no worse (sigterm: both waited for their clients, this one exited at most "
                        f"{AGAINST_SLACK_S:g} s later after they left, stats written), is the server's own")
    a = p.parse_args()
    a.url = a.url.rstrip("/")
    return asyncio.run(main_async(a))


if __name__ == "__main__":
    sys.exit(main())
