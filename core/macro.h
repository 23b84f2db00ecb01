/* core/macro.h: small helpers shared by every layer (no CUDA, no policy). */
#pragma once

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

/* Marks a symbol as part of the exported ABI; everything else is hidden
 * (-fvisibility=hidden). Every WO_EXPORT symbol must be listed in
 * preload/libwoffload.sym; tests/test-exports.sh keeps the two in sync. */
#define WO_EXPORT __attribute__((visibility("default")))

#define WO_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define WO_LIKELY(x) __builtin_expect(!!(x), 1)
#define WO_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define WO_MIN(a, b) ((a) < (b) ? (a) : (b))
#define WO_MAX(a, b) ((a) > (b) ? (a) : (b))
#define WO_ALIGN_UP(x, a) (((x) + ((a)-1)) & ~((__typeof__(x))(a)-1))
#define WO_PRINTF(a, b) __attribute__((format(printf, a, b)))

/* One pause in a bounded spin (lets the sibling hyperthread run). */
static inline void wo_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

#define WO_KiB (UINT64_C(1) << 10)
#define WO_MiB (UINT64_C(1) << 20)
#define WO_GiB (UINT64_C(1) << 30)

/* Decimal digits only: 0, -EINVAL (anything else, or empty), -ERANGE
 * (beyond 64 bits). The settings and the policy parser read integers so. */
static inline int wo_parse_uint(const char *s, uint64_t *ret)
{
    uint64_t v = 0;

    if (!*s)
        return -EINVAL;
    for (; *s; s++) {
        if (*s < '0' || *s > '9')
            return -EINVAL;
        if (v > (UINT64_MAX - 9) / 10)
            return -ERANGE;
        v = v * 10 + (uint64_t)(*s - '0');
    }
    *ret = v;
    return 0;
}

/* Grows the array *v (of elem-byte items, capacity *cap) to hold at least
 * need items, doubling from 64: 0 or -ENOMEM (the array is unchanged). */
static inline int wo_grow(void **v, size_t *cap, size_t need, size_t elem)
{
    size_t ncap;
    void *nv;

    if (need <= *cap)
        return 0;
    ncap = *cap ? *cap * 2 : 64;
    while (ncap < need)
        ncap *= 2;
    if (ncap > SIZE_MAX / elem)
        return -ENOMEM;
    nv = realloc(*v, ncap * elem);
    if (!nv)
        return -ENOMEM;
    *v = nv;
    *cap = ncap;
    return 0;
}

/* Copies a struct of uint64_t counters that other threads update with
 * atomic adds, word by word (each word whole; the struct as a whole is
 * not a snapshot). */
static inline void wo_load_words(void *dst, const void *src, size_t bytes)
{
    const uint64_t *s = src;
    uint64_t *d = dst;

    for (size_t i = 0; i < bytes / sizeof(uint64_t); i++)
        d[i] = __atomic_load_n(&s[i], __ATOMIC_RELAXED);
}

static inline void freep(void *p)
{
    free(*(void **)p);
}
#define _cleanup_(f) __attribute__((cleanup(f)))
#define _cleanup_free_ _cleanup_(freep)
