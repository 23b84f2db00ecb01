#!/usr/bin/env python3
"""Tests of tools/woffload-run (argument handling, library discovery in the
build tree and in an installed layout, the environment it sets, the policy
and settings check before the command starts) and of the python hook's
behaviour when the library is absent. No GPU, no torch.

    python3 tests/test-launcher.py [BUILD_TREE_LAUNCHER]

BUILD_TREE_LAUNCHER: build/tools/woffload-run as configured by meson (meson
test passes it); the checkers beside it (woffload-policy, woffload) are
installed into the temporary layouts. Without it the build-tree and
installed-layout cases are skipped.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEMPLATE = os.path.join(SRC, "tools", "woffload-run.in")
PYDIR = os.path.join(SRC, "python")
BUILD_LAUNCHER = sys.argv[1] if len(sys.argv) > 1 else None
CHECKERS = ("woffload-policy", "woffload")  # what the launcher runs before the command


def real_library():
    """Some harmless shared library this python process already maps (libm
    or libc): preloading it into a child changes nothing."""
    with open("/proc/self/maps") as f:
        paths = [line.split()[-1] for line in f if ".so" in line and line.split()[-1].startswith("/")]
    for want in ("/libm.so", "/libm-", "/libc.so", "/libc-"):
        for p in paths:
            if want in p:
                return p
    raise unittest.SkipTest("no libm/libc mapped")


def configure(dst, **values):
    """The substitution meson's configure_file does, into dst (executable)."""
    with open(TEMPLATE) as f:
        text = f.read()
    for k, v in values.items():
        text = text.replace(f"@{k}@", v)
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    with open(dst, "w") as f:
        f.write(text)
    os.chmod(dst, 0o755)
    return dst


def run(launcher, *args, env=None):
    e = {k: v for k, v in os.environ.items() if not k.startswith("WOFFLOAD_")}
    e.pop("LD_PRELOAD", None)
    e.update(env or {})
    return subprocess.run([sys.executable, launcher, *args], capture_output=True, text=True, env=e,
                          timeout=60)


def dry_env(out):
    env = {}
    for line in out.splitlines():
        if "=" in line and not line.startswith("exec "):
            k, v = line.split("=", 1)
            env[k] = v
    return env


