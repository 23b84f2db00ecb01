/* uvm/names.c: the name side of placement: per-thread tag scopes, the table
 * of interned names, and the allocation records with their sorted tags.
 *
 * Everything but the tag scope stack lives under wo_uvm.lock. Names are
 * reference-counted so that freeing placed memory releases its names too:
 * an engine that loads and frees models in a loop does not grow. */
#include "uvm/internal.h"

#include <string.h>

#include "core/log.h"
#include "core/registry.h"

/* ---- tag scope (thread-local, no lock) ------------------------------------ */

struct scope_stack {
    int depth;
    char *names[WO_TAG_DEPTH_MAX];
};

static __thread struct scope_stack *scope;
static pthread_key_t scope_key;
static pthread_once_t scope_key_once = PTHREAD_ONCE_INIT;

static void scope_free(void *p)
{
    struct scope_stack *s = p;

    if (!s)
        return;
    for (int i = 0; i < s->depth; i++)
        free(s->names[i]);
    free(s);
}

static void scope_key_make(void)
{
    /* The destructor frees the copies of a thread that exits inside a scope. */
    (void)pthread_key_create(&scope_key, scope_free);
}

const char *wo_scope_current(void)
{
    struct scope_stack *s = scope;

    return s && s->depth > 0 ? s->names[s->depth - 1] : NULL;
}

void wo_scope_forget_thread(void)
{
    scope_free(scope);
    scope = NULL;
    pthread_once(&scope_key_once, scope_key_make);
    (void)pthread_setspecific(scope_key, NULL);
}

int wo_scope_push(const char *name)
{
    struct scope_stack *s = scope;
    size_t len;
    char *copy;

    if (!name || !*name) {
        wo_warn("woffload_tag_push: %s name: ignored (-EINVAL)", name ? "empty" : "NULL");
        __atomic_add_fetch(&wo_uvm.misuse, 1, __ATOMIC_RELAXED);
        return -EINVAL;
    }
    len = strnlen(name, WO_TAG_NAME_MAX + 1);
    if (len > WO_TAG_NAME_MAX) {
        wo_warn("woffload_tag_push: name '%.40s...' is longer than %d bytes: ignored (-E2BIG)",
                name, WO_TAG_NAME_MAX);
        __atomic_add_fetch(&wo_uvm.misuse, 1, __ATOMIC_RELAXED);
        return -E2BIG;
    }
    if (!s) {
        pthread_once(&scope_key_once, scope_key_make);
        s = calloc(1, sizeof(*s));
        if (!s)
            return -ENOMEM;
        scope = s;
        (void)pthread_setspecific(scope_key, s);
    }
    if (s->depth >= WO_TAG_DEPTH_MAX) {
        wo_warn("woffload_tag_push('%s'): tag scopes nested deeper than %d: ignored (-E2BIG)", name,
                WO_TAG_DEPTH_MAX);
        __atomic_add_fetch(&wo_uvm.misuse, 1, __ATOMIC_RELAXED);
        return -E2BIG;
    }
    copy = strndup(name, len);
    if (!copy)
        return -ENOMEM;
    s->names[s->depth++] = copy;
    return 0;
}

int wo_scope_pop(void)
{
    struct scope_stack *s = scope;

    if (!s || s->depth == 0) {
        wo_warn("woffload_tag_pop: no tag scope is open on this thread (-EPERM)");
        __atomic_add_fetch(&wo_uvm.misuse, 1, __ATOMIC_RELAXED);
        return -EPERM;
    }
    free(s->names[--s->depth]);
    s->names[s->depth] = NULL;
    return 0;
}

/* ---- names ------------------------------------------------------------------ */

static uint64_t hash_str(const char *s)
{
    uint64_t h = UINT64_C(1469598103934665603); /* FNV-1a */

    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * UINT64_C(1099511628211);
    return h;
}

