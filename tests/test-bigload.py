#!/usr/bin/env python3
"""bench/bigload.py's MoE report (issue 41) without a GPU: the bound of a
row's own offloaded bytes (an expert tensor at its layer's distinct share),
the ratios against host-free and the hand policy under the same blocker,
tokens against plain's, and the continuous-batching table."""
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
import bigload  # noqa: E402

GB = 1e9
EXPERT = "model.layers.{}.mlp.experts.gate_up_proj"


def row(name, frac=None, rates=None, tokens=None, offloaded=None, distinct=None, **kw):
    r = dict(name=name, load_s=kw.pop("load_s", 10.0), peak_device_bytes=kw.pop("peak", 4 * 2**30),
             placements={"device": {"bytes": 2**30}, "host": {"bytes": 2 * 2**30}, "managed": {"bytes": 0}},
             offloaded=offloaded or [], fraction=frac or 1.0, **kw)
    if frac is not None:
        r["blocker"] = dict(size=1, leave=1, free_after=6 * 2**30)
    if rates is not None:
        r["batched"] = {str(b): dict(tok_s=t, tokens=tokens or [[1, 2]] * b) for b, t in rates.items()}
        if distinct is not None:
            for b in rates:
                r["batched"][str(b)]["distinct_experts"] = distinct[b]
    return r


class TestStepBytes(unittest.TestCase):
    def test_expert_tensors_count_at_their_layers_share(self):
        off = [[EXPERT.format(0), "host", 10 * GB], [EXPERT.format(1), "host", 10 * GB],
               ["model.layers.1.self_attn.q_proj.weight", "host", 1 * GB]]
        # layer 0 picks 8 of 128 experts a step, layer 1 64 of 128
        self.assertAlmostEqual(bigload.step_bytes(off, [8, 64], 128), (10 * 8 / 128 + 10 * 0.5 + 1) * GB)

    def test_no_shares_or_nothing_offloaded_is_no_bound(self):
        self.assertIsNone(bigload.step_bytes([[EXPERT.format(0), "host", GB]], None, 128))
        self.assertIsNone(bigload.step_bytes([], [8], 128))

    def test_a_share_never_exceeds_the_whole_tensor(self):
        self.assertEqual(bigload.step_bytes([[EXPERT.format(0), "host", GB]], [200], 128), GB)


class TestPeaks(unittest.TestCase):
    def test_peak_by_phase_and_first_within_two_percent(self):
        tl = [[0.0, "load", 10], [0.1, "b1", 97], [0.2, "b1", 99], [0.3, "b8", 100], [0.4, "b8", 100]]
        pk = bigload.peaks(tl)
        self.assertEqual((pk["peak"], pk["phase"], pk["at"]), (100, "b8", 0.3))
        self.assertEqual(pk["by_phase"], {"load": 10, "b1": 99, "b8": 100})
        self.assertEqual(list(pk["by_phase"]), ["load", "b1", "b8"])
        self.assertEqual(pk["near"], [0.2, "b1"])

    def test_no_timeline_says_nothing(self):
        pk = bigload.peaks([])
        self.assertEqual((pk["peak"], pk["by_phase"], pk["near"]), (0, {}, None))


