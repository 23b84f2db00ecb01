/* tools/replay-link.c: the replay's PCIe link (see replay-int.h): a
 * calendar of busy intervals that kernels' in-place reads and the copy
 * engine's transfers book, and the host work it slows. */
#include "tools/replay-int.h"

#include <math.h>
#include <string.h>

/* ---- the PCIe link: a calendar of busy intervals ------------------------ */

/* Keeps [a, b) of traffic of one kind for wo_replay_link_slowdown(), in start order
 * (pieces of the disjoint calendar: disjoint too), forgetting pieces that
 * ended before the host clock. */
static void traffic(struct sim *s, double a, double b, int dma)
{
    size_t i, j = 0;

    if (s->dm->host_zc_slow <= 1 && s->dm->host_dma_slow <= 1)
        return;
    while (j < s->ntp && s->tp[j].b < s->cpu_t)
        j++;
    if (j) {
        memmove(s->tp, s->tp + j, (s->ntp - j) * sizeof(*s->tp));
        s->ntp -= j;
    }
    if (wo_grow((void **)&s->tp, &s->captp, s->ntp + 1, sizeof(*s->tp)) < 0) {
        s->err = -ENOMEM;
        return;
    }
    for (i = s->ntp; i > 0 && s->tp[i - 1].a > a; i--)
        ;
    memmove(s->tp + i + 1, s->tp + i, (s->ntp - i) * sizeof(*s->tp));
    s->tp[i] = (struct traffic){a, b, dma};
    s->ntp++;
}

/* Uses the link for d seconds from t on, in the idle gaps between earlier
 * bookings (a prefetch booked for later does not block a kernel's read
 * now: the link shares its time); returns when the last byte crossed. */
double wo_replay_link_use(struct sim *s, double t, double d, int dma)
{
    size_t i = 0, j = 0;

    /* forget intervals no later request can touch (requests start at or
     * after the host clock) */
    while (j < s->nlk && s->lk[j].b < s->cpu_t)
        j++;
    if (j) {
        memmove(s->lk, s->lk + j, (s->nlk - j) * sizeof(*s->lk));
        s->nlk -= j;
    }
    while (d > 0) {
        double gap;

        while (i < s->nlk && s->lk[i].b <= t)
            i++;
        if (i < s->nlk && s->lk[i].a <= t) {
            t = s->lk[i].b;
            continue;
        }
        gap = i < s->nlk ? s->lk[i].a - t : INFINITY;
        if (gap > d)
            gap = d;
        traffic(s, t, t + gap, dma);
        /* book [t, t + gap): extend the previous interval or insert */
        if (i > 0 && s->lk[i - 1].b >= t) {
            s->lk[i - 1].b = t + gap;
        } else {
            if (wo_grow((void **)&s->lk, &s->caplk, s->nlk + 1, sizeof(*s->lk)) < 0) {
                s->err = -ENOMEM;
                return t + d;
            }
            memmove(s->lk + i + 1, s->lk + i, (s->nlk - i) * sizeof(*s->lk));
            s->lk[i] = (struct busy){t, t + gap};
            s->nlk++;
            i++;
        }
        if (i < s->nlk && s->lk[i - 1].b >= s->lk[i].a) { /* touches the next one: merge */
            s->lk[i - 1].b = s->lk[i].b;
            memmove(s->lk + i, s->lk + i + 1, (s->nlk - i - 1) * sizeof(*s->lk));
            s->nlk--;
        }
        t += gap;
        d -= gap;
    }
    return t;
}

/* How long `gap` seconds of the host's own work from the host clock on take
 * while the link carries the GPU's in-place reads or a copy engine's
 * transfer (bench/pcie-interference.py: the launch path shares PCIe with
 * them): one walk over the traffic pieces in time order, the work advancing
 * at 1/factor inside a piece and at full speed between pieces, so the
 * stretched part meets the later pieces too. */
double wo_replay_link_slowdown(const struct sim *s, double gap)
{
    double fz = s->dm->host_zc_slow, fd = s->dm->host_dma_slow, t = s->cpu_t, left = gap, took = 0;

    if (fz <= 1 && fd <= 1)
        return gap;
    for (size_t i = 0; i < s->ntp && left > 0; i++) {
        const struct traffic *b = &s->tp[i];
        double f = b->dma ? fd : fz, idle, busy;

        if (b->b <= t)
            continue;
        idle = WO_MAX(b->a - t, 0.0);
        if (idle >= left)
            break;
        left -= idle;
        took += idle;
        t = WO_MAX(t, b->a);
        /* inside the booking the work advances at 1/f */
        busy = WO_MIN(b->b - t, left * f);
        took += busy;
        left -= busy / f;
        t += busy;
    }
    return took + left;
}