class Installed(unittest.TestCase):
    """An installed layout in a temporary prefix: PREFIX/bin/woffload-run,
    PREFIX/lib/x86_64-linux-gnu/libwoffload.so, PREFIX/share/woffload/python."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="wo-launcher-")
        self.prefix = os.path.join(self.tmp, "usr")
        libdir = os.path.join(self.prefix, "lib", "x86_64-linux-gnu")
        os.makedirs(libdir)
        self.lib = os.path.join(libdir, "libwoffload.so")
        shutil.copy(real_library(), self.lib)
        self.py = os.path.join(self.prefix, "share", "woffload", "python")
        shutil.copytree(PYDIR, self.py, ignore=shutil.ignore_patterns("__pycache__"))
        self.launcher = configure(
            os.path.join(self.prefix, "bin", "woffload-run"),
            WO_RUN_MODE="install", WO_RUN_LIBRARY="/nonexistent/lib/libwoffload.so",
            WO_RUN_PYTHONDIR="/nonexistent/share/woffload/python",
            WO_RUN_BIN_TO_LIB="../lib/x86_64-linux-gnu", WO_RUN_BIN_TO_PY="../share/woffload/python",
            WO_VERSION="9.9.9")
        # the build tree's checkers, installed beside the launcher
        for tool in CHECKERS:
            built = os.path.join(os.path.dirname(os.path.abspath(BUILD_LAUNCHER or "/nonexistent/x")), tool)
            if not os.path.isfile(built):
                shutil.rmtree(self.tmp)
                self.skipTest(f"no build tree: {tool} to install beside the launcher")
            shutil.copy(built, os.path.join(self.prefix, "bin", tool))
        self.policy = os.path.join(self.tmp, "p.yaml")
        with open(self.policy, "w") as f:
            f.write("rules: []\n")

    def tearDown(self):
        shutil.rmtree(self.tmp)

    def test_finds_library_relative_to_itself(self):
        r = run(self.launcher, "--policy", self.policy, "--dry-run", "--", "true")
        self.assertEqual(r.returncode, 0, r.stderr)
        env = dry_env(r.stdout)
        self.assertEqual(env["LD_PRELOAD"], self.lib)
        self.assertEqual(env["WOFFLOAD_POLICY"], self.policy)
        self.assertEqual(env["PYTHONPATH"].split(":")[:2], [os.path.join(self.py, "site"), self.py])

    def test_falls_back_to_configured_path(self):
        os.remove(self.lib)
        r = run(self.launcher, "--policy", self.policy, "--", "true")
        self.assertEqual(r.returncode, 2)
        self.assertIn("libwoffload.so not found", r.stderr)
        self.assertIn("/nonexistent/lib/libwoffload.so", r.stderr)
        self.assertIn(self.lib, r.stderr)

    def test_appends_to_existing_preload_once(self):
        env = {"LD_PRELOAD": f"/a/x.so {self.lib}:/b/y.so", "PYTHONPATH": "/keep"}
        r = run(self.launcher, "--policy", self.policy, "--dry-run", "--", "true", env=env)
        e = dry_env(r.stdout)
        self.assertEqual(e["LD_PRELOAD"], f"/a/x.so:{self.lib}:/b/y.so")
        env["LD_PRELOAD"] = "/a/x.so"
        e = dry_env(run(self.launcher, "--policy", self.policy, "--dry-run", "--", "true", env=env).stdout)
        self.assertEqual(e["LD_PRELOAD"], f"/a/x.so:{self.lib}")
        self.assertEqual(e["PYTHONPATH"].split(":")[-1], "/keep")

    def test_options_set_variables(self):
        trace = os.path.join(self.tmp, "t.bin")
        stats = os.path.join(self.tmp, "s.json")
        r = run(self.launcher, "--policy", self.policy, "--trace", trace, "--stats", stats,
                "--log", "DEBUG", "--dry-run", "--", "true")
        e = dry_env(r.stdout)
        self.assertEqual((e["WOFFLOAD_TRACE"], e["WOFFLOAD_STATS"], e["WOFFLOAD_LOG"]), (trace, stats, "debug"))
        self.assertNotIn("WOFFLOAD_STATS_EVERY", e)
        e = dry_env(run(self.launcher, "--policy", self.policy, "--stats", stats, "--stats-every", "5",
                        "--dry-run", "--", "true").stdout)
        self.assertEqual(e["WOFFLOAD_STATS_EVERY"], "5")

    def test_no_auto_keeps_package_but_not_hook(self):
        e = dry_env(run(self.launcher, "--policy", self.policy, "--no-auto", "--dry-run", "--", "true").stdout)
        self.assertEqual(e["PYTHONPATH"], self.py)

    def test_explicit_lib(self):
        e = dry_env(run(self.launcher, "--policy", self.policy, "--lib", self.lib, "--dry-run", "--", "x").stdout)
        self.assertEqual(e["LD_PRELOAD"], self.lib)
        r = run(self.launcher, "--policy", self.policy, "--lib", "/no/such.so", "--", "true")
        self.assertEqual(r.returncode, 2)
        self.assertIn("--lib /no/such.so: no such file", r.stderr)

    def test_usage_errors(self):
        cases = [
            ((), "--policy P (or --fit SIZE) is required"),
            (("--policy", self.policy), "no command given"),
            (("--policy", self.policy, "--"), "no command given"),
            (("--policy", "/no/such.yaml", "--", "true"), "--policy /no/such.yaml: no such file"),
            (("--policy", self.tmp, "--", "true"), "is a directory"),
            (("--policy", self.policy, "--log", "loud", "--", "true"), "--log loud"),
            (("--policy", self.policy, "--trace", "/no/dir/t", "--", "true"), "does not exist"),
            (("--policy", self.policy, "--stats-every", "5", "--", "true"), "needs --stats S"),
            (("--policy", self.policy, "--stats", os.path.join(self.tmp, "s.json"), "--stats-every", "0.5",
              "--", "true"), "expected whole seconds from 1 to 86400"),
        ]
        for args, msg in cases:
            r = run(self.launcher, *args)
            self.assertEqual(r.returncode, 2, (args, r.stderr))
            self.assertIn(msg, r.stderr, args)
            self.assertTrue(r.stderr.startswith("woffload-run: "), r.stderr)
        r = run(self.launcher, "--bogus", "--policy", self.policy, "--", "true")
        self.assertEqual(r.returncode, 2)

    def test_command_not_found(self):
        r = run(self.launcher, "--policy", self.policy, "--", "/no/such/program")
        self.assertEqual(r.returncode, 127)
        self.assertIn("command not found", r.stderr)

    def test_version(self):
        r = run(self.launcher, "--version")
        self.assertEqual((r.returncode, r.stdout.strip()), (0, "woffload-run 9.9.9"))

    def _marker_cmd(self):
        """A command that leaves a file behind when it runs."""
        marker = os.path.join(self.tmp, "started")
        return marker, [sys.executable, "-c", f"open({marker!r}, 'w').write('yes')"]

    def _write(self, name, text):
        path = os.path.join(self.tmp, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def test_bad_policy_is_not_started(self):
        bad = self._write("bad.yaml", "version: 1\nrules:\n  - match: [experts]\n    place: hots\n")
        marker, cmd = self._marker_cmd()
        for extra in ((), ("--dry-run",)):
            r = run(self.launcher, "--policy", bad, *extra, "--", *cmd)
            self.assertEqual(r.returncode, 2, r.stderr)
            # woffload-policy check's own located message: file:line:column, found, expected
            self.assertIn(f"{bad}:4:12: error: found 'hots', expected device, host or managed", r.stderr)
            self.assertIn(f"woffload-run: --policy {bad} is not valid", r.stderr)
            self.assertIn(f"woffload-run: not starting {sys.executable}", r.stderr)
            self.assertEqual(r.stdout, "")
            self.assertFalse(os.path.exists(marker), "the command ran")

    def test_no_check_starts_anyway(self):
        bad = self._write("bad.yaml", "version: 1\nrules:\n  - match: [experts]\n    place: hots\n")
        marker, cmd = self._marker_cmd()
        r = run(self.launcher, "--policy", bad, "--no-check", "--", *cmd,
                env={"WOFFLOAD_RING_EVENTS": "1000"})
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertNotIn("not valid", r.stderr)
        self.assertTrue(os.path.exists(marker), "the command did not run")

    def test_good_policy_starts(self):
        good = self._write("good.yaml", "version: 1\nrules:\n  - match: [experts]\n    place: host\n")
        marker, cmd = self._marker_cmd()
        r = run(self.launcher, "--policy", good, "--", *cmd)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertNotIn("woffload-run:", r.stderr)
        self.assertTrue(os.path.exists(marker), "the command did not run")

    def test_policy_is_checked_in_the_commands_environment(self):
        """${VAR} resolves from the environment the command gets."""
        pol = self._write("var.yaml", "version: 1\nrules:\n  - match: [experts]\n    place: ${WHERE}\n")
        marker, cmd = self._marker_cmd()
        r = run(self.launcher, "--policy", pol, "--", *cmd)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn(f"{pol}:4:12: error: variable 'WHERE' is not set", r.stderr)
        self.assertFalse(os.path.exists(marker), "the command ran")
        r = run(self.launcher, "--policy", pol, "--", *cmd, env={"WHERE": "host"})
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(os.path.exists(marker), "the command did not run")

    def test_bad_setting_starts_with_the_default(self):
        """The shim takes a bad WOFFLOAD_* value as its default and says so; the
        launcher says the same and starts the command (one behaviour)."""
        for var, val, msg in (("WOFFLOAD_RING_EVENTS", "1000", "expected a power-of-two integer"),
                              ("WOFFLOAD_LOG", "loud", "expected off, error, warn, info, debug, trace")):
            marker, cmd = self._marker_cmd()
            r = run(self.launcher, "--policy", self.policy, "--", *cmd, env={var: val})
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn(f'{var}="{val}" is not valid: {msg}', r.stderr)
            self.assertIn("using the default", r.stderr)
            self.assertIn("woffload-run: a WOFFLOAD_* variable has a bad value: the shim uses its default",
                          r.stderr)
            self.assertNotIn("is not valid (woffload-policy", r.stderr)
            self.assertTrue(os.path.exists(marker), "the command did not run")
            os.remove(marker)
        # a name the table does not know is only a warning, as in the shim
        r = run(self.launcher, "--policy", self.policy, "--", *cmd, env={"WOFFLOAD_PREFTECH": "0"})
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(os.path.exists(marker), "the command did not run")

    def test_missing_checker(self):
        os.remove(os.path.join(self.prefix, "bin", "woffload-policy"))
        marker, cmd = self._marker_cmd()
        r = run(self.launcher, "--policy", self.policy, "--", *cmd)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("woffload-policy not found", r.stderr)
        self.assertIn("--no-check", r.stderr)
        self.assertFalse(os.path.exists(marker), "the command ran")
        r = run(self.launcher, "--policy", self.policy, "--no-check", "--", *cmd)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(os.path.exists(marker), "the command did not run")

    def test_execs_with_environment_and_chains_sitecustomize(self):
        """The real exec path: a python child sees the variables, runs the
        hook's sitecustomize (which warns that the stand-in library is not
        libwoffload) and then the sitecustomize it shadows."""
        other = os.path.join(self.tmp, "other")
        os.makedirs(other)
        marker = os.path.join(self.tmp, "chained")
        with open(os.path.join(other, "sitecustomize.py"), "w") as f:
            f.write(f"open({marker!r}, 'w').write('yes')\n")
        code = ("import os, sys, woffload; "
                "print(os.environ['WOFFLOAD_POLICY']); print(woffload.available()); "
                "print('sitecustomize' in sys.modules)")
        r = run(self.launcher, "--policy", self.policy, "--", sys.executable, "-c", code,
                env={"PYTHONPATH": other})
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.split(), [self.policy, "False", "True"])
        self.assertIn("not preloaded", r.stderr)
        with open(marker) as f:
            self.assertEqual(f.read(), "yes")

    # --- --fit (issue 19) ---

    def _policy_cmd(self):
        """A command that reports the policy it was given: path, mode, text."""
        out = os.path.join(self.tmp, "seen")
        code = ("import os, stat, sys; p = os.environ['WOFFLOAD_POLICY']; "
                f"open({out!r}, 'w').write(p + '\\n' + oct(stat.S_IMODE(os.stat(p).st_mode)) + '\\n' "
                "+ open(p).read()); sys.exit(7)")
        return out, [sys.executable, "-c", code]

    def test_fit_writes_a_private_policy_removed_after_the_command(self):
        out, cmd = self._policy_cmd()
        r = run(self.launcher, "--fit", "20GiB", "--keep-free", "1GiB", "--", *cmd)
        self.assertEqual(r.returncode, 7, r.stderr)  # the command's status
        with open(out) as f:
            path, mode, text = f.read().split("\n", 2)
        self.assertEqual(mode, "0o600")
        self.assertIn('fit:\n  device: "20GiB"\n  keep_free: "1GiB"\n', text)
        self.assertFalse(os.path.exists(path), "the fit policy was not removed")

    def test_fit_reserve(self):
        out, cmd = self._policy_cmd()
        for reserve in ("auto", "3GiB"):
            r = run(self.launcher, "--fit", "90%", "--reserve", reserve, "--", *cmd)
            self.assertEqual(r.returncode, 7, r.stderr)
            with open(out) as f:
                text = f.read().split("\n", 2)[2]
            self.assertIn(f'fit:\n  device: "90%"\n  reserve: "{reserve}"\n', text)
        marker, cmd = self._marker_cmd()
        r = run(self.launcher, "--fit", "90%", "--reserve", "lots", "--", *cmd)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("--reserve a size or auto", r.stderr)
        self.assertFalse(os.path.exists(marker), "the command ran")
        r = run(self.launcher, "--fit", "90%", "--reserve", "auto", "--fit-trace", "t.wot", "--", *cmd)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("--reserve does not go with --fit-trace", r.stderr)

    def test_fit_bad_size_is_not_started(self):
        marker, cmd = self._marker_cmd()
        # the launcher's temporary files go to a folder of this test's own
        # (TMPDIR), so that what other processes leave in /tmp cannot count
        tmpdir = os.path.join(self.tmp, "tmpdir")
        os.mkdir(tmpdir)
        for args in (("--fit", "20GX"), ("--fit", "120%"), ("--fit", "0"),
                     ("--fit", "4GiB", "--keep-free", "4GiB"), ("--fit", "4GiB", "--keep-free", "1XB")):
            for extra in ((), ("--no-check",), ("--dry-run",)):
                r = run(self.launcher, *args, *extra, "--", *cmd, env={"TMPDIR": tmpdir})
                self.assertEqual(r.returncode, 2, (args, r.stderr))
                self.assertIn(f"woffload-run: --fit {args[1]}", r.stderr)
                self.assertIn("the fit policy is not valid", r.stderr)
                self.assertRegex(r.stderr, r"woffload-fit-[^:]*\.yaml:[0-9]+:[0-9]+: error: ")
                self.assertFalse(os.path.exists(marker), "the command ran")
        self.assertEqual(os.listdir(tmpdir), [], "the invalid fit policies were not removed")

    def test_fit_with_a_policy_adds_the_key(self):
        good = self._write("good.yaml", "version: 1\nrules:\n  - match: [experts]\n    place: host\n")
        out, cmd = self._policy_cmd()
        r = run(self.launcher, "--fit", "90%", "--policy", good, "--", *cmd)
        self.assertEqual(r.returncode, 7, r.stderr)
        with open(out) as f:
            text = f.read().split("\n", 2)[2]
        self.assertTrue(text.startswith("version: 1\nrules:\n  - match: [experts]\n    place: host\n"), text)
        self.assertIn('fit:\n  device: "90%"\n', text)
        # a policy that has fit: already
        has = self._write("has.yaml", "version: 1\nfit:\n  device: 10GiB\n")
        marker, cmd = self._marker_cmd()
        r = run(self.launcher, "--fit", "20GiB", "--policy", has, "--", *cmd)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn(f"--policy {has} already has a fit: key", r.stderr)
        self.assertFalse(os.path.exists(marker), "the command ran")
        # a bad base policy: its own located message
        bad = self._write("bad.yaml", "version: 1\nrules:\n  - match: [experts]\n    place: hots\n")
        r = run(self.launcher, "--fit", "20GiB", "--policy", bad, "--", *cmd)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn(f"{bad}:4:12: error: found 'hots'", r.stderr)
        self.assertFalse(os.path.exists(marker), "the command ran")

    def test_fit_trace_uses_the_chosen_policy(self):
        trace = os.path.join(SRC, "tests", "traces", "h200-cb-moe32-uniform-gpu.wot.gz")
        out, cmd = self._policy_cmd()
        r = run(self.launcher, "--fit", "30GiB", "--fit-trace", trace, "--", *cmd)
        self.assertEqual(r.returncode, 7, r.stderr)
        self.assertRegex(r.stderr, r"fit: predicted step time [0-9.]+ ms")
        with open(out) as f:
            path, _, text = f.read().split("\n", 2)
        self.assertIn("\ndefault: host\n", text)
        self.assertIn("name: fit-device", text)
        self.assertFalse(os.path.exists(path))
        marker, cmd = self._marker_cmd()
        for args, msg in ((("--fit", "30GiB", "--fit-trace", os.path.join(self.tmp, "none.wot")), "No such file"),
                          (("--fit", "200GiB", "--fit-trace", trace), "more than the device has"),
                          (("--fit", "20GX", "--fit-trace", trace), "--device '20GX'")):
            r = run(self.launcher, *args, "--", *cmd)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn(msg, r.stderr)
            self.assertIn("woffload-policy fit: exit 2", r.stderr)
            self.assertFalse(os.path.exists(marker), "the command ran")

    def test_fit_options_need_fit(self):
        for args in (("--keep-free", "1GiB"), ("--fit-trace", "t.wot"), ("--reserve", "auto")):
            r = run(self.launcher, "--policy", self.policy, *args, "--", "true")
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn("go with --fit SIZE", r.stderr)
        r = run(self.launcher, "--", "true")
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("--policy P (or --fit SIZE) is required", r.stderr)


class BuildTree(unittest.TestCase):
    """The copy meson configured for the build tree."""

    def setUp(self):
        if not BUILD_LAUNCHER:
            self.skipTest("no build-tree launcher given")
        self.tmp = tempfile.mkdtemp(prefix="wo-launcher-")
        self.policy = os.path.join(self.tmp, "p.yaml")
        with open(self.policy, "w") as f:
            f.write("rules: []\n")

    def tearDown(self):
        shutil.rmtree(self.tmp)

    def test_uses_build_tree_library_and_source_hook(self):
        build = os.path.dirname(os.path.dirname(os.path.abspath(BUILD_LAUNCHER)))
        lib = os.path.join(build, "preload", "libwoffload.so")
        r = run(BUILD_LAUNCHER, "--policy", self.policy, "--dry-run", "--", "true")
        if not os.path.exists(lib):
            self.assertEqual(r.returncode, 2)
            self.assertIn(lib, r.stderr)
            return
        self.assertEqual(r.returncode, 0, r.stderr)
        e = dry_env(r.stdout)
        # sanitizer builds put their runtime first (meson.build: san_runtime)
        pre = e["LD_PRELOAD"].split(":")
        self.assertEqual(pre[-1], lib)
        self.assertTrue(all("san" in p for p in pre[:-1]), e["LD_PRELOAD"])
        self.assertEqual(e["PYTHONPATH"].split(":")[:2], [os.path.join(PYDIR, "site"), PYDIR])

    def test_ggml_hook_by_the_commands_needed_libraries(self):
        """A program that links libggml-base.so gets libwoffload-ggml.so after
        libwoffload.so, and the launcher says why (--log info); one that does
        not, none; --ggml and --no-ggml decide over the ELF."""
        build = os.path.dirname(os.path.dirname(os.path.abspath(BUILD_LAUNCHER)))
        hook = os.path.join(build, "ggml", "libwoffload-ggml.so")
        client = os.path.join(build, "tests", "ggml", "ggml-client")
        if not os.path.exists(hook) or not os.path.exists(client):
            self.skipTest("the ggml hook or its test client is not built")
        r = run(BUILD_LAUNCHER, "--policy", self.policy, "--log", "info", "--dry-run", "--", client)
        self.assertEqual(r.returncode, 0, r.stderr)
        pre = dry_env(r.stdout)["LD_PRELOAD"].split(":")
        self.assertEqual(pre[-1], hook)
        self.assertTrue(pre[-2].endswith("/libwoffload.so"), pre)
        self.assertIn(f"ggml hook loaded: {client} links libggml-base.so", r.stderr)
        # through a library of its own (llama-batched-bench's case): found by
        # following NEEDED along the RUNPATH, never by running it
        indirect = os.path.join(build, "tests", "ggml", "ggml-indirect-client")
        r = run(BUILD_LAUNCHER, "--policy", self.policy, "--log", "info", "--dry-run", "--", indirect)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(dry_env(r.stdout)["LD_PRELOAD"].split(":")[-1], hook)
        self.assertIn(f"ggml hook loaded: {indirect} links libggml-base.so", r.stderr)
        r = run(BUILD_LAUNCHER, "--policy", self.policy, "--log", "debug", "--dry-run", "--", "true")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertNotIn(hook, dry_env(r.stdout)["LD_PRELOAD"])
        self.assertIn("ggml hook not loaded", r.stderr)
        self.assertIn("links no ggml library", r.stderr)
        r = run(BUILD_LAUNCHER, "--policy", self.policy, "--ggml", "--dry-run", "--", "true")
        self.assertEqual(dry_env(r.stdout)["LD_PRELOAD"].split(":")[-1], hook)
        self.assertNotIn("ggml hook", r.stderr)  # said only with --log info or debug
        r = run(BUILD_LAUNCHER, "--policy", self.policy, "--no-ggml", "--dry-run", "--", client)
        self.assertNotIn(hook, dry_env(r.stdout)["LD_PRELOAD"])
        r = run(BUILD_LAUNCHER, "--policy", self.policy, "--ggml", "--no-ggml", "--", "true")
        self.assertEqual(r.returncode, 2)
        self.assertIn("--ggml and --no-ggml exclude each other", r.stderr)
        # a script is no ELF: only --ggml loads the hook into it
        r = run(BUILD_LAUNCHER, "--policy", self.policy, "--log", "info", "--dry-run", "--",
                os.path.join(SRC, "tests", "policy-tool.sh"))
        self.assertNotIn(hook, dry_env(r.stdout)["LD_PRELOAD"])
        self.assertIn("is not an ELF executable", r.stderr)


class PythonWithoutLibrary(unittest.TestCase):
    """The package imports and degrades to no-ops without the library."""

    def test_noops(self):
        code = ("import warnings, woffload\n"
                "with warnings.catch_warnings(record=True) as w:\n"
                "    warnings.simplefilter('always')\n"
                "    assert not woffload.available() and woffload.version() is None\n"
                "    assert woffload.seal() < 0 and woffload.tag(1, 1, 'x') < 0\n"
                "    assert woffload.stats() is None\n"
                "    class M:\n"
                "        def named_parameters(self, **k): return iter(())\n"
                "        def named_buffers(self, **k): return iter(())\n"
                "    assert woffload.tag_module(M()).tagged == []\n"
                "    with woffload.window_closed():\n"
                "        pass\n"
                "    assert len(w) == 1 and 'not preloaded' in str(w[0].message), [str(x.message) for x in w]\n"
                "print('ok')\n")
        env = dict(os.environ, PYTHONPATH=PYDIR)
        env.pop("LD_PRELOAD", None)
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
        self.assertEqual((r.returncode, r.stdout.strip()), (0, "ok"), r.stderr)


FAKE_TORCH = """
# A stand-in for the parts of torch the hook uses.
class _Handle:
    def __init__(self, d, k): self.d, self.k = d, k
    def remove(self): self.d.pop(self.k, None)
