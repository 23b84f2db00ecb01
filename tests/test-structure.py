#!/usr/bin/env python3
"""tests/test-structure.py SRCROOT: the folder rules of docs/architecture.md
("Structure rules"), checked on the source tree (issue 39).

1. preload/ includes from uvm/ only the public contract uvm/uvm.h and the
   launch path's hot-path header uvm/hotpath.h (the streaming table the
   hooks read and drop lock-free); any other uvm/ header is an internal and
   fails.
2. No include circle between uvm/ modules. A module is a basename: foo.c and
   foo.h are one node (and foo-int.h, the module's internal header, with
   them; a .c file with no header of its own that includes foo-int.h is one
   of foo's files, as stream-stage.c is the stream executor's), so foo.c
   including bar.h is the edge foo -> bar; a module including its own
   headers adds no edge. Every strongly connected
   component of more than one module is printed and fails.
3. No .c file over MAX_LINES lines in uvm/, preload/, policy/, core/, tools/
   (generated PTX headers are .h and so never counted).
4. No call circle between the files of the libraries given after
   --objects (a static or shared library of this build; its objects are
   read from meson's LIB.p folder with nm): file A -> file B when A's object
   refers to a symbol B's object defines (a call, or data B defines). This
   is per file, not per module: the files of one module must stand on one
   another too (the include rule cannot see these: they share headers).
   Two kinds of edge are the design and are not counted, each named in
   ALLOWED_EDGES with why.

KNOWN and KNOWN_CIRCLES list the violations present when the check landed,
each to be removed by issue 39's remaining steps; they are empty now. The
check fails on any violation not listed (it must not grow) and on any listed
one that is gone (the list must shrink with the fix, so that it cannot hide
a new one under an old name).
"""
import os
import re
import subprocess
import sys

MAX_LINES = 1000
LINE_DIRS = ["uvm", "preload", "policy", "core", "tools"]
PRELOAD_ALLOWED = {"uvm/uvm.h", "uvm/hotpath.h"}

# Violations at the check's landing (issue 39 left to do). Each entry is the
# exact string the check prints for it.
KNOWN = set()
# Module sets of include circles at the landing (sorted, joined by ' ').
KNOWN_CIRCLES = set()

