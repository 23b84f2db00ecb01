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

KNOWN and KNOWN_CIRCLES list the violations present when the check landed,
each to be removed by issue 39's remaining steps; they are empty now. The
check fails on any violation not listed (it must not grow) and on any listed
one that is gone (the list must shrink with the fix, so that it cannot hide
a new one under an old name).
"""
import os
import re
import sys

MAX_LINES = 1000
LINE_DIRS = ["uvm", "preload", "policy", "core", "tools"]
PRELOAD_ALLOWED = {"uvm/uvm.h", "uvm/hotpath.h"}

# Violations at the check's landing (issue 39 left to do). Each entry is the
# exact string the check prints for it.
KNOWN = set()
# Module sets of include circles at the landing (sorted, joined by ' ').
KNOWN_CIRCLES = set()

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
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
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
    print("test-structure: ok (%d uvm modules, %d known violations left)"
          % (len(graph), len(KNOWN) + len(KNOWN_CIRCLES)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
