#!/usr/bin/env python3
"""tests/test-gpu-blocker.py: bench/gpu-blocker.py against the fake driver
(tests/fake: one 16 GiB device a process, WOFAKE_TOTAL_MEM). It holds
what leaves the asked amount free and says so in one line, frees it and
exits 0 at SIGTERM (and, with --stdin, when stdin closes); it refuses to
leave more than is free and a size it cannot read, naming why.

usage: test-gpu-blocker.py FAKE_LIB_DIR"""
import os
import re
import signal
import subprocess
import sys
import time
import unittest

BLOCKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench", "gpu-blocker.py")
ENV = dict(os.environ, WOFAKE_TOTAL_MEM="16G")


def start(*args, stdin=subprocess.DEVNULL):
    return subprocess.Popen([sys.executable, BLOCKER, *args], env=ENV, stdin=stdin, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


class TestBlocker(unittest.TestCase):
    def test_holds_until_sigterm(self) -> None:
        p = start("--leave", "4GiB")
        line = p.stdout.readline()
        m = re.fullmatch(r"gpu-blocker: held (\d+) MiB on device 0: (\d+) MiB free of 16384 MiB\n", line)
        self.assertIsNotNone(m, line)
        self.assertEqual(int(m.group(2)), 4096)
        self.assertEqual(int(m.group(1)) + int(m.group(2)), 16384)
        time.sleep(0.3)
        self.assertIsNone(p.poll(), "it waits for a signal, stdin closed or not")
        p.send_signal(signal.SIGTERM)
        self.assertEqual(p.wait(timeout=10), 0, p.stderr.read())

    def test_stops_when_stdin_closes(self) -> None:
        p = start("--leave", "5000MiB", "--stdin", stdin=subprocess.PIPE)
        self.assertIn("MiB free of 16384 MiB", p.stdout.readline())
        p.stdin.close()
        self.assertEqual(p.wait(timeout=10), 0, p.stderr.read())

    def test_refuses_more_than_free(self) -> None:
        r = subprocess.run([sys.executable, BLOCKER, "--leave", "32GiB"], env=ENV, capture_output=True, text=True,
                           timeout=30)
        self.assertEqual(r.returncode, 1)
        self.assertIn("cannot leave 32768 MiB free on device 0: only 16384 MiB of 16384 MiB are free", r.stderr)

    def test_bad_size(self) -> None:
        r = subprocess.run([sys.executable, BLOCKER, "--leave", "4 quarts"], env=ENV, capture_output=True,
                           text=True, timeout=30)
        self.assertEqual(r.returncode, 2)
        self.assertIn("'4 quarts' is not a size", r.stderr)


if __name__ == "__main__":
    ENV["LD_LIBRARY_PATH"] = sys.argv.pop(1) + ":" + ENV.get("LD_LIBRARY_PATH", "")
    unittest.main()