# Edges of rule 4 that are the design: (file, symbol it is referred to by,
# or None for any; referring file or None for any) -> why.
ALLOWED_EDGES = {
    ("preload/init.c", "wo_preload_init_slow", None):
        "the life cycle: every hook's gate (hook.h) runs the lazy init, which "
        "sets up and resets the hooks' files",
    ("preload/exports-driver.c", None, "preload/resolve.c"):
        "the resolver hands out the exported wrappers' addresses "
        "(cuGetProcAddress): an address taken, not a call",
    ("preload/exports-runtime.c", None, "preload/resolve.c"):
        "as exports-driver.c",
}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def includes(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        return INCLUDE.findall(f.read())


def count_lines(path):
    with open(path, "rb") as f:
        return sum(1 for _ in f)


def module(base):
    """plan-int (plan's internal header) belongs to plan."""
    return base[:-4] if base.endswith("-int") else base


def uvm_graph(root):
    """module -> set of uvm modules it includes (itself excluded)."""
    udir = os.path.join(root, "uvm")
    graph = {}
    for name in sorted(os.listdir(udir)):
        base, ext = os.path.splitext(name)
        if ext not in (".c", ".h"):
            continue
        base = module(base)
        path = os.path.join(udir, name)
        if ext == ".c" and not os.path.exists(os.path.join(udir, base + ".h")):
            for inc in includes(path):
                inc = inc[4:] if inc.startswith("uvm/") else inc
                if inc.endswith("-int.h") and os.path.exists(os.path.join(udir, inc)):
                    base = inc[:-6]
                    break
        graph.setdefault(base, set())
        for inc in includes(path):
            # uvm files include siblings as "x.h" or "uvm/x.h"
            if inc.startswith("uvm/"):
                inc = inc[4:]
            elif "/" in inc:
                continue
            target = module(os.path.splitext(inc)[0])
            if os.path.exists(os.path.join(udir, inc)) and target != base:
                graph[base].add(target)
    return graph


def allowed(src, dst, sym):
    for (to, what, frm) in ALLOWED_EDGES:
        if to == dst and (what is None or what == sym) and (frm is None or frm == src):
            return True
    return False


def object_graph(libs):
    """file -> {file: [symbols]} from the libraries' objects (rule 4)."""
    defs, undef = {}, {}
    for lib in libs:
        odir = lib + ".p"
        if not os.path.isdir(odir):
            raise SystemExit("test-structure: no object folder %s (meson's LIB.p) "
                             "for --objects %s" % (odir, lib))
        folder = os.path.basename(os.path.dirname(lib))
        for name in sorted(os.listdir(odir)):
            if not name.endswith(".c.o"):
                continue
            src = folder + "/" + name[:-2]
            out = subprocess.run(["nm", "-P", os.path.join(odir, name)], check=True,
                                 capture_output=True, text=True).stdout
            undef[src] = set()
            for line in out.splitlines():
                f = line.split()
                if len(f) < 2:
                    continue
                sym, kind = f[0], f[1]
                if kind == "U":
                    undef[src].add(sym)
                elif kind.isupper():
                    defs.setdefault(sym, src)
    graph = {src: {} for src in undef}
    for src, syms in undef.items():
        for sym in sorted(syms):
            dst = defs.get(sym)
            if dst and dst != src and not allowed(src, dst, sym):
                graph[src].setdefault(dst, []).append(sym)
    return graph


def circles(graph):
    """Strongly connected components of more than one node (Tarjan)."""
    index, low, onstack, stack, out = {}, {}, set(), [], []
    counter = [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        onstack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in onstack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                onstack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def main():
    args = sys.argv[1:]
    libs = []
    if "--objects" in args:
        libs = args[args.index("--objects") + 1:]
        args = args[:args.index("--objects")]
    root = args[0] if args else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..")
    found = set()
    fails = []

    pdir = os.path.join(root, "preload")
    for name in sorted(os.listdir(pdir)):
        if not name.endswith((".c", ".h")):
            continue
        for inc in includes(os.path.join(pdir, name)):
            if inc.startswith("uvm/") and inc not in PRELOAD_ALLOWED:
                found.add("preload-include: preload/%s -> %s" % (name, inc))

    graph = uvm_graph(root)
    found_circles = set()
    for comp in circles(graph):
        key = " ".join(comp)
        found_circles.add(key)
        if key not in KNOWN_CIRCLES:
            edges = ["%s -> %s" % (a, b) for a in comp for b in sorted(graph[a])
                     if b in comp]
            fails.append("include circle between uvm/ modules (%d): %s\n    %s"
                         % (len(comp), key, "\n    ".join(edges)))

    calls = object_graph(libs)
    for comp in circles({a: set(b) for a, b in calls.items()}):
        edges = ["%s -> %s: %s" % (a, b, ", ".join(calls[a][b][:4]))
                 for a in comp for b in sorted(calls[a]) if b in comp]
        fails.append("call circle between files (%d): %s\n    %s"
                     % (len(comp), " ".join(comp), "\n    ".join(edges)))

    for d in LINE_DIRS:
        ddir = os.path.join(root, d)
        for name in sorted(os.listdir(ddir)):
            if not name.endswith(".c"):
                continue
            n = count_lines(os.path.join(ddir, name))
            if n > MAX_LINES:
                key = "lines: %s/%s" % (d, name)
                found.add(key)
                if key not in KNOWN:
                    fails.append("%s has %d lines (at most %d)"
                                 % (key[7:], n, MAX_LINES))

    for key in sorted(found - KNOWN):
        if key.startswith("preload-include"):
            fails.append(key + " (preload/ may include only "
                         + ", ".join(sorted(PRELOAD_ALLOWED)) + ")")
    for key in sorted(KNOWN - found):
        fails.append("listed in KNOWN but fixed, take it out: " + key)
    for key in sorted(KNOWN_CIRCLES - found_circles):
        fails.append("listed in KNOWN_CIRCLES but gone, take it out: " + key)

    for f in fails:
        print("test-structure: " + f)
    if fails:
        return 1
    print("test-structure: ok (%d uvm modules, %d files' calls, %d known violations left)"
          % (len(graph), len(calls), len(KNOWN) + len(KNOWN_CIRCLES)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