static int name_hash_grow(void)
{
    size_t nsize = wo_uvm.name_hash_size ? wo_uvm.name_hash_size * 2 : 256;
    struct wo_name **nh = calloc(nsize, sizeof(*nh));

    if (!nh)
        return -ENOMEM;
    for (size_t i = 0; i < wo_uvm.name_hash_size; i++) {
        struct wo_name *n = wo_uvm.name_hash[i], *next;
        for (; n; n = next) {
            next = n->next;
            n->next = nh[n->hash & (nsize - 1)];
            nh[n->hash & (nsize - 1)] = n;
        }
    }
    free(wo_uvm.name_hash);
    wo_uvm.name_hash = nh;
    wo_uvm.name_hash_size = nsize;
    return 0;
}

static int name_id_take(uint32_t *ret)
{
    if (wo_uvm.nfree_ids > 0) {
        *ret = wo_uvm.free_ids[--wo_uvm.nfree_ids];
        return 0;
    }
    {
        uint32_t ncap = wo_uvm.names_cap ? wo_uvm.names_cap * 2 : 256;
        struct wo_name **nv = realloc(wo_uvm.names_by_id, ncap * sizeof(*nv));
        uint32_t *nf;
        if (!nv)
            return -ENOMEM;
        memset(nv + wo_uvm.names_cap, 0, (ncap - wo_uvm.names_cap) * sizeof(*nv));
        wo_uvm.names_by_id = nv;
        nf = realloc(wo_uvm.free_ids, ncap * sizeof(*nf));
        if (!nf)
            return -ENOMEM;
        wo_uvm.free_ids = nf;
        /* The new ids go on the free list, highest first, so the lowest is used next. */
        for (uint32_t i = ncap; i > wo_uvm.names_cap + 1; i--)
            wo_uvm.free_ids[wo_uvm.nfree_ids++] = i - 1;
        *ret = wo_uvm.names_cap;
        wo_uvm.names_cap = ncap;
        return 0;
    }
}

struct wo_name *wo_name_get(const char *s)
{
    uint64_t h = hash_str(s);
    struct wo_name *n;
    uint32_t id;

    if (wo_uvm.name_hash_size) {
        for (n = wo_uvm.name_hash[h & (wo_uvm.name_hash_size - 1)]; n; n = n->next)
            if (n->hash == h && strcmp(n->s, s) == 0)
                return n;
    }
    if (wo_uvm.nnames + 1 > wo_uvm.name_hash_size && name_hash_grow() < 0)
        return NULL;
    n = calloc(1, sizeof(*n));
    if (!n)
        return NULL;
    n->s = strdup(s);
    if (!n->s || name_id_take(&id) < 0) {
        free(n->s);
        free(n);
        return NULL;
    }
    n->id = id;
    n->hash = h;
    n->rule = -2;
    n->last_launch = UINT64_MAX;
    wo_uvm.names_by_id[id] = n;
    n->next = wo_uvm.name_hash[h & (wo_uvm.name_hash_size - 1)];
    wo_uvm.name_hash[h & (wo_uvm.name_hash_size - 1)] = n;
    wo_uvm.nnames++;
    wo_uvm.nnames_peak = WO_MAX(wo_uvm.nnames_peak, wo_uvm.nnames);
    return n;
}

void wo_name_ref(struct wo_name *n)
{
    n->refs++;
}

/* The slot of the released names' index (2 x cap slots, open addressing)
 * that holds the record of s, or the empty one where it would go (s NULL:
 * the first empty one, for a record known to be absent). */
static size_t gone_slot(const uint32_t *ix, size_t nslots, uint64_t hash, const char *s)
{
    size_t k = hash & (nslots - 1);

    for (; ix[k]; k = (k + 1) & (nslots - 1)) {
        const struct wo_name_gone *c = &wo_uvm.names_gone[ix[k] - 1];
        if (s && c->hash == hash && strcmp(c->s, s) == 0)
            break;
    }
    return k;
}

/* Room for one more record: the array and its index doubled (64 at first),
 * the index made again. */
