/* tools/replay-bound.c: the offline-optimal bound (a Lagrangian lower
 * bound on any schedule within the budget) and the clairvoyant static
 * schedule, over the unit accesses a pass recorded (docs/replay.md). */
#include "tools/replay-int.h"

#include <math.h>
#include <string.h>

struct bunit {
    double s, ld, ev;
};

/* ---- the offline-optimal bound ------------------------------------------ */

static int acc_cmp(const void *a, const void *b)
{
    const struct bacc *x = a, *y = b;

    if (x->unit != y->unit)
        return x->unit < y->unit ? -1 : 1;
    return x->k < y->k ? -1 : x->k > y->k;
}

/* The Lagrangian lower bound for weights (al, mu, nu) of the compute,
 * UVM and link constraints and lambda, the price of one resident byte at
 * one launch: min over every schedule of the weighted resource use, less
 * lambda * budget * launches. Each unit's part is a shortest path over its
 * accesses (resident or streamed at each). docs/replay.md derives it. */
static double bound_eval(const struct sim *s, const struct bunit *bu, double budget, double N,
                         double al, double mu, double nu, double la)
{
    double total = al * s->fixed_cp + nu * s->fixed_link - la * budget * N;
    size_t i = 0;

    while (i < s->nacc) {
        uint32_t u = s->acc[i].unit;
        const struct bunit *x = &bu[u];
        double load = mu * x->ld + nu * x->ld, evict = mu * x->ev;
        double R, S, occ1 = la * x->s;
        uint32_t k = s->acc[i].k;

        R = al * s->acc[i].gR + occ1 + WO_MIN(occ1 * k, load);
        S = al * s->acc[i].gS + nu * s->acc[i].lS;
        for (i++; i < s->nacc && s->acc[i].unit == u; i++) {
            double g = (double)(s->acc[i].k - k), cr, cs, nR, nS;

            k = s->acc[i].k;
            cr = al * s->acc[i].gR + occ1;
            cs = al * s->acc[i].gS + nu * s->acc[i].lS;
            nR = cr + WO_MIN(R + WO_MIN(occ1 * (g - 1), evict + load), S + load);
            nS = cs + WO_MIN(S, R + evict);
            R = nR;
            S = nS;
        }
        total += WO_MIN(R + WO_MIN(occ1 * (N - 1 - k), evict), S);
    }
    return total;
}

static double golden_lambda(const struct sim *s, const struct bunit *bu, double budget, double N,
                            double al, double mu, double nu, double hi)
{
    const double gr = 0.6180339887498949;
    double a = 0, b = hi, c = b - gr * (b - a), d = a + gr * (b - a);
    double fc = bound_eval(s, bu, budget, N, al, mu, nu, c);
    double fd = bound_eval(s, bu, budget, N, al, mu, nu, d);
    double best = WO_MAX(bound_eval(s, bu, budget, N, al, mu, nu, 0), WO_MAX(fc, fd));

    for (int it = 0; it < 36; it++) {
        if (fc > fd) {
            b = d;
            d = c;
            fd = fc;
            c = b - gr * (b - a);
            fc = bound_eval(s, bu, budget, N, al, mu, nu, c);
        } else {
            a = c;
            c = d;
            fc = fd;
            d = a + gr * (b - a);
            fd = bound_eval(s, bu, budget, N, al, mu, nu, d);
        }
        best = WO_MAX(best, WO_MAX(fc, fd));
    }
    return best;
}

