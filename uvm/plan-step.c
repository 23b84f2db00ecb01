/* uvm/plan-step.c: where a step ends, found from launch keys alone (plan.h
 * documents the rules: an exact period of the keys, or a key that recurs at
 * regular gaps). Its own idea because it needs nothing of the planner: the
 * planner feeds it one key a launch, and the streaming executor runs one
 * of its own on its keys, the ranges in the order launches reach them
 * (wo_stream_keys, below; plan.h says why other keys). */
#include <string.h>

#include "uvm/plan.h"

void wo_stepper_init(struct wo_stepper *s)
{
    memset(s, 0, sizeof(*s));
}

void wo_stepper_done(struct wo_stepper *s)
{
    free(s->gaps);
    free(s->keys);
    free(s->cand);
    free(s->since);
    memset(s, 0, sizeof(*s));
}

uint64_t wo_stepper_key(uint64_t func, uint32_t id)
{
    /* splitmix64 finaliser: keys only need to differ, not to be secret */
    uint64_t x = func ^ ((uint64_t)id << 32 | id);

    x ^= x >> 30;
    x *= UINT64_C(0xbf58476d1ce4e5b9);
    x ^= x >> 27;
    x *= UINT64_C(0x94d049bb133111eb);
    return x ^ (x >> 31);
}

/* The regular-gap rule (plan.h): 1 when key just became the anchor. */
static int stepper_gap(struct wo_stepper *s, uint64_t key)
{
    struct wo_stepgap *e = NULL;
    uint64_t g;

    if (!s->gaps && !(s->gaps = calloc(WO_STEPPER_GAPS, sizeof(*s->gaps))))
        return 0;
    for (uint32_t k = 0; k < 8; k++) {
        struct wo_stepgap *c = &s->gaps[(key + k) & (WO_STEPPER_GAPS - 1)];
        if (c->last && c->key == key) {
            e = c;
            break;
        }
        if (!c->last) {
            c->key = key;
            c->last = c->start = s->pos;
            return 0;
        }
    }
    if (!e)
        return 0; /* table crowded around this key: it cannot be the anchor */
    if (s->pos - e->last < WO_STEPPER_GAP_MIN) {
        e->last = s->pos; /* a repeat inside a cluster */
        return 0;
    }
    g = s->pos - e->start;
    e->last = e->start = s->pos;
    if (e->gap && g >= WO_STEPPER_GAP_MIN && g * 10 >= (uint64_t)e->gap * 9 &&
        g * 10 <= (uint64_t)e->gap * 11)
        e->runs++;
    else
        e->runs = 0;
    e->gap = (uint32_t)WO_MIN(g, (uint64_t)UINT32_MAX);
    return e->runs >= WO_STEPPER_GAP_RUNS;
}

/* Whether a candidate period is matching now (its run has lasted a while,
 * and the anchor came in it): then the anchor's absence is a long step,
 * not a phase that ended. A run without the anchor is another phase that
 * happens to share a period with this one: it must not hold off the
 * patience rule. */
static bool running(const struct wo_stepper *s)
{
    for (size_t c = 0; c < s->ncand; c++)
        if (s->n - s->since[c] >= WO_STEPPER_GAP_MIN && s->last_anchor >= s->since[c])
            return true;
    return false;
}

/* Period P, proposed at key i: a new candidate whose run starts there.
 * When the table is full, the candidate broken most recently gives way. */
static void add_candidate(struct wo_stepper *s, size_t P, size_t i)
{
    size_t c, worst = 0;

    bool any = false;

    for (c = 0; c < s->ncand; c++) {
        if (s->cand[c] == P)
            return;
        /* one proposed at this key has the latest start and has not been
         * tried: never the one to give way */
        if (s->since[c] < i && (!any || s->since[c] > s->since[worst])) {
            worst = c;
            any = true;
        }
    }
    if (s->ncand < WO_STEPPER_CANDS) {
        if (wo_grow((void **)&s->cand, &s->capcand, s->ncand + 1, sizeof(*s->cand)) < 0 ||
            wo_grow((void **)&s->since, &s->capsince, s->ncand + 1, sizeof(*s->since)) < 0)
            return;
        c = s->ncand++;
    } else if (any) {
        c = worst;
    } else {
        return;
    }
    s->cand[c] = P;
    s->since[c] = i;
}