static int gone_grow(void)
{
    size_t ncap = wo_uvm.names_gone_cap ? wo_uvm.names_gone_cap * 2 : 64;
    struct wo_name_gone *v;
    uint32_t *ix;

    if (ncap > WO_NAMES_GONE_MAX || !(ix = calloc(ncap * 2, sizeof(*ix))))
        return -1;
    if (!(v = realloc(wo_uvm.names_gone, ncap * sizeof(*v)))) {
        free(ix);
        return -1;
    }
    wo_uvm.names_gone = v;
    for (size_t i = 0; i < wo_uvm.nnames_gone; i++)
        ix[gone_slot(ix, ncap * 2, v[i].hash, NULL)] = (uint32_t)i + 1;
    free(wo_uvm.names_gone_index);
    wo_uvm.names_gone_index = ix;
    wo_uvm.names_gone_cap = ncap;
    return 0;
}

/* The record of a name whose last tag went (internal.h, wo_name_gone): the
 * one of its string when there is one (an engine that loads the same model
 * again), else a new one that takes the string over, within the limit.
 * Returns whether it kept one. */
static bool name_gone_keep(struct wo_name *n)
{
    struct wo_name_gone *g;
    size_t slot;

    if (wo_uvm.nnames_gone == wo_uvm.names_gone_cap &&
        (wo_uvm.nnames_gone >= WO_MAX(wo_uvm.nnames_peak, (size_t)64) || gone_grow() < 0) &&
        !wo_uvm.names_gone_cap) {
        wo_uvm.names_gone_dropped++;
        return false;
    }
    slot = gone_slot(wo_uvm.names_gone_index, wo_uvm.names_gone_cap * 2, n->hash, n->s);
    if (wo_uvm.names_gone_index[slot]) {
        g = &wo_uvm.names_gone[wo_uvm.names_gone_index[slot] - 1];
    } else {
        if (wo_uvm.nnames_gone == wo_uvm.names_gone_cap ||
            wo_uvm.nnames_gone >= WO_MAX(wo_uvm.nnames_peak, (size_t)64)) {
            wo_uvm.names_gone_dropped++;
            return false;
        }
        wo_uvm.names_gone_index[slot] = (uint32_t)wo_uvm.nnames_gone + 1;
        g = &wo_uvm.names_gone[wo_uvm.nnames_gone++];
        memset(g, 0, sizeof(*g));
        g->s = n->s;
        g->hash = n->hash;
        n->s = NULL;
    }
    g->rule = n->rule;
    g->want = n->want;
    g->place = n->place;
    g->unplaceable = n->unplaceable;
    g->over_budget = n->over_budget;
    g->peak_bytes = WO_MAX(g->peak_bytes, n->peak_bytes);
    g->peak_tags = WO_MAX(g->peak_tags, n->peak_tags);
    g->launches += n->launches;
    g->hits += n->hits;
    g->touched += n->touched;
    g->lives++;
    return true;
}

void wo_name_unref(struct wo_name *n)
{
    struct wo_name **pp;

    if (!n || --n->refs > 0)
        return;
    if (n->peak_tags)
        name_gone_keep(n);
    for (pp = &wo_uvm.name_hash[n->hash & (wo_uvm.name_hash_size - 1)]; *pp; pp = &(*pp)->next) {
        if (*pp == n) {
            *pp = n->next;
            break;
        }
    }
    wo_uvm.names_by_id[n->id] = NULL;
    wo_uvm.free_ids[wo_uvm.nfree_ids++] = n->id;
    wo_uvm.nnames--;
    free(n->s);
    free(n);
}

struct wo_name *wo_name_by_id(uint32_t id)
{
    return id < wo_uvm.names_cap ? wo_uvm.names_by_id[id] : NULL;
}

/* ---- allocation records ------------------------------------------------------ */

static size_t alloc_slot(uint64_t base, size_t size)
{
    /* Allocation bases are at least 256-byte aligned: mix the higher bits. */
    return (size_t)((base >> 8) * UINT64_C(0x9E3779B97F4A7C15) >> 20) & (size - 1);
}

struct wo_alloc *wo_alloc_find_base(uint64_t base)
{
    struct wo_alloc *a;

    if (!wo_uvm.alloc_hash_size)
        return NULL;
    for (a = wo_uvm.alloc_hash[alloc_slot(base, wo_uvm.alloc_hash_size)]; a; a = a->next)
        if (a->base == base)
            return a;
    return NULL;
}

