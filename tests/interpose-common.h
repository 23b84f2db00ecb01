/* tests/interpose-common.h: helpers for the interposition tests, which run
 * under LD_PRELOAD=libwoffload.so with the fake driver on LD_LIBRARY_PATH:
 * reading the shim's counters from its stats JSON (woffload_stats through
 * dlsym, as a Python hook would), and booting the fake driver the way a
 * static CUDA runtime does. Header-only: each test is one program. */
#pragma once

#include <cuda.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The stats JSON (malloc'ed) or NULL when the shim is not loaded. */
static inline char *wo_test_stats(void)
{
    long (*stats)(char *, size_t) = (long (*)(char *, size_t))dlsym(RTLD_DEFAULT, "woffload_stats");
    long n;
    char *buf;

    if (!stats)
        return NULL;
    n = stats(NULL, 0);
    if (n < 0)
        return NULL;
    buf = malloc((size_t)n + 4096);
    if (!buf)
        return NULL;
    stats(buf, (size_t)n + 4096);
    return buf;
}

/* A number after "key": inside the object that follows "section":{ (NULL:
 * anywhere). -1 when absent. Enough for the flat objects we read. */
static inline long long wo_json_num(const char *json, const char *section, const char *key)
{
    char pat[160];
    const char *p = json;

    if (!json)
        return -1;
    if (section) {
        snprintf(pat, sizeof(pat), "\"%s\":{", section);
        p = strstr(json, pat);
        if (!p)
            return -1;
        p += strlen(pat);
    }
    snprintf(pat, sizeof(pat), "\"%s\":", key);
    p = strstr(p, pat);
    if (!p)
        return -1;
    return strtoll(p + strlen(pat), NULL, 10);
}

/* One interpose counter now (0 when absent from "calls", -1 otherwise). */
static inline long long wo_counter(const char *name)
{
    char *s = wo_test_stats();
    long long v = wo_json_num(s, "interpose", name);
    free(s);
    return v;
}

/* Calls of one hooked entry point ("calls" lists only non-zero ones). */
static inline long long wo_calls(const char *sym)
{
    char *s = wo_test_stats();
    long long v = wo_json_num(s, "calls", sym);
    if (v < 0 && s)
        v = 0;
    free(s);
    return v;
}

/* True when addr lies in a loaded object whose file name contains `part`. */
static inline int wo_addr_in(const void *addr, const char *part)
{
    Dl_info info;
    return addr && dladdr(addr, &info) && info.dli_fname && strstr(info.dli_fname, part) != NULL;
}
