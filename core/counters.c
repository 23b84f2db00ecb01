/* core/counters.c: see counters.h. The per-caller table resolves addresses to
 * library names only when the JSON is built (dladdr takes the loader lock,
 * which a hook must never do). */
#include "core/counters.h"

#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

uint64_t wo_counter_values[WO_CTR_MAX];

static const char *const counter_names[WO_CTR_MAX] = {
#define WO_CTR_NAME(name) #name,
    WO_COUNTERS(WO_CTR_NAME)
#undef WO_CTR_NAME
};

static const char *const caller_ctr_names[WO_CALLER_MAX] = {"alloc", "copy", "launch"};

/* Registered once by preload/ before any hook runs; read by the JSON writer. */
static const char *const *call_names;
static uint64_t *call_values;
static size_t call_n;

#define CALLER_SLOTS 1024u /* power of two */
#define CALLER_PROBES 16u

struct caller_slot {
    uintptr_t key; /* return address; 0 = empty; set once by CAS */
    uint64_t n[WO_CALLER_MAX];
};
static struct caller_slot callers[CALLER_SLOTS];
static uint64_t caller_other[WO_CALLER_MAX];

uint64_t wo_counter_get(enum wo_ctr c)
{
    return c < WO_CTR_MAX ? __atomic_load_n(&wo_counter_values[c], __ATOMIC_RELAXED) : 0;
}

void wo_counters_register_calls(const char *const *names, uint64_t *values, size_t n)
{
    call_names = names;
    call_values = values;
    __atomic_store_n(&call_n, n, __ATOMIC_RELEASE);
}

size_t wo_counters_calls(uint64_t *out, size_t cap)
{
    size_t n = __atomic_load_n(&call_n, __ATOMIC_ACQUIRE);

    n = n < cap ? n : cap;
    for (size_t i = 0; i < n; i++)
        out[i] = __atomic_load_n(&call_values[i], __ATOMIC_RELAXED);
    return n;
}

const char *wo_counters_call_name(size_t i)
{
    return i < __atomic_load_n(&call_n, __ATOMIC_ACQUIRE) ? call_names[i] : NULL;
}

void wo_count_caller(const void *ra, enum wo_caller_ctr c)
{
    uintptr_t key = (uintptr_t)ra;
    /* Fibonacci hashing: return addresses differ in their low bits. */
    uint32_t h = (uint32_t)((key * UINT64_C(0x9E3779B97F4A7C15)) >> 40);

    if (!key || c >= WO_CALLER_MAX)
        return;
    for (uint32_t i = 0; i < CALLER_PROBES; i++) {
        struct caller_slot *s = &callers[(h + i) & (CALLER_SLOTS - 1)];
        uintptr_t k = __atomic_load_n(&s->key, __ATOMIC_ACQUIRE);
        if (k == 0) {
            uintptr_t expect = 0;
            if (__atomic_compare_exchange_n(&s->key, &expect, key, false, __ATOMIC_ACQ_REL,
                                            __ATOMIC_ACQUIRE))
                k = key;
            else
                k = expect; /* another thread took the slot: maybe for this key */
        }
        if (k == key) {
            __atomic_fetch_add(&s->n[c], 1, __ATOMIC_RELAXED);
            return;
        }
    }
    __atomic_fetch_add(&caller_other[c], 1, __ATOMIC_RELAXED);
}

/* snprintf into a bounded buffer that keeps counting past its end. */
struct out {
    char *buf;
    size_t len;
    size_t pos;
};

static void put(struct out *o, const char *fmt, ...) WO_PRINTF(2, 3);
static void put(struct out *o, const char *fmt, ...)
{
    va_list ap;
    int n;
    char *dst = o->pos < o->len ? o->buf + o->pos : NULL;
    size_t room = o->pos < o->len ? o->len - o->pos : 0;

    va_start(ap, fmt);
    n = vsnprintf(dst, room, fmt, ap);
    va_end(ap);
    if (n > 0)
        o->pos += (size_t)n;
}

/* A library name safe to print inside a JSON string. */
static void module_name(const void *addr, char *name, size_t len)
{
    Dl_info info;
    const char *base = "unknown";
    size_t j = 0;

    if (dladdr(addr, &info) && info.dli_fname && *info.dli_fname) {
        base = strrchr(info.dli_fname, '/');
        base = base ? base + 1 : info.dli_fname;
    } else if (dladdr(addr, &info)) {
        base = "main";
    }
    for (; *base && j + 1 < len; base++)
        name[j++] = (*base == '"' || *base == '\\' || (unsigned char)*base < 0x20) ? '_' : *base;
    name[j] = '\0';
}

#define MAX_MODULES 64

struct module {
    char name[96];
    uint64_t n[WO_CALLER_MAX];
};

long wo_counters_json(char *buf, size_t len)
{
    struct out o = {buf, len, 0};
    struct module mods[MAX_MODULES];
    size_t nmods = 0, ncalls;
    const char *sep = "";

    if (len > 0)
        buf[0] = '\0';
    put(&o, "{");
    for (int i = 0; i < WO_CTR_MAX; i++) {
        put(&o, "%s\"%s\":%llu", sep, counter_names[i], (unsigned long long)wo_counter_get(i));
        sep = ",";
    }

    put(&o, ",\"calls\":{");
    sep = "";
    ncalls = __atomic_load_n(&call_n, __ATOMIC_ACQUIRE);
    for (size_t i = 0; i < ncalls; i++) {
        uint64_t v = __atomic_load_n(&call_values[i], __ATOMIC_RELAXED);
        if (!v)
            continue;
        put(&o, "%s\"%s\":%llu", sep, call_names[i], (unsigned long long)v);
        sep = ",";
    }
    put(&o, "}");

    /* Aggregate call sites per library. */
    for (unsigned i = 0; i < CALLER_SLOTS; i++) {
        uintptr_t key = __atomic_load_n(&callers[i].key, __ATOMIC_ACQUIRE);
        char name[96];
        size_t m;
        if (!key)
            continue;
        module_name((const void *)key, name, sizeof(name));
        for (m = 0; m < nmods; m++)
            if (strcmp(mods[m].name, name) == 0)
                break;
        if (m == nmods) {
            if (nmods == MAX_MODULES)
                m = MAX_MODULES - 1; /* the last one collects the rest */
            else {
                memset(&mods[m], 0, sizeof(mods[m]));
                memcpy(mods[m].name, name, sizeof(name));
                nmods++;
            }
        }
        for (int c = 0; c < WO_CALLER_MAX; c++)
            mods[m].n[c] += __atomic_load_n(&callers[i].n[c], __ATOMIC_RELAXED);
    }
    put(&o, ",\"callers\":{");
    sep = "";
    for (size_t m = 0; m < nmods; m++) {
        put(&o, "%s\"%s\":{", sep, mods[m].name);
        for (int c = 0; c < WO_CALLER_MAX; c++)
            put(&o, "%s\"%s\":%llu", c ? "," : "", caller_ctr_names[c],
                (unsigned long long)mods[m].n[c]);
        put(&o, "}");
        sep = ",";
    }
    put(&o, "%s\"other\":{", sep);
    for (int c = 0; c < WO_CALLER_MAX; c++)
        put(&o, "%s\"%s\":%llu", c ? "," : "", caller_ctr_names[c],
            (unsigned long long)__atomic_load_n(&caller_other[c], __ATOMIC_RELAXED));
    put(&o, "}}}");
    return (long)o.pos;
}
