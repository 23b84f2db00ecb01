/* uvm/picks-watch.c: the copy engine's watchdog: the stall report, and the
 * rescue of the jobs a held copy thread leaves the engine waiting for
 * (uvm/picks-dma.h: wo_dma_guard). */
#include "uvm/picks-dma-int.h"

#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/log.h"
#include "core/settings.h"
#include "uvm/internal.h"
#include "uvm/picks-calls.h"

/* Appends to msg (used bytes so far, truncated at its end). */
static void add(char *msg, size_t cap, size_t *used, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void add(char *msg, size_t cap, size_t *used, const char *fmt, ...)
{
    va_list ap;
    int r;

    if (*used + 1 >= cap)
        return;
    va_start(ap, fmt);
    r = vsnprintf(msg + *used, cap - *used, fmt, ap);
    va_end(ap);
    if (r > 0)
        *used = WO_MIN(*used + (size_t)r, cap - 1);
}

/* " the copy thread has been in cuMemcpyAsync for 5.2 s;" when thread who
 * has been in a driver call longer than lim. */
static void say_doing(char *msg, size_t cap, size_t *used, unsigned who, uint64_t now, uint64_t lim)
{
    const char *call = __atomic_load_n(&wo_dm.doing[who].call, __ATOMIC_ACQUIRE);
    uint64_t since = __atomic_load_n(&wo_dm.doing[who].since, __ATOMIC_RELAXED);

    if (call && since && now > since && now - since > lim)
        add(msg, cap, used, " the %s thread has been in %s for %.1f s;", who ? "mirror" : "copy",
            call, (double)(now - since) / 1e9);
}

/* "the mirror thread", or "a call from cuMemFree_v2" (the exported
 * function nearest the address that raised the gate), or "a free or a wait
 * for the context". */
void wo_dma_gate_raiser(char *who, size_t cap)
{
    void *by = __atomic_load_n(&wo_dm.gate_by, __ATOMIC_RELAXED);
    Dl_info di;

    if (__atomic_load_n(&wo_dm.gate_mirror, __ATOMIC_RELAXED))
        snprintf(who, cap, "the mirror thread (pinning a mirror)");
    else if (by && dladdr(by, &di) && di.dli_sname)
        snprintf(who, cap, "a call from %s", di.dli_sname);
    else
        snprintf(who, cap, "a free or a wait for the context");
}

/* The rescue (under wo_dm.lock, at a watchdog's look): when the copy thread
 * has been in one driver call past the limit while serving a job whose ids
 * came, each stream's queued jobs whose guards are on the engine's stream
 * (wo_dma_guard), from its head while the flag before has landed, are marked
 * with their seqs in their slots' rescue marks (the served job's picked
 * experts, the others' every expert) and the stream's flag is written from
 * the host: the engine's stream goes on, and each guard, a copy kernel right
 * after its wait, copies those rows from the host (the kernels' path) before
 * the launch that reads them. A driver call of the copy thread that waits for the
 * engine's stream (a load or a free of another thread that holds the
 * driver's lock and waits for the context's work, while the engine's
 * stream waits for the copy thread) then ends, and so does the hang: a stall
 * of the limit instead. The copy thread goes on serving the job: its copies
 * land later with the same bytes, in the same buffer, ahead of any later
 * job's copies on the copy stream; its flag write writes the same value. */
static void rescue_look(uint64_t now, uint64_t lim)
{
    const char *call = __atomic_load_n(&wo_dm.doing[0].call, __ATOMIC_ACQUIRE);
    uint64_t since = __atomic_load_n(&wo_dm.doing[0].since, __ATOMIC_RELAXED);
    struct slot *serving = wo_dm.serving;
    uint8_t pick[WO_PICKS_EXPERTS];

    if (!serving || !call || !since || now < since || now - since <= lim || !wo_dm.rescue)
        return;
    /* each stream's queued jobs from its head, in order, while guarded: the
     * job being served by its picks, the others (their ids unread) by every
     * row, a superset of their picks (the buffer is laid out as the tensor) */
    for (unsigned ix = 0; ix < WO_PICKS_STREAMS; ix++) {
        uint32_t upto = 0;

        for (unsigned k = wo_dm.q[ix].head; k != wo_dm.q[ix].tail; k++) {
            struct slot *sl = &wo_dm.s[wo_dm.q[ix].ring[k % SLOTS]];
            uint32_t fl = __atomic_load_n(&wo_dm.flags[ix], __ATOMIC_ACQUIRE);

            if (!sl->guarded || (!upto && !reached(fl, sl->seq - 1)))
                break; /* not yet waited for, or an earlier flag's write has not landed */
            upto = sl->seq;
            if (sl->rescued || reached(fl, sl->seq))
                continue;
            if (sl == serving)
                wo_dma_picked(sl, pick);
            else
                memset(pick, 1, sl->j.c.n_experts);
            uint32_t *m = wo_dm.rescue + (size_t)(sl - wo_dm.s) * WO_PICKS_EXPERTS;
            for (unsigned e = 0; e < sl->j.c.n_experts; e++)
                if (pick[e])
                    __atomic_store_n(&m[e], sl->seq, __ATOMIC_RELAXED);
            sl->rescued = true;
            __atomic_add_fetch(&wo_dm.pending, 1, __ATOMIC_RELEASE);
            if (!wo_dm.f.rescues++)
                wo_warn("picks: the copy thread has been in %s for %.1f s while the engine's "
                        "stream %u waits for job %u: the rows of it and of the jobs queued behind "
                        "are copied by the kernels on the engine's streams (a rescue: a stall, "
                        "not a hang; counted in stats picks.engine.rescues)",
                        call, (double)(now - since) / 1e9, ix, sl->seq);
        }
        /* the marks before the flag: a guard reads them once its wait passed */
        if (upto && !reached(__atomic_load_n(&wo_dm.flags[ix], __ATOMIC_ACQUIRE), upto))
            __atomic_store_n(&wo_dm.flags[ix], upto, __ATOMIC_RELEASE);
    }
}

/* A copy engine that stops moving hangs the engine's stream, which waits on
 * the device for the copy thread's flag: when a driver call of the shim's
 * threads, or the oldest queued copy, or the gate has lasted longer than
 * WOFFLOAD_PICKS_STALL_MS, say once what each was doing (the driver call
 * that holds the others off is the one to look at), and count it. */
void *wo_dma_watchdog(void *arg)
{
    uint64_t lim = (uint64_t)wo_settings()->picks_stall_ms * 1000000ull;

    (void)arg;
    (void)wo_dm.d->cuCtxSetCurrent(wo_dm.ctx); /* its queries of the copy stream */
    pthread_mutex_lock(&wo_dm.lock);
    /* it runs until the copy engine stops, also once it has spoken: a
     * thread that ended early would be left unjoined at exit */
    while (!wo_dm.stop) {
        struct timespec ts;
        uint64_t now, oldest = 0, gate;
        char msg[sizeof(wo_dm.f.stall_report)];
        unsigned calls_ix = WO_PICKS_STREAMS; /* whose calls since a job it says */
        size_t used = 0;

        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100000000l; /* ten looks a second */
        if (ts.tv_nsec >= 1000000000l) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000l;
        }
        (void)pthread_cond_timedwait(&wo_dm.wcv, &wo_dm.lock, &ts);
        if (wo_dm.stop)
            break;
        now = now_ns();
        if (wo_dm.f.stalls) { /* said once; rescued at every stall */
            rescue_look(now, lim);
            continue;
        }
        for (unsigned k = 0; k < SLOTS; k++) {
            struct slot *sl = &wo_dm.s[k];

            if (sl->state != S_QUEUED) {
                sl->seen = 0;
                continue;
            }
            if (!sl->seen || sl->seen_ix != sl->ix || sl->seen_seq != sl->seq) {
                sl->seen = now;
                sl->seen_ix = sl->ix;
                sl->seen_seq = sl->seq;
            }
            if (!oldest || sl->seen < oldest)
                oldest = sl->seen;
        }
        gate = __atomic_load_n(&wo_dm.gate_since, __ATOMIC_RELAXED);
        say_doing(msg, sizeof(msg), &used, 0, now, lim);
        say_doing(msg, sizeof(msg), &used, 1, now, lim);
        if (oldest && now > oldest && now - oldest > lim)
            add(msg, sizeof(msg), &used, " %u %s queued, the oldest for %.1f s;", wo_dm.queued,
                wo_dm.queued == 1 ? "copy" : "copies", (double)(now - oldest) / 1e9);
        /* every job served, yet a flag behind (a hang the queue does not show) */
        for (unsigned ix = 0; ix < WO_PICKS_STREAMS; ix++) {
            uint32_t fl = __atomic_load_n(&wo_dm.flags[ix], __ATOMIC_ACQUIRE);
            if (!wo_dm.served_at[ix] || now - wo_dm.served_at[ix] <= lim ||
                reached(fl, wo_dm.served[ix]))
                continue;
            add(msg, sizeof(msg), &used,
                " stream %u: its flag at %u, %.1f s after job %u was served;", ix, fl,
                (double)(now - wo_dm.served_at[ix]) / 1e9, wo_dm.served[ix]);
            calls_ix = ix;
        }
        if (gate && now > gate && now - gate > lim) {
            char who[96];
            wo_dma_gate_raiser(who, sizeof(who));
            add(msg, sizeof(msg), &used, " %s has held the gate for %.1f s;", who,
                (double)(now - gate) / 1e9);
        }
        if (!used)
            continue;
        /* where each stream with a queued copy stands: its oldest job, the
         * flag its stream waits on, the last job served. A flag behind the
         * job before the oldest means an earlier copy has not landed; at it,
         * the engine's stream has not reached the oldest job's ids */
        CUevent head_ev = NULL;
        for (unsigned ix = 0, said = 0; ix < WO_PICKS_STREAMS && said < 3; ix++)
            if (wo_dm.q[ix].head != wo_dm.q[ix].tail) {
                const struct slot *h = &wo_dm.s[wo_dm.q[ix].ring[wo_dm.q[ix].head % SLOTS]];
                add(msg, sizeof(msg), &used,
                    " stream %u: oldest queued job %u, its flag at %u, served up to %u", ix, h->seq,
                    __atomic_load_n(&wo_dm.flags[ix], __ATOMIC_ACQUIRE), wo_dm.served[ix]);
                if (wo_dm.served_at[ix] && now > wo_dm.served_at[ix])
                    add(msg, sizeof(msg), &used, " %.1f s ago",
                        (double)(now - wo_dm.served_at[ix]) / 1e9);
                add(msg, sizeof(msg), &used, ";");
                if (!said) {
                    head_ev = h->ev;
                    calls_ix = ix;
                }
                said++;
            }
        /* what may hold the copy thread off: a strict capture */
        add(msg, sizeof(msg), &used, " %d captures under way (%d of them global or thread-local);",
            __atomic_load_n(&wo_captures_live, __ATOMIC_SEQ_CST),
            __atomic_load_n(&wo_captures_strict, __ATOMIC_SEQ_CST));
        wo_dm.f.stalls++;
        /* whether the copy stream still holds work and the oldest job's ids
         * have come (a flag behind a served job with the copy stream busy:
         * the copy engine itself is held; idle: the flag's write went
         * astray), asked outside the lock (a query may wait on the driver)
         * and never during a strict capture (it would break it) */
        if (wo_dma_driver_enter()) {
            CUstream copy = wo_dm.copy;
            pthread_mutex_unlock(&wo_dm.lock);
            CUresult qs = copy && wo_dm.d->cuStreamQuery ? wo_dm.d->cuStreamQuery(copy)
                                                         : CUDA_ERROR_NOT_SUPPORTED;
            CUresult qe = head_ev ? wo_dm.d->cuEventQuery(head_ev) : CUDA_ERROR_NOT_SUPPORTED;
            wo_dma_driver_leave();
            pthread_mutex_lock(&wo_dm.lock);
            add(msg, sizeof(msg), &used, " the copy stream %s;",
                qs == CUDA_SUCCESS           ? "is idle"
                : qs == CUDA_ERROR_NOT_READY ? "has work"
                                             : "?");
            if (head_ev)
                add(msg, sizeof(msg), &used, " the oldest job's ids %s;",
                    qe == CUDA_SUCCESS           ? "have come"
                    : qe == CUDA_ERROR_NOT_READY ? "have not come"
                                                 : "?");
        }
        wo_calls_say(calls_ix, msg, sizeof(msg), &used);
        msg[used - 1] = '\0'; /* the last ';' */
        /* kept for the stats (a test reads the clauses there) */
        snprintf(wo_dm.f.stall_report, sizeof(wo_dm.f.stall_report), "%s", msg + (msg[0] == ' '));
        wo_warn("picks: the copy engine looks stuck:%s. If the process hangs, run with "
                "WOFFLOAD_PICKS_ENGINE=0",
                msg);
        rescue_look(now_ns(), lim);
    }
    pthread_mutex_unlock(&wo_dm.lock);
    return NULL;
}