_hooks = {}
class T:
    def __init__(self, ptr, n, cuda=True, elem=2):
        self.ptr, self.n, self.is_cuda, self.elem = ptr, n, cuda, elem
        self.is_meta, self.shape, self._stride = False, (n,), (1,)
    def numel(self): return self.n
    def element_size(self): return self.elem
    def stride(self): return self._stride
    def data_ptr(self): return self.ptr
class Module:
    def __init__(self, **kw): self.kw = kw; self.calls = 0
    def _items(self, prefix, kind):
        for k, v in self.kw.items():
            name = prefix + ("." if prefix else "") + k
            if isinstance(v, Module):
                yield from v._items(name, kind)
            elif (kind == "param") == (not k.startswith("buf")):
                yield name, v
    def named_parameters(self, prefix="", remove_duplicate=True): return self._items(prefix, "param")
    def named_buffers(self, prefix="", remove_duplicate=True): return self._items(prefix, "buf")
    def parameters(self): return (v for _, v in self.named_parameters())
    def __call__(self, *args):
        for h in list(_hooks.values()):
            h(self, args)
        self.calls += 1
class _NS: pass
nn = _NS(); nn.Module = Module; nn.modules = _NS(); nn.modules.module = _NS()
def register_module_forward_pre_hook(h):
    k = object(); _hooks[k] = h; return _Handle(_hooks, k)
