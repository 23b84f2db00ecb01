/* bench/bench-trace.c: what recording a trace costs.
 *
 * The hook side of a launch is one ring push whether or not a trace is
 * recorded; the trace writer runs on the consumer thread. So three figures:
 *   push      ns per wo_ring_push of a launch event (2 hits), no consumer
 *   writer    ns per event and events/s for wo_trace_event on the consumer
 *             side, to a file (and to /dev/null: the encode+CRC cost alone)
 *   pipeline  a producer pushing launches while a consumer pops and records
 *             them: ns per launch on the producer, events recorded per
 *             second, events dropped by a full ring; once flat out (more
 *             launches than any engine issues) and once paced at one launch
 *             every 2 us (a fast engine thread: cuLaunchKernel alone costs
 *             a few us)
 * Each is the median of 5 runs after a warm-up run. The machine this runs
 * on in CI is shared: wall-clock figures include time other processes took
 * the CPU, so the single-thread figures are also given in thread CPU time.
 *
 *   bench-trace [--events N] [--dir DIR]   (default 2000000 events, /tmp) */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/event.h"
#include "core/trace.h"

#define RUNS 5

static uint64_t nevents = 2000000;
static const char *dir = "/tmp";

static struct wo_event launch_event(uint64_t i)
{
    struct wo_event ev;

    memset(&ev, 0, sizeof(ev));
    ev.type = WO_EV_LAUNCH;
    ev.t_ns = 1000000000 + i * 4000;
    ev.stream = 0x5555aaaa0010;
    ev.tid = 4242;
    ev.api = 9;
    ev.l.func = 0x7f3a00000000 + (i % 37) * 0x1000;
    ev.l.grid[0] = 132;
    ev.l.grid[1] = ev.l.grid[2] = 1;
    ev.l.block[0] = 256;
    ev.l.block[1] = ev.l.block[2] = 1;
    ev.nhits = 2;
    ev.l.hits[0] = (struct wo_ev_hit){(uint32_t)(i % 200), 1, (i % 8) * (4u << 20), (i % 8) * (4u << 20) + 1};
    ev.l.hits[1] = (struct wo_ev_hit){201, 1, 0, 1};
    return ev;
}

static uint64_t cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v)
{
    qsort(v, RUNS, sizeof(*v), cmp_double);
    return v[RUNS / 2];
}

/* ns per push into a ring big enough never to fill (*cpu: thread CPU time). */
static double bench_push(double *cpu)
{
    uint32_t cap = 1;
    struct wo_ring *r;
    struct wo_event ev = launch_event(1), out;
    uint64_t n = nevents, t0, t1, c0, c1;

    while (cap < n)
        cap <<= 1;
    r = wo_ring_new(cap);
    if (!r) {
        fprintf(stderr, "bench-trace: no memory for a ring of %u events\n", cap);
        exit(1);
    }
    c0 = cpu_ns();
    t0 = wo_now_ns();
    for (uint64_t i = 0; i < n; i++) {
        ev.t_ns = i; /* as the hook stamps each event */
        wo_ring_push(r, &ev);
    }
    t1 = wo_now_ns();
    c1 = cpu_ns();
    *cpu = (double)(c1 - c0) / (double)n;
    while (wo_ring_pop(r, &out))
        ;
    wo_ring_free(r);
    return (double)(t1 - t0) / (double)n;
}

/* ns per wo_now_ns() call: every hook stamps its event with one. */
static double bench_clock(void)
{
    uint64_t t0 = wo_now_ns(), sink = 0;
    for (uint64_t i = 0; i < nevents; i++)
        sink += wo_now_ns();
    return (double)(wo_now_ns() - t0 - (sink & 1)) / (double)nevents;
}

/* ns per recorded event, writer only. */
static double bench_writer(const char *path, double *mbps, double *cpu)
{
    struct wo_trace *t;
    uint64_t t0, t1, c0, c1;
    FILE *f;
    long sz = 0;

    if (wo_trace_open(path, &t) < 0)
        exit(1);
    c0 = cpu_ns();
    t0 = wo_now_ns();
    for (uint64_t i = 0; i < nevents; i++) {
        struct wo_event ev = launch_event(i);
        wo_trace_event_ids(t, &ev, WO_TRACE_NO_ID, 0);
    }
    if (wo_trace_close(t, 0) < 0)
        exit(1);
    t1 = wo_now_ns();
    c1 = cpu_ns();
    *cpu = (double)(c1 - c0) / (double)nevents;
    f = fopen(path, "rb");
    if (f && fseek(f, 0, SEEK_END) == 0)
        sz = ftell(f);
    if (f)
        fclose(f);
    *mbps = sz > 0 ? (double)sz / ((double)(t1 - t0) / 1e9) / 1e6 : 0;
    return (double)(t1 - t0) / (double)nevents;
}

struct pipe_state {
    struct wo_ring *ring;
    struct wo_trace *trace;
    atomic_int done;
    uint64_t recorded;
};

static void *consumer(void *arg)
{
    struct pipe_state *s = arg;
    struct wo_event ev;

    for (;;) {
        int got = wo_ring_pop(s->ring, &ev);
        if (got) {
            wo_trace_event_ids(s->trace, &ev, WO_TRACE_NO_ID, 0);
            s->recorded++;
        } else if (atomic_load(&s->done)) {
            if (!wo_ring_pop(s->ring, &ev))
                break;
            wo_trace_event_ids(s->trace, &ev, WO_TRACE_NO_ID, 0);
            s->recorded++;
        } else {
            sched_yield();
        }
    }
    return NULL;
}