static int alloc_hash_grow(void)
{
    size_t nsize = wo_uvm.alloc_hash_size ? wo_uvm.alloc_hash_size * 2 : 1024;
    struct wo_alloc **nh = calloc(nsize, sizeof(*nh));

    if (!nh)
        return -ENOMEM;
    for (size_t i = 0; i < wo_uvm.alloc_hash_size; i++) {
        struct wo_alloc *a = wo_uvm.alloc_hash[i], *next;
        for (; a; a = next) {
            size_t s = alloc_slot(a->base, nsize);
            next = a->next;
            a->next = nh[s];
            nh[s] = a;
        }
    }
    free(wo_uvm.alloc_hash);
    wo_uvm.alloc_hash = nh;
    wo_uvm.alloc_hash_size = nsize;
    return 0;
}

int wo_alloc_insert(struct wo_alloc *a)
{
    size_t s;

    if (wo_uvm.nallocs + 1 > wo_uvm.alloc_hash_size && alloc_hash_grow() < 0)
        return -ENOMEM;
    s = alloc_slot(a->base, wo_uvm.alloc_hash_size);
    a->next = wo_uvm.alloc_hash[s];
    wo_uvm.alloc_hash[s] = a;
    wo_uvm.nallocs++;
    return 0;
}

void wo_alloc_unlink(struct wo_alloc *a)
{
    struct wo_alloc **pp;

    if (!wo_uvm.alloc_hash_size)
        return;
    for (pp = &wo_uvm.alloc_hash[alloc_slot(a->base, wo_uvm.alloc_hash_size)]; *pp;
         pp = &(*pp)->next) {
        if (*pp == a) {
            *pp = a->next;
            wo_uvm.nallocs--;
            return;
        }
    }
}

struct wo_alloc *wo_alloc_find_addr(uint64_t addr)
{
    struct wo_range r;
    struct wo_alloc *a;

    if (wo_registry_find(addr, &r) < 0)
        return NULL;
    a = wo_alloc_find_base(r.base);
    if (a && a->size == r.size)
        return a;
    if (a) {
        /* A stale record (the range was freed without telling uvm/, and the
         * address reused): forget it. Memory uvm/ served is only ever
         * released by wo_uvm_free(), so such a record is never one of those. */
        if (a->kind != WO_KIND_OBSERVED)
            return NULL;
        wo_alloc_unlink(a);
        wo_alloc_destroy(a);
    }
    a = calloc(1, sizeof(*a));
    if (!a)
        return NULL;
    a->base = r.base;
    a->size = r.size;
    a->id = r.id;
    a->gen = r.gen;
    a->flags = r.flags;
    a->kind = WO_KIND_OBSERVED;
    if (wo_alloc_insert(a) < 0) {
        free(a);
        return NULL;
    }
    return a;
}

void wo_alloc_destroy(struct wo_alloc *a)
{
    if (!a)
        return;
    for (size_t i = 0; i < a->ntags; i++) {
        struct wo_tag *t = &a->tags[i];
        if (t->charged)
            wo_host_budget_release(&wo_uvm.host_budget, t->size);
        t->name->bytes -= t->size;
        t->name->ntags--;
        wo_name_unref(t->name);
    }
    if (a->default_charged)
        wo_host_budget_release(&wo_uvm.host_budget, a->default_bytes);
    if (a->kind == WO_KIND_MANAGED)
        wo_uvm.cap.live -= WO_MIN(wo_uvm.cap.live, a->size);
    free(a->tags);
    free(a);
}