class TestMoeTables(unittest.TestCase):
    def setUp(self):
        off = [[EXPERT.format(0), "host", 11 * GB]]  # 11 GB of experts, layer 0
        self.rows = [
            row("plain", rates={1: 100.0, 8: 400.0}, distinct={1: [8], 8: [55]}),
            row("host-free", rates={1: 20.0, 8: 30.0}, offloaded=off),
            row("fit-0.5", frac=0.5, rates={1: 30.0, 8: 45.0}, offloaded=off,
                fit={"budget": 4 * 2**30}, peak=int(5.5 * 2**30)),
            row("hand-0.5", frac=0.5, rates={1: 15.0, 8: 40.0}, offloaded=off,
                tokens=[[9, 9]]),  # b1 differs from plain; b8 given below
        ]
        self.rows[3]["batched"]["8"]["tokens"] = [[1, 2]] * 8
        self.text = bigload.moe_tables(self.rows, 128, 1 << 30)
        self.lines = self.text.splitlines()

    def line(self, run, batch):
        return next(x for x in self.lines if x.startswith(f"| {run} |") and f"| {batch} |" in x
                    and "tok" not in x)

    def cells(self, run, batch):
        return [c.strip() for c in self.line(run, batch).split("|")[1:-1]]

    def test_bound_is_the_rows_own_distinct_bytes(self):
        # b1: 11 GB x 8/128 = 0.6875 GB a step at 55 GB/s: 80 tok/s; fit's 30 is 0.38x
        c = self.cells("fit-0.5", 1)
        self.assertEqual(c[5], "80.00")
        self.assertEqual(c[6], "0.38x")
        # b8: 11 GB x 55/128 a step, 8 tokens each: 93.09 tok/s
        self.assertEqual(self.cells("fit-0.5", 8)[5], "93.09")

    def test_the_bound_is_never_above_plain(self):
        # plain at b1 50 tok/s, below the PCIe bound's 80: fit's 30 is 0.60x of 50
        rows = [dict(r) for r in self.rows]
        rows[0] = row("plain", rates={1: 50.0, 8: 400.0}, distinct={1: [8], 8: [55]})
        text = bigload.moe_tables(rows, 128, 1 << 30)
        ln = next(x for x in text.splitlines() if x.startswith("| fit-0.5 | 0.5 | 1 |"))
        c = [x.strip() for x in ln.split("|")[1:-1]]
        self.assertEqual(c[5], "80.00")  # the PCIe bound, shown
        self.assertEqual(c[6], "0.60x")  # judged against plain's 50
        self.assertIn("- fit-0.5 b1 x bound: NOT met (0.60x, at least 0.90x)", text)

    def test_the_repeats_spread(self):
        rows = [dict(r) for r in self.rows]
        rows[2] = dict(rows[2], batched={k: dict(v) for k, v in rows[2]["batched"].items()})
        rows[2]["batched"]["1"]["tok_s_repeats"] = [29.0, 30.0, 31.5]
        text = bigload.moe_tables(rows, 128, 1 << 30)
        self.assertRegex(text, r"\| fit-0\.5 \| 0\.5 \| 1 \| 30\.00 \| 29\.00-31\.50 \|")
        self.assertRegex(self.text, r"\| fit-0\.5 \| 0\.5 \| 1 \| 30\.00 \| - \|")

    def test_against_host_free_and_the_hand_policy_of_the_same_blocker(self):
        c = self.cells("fit-0.5", 1)
        self.assertEqual(c[7], "1.50x")  # 30 / 20
        self.assertEqual(c[8], "2.00x")  # 30 / 15
        self.assertEqual(self.cells("hand-0.5", 8)[8], "-")  # no ratio to itself

    def test_tokens_against_plain(self):
        self.assertEqual(self.cells("fit-0.5", 1)[9], "identical")
        self.assertEqual(self.cells("hand-0.5", 1)[9], "DIFFER")
        self.assertEqual(self.cells("hand-0.5", 8)[9], "identical")
        self.assertEqual(self.cells("plain", 1)[9], "ref")

    def test_load_table_says_the_peak_against_the_fit_size(self):
        # 6 GiB free after the blocker, keep_free 1 GiB: a fit size of 5 GiB
        ln = next(x for x in self.lines if x.startswith("| fit-0.5 | 0.5 | 10.0 (1.00x)"))
        self.assertIn("| 5.00 (1.10x) |", ln)
        hand = next(x for x in self.lines if x.startswith("| hand-0.5 | 0.5 |"))
        self.assertEqual(hand.split("|")[5].strip(), "-")  # no fit, no fit size

    def test_sizes(self):
        self.assertEqual(bigload.parse_size("1GiB"), 1 << 30)
        self.assertEqual(bigload.parse_size("256MiB"), 256 << 20)
        self.assertEqual(bigload.parse_size("4096"), 4096)

    def test_cpus(self):
        self.assertEqual(bigload.parse_cpus("0-3,8"), [0, 1, 2, 3, 8])
        self.assertEqual(bigload.parse_cpus(""), [])
        for bad in ("3-1", "x", "-2"):
            with self.assertRaises(ValueError):
                bigload.parse_cpus(bad)

    def test_an_error_row_is_reported_not_raised(self):
        rows = self.rows + [dict(name="fit-0.25", error="OutOfMemoryError: CUDA out of memory\n")]
        self.assertIn("| fit-0.25 | | error: OutOfMemoryError", bigload.moe_tables(rows, 128, 1 << 30))

    def test_the_error_shown_is_not_the_shims_exit_summary(self):
        err = ("Traceback ...\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.00 GiB\n"
               "woffload: exit: device 706.00 MiB in 84 tensors\nwoffload: picks: by tensor, moved a step\n")
        text = bigload.moe_tables(self.rows + [dict(name="hand-0.25", error=err)], 128, 1 << 30)
        self.assertIn("| hand-0.25 | | error: torch.OutOfMemoryError: CUDA out of memory", text)

    def test_a_batch_the_engine_had_no_memory_for_keeps_the_smaller_ones(self):
        rows = [dict(r) for r in self.rows]
        rows[2] = dict(rows[2], batched=dict(rows[2]["batched"]))
        rows[2]["batched"]["32"] = dict(error="engine out of memory: CUDA out of memory")
        text = bigload.moe_tables(rows, 128, 1 << 30)
        self.assertIn("| fit-0.5 | 0.5 | 32 | engine out of memory: CUDA out of memory |", text)
        self.assertRegex(text, r"\| fit-0\.5 \| 0\.5 \| 8 \| 45\.00 \|")

    def test_the_names_announced_before_their_bytes(self):
        rows = [dict(r) for r in self.rows]
        rows[2] = dict(rows[2], expect={"names": 24, "served_host_bytes": 12 * 2**30,
                                        "prepin": {"taken_bytes": 9 * 2**30}})
        text = bigload.moe_tables(rows, 128, 1 << 30)
        self.assertRegex(text, r"\| fit-0\.5 \| 0\.5 \|.*\| 12\.00 / 9\.00 \|")
        self.assertRegex(text, r"\| plain \| all \|.*\| - \|")

    def test_the_targets_of_the_fit_rows(self):
        rows = [dict(r) for r in self.rows]
        rows.append(row("fit-0.25", frac=0.25, rates={1: 40.0, 8: 30.0},
                        offloaded=[[EXPERT.format(0), "host", 11 * GB]],
                        fit={"budget": 2**30}, peak=int(1.5 * 2**30)))
        rows.append(row("hand-0.25", frac=0.25, rates={1: 20.0, 8: 20.0}))
        text = bigload.moe_tables(rows, 128, 1 << 30)
        self.assertIn("Issue 41's targets (fit rows):", text)
        # fit-0.5 b1 30 against host-free's 20 and hand's 15
        self.assertIn("- fit-0.5 b1 x host-free: met (1.50x, at least 1.00x)", text)
        self.assertIn("- fit-0.5 b1 x hand-0.5: met (2.00x, at least 1.00x)", text)
        # b8 45 against hand 40, host-free 30
        self.assertIn("- fit-0.5 b8 x hand-0.5: met (1.12x, at least 1.00x)", text)
        # monotone: fit-0.5 (more free) 30 at b1 against fit-0.25's 40: slower
        self.assertIn("- b1: fit-0.5 x fit-0.25 (more free memory): NOT met (0.75x", text)
        self.assertIn("- b8: fit-0.5 x fit-0.25 (more free memory): met (1.50x", text)
        # a row of another kind (a reserve) at the same F is no "more free memory" pair
        rows.append(row("fit-r2GiB-0.5", frac=0.5, rates={1: 10.0}, offloaded=[], fit={"budget": 2**30}))
        text = bigload.moe_tables(rows, 128, 1 << 30)
        self.assertNotIn("fit-0.5 x fit-r2GiB-0.5", text)
        self.assertNotIn("fit-r2GiB-0.5 x fit-0.25", text)
        # the hand policy with the copy engine under the same blocker, when run
        rows.append(row("hand-engine-0.5", frac=0.5, rates={1: 60.0, 8: 30.0}))
        text = bigload.moe_tables(rows, 128, 1 << 30)
        self.assertIn("- fit-0.5 b1 x hand-engine-0.5: NOT met (0.50x, at least 1.00x)", text)
        self.assertIn("- fit-0.5 b8 x hand-engine-0.5: met (1.50x", text)
        self.assertNotIn("fit-0.25 b1 x hand-engine", text)
        # and with hot experts under the same blocker, when run
        rows.append(row("hand-hot-0.5", frac=0.5, rates={1: 20.0, 8: 90.0}))
        text = bigload.moe_tables(rows, 128, 1 << 30)
        self.assertIn("- fit-0.5 b1 x hand-hot-0.5: met (1.50x, at least 1.00x)", text)
        self.assertIn("- fit-0.5 b8 x hand-hot-0.5: NOT met (0.50x, at least 1.00x)", text)
        self.assertNotIn("fit-0.25 b1 x hand-hot", text)
        # load 10 s against plain's 10 s; peak 5.5 GiB against 5 GiB free less 1 GiB
        self.assertIn("- fit-0.5 load x plain: met (1.00x, at most 1.30x)", text)
        self.assertIn("- fit-0.5 peak x fit size: NOT met (1.10x, at most 1.05x)", text)
        self.assertIn("- fit-0.5 b1 tokens: met", text)

    def test_the_targets_of_issue_42_rows(self):
        off = [[EXPERT.format(0), "host", 11 * GB]]
        rows = [dict(r) for r in self.rows]
        rows.append(row("host-free-engine", rates={1: 19.0, 8: 36.0}, offloaded=off))
        rows.append(row("hot-free", rates={1: 25.0, 8: 70.0}, offloaded=off, tokens=[[7, 7]]))
        rows.append(row("host-free-engine-20", rates={1: 18.0, 8: 37.0}, offloaded=off))
        text = bigload.moe_tables(rows, 128, 1 << 30)
        self.assertIn("Issue 42's targets (no blocker: every expert host, half their bytes hot):", text)
        # b8: 11 GB x 55/128 = 4.73 GB a step at 55 GB/s: 93.1 tok/s, less than plain's 400
        self.assertIn("- host-free b8 x bound: NOT met (0.32x, at least 0.90x)", text)
        self.assertIn("- host-free-engine b8 x bound: NOT met (0.39x", text)
        self.assertIn("- host-free-engine-20 b1 x host-free: NOT met (0.90x", text)
        # against the fastest all-host row at b8: the engine's 37 at 20%
        self.assertIn("- hot-free b8 x the all-host row: met (1.89x, at least 1.70x)", text)
        self.assertIn("- host-free-engine b1 x host-free: NOT met (0.95x, at least 1.00x)", text)
        self.assertIn("- hot-free b1 x host-free: met (1.25x", text)
        self.assertIn("- hot-free b1 tokens: NOT met (they differ)", text)
        self.assertIn("- host-free-engine b8 tokens: met", text)
        # without them, host-free's bound alone, and no hot line
        text = bigload.moe_tables(self.rows, 128, 1 << 30)
        self.assertIn("- host-free b8 x bound:", text)
        self.assertNotIn("hot-free", text)

    def test_the_copy_engines_runs(self):
        self.assertEqual(bigload.engine_pct("host-free-engine"), 50)
        self.assertEqual(bigload.engine_pct("fit-engine-all"), 1)
        self.assertEqual(bigload.engine_pct("hand-engine-20"), 20)
        self.assertEqual(bigload.engine_pct("fit-engine-20-lazy"), 20)
        self.assertEqual(bigload.engine_env("fit-engine-20-lazy"),
                         {"WOFFLOAD_PICKS_ENGINE": "20", "WOFFLOAD_PICKS_LAZY": "1"})
        self.assertEqual(bigload.engine_env("fit-engine-20"), {"WOFFLOAD_PICKS_ENGINE": "20"})
        self.assertEqual(bigload.engine_env("fit-engine-20-eager-bind"),
                         {"WOFFLOAD_PICKS_ENGINE": "20", "WOFFLOAD_PICKS_LAZY": "0",
                          "WOFFLOAD_FIT_BIND": "1"})
        self.assertEqual(bigload.engine_pct("fit-engine-20-bind-auto"), 20)
        self.assertEqual(bigload.engine_suffix_error("fit-engine-20-lazy-bind-auto"), "")
        self.assertIn("together", bigload.engine_suffix_error("fit-engine-lazy-eager"))
        self.assertIn("fit's", bigload.engine_suffix_error("hand-engine-20-auto"))
        self.assertIn("twice", bigload.engine_suffix_error("fit-engine-bind-bind"))
        for name in ("fit-engine-0", "fit-engine-101", "fit-engine-late", "hot-free", "fit",
                     "fit-engine-20-fast", "fit-engine-lazy20"):
            self.assertEqual(bigload.engine_pct(name), 0, name)

    def test_the_loads_copies(self):
        r = row("fit-0.5", load_s=13.4, managed_cap={"pin_seconds": 0.5},
                load_copies={"device": {"calls": 3, "bytes": 2**30, "seconds": 0.25},
                             "host": {"calls": 22, "bytes": 12 * 2**30, "seconds": 4.0},
                             "managed": {"calls": 0, "bytes": 0, "seconds": 0.0}})
        self.assertEqual(bigload.load_line(r),
                         "load: the engine's copies before seal (time inside the calls): into the "
                         "engine's memory 1.00 GiB in "
                         "0.25 s (4.0 GiB/s), into host 12.00 GiB in 4.00 s (3.0 GiB/s); the loader's "
                         "own pinning 0.50 s; load 13.4 s")
        self.assertEqual(bigload.load_line(row("plain")), "")

    def test_half_the_experts_bytes_from_the_host_free_row(self):
        rows = [row("host-free", offloaded=[[EXPERT.format(0), "host", 10 * 2**30],
                                            ["model.embed_tokens.weight", "host", 2**30]])]
        self.assertEqual(bigload.experts_bytes(rows, 100), 10 * 2**30)
        self.assertEqual(bigload.experts_bytes([], 100), 50)

    def test_continuous_batching_table(self):
        rows = [dict(r) for r in self.rows]
        rows += [dict(name="plain-cb", cb_tok_s=300.0, tokens=[[1]], load_s=9.0),
                 dict(name="host-free-cb", cb_tok_s=100.0, tokens=[[1]], load_s=9.0),
                 dict(name="fit-0.5-cb", fraction=0.5, blocker={}, cb_tok_s=120.0, tokens=[[2]], load_s=9.0),
                 dict(name="hand-0.5-cb", fraction=0.5, blocker={}, cb_tok_s=80.0, tokens=[[1]], load_s=9.0)]
        text = bigload.moe_tables(rows, 128, 1 << 30)
        ln = next(x for x in text.splitlines() if x.startswith("| fit-0.5-cb | 0.5 | 120.00"))
        self.assertEqual([c.strip() for c in ln.split("|")[1:-1]][3:],
                         ["0.40x", "1.20x", "1.50x", "DIFFER"])


