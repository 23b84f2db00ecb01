#!/usr/bin/env python3
"""tests/make-trace-corpus.py GEN OUTDIR: (re)makes the committed trace corpus
(tests/corpus/trace/) from gen-trace. valid-* files must read without error
(strictly: footer present), invalid-* must be rejected with -EBADMSG (*.gz:
gzip-compressed, read as such by the reader); the
trace-corpus test and woffload-trace-tool check both, and the libFuzzer target
starts from these files. Run it only when the format changes; commit the result.
"""
import gzip
import os
import struct
import subprocess
import sys


def crc32c(data, crc=0):
    table = crc32c.table
    crc ^= 0xFFFFFFFF
    for b in data:
        crc = (crc >> 8) ^ table[(crc ^ b) & 0xFF]
    return crc ^ 0xFFFFFFFF


crc32c.table = []
for i in range(256):
    c = i
    for _ in range(8):
        c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
    crc32c.table.append(c)


def records(b):
    """Offsets of the records (after the 16-byte prelude)."""
    out, off = [], 16
    while off < len(b):
        (length,) = struct.unpack_from("<I", b, off)
        out.append(off)
        off += 8 + length + 4
    return out


def fix_crc(b, off):
    (length,) = struct.unpack_from("<I", b, off)
    struct.pack_into("<I", b, off + 8 + length, crc32c(bytes(b[off:off + 8 + length])))


def with_record(trace, at, rec):
    """trace with rec inserted at offset at, the footer's record count raised."""
    out = bytearray(trace)
    out[at:at] = rec
    foot = records(out)[-1]
    (n,) = struct.unpack_from("<Q", out, foot + 8 + 16)
    struct.pack_into("<Q", out, foot + 8 + 16, n + 1)
    fix_crc(out, foot)
    return out


def picks_traces(every, recs):
    """A PICKS record (type 0x81, docs/trace-format.md) of two expert tensors
    in the every-type trace, and the same with a count its length does not
    hold (3 tensors in 12 + 2 x 72 bytes)."""
    tensors = [(7, 3, 0, 1 << 20, 16, 10, 9, 1, 30, 0), (7, 3, 1 << 20, 1 << 19, 16, 10, 9, 1, 40, 2)]
    payload = struct.pack("<QI", 123456789, len(tensors))
    for t in tensors:
        payload += struct.pack("<IIQQII5Q", t[0], t[1], t[2], t[3], t[4], 0, *t[5:])
    rec = bytearray(struct.pack("<IBBH", len(payload), 0x81, 0, 0) + payload + b"\0\0\0\0")
    fix_crc(rec, 0)
    bad = bytearray(rec)
    struct.pack_into("<I", bad, 8 + 8, 3)
    fix_crc(bad, 0)
    return with_record(every, recs[2], rec), with_record(every, recs[2], bad)


