/* tests/fuzz-gguf.c: the GGUF header reader (tools/gguf.c) on arbitrary
 * bytes.
 *
 * With -Dfuzz=true and clang this is a libFuzzer target (WO_FUZZ_LIBFUZZER);
 * otherwise it is a normal program that replays files (the committed corpus
 * under tests/corpus/gguf/) through the same function, as a test. Corpus
 * files named valid-* must read without error, invalid-* must be rejected;
 * any other name (inputs the fuzzer found) must only not crash.
 *
 * The invariants, beyond "no crash, no out-of-bounds read, no leak" (the
 * sanitizers' part): an error is -EINVAL or -ENOMEM and comes with a text
 * that names the input and a byte inside it; a file read whole has every
 * tensor's data inside it, a known type, 1-4 dimensions, and bytes that
 * agree with its shape. */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tools/gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int cond, const char *what)
{
    if (!cond) {
        fprintf(stderr, "fuzz-gguf: invariant broken: %s\n", what);
        abort();
    }
}

/* 0 when it read, else the reader's error. */
static int run_one(const uint8_t *data, size_t size)
{
    static const char name[] = "input";
    struct wo_gguf g;
    char err[512];
    FILE *f;
    int ret;

    if (!size)
        return -EINVAL; /* fmemopen takes no empty buffer */
    f = fmemopen((void *)(uintptr_t)data, size, "rb");
    if (!f)
        return -ENOMEM;
    ret = wo_gguf_read_stream(f, size, name, &g, err, sizeof(err));
    fclose(f);
    if (ret) {
        uint64_t at;
        check(ret == -EINVAL || ret == -ENOMEM, "errors are -EINVAL or -ENOMEM");
        check(strncmp(err, "input: at byte ", 15) == 0, "an error names the input and a byte");
        check(sscanf(err + 15, "%" SCNu64, &at) == 1 && at <= size,
              "the byte lies inside the input");
        check(g.n == 0 && g.t == NULL && g.arch == NULL, "a failed read leaves nothing held");
        return ret;
    }
    check(g.version == 2 || g.version == 3, "versions 2 and 3");
    check(g.alignment && !(g.alignment & (g.alignment - 1)), "the alignment is a power of two");
    for (size_t i = 0; i < g.n; i++) {
        const struct wo_gguf_tensor *t = &g.t[i];
        uint32_t block, bb;
        uint64_t elems = 1;
        check(t->name != NULL, "every tensor has a name");
        check(wo_gguf_type(t->type, NULL, &block, &bb), "every type is known");
        check(t->n_dims >= 1 && t->n_dims <= WO_GGUF_MAX_DIMS, "1-4 dimensions");
        for (unsigned d = 0; d < WO_GGUF_MAX_DIMS; d++)
            elems *= t->ne[d];
        check(elems % block == 0 && t->bytes == elems / block * bb, "bytes agree with the shape");
        check(g.data_start + t->offset + t->bytes <= size, "every tensor's data lies in the input");
    }
    wo_gguf_free(&g);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    (void)run_one(data, size);
    return 0;
}

#ifndef WO_FUZZ_LIBFUZZER
/* Replays every file of the corpus directory argv[1]. */
int main(int argc, char **argv)
{
    DIR *dir;
    struct dirent *e;
    unsigned n = 0, bad = 0;

    if (argc != 2 || !(dir = opendir(argv[1]))) {
        fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
        return 2;
    }
    while ((e = readdir(dir))) {
        char path[4096];
        struct stat st;
        uint8_t *buf;
        FILE *f;
        int ret;

        snprintf(path, sizeof(path), "%s/%s", argv[1], e->d_name);
        if (stat(path, &st) != 0 || !S_ISREG(st.st_mode))
            continue;
        buf = malloc(st.st_size ? (size_t)st.st_size : 1);
        f = fopen(path, "rb");
        if (!buf || !f || fread(buf, 1, (size_t)st.st_size, f) != (size_t)st.st_size) {
            fprintf(stderr, "fuzz-gguf: cannot read %s\n", path);
            return 1;
        }
        fclose(f);
        ret = run_one(buf, (size_t)st.st_size);
        free(buf);
        n++;
        if (strncmp(e->d_name, "valid-", 6) == 0 && ret != 0) {
            fprintf(stderr, "fuzz-gguf: %s: rejected (%d), expected to read\n", e->d_name, ret);
            bad++;
        } else if (strncmp(e->d_name, "invalid-", 8) == 0 && ret == 0) {
            fprintf(stderr, "fuzz-gguf: %s: read, expected an error\n", e->d_name);
            bad++;
        }
    }
    closedir(dir);
    printf("fuzz-gguf: %u inputs, %u wrong\n", n, bad);
    return bad || !n ? 1 : 0;
}
#endif
