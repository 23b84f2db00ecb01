/* core/trace-load.c: the trace loader (core/trace.h, wo_trace_load): reads
 * a whole trace through the reader (trace-read.c, which checks every byte)
 * into tables: kernels by function, ranges by (id, gen) with their names,
 * the events, the header's info. A free finds its range through a map of
 * live ranges by base address, so a trace of millions of allocations
 * loads in linear time. Linked with the reader into the tools and tests,
 * never into the shim. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/trace-int.h"
#include "core/trace.h"

static int cmp_kernel(const void *a, const void *b)
{
    const struct wo_trace_kernel_name *x = a, *y = b;
    return x->func < y->func ? -1 : x->func > y->func;
}

struct range_key {
    uint32_t id, gen;
    size_t index;
};

static int cmp_range_key(const void *a, const void *b)
{
    const struct range_key *x = a, *y = b;
    if (x->id != y->id)
        return x->id < y->id ? -1 : 1;
    if (x->gen != y->gen)
        return x->gen < y->gen ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

/* d->id_first from keys (sorted by id, gen): where each id's ranges start
 * in range_index. Registry ids are dense from 0, so the table is about as
 * long as the ranges; a trace whose ids are not (hand-made, or damaged) keeps
 * the search over all of range_index (no table: id_first NULL). */
static void index_ids(struct wo_trace_data *d, const struct range_key *keys)
{
    uint32_t max = keys[d->nranges - 1].id;
    size_t k = 0;

    if ((uint64_t)max > 4 * (uint64_t)d->nranges + 65536)
        return;
    d->id_first = malloc(((size_t)max + 2) * sizeof(*d->id_first));
    if (!d->id_first)
        return; /* the search over all of range_index answers the same */
    for (size_t id = 0; id <= (size_t)max + 1; id++) {
        while (k < d->nranges && keys[k].id < id)
            k++;
        d->id_first[id] = k;
    }
    d->nid = (size_t)max + 1;
}

/* Live ranges by base address (live ranges never share a base): a free
 * event finds its range in O(1), so a trace of millions of alloc/free pairs
 * loads in linear time. Linear probing with backward-shift deletion. */
struct live_map {
    uint64_t *keys;
    size_t *vals;
    uint8_t *used;
    size_t cap, n;
};

static size_t live_slot(const struct live_map *m, uint64_t key)
{
    return (size_t)((key * 0x9E3779B97F4A7C15ull) >> 17) & (m->cap - 1);
}

static int live_put(struct live_map *m, uint64_t key, size_t val)
{
    size_t i;

    if ((m->n + 1) * 2 > m->cap) {
        struct live_map g = {0};
        g.cap = m->cap ? m->cap * 2 : 256;
        g.keys = malloc(g.cap * sizeof(*g.keys));
        g.vals = malloc(g.cap * sizeof(*g.vals));
        g.used = calloc(g.cap, 1);
        if (!g.keys || !g.vals || !g.used) {
            free(g.keys);
            free(g.vals);
            free(g.used);
            return -ENOMEM;
        }
        for (size_t k = 0; k < m->cap; k++)
            if (m->used[k]) {
                for (i = live_slot(&g, m->keys[k]); g.used[i]; i = (i + 1) & (g.cap - 1))
                    ;
                g.used[i] = 1;
                g.keys[i] = m->keys[k];
                g.vals[i] = m->vals[k];
                g.n++;
            }
        free(m->keys);
        free(m->vals);
        free(m->used);
        *m = g;
    }
    for (i = live_slot(m, key); m->used[i]; i = (i + 1) & (m->cap - 1))
        if (m->keys[i] == key) {
            m->vals[i] = val; /* an earlier range there was freed unrecorded */
            return 0;
        }
    m->used[i] = 1;
    m->keys[i] = key;
    m->vals[i] = val;
    m->n++;
    return 0;
}

