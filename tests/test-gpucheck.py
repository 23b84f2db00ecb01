"""tests/gpu/gpucheck.py on this machine (no GPU needed): a child the shim
reports stuck is ended early, with its threads' stacks after its stderr
(run_watched, through bench/stall-stacks.sh), or goes on and, past its
timeout, ends with them; a child that ends well gives its result as before."""
import os
import sys
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu"))
import gpucheck  # noqa: E402

STUCK = ("import os, sys, time\n"
         "sys.stderr.write(f'woffload: info: libwoffload 0.1.0 loaded (pid {os.getpid()})\\n')\n"
         "sys.stderr.write('woffload: warning: picks: the copy engine looks stuck: test\\n')\n"
         "sys.stderr.flush()\n"
         "time.sleep(120)\n")
FINE = ("import sys\n"
        "sys.stderr.write('woffload: info: libwoffload 0.1.0 loaded (pid 1)\\n')\n"
        "print('RESULT {\"tokens\": {\"0\": [[1, 2]]}}')\n")


# 15 s: both rounds of stacks (2 s apart, each a gdb attach that takes
# seconds on a loaded two-core machine: CI runs two configurations at once)
# come before it ends; with 6 s the second round was cut off there
STALLED = ("import os, sys, time\n"
           "sys.stderr.write(f'woffload: info: libwoffload 0.1.0 loaded (pid {os.getpid()})\\n')\n"
           "sys.stderr.write('woffload: warning: picks: the copy engine looks stuck: test\\n')\n"
           "sys.stderr.flush()\n"
           "time.sleep(15)\n"
           "print('RESULT {\"tokens\": {}}')\n")


class TestWatched(unittest.TestCase):
    def test_stalled_child_goes_on(self):
        got = gpucheck.result([sys.executable, "-c", STALLED], must=False, timeout=60,
                              stacks=True, kill_on_stall=False)
        self.assertEqual(got.get("tokens"), {}, "not killed: its result comes")
        self.assertIn("######## stacks-", got["stderr"])
        self.assertIn("### round 2", got["stderr"])

    def test_stuck_child_ends_with_stacks(self):
        t0 = time.monotonic()
        got = gpucheck.result([sys.executable, "-c", STUCK], must=False, timeout=120, stacks=True)
        took = time.monotonic() - t0
        self.assertLess(took, 90, "the stall's stacks end the child well before its timeout")
        self.assertIn("error", got)
        self.assertIn("######## stacks-", got["stderr"])
        self.assertIn("### round 2", got["stderr"])
        self.assertIn("looks stuck", got["stderr"])

    def test_stalled_child_past_its_timeout_keeps_the_stacks(self):
        # the rows' way (kill_on_stall=False): the stall's stacks are taken,
        # the child goes on and then runs out of time; the hang's tail
        # carries the stacks (they were dropped before: the H100's
        # lazy-loading row, 2026-12-05)
        got = gpucheck.result([sys.executable, "-c", STUCK], must=False, timeout=25,
                              stacks=True, kill_on_stall=False)
        self.assertIn("still running after 25 s", got.get("error", ""))
        self.assertIn("######## stacks-", got["stderr"])
        self.assertIn("### round 2", got["stderr"])
        self.assertIn("looks stuck", got["stderr"])

    def test_fine_child_result(self):
        got = gpucheck.result([sys.executable, "-c", FINE], must=False, timeout=60, stacks=True)
        self.assertEqual(got.get("tokens"), {"0": [[1, 2]]})
        self.assertNotIn("######## stacks-", got["stderr"])
        self.assertIn("loaded (pid 1)", got["stderr"])


if __name__ == "__main__":
    unittest.main()