unsigned wo_stepper_feed(struct wo_stepper *s, uint64_t key)
{
    size_t i;

    s->pos++;
    if (!s->per_step && stepper_gap(s, key)) {
        /* this occurrence of the anchor is the first boundary; like the
         * exact rule's, it closes two steps (the anchor has recurred at
         * regular gaps at least three times before it) */
        s->anchor = key;
        s->clusters = true;
        s->anchor_last = s->last_boundary = s->pos;
        s->per_step = 1;
        s->seen = 0;
        s->steps = 1;
        free(s->keys);
        s->keys = NULL;
        s->n = s->cap = 0;
        s->ncand = 0;
        free(s->gaps);
        s->gaps = NULL;
        return 2;
    }
    if (s->per_step && key != s->anchor &&
        s->pos - s->anchor_last > WO_MAX((uint64_t)WO_STEPPER_PATIENCE, 4 * s->step_keys)) {
        /* The anchor belonged to a phase that is over (a prefill's
         * per-expert loop, whose kernels the decode never launches): find
         * the steps again from here. */
        s->per_step = 0;
        s->clusters = false;
        s->seen = 0;
        s->steps = 0;
        s->n = 0;
        s->ncand = 0;
        s->step_keys = 0;
    }
    if (s->per_step) {
        if (key != s->anchor)
            return 0;
        if (!s->clusters)
            s->anchor_last = s->pos;
        if (s->clusters) {
            /* one cluster of the anchor per step: its first occurrence */
            bool inner = s->pos - s->anchor_last < WO_STEPPER_GAP_MIN;

            s->anchor_last = s->pos;
            if (inner)
                return 0;
        }
        if (++s->seen < s->per_step)
            return 0;
        s->seen = 0;
        s->steps++;
        s->step_keys = s->pos - s->last_boundary;
        s->last_boundary = s->pos;
        return s->steps == 1 ? 2 : 1;
    }
    if (s->n >= WO_STEPPER_MAX) {
        s->n = 0; /* no period: start over, this key is the new anchor */
        s->ncand = 0;
    }
    if (s->n && !running(s) &&
        s->n - s->last_anchor >= WO_MAX(s->patience, (size_t)WO_STEPPER_PATIENCE)) {
        /* the anchor has not come back for a long while and nothing is
         * matching: it belonged to a phase that is over (a prefill before
         * the decode steps). Start over from this key, with more patience
         * next time in case steps are simply long. */
        s->patience =
            WO_MIN(WO_MAX(s->patience, (size_t)WO_STEPPER_PATIENCE) * 2, (size_t)WO_STEPPER_MAX);
        s->n = 0;
        s->ncand = 0;
    }
    if (wo_grow((void **)&s->keys, &s->cap, s->n + 1, sizeof(*s->keys)) < 0)
        return 0; /* learns nothing from this key; later keys try again */
    i = s->n;
    s->keys[s->n++] = key;
    if (i == 0) {
        s->anchor = key;
        s->last_anchor = 0;
        s->prev[0] = 0;
        s->nprev = 1;
        return 0;
    }
    /* key i against key i - P: a mismatch starts the candidate's run again */
    for (size_t c = 0; c < s->ncand; c++)
        if (s->keys[i - s->cand[c]] != key)
            s->since[c] = i + 1;
    if (key == s->anchor) {
        for (unsigned a = 0; a < WO_MIN(s->nprev, WO_STEPPER_PREV); a++)
            add_candidate(s, i - s->prev[a], i);
        s->prev[s->nprev++ % WO_STEPPER_PREV] = i;
        s->last_anchor = i;
    }
    /* the shortest candidate that matched long enough wins (the table is
     * not in order of period: a candidate that gave way left its place) */
    for (;;) {
        size_t P, c, best = SIZE_MAX;

        /* a repeat inside a step (top-k experts of one layer launch the
         * same keys k times) matches a short second period too: a period
         * must also hold for WO_STEPPER_MIN_MATCH keys past its first */
        for (c = 0; c < s->ncand; c++) {
            size_t r = i + 1 - s->since[c];
            if (r >= s->cand[c] && r >= WO_STEPPER_MIN_MATCH &&
                (best == SIZE_MAX || s->cand[c] < s->cand[best]))
                best = c;
        }
        if (best == SIZE_MAX)
            break;
        c = best;
        P = s->cand[c];
        /* anchors in the last period: the step's own, not the start's. A
         * run that started again after the anchor's last occurrence may
         * hold none: steps are counted in anchors, so it cannot be one */
        {
            uint32_t a = 0;
            for (size_t k = i + 1 - P; k <= i; k++)
                a += s->keys[k] == s->anchor;
            if (!a) {
                s->since[c] = i + 1; /* nor is it a run the patience rule waits for */
                continue;
            }
            s->per_step = a;
        }
        s->seen = s->per_step - 1; /* the next anchor is a boundary */
        s->anchor_last = s->last_boundary = s->pos;
        free(s->keys);
        s->keys = NULL;
        s->n = s->cap = 0;
        s->ncand = 0;
        return 0;
    }
    return 0;
}

void wo_stream_keys_init(struct wo_stream_keys *k)
{
    wo_stepper_init(&k->st);
    k->first_low = UINT32_MAX;
    k->lows_vary = false;
    k->last_seen = UINT32_MAX;
}

void wo_stream_keys_done(struct wo_stream_keys *k)
{
    wo_stepper_done(&k->st);
}

unsigned wo_stream_keys_feed(struct wo_stream_keys *k, uint64_t func, uint32_t low, bool *switched)
{
    bool same = low == k->last_seen;

    *switched = false;
    k->last_seen = low;
    if (!k->lows_vary && k->first_low != UINT32_MAX && low != k->first_low) {
        k->lows_vary = true;
        *switched = true;
        wo_stepper_done(&k->st);
        wo_stepper_init(&k->st);
    }
    if (k->first_low == UINT32_MAX)
        k->first_low = low;
    if (k->lows_vary)
        return same ? 0 : wo_stepper_feed(&k->st, wo_stepper_key(0, low));
    return wo_stepper_feed(&k->st, wo_stepper_key(func, low));
}