def main():
    gen, outdir = sys.argv[1], sys.argv[2]
    os.makedirs(outdir, exist_ok=True)

    def generate(name, *args):
        path = os.path.join(outdir, name)
        subprocess.run([gen, path, *args], check=True)
        return bytearray(open(path, "rb").read())

    def write(name, data):
        open(os.path.join(outdir, name), "wb").write(bytes(data))

    tiny = generate("valid-moe-tiny.wotrace", "--layers", "1", "--experts", "4", "--topk", "2",
                    "--steps", "3", "--expert-mib", "1")
    generate("valid-moe-small.wotrace", "--layers", "2", "--experts", "8", "--topk", "2",
             "--steps", "4", "--skew", "2", "--seed", "7")
    every = generate("valid-every-type.wotrace", "--every-type")
    recs = records(every)

    # an optional record type (0x80 bit) from a later writer is skipped
    opt = bytearray(every)
    extra = bytearray(struct.pack("<IBBH", 3, 0x90, 0, 0) + b"xyz" + b"\0\0\0\0")
    fix_crc(extra, 0)
    opt[recs[2]:recs[2]] = extra
    # the footer counts records: the skipped one too
    foot = records(opt)[-1]
    (n,) = struct.unpack_from("<Q", opt, foot + 8 + 16)
    struct.pack_into("<Q", opt, foot + 8 + 16, n + 1)
    fix_crc(opt, foot)
    write("valid-optional-record.wotrace", opt)
    valid_picks, bad_picks = picks_traces(every, recs)
    write("valid-picks-record.wotrace", valid_picks)
    write("invalid-picks-count-vs-length.wotrace", bad_picks)

    write("invalid-empty.wotrace", b"")
    write("invalid-prelude-only.wotrace", every[:16])
    write("invalid-truncated-prelude.wotrace", every[:11])
    write("invalid-bad-magic.wotrace", b"WOTRACX\x1a" + every[8:])
    v2 = bytearray(every)
    struct.pack_into("<H", v2, 8, 2)
    struct.pack_into("<I", v2, 12, crc32c(bytes(v2[:12])))
    write("invalid-version-2.wotrace", v2)
    write("invalid-no-footer.wotrace", every[:recs[-1]])
    write("invalid-truncated-mid-record.wotrace", tiny[:len(tiny) // 2])
    write("invalid-truncated-crc.wotrace", every[:len(every) - 2])
    flip = bytearray(tiny)
    flip[len(flip) // 3] ^= 0x04
    write("invalid-bit-flip.wotrace", flip)
    huge = bytearray(every)
    struct.pack_into("<I", huge, recs[1], 0x7FFFFFFF)
    write("invalid-huge-length.wotrace", huge)
    unk = bytearray(every)
    unk[recs[1] + 4] = 0x33
    fix_crc(unk, recs[1])
    write("invalid-unknown-type.wotrace", unk)
    ev = bytearray(every)
    # the first event record: a launch with more hits than its length holds
    for off in recs:
        if ev[off + 4] == 2 and ev[off + 5] == 5:
            struct.pack_into("<H", ev, off + 8 + 24 + 32, 7)
            fix_crc(ev, off)
            break
    write("invalid-launch-hits-vs-length.wotrace", ev)
    # kernel and rule records shorter than their fixed part (a fuzzer found
    # the reader reading a kernel's function handle past such a record)
    for name, rtype in (("kernel", 0x03), ("rule", 0x05)):
        short = bytearray(struct.pack("<IBBH", 4, rtype, 0, 0) + b"\1\0\0\0" + b"\0\0\0\0")
        fix_crc(short, 0)
        write("invalid-short-%s.wotrace" % name, with_record(every, recs[2], short))
    lost = every[:recs[3]] + every[recs[4]:]
    write("invalid-record-lost.wotrace", lost)
    write("invalid-after-footer.wotrace", every + every[recs[1]:recs[2]])
    noh = every[:16] + every[recs[1]:]
    write("invalid-no-header.wotrace", noh)

    # gzip-compressed (.wot.gz): the reader inflates them as it reads; damage
    # to the gzip layer is an error like any other
    gz = gzip.compress(bytes(every), compresslevel=9, mtime=0)
    write("valid-every-type.wotrace.gz", gz)
    write("valid-two-gzip-members.wotrace.gz",
          gzip.compress(bytes(every[:recs[3]]), mtime=0) + gzip.compress(bytes(every[recs[3]:]), mtime=0))
    write("invalid-truncated-gzip.wotrace.gz", gz[:len(gz) // 2])
    write("invalid-gzip-trailer-cut.wotrace.gz", gz[:-3])
    bad_crc = bytearray(gz)
    bad_crc[-8] ^= 0x01  # the gzip trailer's CRC-32 of the decompressed bytes
    write("invalid-gzip-crc.wotrace.gz", bad_crc)
    write("invalid-gzip-not-a-trace.wotrace.gz", gzip.compress(b"not a trace, but gzip" * 4, mtime=0))


if __name__ == "__main__":
    main()
