/* tests/preload-check.h: what the end-to-end programs that run under the
 * preloaded shim and the fake driver share (test-uvm-preload.c,
 * test-stream-preload.c, test-bigload.c): CHECK(), which counts a failure
 * and goes on so one run reports every broken promise, and need(), a
 * dlsym() that stops the program when a symbol is missing. Each program
 * returns `failures ? 1 : 0`. */
#pragma once

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

static int failures;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);               \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

static inline void *need(void *h, const char *name)
{
    void *p = dlsym(h, name);
    if (!p) {
        fprintf(stderr, "missing symbol %s\n", name);
        exit(1);
    }
    return p;
}