class TestWarmCache(unittest.TestCase):
    def test_reads_every_file_once(self):
        import tempfile
        with tempfile.TemporaryDirectory() as d:
            os.makedirs(os.path.join(d, "sub"))
            with open(os.path.join(d, "a.safetensors"), "wb") as f:
                f.write(b"x" * (3 << 20) + b"yz")
            with open(os.path.join(d, "sub", "b.json"), "wb") as f:
                f.write(b"{}")
            w = bigload.warm_cache(d, chunk=1 << 20)
            self.assertEqual((w["bytes"], w["files"]), ((3 << 20) + 4, 2))
            self.assertGreaterEqual(w["s"], 0.0)

    def test_a_missing_checkpoint_reads_nothing(self):
        w = bigload.warm_cache("/nonexistent/bigload-ckpt")
        self.assertEqual((w["bytes"], w["files"]), (0, 0))


class TestRowPlan(unittest.TestCase):
    """main()'s rows for a MoE shape, each run replaced by a record of its spec."""

    def plan(self, *argv):
        import tempfile
        specs = []

        def fake_run(spec, args):
            specs.append(spec)
            if spec["name"] == "make":
                return dict(weight_bytes=20 * 2**30)
            return dict(name=spec["name"], error="not run")

        real = bigload.run
        bigload.run = fake_run
        try:
            with tempfile.TemporaryDirectory() as out:
                old = sys.argv
                sys.argv = ["bigload.py", "--out", out, *argv]
                try:
                    rc = bigload.main()
                finally:
                    sys.argv = old
                self.assertTrue(os.path.exists(os.path.join(out, "bigload.md")))
        finally:
            bigload.run = real
        self.assertEqual(rc, 1)  # every row failed
        return specs

    def test_moe_rows(self):
        specs = self.plan("--shape", "moe128", "--modes", "batched,cb")
        names = [s["name"] for s in specs]
        self.assertEqual(names, ["make", "plain", "plain-cb", "host-free", "host-free-cb",
                                 "fit-0.5", "fit-0.5-cb", "hand-0.5", "hand-0.5-cb",
                                 "fit-0.25", "fit-0.25-cb", "hand-0.25", "hand-0.25-cb"])
        by = {s["name"]: s for s in specs}
        self.assertEqual(by["make"]["layers"], 16)
        self.assertTrue(by["make"]["ckpt"].endswith("bigload-ckpt-moe128-16"))
        self.assertEqual(by["plain"]["batches"], [1, 8, 32])
        self.assertTrue(by["plain"]["distinct"])
        self.assertFalse(by["plain-cb"]["distinct"])
        self.assertTrue(by["hand-0.25-cb"]["cb"])
        self.assertEqual(by["hand-0.25"]["fraction"], 0.25)
        self.assertNotIn("fraction", by["host-free"])
        self.assertIn("place: host", by["hand-0.5"]["policy"])
        self.assertIn("match: experts", by["host-free"]["policy"])
        self.assertIn("fit: {device: 100%", by["fit-0.5"]["policy"])

    def test_cb_alone(self):
        names = [s["name"] for s in self.plan("--shape", "moe", "--modes", "cb", "--fractions", "0.5")]
        self.assertEqual(names, ["make", "plain-cb", "host-free-cb", "fit-0.5-cb", "hand-0.5-cb"])

    def test_no_row_starts_past_the_deadline(self):
        import argparse
        args = argparse.Namespace(deadline=100.0, min_left=60.0, timeout=600.0, out="/nonexistent",
                                  build="/nonexistent", log="info")
        started = bigload.STARTED
        bigload.STARTED -= 50  # 50 s left: under --min-left
        try:
            r = bigload.run(dict(name="plain"), args)
        finally:
            bigload.STARTED = started
        self.assertIn("skipped: out of time", r["error"])

    def test_dense_keeps_its_rows(self):
        names = [s["name"] for s in self.plan("--fractions", "0.5")]
        self.assertEqual(names, ["make", "plain", "fit-0.5", "fp8-plain", "fp8-0.6"])


