#!/usr/bin/env python3
"""tests/test-docs-xref.py SOURCE_DIR: every reference to a page of docs/
names a page that exists, and a section it quotes is one of that page's:
a heading, or a paragraph's bold title (**The gate.**).

References are read in every tracked source, build, script and document
file but the recorded results (bench/results/) and the history pages
(docs/history/), which keep the names of their day. Two forms count:
`docs/NAME.md, "Section"` (also `docs/NAME.md "Section"`, a line break and
a comment's leading `*`, `#` or `//` between them allowed) and
`docs/NAME.md, Section` up to the next `)`, `;`, `:`, `.` or `"`, which must
start with a capital. A quoted section matches a title that contains it,
an unquoted one a title it contains or that contains it, case aside.
`ggml's docs/NAME.md` is llama.cpp's own page and is skipped."""
import os
import re
import subprocess
import sys

SOURCES = re.compile(r"\.(c|h|cu|py|md|sh|build|in|yaml)$")
QUOTED = re.compile(r"(ggml's )?docs/([a-z0-9-]+)\.md(?:(?:,\s*|\s+)\"([^\"]{3,80})\")?")
UNQUOTED = re.compile(r"(ggml's )?docs/([a-z0-9-]+)\.md, ([A-Z][^)\";:.]{2,60})[)\";:.]")


def titles(path):
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("#"):
                out.append(line.lstrip("#").strip().lower())
            out += [t.strip().lower() for t in re.findall(r"\*\*([^*]+)\*\*", line)]
    return [t for t in out if len(t) > 3]


def main():
    src = sys.argv[1] if len(sys.argv) > 1 else "."
    try:
        listed = subprocess.run(["git", "-C", src, "ls-files"], check=True, capture_output=True,
                                text=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        print("SKIP: not a git checkout, no file list")
        return 77
    files = [f for f in listed if SOURCES.search(f) and not f.startswith(("bench/results/", "docs/history/"))
             and os.path.isfile(os.path.join(src, f))]
    pages = {}
    for f in os.listdir(os.path.join(src, "docs")):
        if f.endswith(".md"):
            pages["docs/" + f] = titles(os.path.join(src, "docs", f))
    refs = fails = 0
    for f in files:
        with open(os.path.join(src, f), encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        # a reference broken over lines, in a comment or a paragraph
        flat = re.sub(r"\s*\n\s*(?:\*|#|//)?\s*", " ", text)
        for m in QUOTED.finditer(flat):
            if m.group(1):
                continue
            refs += 1
            page = "docs/%s.md" % m.group(2)
            if page not in pages:
                print("FAIL: %s names %s, which does not exist" % (f, page))
                fails += 1
                continue
            sec = re.sub(r"\s+", " ", m.group(3) or "").strip().lower()
            if sec and not any(sec in t for t in pages[page]):
                print("FAIL: %s names %s, \"%s\": no such section there" % (f, page, m.group(3)))
                fails += 1
        for m in UNQUOTED.finditer(flat):
            page = "docs/%s.md" % m.group(2)
            if m.group(1) or page not in pages:
                continue
            sec = m.group(3).strip().lower()
            if not any(sec in t or t in sec for t in pages[page]):
                print("FAIL: %s names %s, %s: no such section there" % (f, page, m.group(3).strip()))
                fails += 1
    print("%d references to docs/ pages in %d files, %d broken" % (refs, len(files), fails))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