/* Removes key: 1 and *val, or 0. */
static int live_take(struct live_map *m, uint64_t key, size_t *val)
{
    size_t i, j;

    if (!m->cap)
        return 0;
    for (i = live_slot(m, key); m->used[i]; i = (i + 1) & (m->cap - 1))
        if (m->keys[i] == key)
            break;
    if (!m->used[i])
        return 0;
    *val = m->vals[i];
    /* backward shift: later members of the probe run move up into the hole */
    for (j = (i + 1) & (m->cap - 1); m->used[j]; j = (j + 1) & (m->cap - 1)) {
        size_t home = live_slot(m, m->keys[j]);
        if ((j > i && (home <= i || home > j)) || (j < i && home <= i && home > j)) {
            m->keys[i] = m->keys[j];
            m->vals[i] = m->vals[j];
            i = j;
        }
    }
    m->used[i] = 0;
    m->n--;
    return 1;
}

static void live_free(struct live_map *m)
{
    free(m->keys);
    free(m->vals);
    free(m->used);
}

/* The entry of v (n of them) for the same tensor as p, hint first (the
 * recorder lists its tensors in the same order each time): n when none. */
static size_t pick_find(const struct wo_trace_pick *v, size_t n, const struct wo_trace_pick *p,
                        size_t hint)
{
    if (hint < n && v[hint].id == p->id && v[hint].gen == p->gen && v[hint].offset == p->offset)
        return hint;
    for (size_t k = 0; k < n; k++)
        if (v[k].id == p->id && v[k].gen == p->gen && v[k].offset == p->offset)
            return k;
    return n;
}

