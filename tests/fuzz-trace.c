/* tests/fuzz-trace.c: the trace reader on arbitrary bytes.
 *
 * With -Dfuzz=true and clang this is a libFuzzer target (WO_FUZZ_LIBFUZZER);
 * otherwise it is a normal program that replays files (the committed corpus
 * under tests/corpus/trace/) through the same function, as a test. Corpus
 * files named valid-* must read without error, invalid-* must be rejected
 * with -EBADMSG; any other name (inputs the fuzzer found) must only not crash.
 *
 * The invariants checked here, beyond "no crash, no out-of-bounds read,
 * no leak" (the sanitizers' part): an error is -EBADMSG, -E2BIG or -ENOMEM,
 * it comes with a text and an offset inside the input, and the record
 * iterator and the loader agree. Input that starts with the gzip magic is
 * inflated by the reader (a .wot.gz): its offsets are those of the
 * decompressed trace, so they are not bounded by the input's size. */
#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "core/trace.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int cond, const char *what)
{
    if (!cond) {
        fprintf(stderr, "fuzz-trace: invariant broken: %s\n", what);
        abort();
    }
}

/* Returns the iterator's final status (0 or -errno). */
static int run_one(const uint8_t *data, size_t size, unsigned flags)
{
    struct wo_trace_reader *r;
    struct wo_trace_rec rec;
    struct wo_trace_data *d;
    uint64_t nrec = 0, nev = 0, last = 0;
    int e = wo_trace_reader_open_mem(data, size, flags, &r), e2;
    bool gz = size >= 2 && data[0] == 0x1f && data[1] == 0x8b;
    uint64_t end = gz ? UINT64_MAX : size; /* offsets lie before it */

    check(r != NULL || e == -ENOMEM, "open_mem returns a reader unless out of memory");
    check(!r || wo_trace_reader_compressed(r) == gz, "gzip is recognised by its magic bytes");
    if (!r)
        return e;
    if (e == 0) {
        while ((e = wo_trace_next(r, &rec)) > 0) {
            check(rec.offset >= last && rec.offset < end, "records move forward inside the input");
            check(rec.offset + rec.length <= end, "a record lies inside the input");
            last = rec.offset + 1;
            nrec++;
            nev += rec.type == WO_TREC_EVENT;
            if (rec.type == WO_TREC_EVENT)
                check(rec.ev.nhits <= WO_EV_MAX_HITS, "hits within bounds");
            if (rec.name)
                check(strlen(rec.name) <= UINT16_MAX, "names are bounded");
        }
    }
    if (e < 0) {
        check(e == -EBADMSG || e == -ENOMEM, "errors are -EBADMSG or -ENOMEM");
        check(wo_trace_reader_error(r)[0] != '\0', "an error has a text");
        check(strncmp(wo_trace_reader_error(r), "offset ", 7) == 0, "an error names an offset");
        check(wo_trace_reader_error_offset(r) <= end, "the error offset lies inside the input");
        check(wo_trace_next(r, &rec) == e, "errors are sticky");
    }
    for (size_t i = 0; i < wo_trace_reader_ninfo(r); i++) {
        const char *k, *v;
        check(wo_trace_reader_info_at(r, i, &k, &v) == 0 && k[0], "info keys are non-empty");
    }
    wo_trace_reader_close(r);

    e2 = wo_trace_load_mem(data, size, flags, 0, &d);
    if (e2 != -ENOMEM && e != -ENOMEM) {
        check(e2 == e, "the loader and the iterator agree");
        check(d != NULL, "the loader returns what it read");
        check(d->nevents == nev, "the loader keeps every event");
        for (size_t i = 0; i < d->nkernels; i++)
            check(wo_trace_data_kernel(d, d->kernels[i].func) != NULL, "kernel lookup finds each kernel");
        for (size_t i = 0; i < d->nranges; i++)
            check(wo_trace_data_range(d, d->ranges[i].id, d->ranges[i].gen) != NULL,
                  "range lookup finds each range");
    }
    wo_trace_data_free(d);
    (void)nrec;
    return e;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int strict = run_one(data, size, WO_TRACE_STRICT);
    int lenient = run_one(data, size, 0);

    /* strictness only adds the footer requirement */
    check(!(strict == 0 && lenient != 0), "a strictly valid trace is leniently valid");
    return 0;
}

#ifndef WO_FUZZ_LIBFUZZER
static int replay_file(const char *path, const char *base)
{
    FILE *f = fopen(path, "rb");
    uint8_t *buf = NULL;
    long n;
    int e, bad = 0;

    if (!f || fseek(f, 0, SEEK_END) < 0 || (n = ftell(f)) < 0) {
        fprintf(stderr, "fuzz-trace: %s: %s\n", path, strerror(errno));
        if (f)
            fclose(f);
        return 1;
    }
    rewind(f);
    buf = malloc((size_t)n + 1);
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        fprintf(stderr, "fuzz-trace: %s: cannot read\n", path);
        fclose(f);
        free(buf);
        return 1;
    }
    fclose(f);
    LLVMFuzzerTestOneInput(buf, (size_t)n);
    e = run_one(buf, (size_t)n, WO_TRACE_STRICT);
    if (strncmp(base, "valid-", 6) == 0 && e != 0) {
        fprintf(stderr, "FAIL %s: expected a valid trace, got %d\n", path, e);
        bad = 1;
    } else if (strncmp(base, "invalid-", 8) == 0 && e != -EBADMSG) {
        fprintf(stderr, "FAIL %s: expected -EBADMSG, got %d\n", path, e);
        bad = 1;
    } else {
        printf("ok   %s (%ld bytes): %s\n", base, n, e == 0 ? "valid" : "rejected");
    }
    free(buf);
    return bad;
}

int main(int argc, char **argv)
{
    int bad = 0, files = 0;

    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) < 0) {
            fprintf(stderr, "fuzz-trace: %s: %s\n", argv[i], strerror(errno));
            return 1;
        }
        if (S_ISDIR(st.st_mode)) {
            struct dirent **ents;
            int n = scandir(argv[i], &ents, NULL, alphasort);
            if (n < 0) {
                fprintf(stderr, "fuzz-trace: %s: %s\n", argv[i], strerror(errno));
                return 1;
            }
            for (int k = 0; k < n; k++) {
                char path[4096];
                if (ents[k]->d_name[0] != '.') {
                    snprintf(path, sizeof(path), "%s/%s", argv[i], ents[k]->d_name);
                    bad |= replay_file(path, ents[k]->d_name);
                    files++;
                }
                free(ents[k]);
            }
            free(ents);
        } else {
            const char *base = strrchr(argv[i], '/');
            bad |= replay_file(argv[i], base ? base + 1 : argv[i]);
            files++;
        }
    }
    if (files == 0) {
        fprintf(stderr, "usage: fuzz-trace FILE|DIR...  (no inputs given)\n");
        return 1;
    }
    return bad;
}
#endif
