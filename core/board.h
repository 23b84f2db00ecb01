/* core/board.h: figures by name, published by one thread, read by any.
 *
 * An executor's per-name figures belong to the thread that runs it;
 * woffload_stats() and the exit summary run on others. So the owner
 * publishes a copy now and then (at most every 100 ms, and at exit) and
 * readers walk the last copy under the board's lock. One board per
 * executor (the prefetcher's, the streaming executor's); the figures are
 * theirs, of the size the board was made with.
 *
 *     static struct wo_board b = WO_BOARD_INIT(struct my_stats);
 *     struct wo_board_draft d;
 *     if (wo_board_begin(&b, &d, n, force)) {
 *         for (...) { struct my_stats *st = wo_board_add(&d, name); if (!st) break; ... }
 *         wo_board_publish(&b, &d, NULL, NULL);
 *     }
 */
#pragma once

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct wo_board {
    pthread_mutex_t lock;
    size_t stride;  /* bytes of one name's figures */
    char **names;   /* the last copy published: n names */
    unsigned char *st; /* and their figures, stride bytes each */
    size_t n;
    uint64_t ns;    /* when it was begun (wo_now_ns's clock) */
};

#define WO_BOARD_INIT(type) {PTHREAD_MUTEX_INITIALIZER, sizeof(type), NULL, NULL, 0, 0}

/* A copy being made by the owner, not yet seen by readers. */
struct wo_board_draft {
    char **names;
    unsigned char *st;
    size_t n, cap, stride;
};

/* A draft of room for cap names, when a copy is due: the last one begun
 * at least 100 ms ago, or force. False when none is due or memory ran
 * out (the figures stay as last published). */
bool wo_board_begin(struct wo_board *b, struct wo_board_draft *d, size_t cap, bool force);
/* The zeroed figures of one more name (copied), NULL when the draft is
 * full or memory ran out: the names added so far are still published. */
void *wo_board_add(struct wo_board_draft *d, const char *name);
/* Publishes the draft, and under the board's lock calls also(ud) when not
 * NULL (figures that are not by name, kept beside them); frees the copy it
 * replaces. */
void wo_board_publish(struct wo_board *b, struct wo_board_draft *d, void (*also)(void *ud),
                      void *ud);
/* fn for each name of the last copy, under the board's lock. */
void wo_board_foreach(struct wo_board *b, void (*fn)(void *ud, const char *name, const void *st),
                      void *ud);
/* Runs fn(ud) under the board's lock (figures kept beside the names). */
void wo_board_locked(struct wo_board *b, void (*fn)(void *ud), void *ud);
