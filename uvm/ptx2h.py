#!/usr/bin/env python3
"""uvm/ptx2h.py PTX: the PTX file as a C string (uvm/stream-copy-ptx.h)."""
import sys

src = open(sys.argv[1]).read()
print("/* uvm/stream-copy-ptx.h: generated from uvm/stream-copy.cu (see there). */")
print("#pragma once")
print("static const char wo_stream_copy_ptx[] =")
for line in src.splitlines():
    print('    "%s\\n"' % line.replace("\\", "\\\\").replace('"', '\\"'))
print("    ;")