class TestPriorRows(unittest.TestCase):
    """--with: an earlier call's rows join the report; a file of another
    checkpoint is refused; the later file wins a name both have."""

    def write(self, d, name, rows, wb=100, shape="moe128"):
        import json
        fn = os.path.join(d, name)
        with open(fn, "w") as f:
            json.dump(dict(make=dict(weight_bytes=wb, shape=shape), rows=rows), f)
        return fn

    def test_rows_join_and_the_later_file_wins(self):
        import tempfile
        with tempfile.TemporaryDirectory() as d:
            a = self.write(d, "a.json", [dict(name="plain", tok=1), dict(name="fit-0.5", tok=1)])
            b = self.write(d, "b.json", [dict(name="fit-0.5", tok=2)])
            got = {r["name"]: r for r in bigload.prior_rows([a, b], 100, "moe128")}
            self.assertEqual(sorted(got), ["fit-0.5", "plain"])
            self.assertEqual(got["fit-0.5"]["tok"], 2)
            self.assertEqual(got["plain"]["prior"], a)

    def test_another_checkpoint_is_refused(self):
        import tempfile
        with tempfile.TemporaryDirectory() as d:
            a = self.write(d, "a.json", [dict(name="plain")], wb=99)
            with self.assertRaisesRegex(ValueError, "another checkpoint"):
                bigload.prior_rows([a], 100, "moe128")
            b = self.write(d, "b.json", [dict(name="plain")], shape="moe")
            with self.assertRaisesRegex(ValueError, "another checkpoint"):
                bigload.prior_rows([b], 100, "moe128")