/* Binary search: tags are sorted and disjoint. */
size_t wo_alloc_tag_above(const struct wo_alloc *a, uint64_t off)
{
    size_t lo = 0, hi = a->ntags;

    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (a->tags[mid].off + a->tags[mid].size <= off)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

int wo_alloc_add_tag(struct wo_alloc *a, uint64_t off, uint64_t size, struct wo_name *n,
                     struct wo_tag **ret, const struct wo_tag **clash)
{
    size_t i = wo_alloc_tag_above(a, off);
    struct wo_tag *t;

    if (i < a->ntags && a->tags[i].off < off + size) {
        /* Overlaps tag i. The same name over a range it already covers is a
         * repeat (PyTorch tags tied weights twice); anything else clashes. */
        t = &a->tags[i];
        if (t->name == n && t->off <= off && off + size <= t->off + t->size) {
            *ret = t;
            return 1;
        }
        *clash = t;
        return -EEXIST;
    }
    if (a->ntags == a->cap) {
        size_t ncap = a->cap ? a->cap * 2 : 4;
        struct wo_tag *nt = realloc(a->tags, ncap * sizeof(*nt));
        if (!nt)
            return -ENOMEM;
        a->tags = nt;
        a->cap = ncap;
    }
    memmove(&a->tags[i + 1], &a->tags[i], (a->ntags - i) * sizeof(*t));
    a->ntags++;
    t = &a->tags[i];
    memset(t, 0, sizeof(*t));
    t->off = off;
    t->size = size;
    t->name = n;
    t->order = ++wo_uvm.tag_order;
    wo_name_ref(n);
    n->bytes += size;
    n->ntags++;
    n->peak_bytes = WO_MAX(n->peak_bytes, n->bytes);
    n->peak_tags = WO_MAX(n->peak_tags, n->ntags);
    /* A named range is worth an event per launch (per-name books, the
     * prefetcher's segments); no memory for the mark only costs those. */
    (void)wo_registry_watch(a->id, a->gen);
    *ret = t;
    return 0;
}

void wo_names_free_all(void)
{
    for (uint32_t i = 0; i < wo_uvm.names_cap; i++) {
        struct wo_name *n = wo_uvm.names_by_id[i];
        if (n) {
            free(n->s);
            free(n);
        }
    }
    for (size_t i = 0; i < wo_uvm.nnames_gone; i++)
        free(wo_uvm.names_gone[i].s);
    free(wo_uvm.names_gone);
    free(wo_uvm.names_gone_index);
    wo_uvm.names_gone = NULL;
    wo_uvm.names_gone_index = NULL;
    wo_uvm.nnames_gone = wo_uvm.names_gone_cap = 0;
    wo_uvm.names_gone_dropped = 0;
    free(wo_uvm.names_by_id);
    free(wo_uvm.free_ids);
    free(wo_uvm.name_hash);
    wo_uvm.names_by_id = NULL;
    wo_uvm.free_ids = NULL;
    wo_uvm.name_hash = NULL;
    wo_uvm.names_cap = wo_uvm.nfree_ids = 0;
    wo_uvm.name_hash_size = wo_uvm.nnames = wo_uvm.nnames_peak = 0;
}

/* ---- placement counts (under wo_uvm.lock) ------------------------------------ */

/* The bytes and tensors of each placement, from the allocation records:
 * the stats' and fit's books (internal.h). */
void wo_place_counts(struct wo_place_counts *c)
{
    memset(c, 0, sizeof(*c));
    for (size_t i = 0; i < wo_uvm.alloc_hash_size; i++) {
        for (const struct wo_alloc *a = wo_uvm.alloc_hash[i]; a; a = a->next) {
            uint64_t tagged = 0;
            for (size_t k = 0; k < a->ntags; k++) {
                const struct wo_tag *t = &a->tags[k];
                tagged += t->size;
                if (a->kind == WO_KIND_OBSERVED) {
                    c->unplaceable.bytes += t->size;
                    c->unplaceable.tensors++;
                } else if (t->place > WO_PLACE_UNSET && t->place < WO_PLACE_MAX) {
                    c->by[t->place].bytes += t->size;
                    c->by[t->place].tensors++;
                }
            }
            if (a->kind == WO_KIND_OBSERVED || tagged >= a->size)
                continue;
            if (a->place > WO_PLACE_UNSET && a->place < WO_PLACE_MAX) {
                c->by[a->place].bytes += a->size - tagged;
                c->untagged[a->place] += a->size - tagged;
            } else {
                c->pending.bytes += a->size - tagged;
                c->pending.tensors++;
            }
        }
    }
}