static int load(struct wo_trace_reader *r, size_t max_events, struct wo_trace_data **ret)
{
    struct wo_trace_data *d = calloc(1, sizeof(*d));
    size_t cap_ev = 0, cap_rg = 0, cap_k = 0, cap_t = 0, cap_ru = 0;
    struct live_map live = {0};
    struct wo_trace_rec rec;
    int e = 0;

    if (!d)
        return -ENOMEM;
    *ret = d;
    wo_trace_reader_version(r, &d->version_major, &d->version_minor);
    while ((e = wo_trace_next(r, &rec)) > 0) {
        switch (rec.type) {
        case WO_TREC_EVENT: {
            struct wo_trace_ev *te;
            if (max_events && d->nevents >= max_events) {
                e = -E2BIG;
                snprintf(d->error_text, sizeof(d->error_text),
                         "offset %llu: more than %zu events (the limit of this tool)",
                         (unsigned long long)rec.offset, max_events);
                d->error_offset = rec.offset;
                goto out;
            }
            if ((e = wo_grow((void **)&d->events, &cap_ev, d->nevents + 1, sizeof(*d->events))) < 0)
                goto out;
            te = &d->events[d->nevents++];
            te->ev = rec.ev;
            te->range_id = rec.range_id;
            te->range_gen = rec.range_gen;
            if (rec.ev.type == WO_EV_ALLOC && rec.range_id != WO_TRACE_NO_ID) {
                struct wo_trace_range *g;
                if ((e = wo_grow((void **)&d->ranges, &cap_rg, d->nranges + 1, sizeof(*d->ranges))) < 0)
                    goto out;
                g = &d->ranges[d->nranges++];
                memset(g, 0, sizeof(*g));
                g->id = rec.range_id;
                g->gen = rec.range_gen;
                g->base = rec.ev.a.base;
                g->size = rec.ev.a.size;
                g->seq = rec.ev.a.seq;
                g->flags = rec.ev.a.flags;
                g->device = rec.ev.a.device;
                g->t_alloc_ns = rec.ev.t_ns;
                if ((e = live_put(&live, g->base, d->nranges - 1)) < 0)
                    goto out;
            } else if (rec.ev.type == WO_EV_FREE) {
                size_t k;
                if (live_take(&live, rec.ev.a.base, &k)) {
                    struct wo_trace_range *g = &d->ranges[k];
                    g->t_free_ns = rec.ev.t_ns ? rec.ev.t_ns : 1;
                    te->range_id = g->id;
                    te->range_gen = g->gen;
                }
            }
            break;
        }
        case WO_TREC_KERNEL:
            if ((e = wo_grow((void **)&d->kernels, &cap_k, d->nkernels + 1, sizeof(*d->kernels))) < 0)
                goto out;
            d->kernels[d->nkernels].func = rec.func;
            if (!(d->kernels[d->nkernels].name = strdup(rec.name))) {
                e = -ENOMEM;
                goto out;
            }
            d->nkernels++;
            break;
        case WO_TREC_TAG:
            if ((e = wo_grow((void **)&d->tags, &cap_t, d->ntags + 1, sizeof(*d->tags))) < 0)
                goto out;
            d->tags[d->ntags] = rec.tag;
            if (!(d->tags[d->ntags].name = strdup(rec.tag.name))) {
                e = -ENOMEM;
                goto out;
            }
            d->ntags++;
            break;
        case WO_TREC_RULE:
            if ((e = wo_grow((void **)&d->rules, &cap_ru, d->nrules + 1, sizeof(*d->rules))) < 0)
                goto out;
            d->rules[d->nrules].index = rec.rule;
            if (!(d->rules[d->nrules].name = strdup(rec.name))) {
                e = -ENOMEM;
                goto out;
            }
            d->nrules++;
            break;
        case WO_TREC_FOOTER:
            d->has_footer = 1;
            d->footer = rec.footer;
            break;
        case WO_TREC_PICKS: {
            /* cumulative: the last record says it all, and each tensor's
             * base is the first record that had its last hot set (the run
             * from there on is its steady state: wo_trace_pick_steady) */
            struct wo_trace_pick *pk = rec.npicks ? malloc(rec.npicks * sizeof(*pk)) : NULL;
            struct wo_trace_pick *base = rec.npicks ? malloc(rec.npicks * sizeof(*base)) : NULL;

            if (rec.npicks && (!pk || !base)) {
                free(pk);
                free(base);
                e = -ENOMEM;
                goto out;
            }
            for (size_t i = 0; i < rec.npicks; i++) {
                size_t k = pick_find(d->picks, d->npicks, &rec.picks[i], i);
                pk[i] = rec.picks[i];
                base[i] = k < d->npicks && d->picks[k].hot == pk[i].hot ? d->picks_base[k] : pk[i];
            }
            free(d->picks);
            free(d->picks_base);
            d->picks = pk;
            d->picks_base = base;
            d->npicks = rec.npicks;
            d->picks_t_ns = rec.picks_t_ns;
            break;
        }
        default:
            break;
        }
    }
    if (e < 0) {
        snprintf(d->error_text, sizeof(d->error_text), "%s", wo_trace_reader_error(r));
        d->error_offset = wo_trace_reader_error_offset(r);
    }

out:
    live_free(&live);
    /* Whatever was read stays usable: tables are finished even after an error. */
    d->ninfo = wo_trace_reader_ninfo(r);
    d->info_keys = calloc(d->ninfo + 1, sizeof(char *));
    d->info_values = calloc(d->ninfo + 1, sizeof(char *));
    if (!d->info_keys || !d->info_values) {
        d->ninfo = 0;
        e = -ENOMEM;
    }
    for (size_t i = 0; i < d->ninfo; i++) {
        const char *k = "", *v = "";
        wo_trace_reader_info_at(r, i, &k, &v);
        d->info_keys[i] = strdup(k);
        d->info_values[i] = strdup(v);
        if (!d->info_keys[i] || !d->info_values[i])
            e = -ENOMEM;
    }
    if (d->nkernels) {
        size_t w = 0;
        qsort(d->kernels, d->nkernels, sizeof(*d->kernels), cmp_kernel);
        /* a function named twice: the later record wins (qsort is not stable,
         * both names came from the same function, either is right) */
        for (size_t i = 0; i < d->nkernels; i++) {
            if (w && d->kernels[w - 1].func == d->kernels[i].func) {
                free(d->kernels[i].name);
                continue;
            }
            d->kernels[w++] = d->kernels[i];
        }
        d->nkernels = w;
    }
    if (d->nranges) {
        struct range_key *keys = malloc(d->nranges * sizeof(*keys));
        d->range_index = malloc(d->nranges * sizeof(size_t));
        if (!keys || !d->range_index) {
            free(d->range_index);
            d->range_index = NULL;
            e = -ENOMEM;
        } else {
            for (size_t i = 0; i < d->nranges; i++)
                keys[i] = (struct range_key){d->ranges[i].id, d->ranges[i].gen, i};
            qsort(keys, d->nranges, sizeof(*keys), cmp_range_key);
            for (size_t i = 0; i < d->nranges; i++)
                d->range_index[i] = keys[i].index;
            index_ids(d, keys);
        }
        free(keys);
    }
    d->has_footer = wo_trace_reader_has_footer(r);
    d->error = e < 0 ? e : 0;
    if (e == -ENOMEM && !d->error_text[0])
        snprintf(d->error_text, sizeof(d->error_text), "out of memory");
    return e < 0 ? e : 0;
}

