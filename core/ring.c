/* core/ring.c: bounded multi-producer single-consumer event ring.
 *
 * D. Vyukov's bounded queue: each cell carries a sequence number that tells
 * producers and the consumer whose turn the cell is. Producers claim a slot
 * with one CAS on `head`; a full ring is detected without waiting and the
 * event is dropped and counted, so a hook never blocks on a slow consumer.
 *
 * Two priorities: an event pushed with wo_ring_push_low() is refused once
 * the ring is three quarters full, so events nobody learns from (launches
 * that touch no watched range, pushed only for a trace) cannot take the last
 * quarter from those the prefetcher needs. */
#include "core/event.h"

#include <stdatomic.h>
#include <string.h>
#include <time.h>

struct cell {
    _Atomic uint64_t seq;
    struct wo_event ev;
};

struct wo_ring {
    uint64_t mask;
    _Alignas(64) _Atomic uint64_t head; /* next slot producers claim */
    _Alignas(64) _Atomic uint64_t tail; /* next slot the consumer reads */
    _Alignas(64) _Atomic uint64_t dropped;
    _Atomic uint64_t pushed;
    uint64_t low_limit; /* occupancy from which low-priority pushes are refused */
    struct cell *cells;
};

struct wo_ring *wo_ring_new(uint32_t capacity)
{
    struct wo_ring *r;

    if (capacity < 2 || (capacity & (capacity - 1)) != 0)
        return NULL;
    r = aligned_alloc(64, sizeof(*r));
    if (!r)
        return NULL;
    memset(r, 0, sizeof(*r));
    r->cells = calloc(capacity, sizeof(struct cell));
    if (!r->cells) {
        free(r);
        return NULL;
    }
    r->mask = capacity - 1;
    r->low_limit = capacity - capacity / 4;
    for (uint64_t i = 0; i < capacity; i++)
        atomic_init(&r->cells[i].seq, i);
    return r;
}

void wo_ring_free(struct wo_ring *r)
{
    if (!r)
        return;
    free(r->cells);
    free(r);
}

static int push(struct wo_ring *r, const struct wo_event *ev, bool low)
{
    uint64_t pos = atomic_load_explicit(&r->head, memory_order_relaxed);
    struct cell *c;

    /* Occupancy from a stale tail is an overestimate: at worst a low event
     * is refused a little early. The tail's cache line is read only here. */
    if (low && pos - atomic_load_explicit(&r->tail, memory_order_relaxed) >= r->low_limit) {
        atomic_fetch_add_explicit(&r->dropped, 1, memory_order_relaxed);
        return -ENOSPC;
    }
    for (;;) {
        int64_t diff;
        c = &r->cells[pos & r->mask];
        diff = (int64_t)(atomic_load_explicit(&c->seq, memory_order_acquire) - pos);
        if (diff == 0) {
            if (atomic_compare_exchange_weak_explicit(&r->head, &pos, pos + 1,
                                                      memory_order_relaxed, memory_order_relaxed))
                break;
            /* pos was reloaded by the failed CAS */
        } else if (diff < 0) {
            atomic_fetch_add_explicit(&r->dropped, 1, memory_order_relaxed);
            return -ENOSPC;
        } else {
            pos = atomic_load_explicit(&r->head, memory_order_relaxed);
        }
    }
    c->ev = *ev;
    atomic_store_explicit(&c->seq, pos + 1, memory_order_release);
    atomic_fetch_add_explicit(&r->pushed, 1, memory_order_relaxed);
    return 0;
}

int wo_ring_push(struct wo_ring *r, const struct wo_event *ev)
{
    return push(r, ev, false);
}

int wo_ring_push_low(struct wo_ring *r, const struct wo_event *ev)
{
    return push(r, ev, true);
}

int wo_ring_pop(struct wo_ring *r, struct wo_event *ev)
{
    uint64_t pos = atomic_load_explicit(&r->tail, memory_order_relaxed);
    struct cell *c = &r->cells[pos & r->mask];
    uint64_t seq = atomic_load_explicit(&c->seq, memory_order_acquire);

    if (seq != pos + 1)
        return 0; /* empty, or the producer of this slot has not finished */
    *ev = c->ev;
    atomic_store_explicit(&c->seq, pos + r->mask + 1, memory_order_release);
    atomic_store_explicit(&r->tail, pos + 1, memory_order_relaxed);
    return 1;
}

uint64_t wo_ring_dropped(const struct wo_ring *r)
{
    return atomic_load_explicit(&((struct wo_ring *)r)->dropped, memory_order_relaxed);
}

uint64_t wo_ring_capacity(const struct wo_ring *r)
{
    return r->mask + 1;
}

uint64_t wo_ring_pushed(const struct wo_ring *r)
{
    return atomic_load_explicit(&((struct wo_ring *)r)->pushed, memory_order_relaxed);
}

uint64_t wo_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * UINT64_C(1000000000) + (uint64_t)ts.tv_nsec;
}