double wo_replay_bound(struct sim *s, uint64_t budget)
{
    struct bunit *bu;
    double N = (double)s->w_k, best = 0, bm = 0, bn = 0, pf_best, lhi;

    if (s->w_k == 0)
        return 0;
    bu = calloc(s->nunits ? s->nunits : 1, sizeof(*bu));
    if (!bu)
        return 0;
    pf_best = 0;
    for (int i = 0; i < 4; i++)
        pf_best = WO_MAX(pf_best, s->dm->pf_gbs[i]);
    pf_best = WO_MAX(pf_best, s->dm->rm_pf_gbs) * 1e9;
    for (size_t i = 0; i < s->d->nranges; i++) {
        const struct rr *r = &s->r[i];

        if (!r->ready)
            continue;
        for (uint64_t u = 0; u * r->usize < r->tr->size; u++) {
            struct bunit *x = &bu[r->ubase + u];

            x->s = (double)WO_MIN(r->usize, r->tr->size - u * r->usize);
            /* the cheapest the model allows: best bandwidth, no call cost */
            x->ld = x->s / pf_best;
            x->ev = r->written ? x->s / (s->dm->copyback_gbs * 1e9)
                               : WO_MIN(x->s / (s->dm->collapse_gbs * 1e9),
                                        x->s / (s->dm->copyback_gbs * 1e9));
        }
    }
    if (s->nacc) /* none: nothing managed was read (every read picked, or in place) */
        qsort(s->acc, s->nacc, sizeof(*s->acc), acc_cmp);
    lhi = 2 * WO_MAX(s->zc_s, 1.0 / pf_best);
    /* coarse grid over the weights, then a finer one around the best */
    for (int pass = 0; pass < 2; pass++) {
        double step = pass ? 0.02 : 0.1, m0 = pass ? bm - 0.1 : 0, n0 = pass ? bn - 0.1 : 0;
        int nstep = pass ? 10 : 10;

        for (int i = 0; i <= nstep; i++) {
            for (int j = 0; j <= nstep; j++) {
                double mu = m0 + i * step, nu = n0 + j * step, v;

                if (mu < -1e-9 || nu < -1e-9 || mu + nu > 1 + 1e-9)
                    continue;
                mu = WO_MAX(mu, 0.0);
                nu = WO_MAX(nu, 0.0);
                v = golden_lambda(s, bu, (double)budget, N, WO_MAX(1 - mu - nu, 0.0), mu, nu, lhi);
                if (v > best) {
                    best = v;
                    bm = mu;
                    bn = nu;
                }
            }
        }
    }
    free(bu);
    return best;
}

struct ocand {
    double density;
    uint32_t unit;
};

static int ocand_cmp(const void *a, const void *b)
{
    const struct ocand *x = a, *y = b;

    if (x->density != y->density)
        return x->density > y->density ? -1 : 1;
    return x->unit < y->unit ? -1 : x->unit > y->unit;
}

/* The clairvoyant static schedule: the units whose residency saves the most
 * GPU time per byte over the measured window (it knows every access), as
 * many as the budget holds, resident from the start. */
uint8_t *wo_replay_oracle_set(const struct sim *s, uint64_t budget)
{
    double *save = calloc(s->nunits ? s->nunits : 1, sizeof(*save));
    struct ocand *c = calloc(s->nunits ? s->nunits : 1, sizeof(*c));
    uint8_t *set = calloc(s->nunits ? s->nunits : 1, 1);
    double used = 0;

    if (!save || !c || !set) {
        free(save);
        free(c);
        free(set);
        return NULL;
    }
    for (size_t i = 0; i < s->nacc; i++)
        save[s->acc[i].unit] += s->acc[i].gS - s->acc[i].gR + s->acc[i].lS;
    for (size_t i = 0; i < s->d->nranges; i++) {
        const struct rr *r = &s->r[i];

        if (!r->ready)
            continue;
        for (uint64_t u = 0; u * r->usize < r->tr->size; u++) {
            double sz = (double)WO_MIN(r->usize, r->tr->size - u * r->usize);

            c[r->ubase + u] = (struct ocand){save[r->ubase + u] / sz, (uint32_t)(r->ubase + u)};
            save[r->ubase + u] = sz; /* reused: the unit's size */
        }
    }
    qsort(c, s->nunits, sizeof(*c), ocand_cmp);
    for (uint32_t i = 0; i < s->nunits; i++) {
        if (c[i].density <= 0 || used + save[c[i].unit] > (double)budget)
            continue;
        used += save[c[i].unit];
        set[c[i].unit] = 1;
    }
    free(save);
    free(c);
    return set;
}