/* pace_ns 0: flat out. Returns the producer's ns per launch spent in the
 * hook's part (stamp + push), pacing excluded. */
static double bench_pipeline(const char *path, uint64_t pace_ns, double *rec_per_s,
                             double *dropped_pct)
{
    struct pipe_state s = {0};
    pthread_t th;
    uint64_t t0, t1, t2, spent = 0;

    s.ring = wo_ring_new(16384); /* WOFFLOAD_RING_EVENTS' default */
    if (!s.ring || wo_trace_open(path, &s.trace) < 0)
        exit(1);
    pthread_create(&th, NULL, consumer, &s);
    t0 = wo_now_ns();
    for (uint64_t i = 0; i < nevents; i++) {
        struct wo_event ev = launch_event(i);
        uint64_t a = wo_now_ns(), b;
        ev.t_ns = a; /* the hook stamps its event: part of its cost */
        wo_ring_push(s.ring, &ev);
        b = wo_now_ns();
        spent += b - a;
        if (pace_ns)
            while (wo_now_ns() < a + pace_ns)
                ;
    }
    t1 = wo_now_ns();
    atomic_store(&s.done, 1);
    pthread_join(th, NULL);
    t2 = wo_now_ns();
    *dropped_pct = 100.0 * (double)wo_ring_dropped(s.ring) / (double)nevents;
    *rec_per_s = (double)s.recorded / ((double)(t2 - t0) / 1e9);
    wo_trace_close(s.trace, wo_ring_dropped(s.ring));
    wo_ring_free(s.ring);
    (void)t1;
    return (double)spent / (double)nevents;
}

int main(int argc, char **argv)
{
    double push[RUNS], pushc[RUNS], wfile[RUNS], wfilec[RUNS], wnull[RUNS], wnullc[RUNS], mb[RUNS],
        mbn[RUNS], pp[RUNS], prate[RUNS], pdrop[RUNS], qp[RUNS], qrate[RUNS], qdrop[RUNS], clk[RUNS], x;
    char path[4096], cpu[256] = "?";
    FILE *f;

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--events") == 0 && i + 1 < argc)
            nevents = strtoull(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--dir") == 0 && i + 1 < argc)
            dir = argv[++i];
        else {
            fprintf(stderr, "usage: bench-trace [--events N] [--dir DIR]\n");
            return 1;
        }
    }
    if (nevents < 1000)
        nevents = 1000;
    snprintf(path, sizeof(path), "%s/bench-trace-%d.wotrace", dir, (int)getpid());
    f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[512];
        while (fgets(line, sizeof(line), f))
            if (strncmp(line, "model name", 10) == 0) {
                char *c = strchr(line, ':');
                snprintf(cpu, sizeof(cpu), "%.200s", c ? c + 2 : line);
                cpu[strcspn(cpu, "\n")] = '\0';
                break;
            }
        fclose(f);
    }

    /* warm-up: page in the ring and the writer's buffer, settle the clock */
    bench_push(&x);
    bench_writer(path, &mb[0], &x);
    for (int r = 0; r < RUNS; r++) {
        clk[r] = bench_clock();
        push[r] = bench_push(&pushc[r]);
        wfile[r] = bench_writer(path, &mb[r], &wfilec[r]);
        wnull[r] = bench_writer("/dev/null", &mbn[r], &wnullc[r]);
        pp[r] = bench_pipeline(path, 0, &prate[r], &pdrop[r]);
        qp[r] = bench_pipeline(path, 2000, &qrate[r], &qdrop[r]);
    }
    unlink(path);

    printf("bench-trace: %llu launch events (2 hits, 124 bytes on disk each), median of %d runs\n",
           (unsigned long long)nevents, RUNS);
    printf("cpu: %s, %ld online\n", cpu, sysconf(_SC_NPROCESSORS_ONLN));
    printf("%-46s %8s %8s %12s\n", "", "wall ns", "cpu ns", "events/s");
    printf("%-46s %8.1f\n", "hook side: the timestamp (wo_now_ns)", median(clk));
    printf("%-46s %8.1f %8.1f\n", "hook side: ring push (no consumer)", median(push), median(pushc));
    printf("%-46s %8.1f %8.1f %10.2f M  %.0f MB/s\n", "consumer side: trace writer, file in --dir",
           median(wfile), median(wfilec), 1e3 / median(wfilec), median(mb));
    printf("%-46s %8.1f %8.1f %10.2f M\n", "consumer side: trace writer, /dev/null", median(wnull),
           median(wnullc), 1e3 / median(wnullc));
    printf("%-46s %8.1f %8s %10.2f M  %.2f%% dropped\n", "pipeline flat out: stamp + push (+1 clock)",
           median(pp), "", median(prate) / 1e6, median(pdrop));
    printf("%-46s %8.1f %8s %10.2f M  %.2f%% dropped\n", "pipeline, a launch every 2 us: same",
           median(qp), "", median(qrate) / 1e6, median(qdrop));
    printf("target: <= 1000 ns per launch on the hook side\n");
    return 0;
}
