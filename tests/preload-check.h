/* tests/preload-check.h: what the end-to-end programs that run under the
 * preloaded shim and the fake driver share (test-uvm-preload.c,
 * test-stream-preload.c, test-bigload.c): CHECK(), which counts a failure
 * and goes on so one run reports every broken promise; need(), a dlsym()
 * that stops the program when a symbol is missing; slurp(), which reads
 * what a child left in a file; want(), which says whether a case named on
 * the command line runs. Each program
 * returns `failures ? 1 : 0`. */
#pragma once

#include <dlfcn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;
static int failed_lines[8]; /* the first few, for check_summary() */

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);               \
            if (failures < 8)                                                                      \
                failed_lines[failures] = __LINE__;                                                 \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

/* One last line naming the failed checks: a CI log keeps the tail, and the
 * dumps a failing program prints before it can push the first lines out. */
static inline void check_summary(const char *who)
{
    if (!failures)
        return;
    fprintf(stderr, "%s: %d check(s) failed, at line", who, failures);
    for (int i = 0; i < failures && i < 8; i++)
        fprintf(stderr, " %d", failed_lines[i]);
    fprintf(stderr, "\n");
}

static inline void *need(void *h, const char *name)
{
    void *p = dlsym(h, name);
    if (!p) {
        fprintf(stderr, "missing symbol %s\n", name);
        exit(1);
    }
    return p;
}

/* Reads up to len - 1 bytes of path into buf, NUL-terminated; returns the
 * bytes read (0 when the file cannot be opened: buf is then ""). */
static inline size_t slurp(const char *path, char *buf, size_t len)
{
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, len - 1, f) : 0;

    buf[n] = '\0';
    if (f)
        fclose(f);
    return n;
}

/* Whether case name runs: every one when the program got no arguments,
 * else those named (meson.build runs subsets under ThreadSanitizer). */
static inline bool want(int argc, char **argv, const char *name)
{
    if (argc < 2)
        return true;
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], name) == 0)
            return true;
    return false;
}