/* Loads from a reader just opened (e its open status): a failed open still
 * gives *ret the error and where it happened, for the caller's message. */
static int load_opened(struct wo_trace_reader *r, int e, size_t max_events,
                       struct wo_trace_data **ret)
{
    *ret = NULL;
    if (!r)
        return e;
    if (e < 0) {
        struct wo_trace_data *d = calloc(1, sizeof(*d));
        if (d) {
            d->error = e;
            d->error_offset = wo_trace_reader_error_offset(r);
            snprintf(d->error_text, sizeof(d->error_text), "%s", wo_trace_reader_error(r));
        }
        *ret = d;
        wo_trace_reader_close(r);
        return d ? e : -ENOMEM;
    }
    e = load(r, max_events, ret);
    wo_trace_reader_close(r);
    return e;
}

int wo_trace_load(const char *path, unsigned flags, size_t max_events, struct wo_trace_data **ret)
{
    struct wo_trace_reader *r;
    int e = wo_trace_reader_open(path, flags, &r);

    return load_opened(r, e, max_events, ret);
}

int wo_trace_load_mem(const void *buf, size_t len, unsigned flags, size_t max_events,
                      struct wo_trace_data **ret)
{
    struct wo_trace_reader *r;
    int e = wo_trace_reader_open_mem(buf, len, flags, &r);

    return load_opened(r, e, max_events, ret);
}

void wo_trace_data_free(struct wo_trace_data *d)
{
    if (!d)
        return;
    for (size_t i = 0; i < d->ninfo; i++) {
        free(d->info_keys[i]);
        free(d->info_values[i]);
    }
    free(d->info_keys);
    free(d->info_values);
    free(d->events);
    free(d->ranges);
    free(d->range_index);
    free(d->id_first);
    for (size_t i = 0; i < d->nkernels; i++)
        free(d->kernels[i].name);
    free(d->kernels);
    for (size_t i = 0; i < d->ntags; i++)
        free((char *)d->tags[i].name);
    free(d->tags);
    for (size_t i = 0; i < d->nrules; i++)
        free(d->rules[i].name);
    free(d->rules);
    free(d->picks);
    free(d->picks_base);
    free(d);
}

const char *wo_trace_data_kernel(const struct wo_trace_data *d, uint64_t func)
{
    size_t lo = 0, hi = d->nkernels;

    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (d->kernels[mid].func < func)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < d->nkernels && d->kernels[lo].func == func ? d->kernels[lo].name : NULL;
}

const struct wo_trace_range *wo_trace_data_range(const struct wo_trace_data *d, uint32_t id,
                                                 uint32_t gen)
{
    size_t lo = 0, hi = d->nranges;

    if (!d->range_index)
        return NULL;
    if (d->id_first) {
        /* the replay asks once for every hit of every launch: a third of
         * its instructions went to the search over all ranges */
        if (id >= d->nid)
            return NULL;
        lo = d->id_first[id];
        hi = d->id_first[id + 1];
    }
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const struct wo_trace_range *g = &d->ranges[d->range_index[mid]];
        if (g->id < id || (g->id == id && g->gen < gen))
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < d->nranges) {
        const struct wo_trace_range *g = &d->ranges[d->range_index[lo]];
        if (g->id == id && g->gen == gen)
            return g;
    }
    return NULL;
}

const char *wo_trace_data_info(const struct wo_trace_data *d, const char *key)
{
    for (size_t i = d->ninfo; i-- > 0;)
        if (strcmp(d->info_keys[i], key) == 0)
            return d->info_values[i];
    return NULL;
}