class TestTimedDecode(unittest.TestCase):
    """The rate is the median of the repeats, each less the one-token
    generate (the prefill), and the tokens are the first repeat's."""

    def test_median_of_the_repeats(self):
        class Ids:
            shape = (2, 3)

            def __getitem__(self, k):
                return self

        class Out:
            def __init__(self, v):
                self.v = v

            def __getitem__(self, k):
                return self

            def tolist(self):
                return [[self.v]]

        class NoGrad:
            def __enter__(self):
                return self

            def __exit__(self, *a):
                return False

        class Cuda:
            @staticmethod
            def synchronize():
                pass

        class Torch:
            cuda = Cuda

            @staticmethod
            def no_grad():
                return NoGrad()

            @staticmethod
            def ones_like(x):
                return x

        calls = []

        class Model:
            def generate(self, ids, max_new_tokens, min_new_tokens, **kw):
                calls.append(max_new_tokens)
                return Out(len(calls))

        # the clock: warm-up 0-5, five repeats of 1.0, 1.2, 0.8, 3.0, 1.1 s, prefill 0.1 s
        ticks = [0.0, 5.0]
        t = 10.0
        for d in (1.0, 1.2, 0.8, 3.0, 1.1, 0.1):
            ticks += [t, t + d]
            t += 10.0
        it = iter(ticks)
        real = bigload.time.perf_counter
        bigload.time.perf_counter = lambda: next(it)
        try:
            rate, toks, first, rates = bigload.timed_decode(Torch, Model(), Ids(), 9, 12, 5)
        finally:
            bigload.time.perf_counter = real
        self.assertEqual(calls, [12, 9, 9, 9, 9, 9, 1])
        # batch 2, 8 decode tokens each: 16 / (full - 0.1)
        self.assertEqual([round(r, 3) for r in rates], [17.778, 14.545, 22.857, 5.517, 16.0])
        self.assertAlmostEqual(rate, 16.0)
        self.assertEqual(first, 5.0)
        self.assertEqual(toks, [[2]])  # the first timed generate's


if __name__ == "__main__":
    unittest.main(verbosity=2)
