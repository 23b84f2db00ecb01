/* bench/bench-registry.c: cost of wo_registry_lookup, the call the launch
 * hook makes for every 8-byte word of kernel parameters.
 *
 * For 10, 1,000, 10,000 and 100,000 live ranges it prints ns per lookup for
 *   hit       an address inside a random range
 *   miss-gap  an address in a gap between ranges (a granule that holds ranges)
 *   miss-far  a word that is no tracked address (small integers, floats,
 *             addresses far from any range: the common parameter word)
 * and ns per simulated launch: read_begin, 30 words (4 pointers into ranges,
 * 26 other words), read_end. Each figure is the median of 5 runs after a
 * warm-up run. Addresses are precomputed into a table larger than L1 so the
 * loop measures lookups, not address generation.
 *
 * Usage: bench-registry [lookups-per-run]   (default 4,000,000) */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "core/registry.h"

#define RUNS 5
#define NADDR (1u << 16)

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static volatile uint64_t sink;

/* ns per lookup over `n` lookups cycling through addrs[]. */
static double time_lookups(const uint64_t *addrs, uint64_t n)
{
    uint64_t t0, hits = 0;
    struct wo_hit h;

    wo_registry_read_begin();
    t0 = now_ns();
    for (uint64_t i = 0; i < n; i++)
        if (wo_registry_lookup(addrs[i & (NADDR - 1)], &h))
            hits += h.offset + 1;
    t0 = now_ns() - t0;
    wo_registry_read_end();
    sink += hits;
    return (double)t0 / (double)n;
}

/* ns per launch of 30 words, each launch its own read section. */
static double time_launches(const uint64_t *words, uint64_t nlaunch)
{
    uint64_t t0, hits = 0;
    struct wo_hit h;

    t0 = now_ns();
    for (uint64_t l = 0; l < nlaunch; l++) {
        const uint64_t *w = &words[(l * 30) % (NADDR - 30)];
        wo_registry_read_begin();
        for (int k = 0; k < 30; k++)
            if (wo_registry_lookup(w[k], &h))
                hits += h.id;
        wo_registry_read_end();
    }
    t0 = now_ns() - t0;
    sink += hits;
    return (double)t0 / (double)nlaunch;
}

static double median(double (*fn)(const uint64_t *, uint64_t), const uint64_t *a, uint64_t n)
{
    double v[RUNS];
    fn(a, n / 4); /* warm-up with the very call timed */
    for (int i = 0; i < RUNS; i++)
        v[i] = fn(a, n);
    qsort(v, RUNS, sizeof(v[0]), cmp_double);
    return v[RUNS / 2];
}

int main(int argc, char **argv)
{
    static const uint32_t counts[] = {10, 1000, 10000, 100000};
    uint64_t nlook = argc > 1 ? strtoull(argv[1], NULL, 10) : 4000000;
    uint64_t *bases = malloc(100000 * sizeof(*bases)), *sizes = malloc(100000 * sizeof(*sizes));
    uint64_t *hit = malloc(NADDR * sizeof(uint64_t)), *gap = malloc(NADDR * sizeof(uint64_t));
    uint64_t *far = malloc(NADDR * sizeof(uint64_t)), *launch = malloc(NADDR * sizeof(uint64_t));

    if (!bases || !sizes || !hit || !gap || !far || !launch || nlook < 1000) {
        fprintf(stderr, "bench-registry: out of memory or lookups < 1000\n");
        return 1;
    }
    wo_registry_init();
    printf("# bench-registry: ns per wo_registry_lookup (median of %d runs of %llu lookups)\n",
           RUNS, (unsigned long long)nlook);
    printf("# sizes: 3/4 of ranges 512 B..64 KiB, 1/4 64 KiB..8 MiB; 0..3 pages gap between\n");
    printf("%8s %10s %10s %10s %18s\n", "ranges", "hit", "miss-gap", "miss-far", "launch(30 words)");
    for (size_t c = 0; c < WO_ARRAY_SIZE(counts); c++) {
        uint32_t n = counts[c];
        uint64_t seed = 0x9e3779b97f4a7c15ull, at = UINT64_C(0x7f3000000000);
        uint32_t ngap = 0;

        wo_registry_reset();
        for (uint32_t i = 0; i < n; i++) {
            uint64_t r = rnd(&seed);
            sizes[i] = (r & 3) ? 512 + (r >> 8) % (64 * 1024) : 64 * 1024 + (r >> 8) % (8 * WO_MiB);
            bases[i] = at;
            at += sizes[i] + ((r >> 40) % 4) * 4096;
            if (wo_registry_add(bases[i], sizes[i], 0, 0, NULL, NULL) < 0) {
                fprintf(stderr, "bench-registry: add failed\n");
                return 1;
            }
        }
        for (uint32_t i = 0; i < NADDR; i++) {
            uint32_t k = (uint32_t)(rnd(&seed) % n);
            hit[i] = bases[k] + rnd(&seed) % sizes[k];
        }
        /* gaps: the first byte after a range that has one */
        for (uint32_t i = 0; i < NADDR; i++) {
            uint32_t k = (uint32_t)(rnd(&seed) % n);
            for (uint32_t j = 0; j < n; j++, k = (k + 1) % n) {
                if (k + 1 == n || bases[k] + sizes[k] != bases[k + 1]) {
                    gap[i] = bases[k] + sizes[k];
                    ngap++;
                    break;
                }
            }
        }
        for (uint32_t i = 0; i < NADDR; i++) {
            uint64_t r = rnd(&seed);
            switch (r % 4) {
            case 0: far[i] = r % 4096; break;                              /* small integers */
            case 1: far[i] = 0x3f80000040000000ull + (r >> 40); break;     /* float pairs */
            case 2: far[i] = UINT64_C(0x560000000000) + (r >> 24); break;  /* a host heap */
            default: far[i] = UINT64_C(0x7ffc00000000) + (r >> 30); break; /* a stack */
            }
        }
        for (uint32_t i = 0; i < NADDR; i++)
            launch[i] = (rnd(&seed) % 30) < 4 ? hit[i] : far[i];
        /* sanity: the tables are what they say */
        {
            struct wo_hit h;
            wo_registry_read_begin();
            for (uint32_t i = 0; i < NADDR; i++) {
                if (!wo_registry_lookup(hit[i], &h) || wo_registry_lookup(far[i], &h) ||
                    (ngap && wo_registry_lookup(gap[i], &h))) {
                    fprintf(stderr, "bench-registry: lookup table inconsistent at %u\n", i);
                    return 1;
                }
            }
            wo_registry_read_end();
        }
        printf("%8u %10.2f %10.2f %10.2f %18.1f\n", n, median(time_lookups, hit, nlook),
               median(time_lookups, gap, nlook), median(time_lookups, far, nlook),
               median(time_launches, launch, nlook / 30));
        fflush(stdout);
    }
    wo_registry_reset();
    free(bases);
    free(sizes);
    free(hit);
    free(gap);
    free(far);
    free(launch);
    return 0;
}
