/* core/board.c: see board.h. */
#include "core/board.h"

#include <stdlib.h>
#include <string.h>

#include "core/event.h"

static void drop(char **names, unsigned char *st, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    free(st);
}

bool wo_board_begin(struct wo_board *b, struct wo_board_draft *d, size_t cap, bool force)
{
    uint64_t now = wo_now_ns();

    memset(d, 0, sizeof(*d));
    if (!force && now - b->ns < 100 * UINT64_C(1000000))
        return false;
    b->ns = now;
    cap = cap ? cap : 1;
    d->names = calloc(cap, sizeof(*d->names));
    d->st = calloc(cap, b->stride);
    if (!d->names || !d->st) {
        drop(d->names, d->st, 0);
        memset(d, 0, sizeof(*d));
        return false;
    }
    d->cap = cap;
    d->stride = b->stride;
    return true;
}

void *wo_board_add(struct wo_board_draft *d, const char *name)
{
    if (d->n == d->cap || !(d->names[d->n] = strdup(name ? name : "(unnamed)")))
        return NULL;
    return d->st + d->stride * d->n++;
}

void wo_board_publish(struct wo_board *b, struct wo_board_draft *d, void (*also)(void *ud),
                      void *ud)
{
    char **names;
    unsigned char *st;
    size_t n;

    pthread_mutex_lock(&b->lock);
    names = b->names;
    st = b->st;
    n = b->n;
    b->names = d->names;
    b->st = d->st;
    b->n = d->n;
    if (also)
        also(ud);
    pthread_mutex_unlock(&b->lock);
    drop(names, st, n);
    memset(d, 0, sizeof(*d));
}

void wo_board_foreach(struct wo_board *b, void (*fn)(void *ud, const char *name, const void *st),
                      void *ud)
{
    pthread_mutex_lock(&b->lock);
    for (size_t i = 0; i < b->n; i++)
        fn(ud, b->names[i], b->st + b->stride * i);
    pthread_mutex_unlock(&b->lock);
}

void wo_board_locked(struct wo_board *b, void (*fn)(void *ud), void *ud)
{
    pthread_mutex_lock(&b->lock);
    fn(ud);
    pthread_mutex_unlock(&b->lock);
}