nn.modules.module.register_module_forward_pre_hook = register_module_forward_pre_hook
compiler = _NS(); compiler.disable = lambda f: f
"""

HOOK_SCRIPT = """
import errno, woffload
calls = []
class Fake:
    def __getattr__(self, name):
        def f(*a):
            calls.append((name,) + tuple(getattr(x, 'value', x) for x in a))
            if name == 'woffload_tag' and a[2] == b'other.w':
                return -errno.ENOENT
            return 0
        return f
woffload._lib, woffload._lib_looked_up = Fake(), True
from woffload import _auto
_auto.install()
assert not any(c[0] == 'woffload_seal' for c in calls)
import torch                                   # the watcher installs the forward hook here
T, M = torch.T, torch.nn.Module
cpu = M(w=T(0x1000, 8, cuda=False))
cpu()                                          # no CUDA parameters: ignored
assert not any(c[0] == 'woffload_tag' for c in calls), calls
shared = T(0x9000, 64)
model = M(embed=shared, layers=M(l0=M(w=T(0x2000, 100), buf_b=T(0x3000, 4))), lm_head=shared,
          cpuw=T(0x4000, 4, cuda=False))
model(); model()
tags = [(c[1], c[2], c[3].decode()) for c in calls if c[0] == 'woffload_tag']
# tied: tagged by the head's name, which reads it whole every step
assert tags == [(0x9000, 128, 'lm_head'), (0x2000, 200, 'layers.l0.w'), (0x3000, 8, 'layers.l0.buf_b')], tags
assert [c[0] for c in calls].count('woffload_seal') == 1
M(w=T(0x5000, 4))()                            # a second model: the hook is gone
assert [c[0] for c in calls].count('woffload_tag') == 3
assert not torch._hooks
rep = woffload.tag_module(M(a=T(0x7000, 4), b=T(0x7000, 4), other=M(w=T(0x8000, 4))))
assert rep.tagged == ['a'] and rep.aliases == {'b': 'a'} and rep.errors == {'other.w': -errno.ENOENT}, rep
rep = woffload.tag_module(M(model=M(embed_tokens=T(0x6000, 4)), lm_head=T(0x6000, 4)))
assert rep.tagged == ['lm_head'] and rep.aliases == {'model.embed_tokens': 'lm_head'}, rep
assert woffload.preferred_name(['transformer.wte.weight', 'embed_out.weight']) == 'embed_out.weight'
assert woffload.preferred_name(['a.q', 'a.q_alias']) == 'a.q'
print('ok')
"""


class AutoHook(unittest.TestCase):
    """The automatic hook's rule, against a stand-in torch and library."""

    def test_first_cuda_module_is_tagged_and_sealed_once(self):
        tmp = tempfile.mkdtemp(prefix="wo-hook-")
        try:
            os.makedirs(os.path.join(tmp, "torch"))
            with open(os.path.join(tmp, "torch", "__init__.py"), "w") as f:
                f.write(FAKE_TORCH)
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([PYDIR, tmp]))
            env.pop("LD_PRELOAD", None)
            r = subprocess.run([sys.executable, "-c", HOOK_SCRIPT], capture_output=True, text=True,
                               env=env, timeout=60)
            self.assertEqual((r.returncode, r.stdout.strip()), (0, "ok"), r.stderr)
        finally:
            shutil.rmtree(tmp)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0], "-v"])
