/* preload/redirect.h: launch redirection, the hook side of the streaming
 * executor (uvm/hotpath.h). Called by the launch hooks (launch.c) between the
 * parameter scan and the real launch:
 *
 *   n = wo_redirect_begin(&rd, hits, nhits, stream, captured);
 *   if (n) params = wo_redirect_params(&rd, params, sizes, nparams, &buf);  (or _extra)
 *   if (n && (!params || !wo_redirect_wait(&rd, stream))) -> launch as is
 *   real launch
 *   wo_redirect_end(&rd, stream);
 *
 * O(1) per hit, no lock, no allocation: the new parameter array and the
 * rewritten parameter bytes live in the caller's struct wo_redirect_buf. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "core/event.h"

#define WO_REDIRECT_MAX 8      /* ranges one launch may read from slots and buffers */
#define WO_REDIRECT_PARAMS 256 /* launches with more parameters read in place */
#define WO_REDIRECT_BYTES 4096 /* bytes of rewritten parameters (the classic limit) */
#define WO_NOTPTR_WORDS 512u   /* parameter words whose pointer-ness launch.c learns */

struct wo_redirect {
    unsigned n;     /* moves: [0, nslot) pinned slots, [nslot, n) picked buffers */
    unsigned nslot;
    unsigned slot[WO_REDIRECT_MAX];
    uint64_t from[WO_REDIRECT_MAX], to[WO_REDIRECT_MAX]; /* [from, to) moves to dev */
    uint64_t dev[WO_REDIRECT_MAX];
    /* a picked buffer's: only words at from + a multiple of this move (an
     * expert's row: where engines point into a stacked expert tensor); 0
     * (slots): any word aligned as a weight pointer is */
    uint64_t row[WO_REDIRECT_MAX];
    uint64_t key; /* the launch key (core/kernel-name.h): picked moves learn its slots */
};

/* Whether word w of a function's parameters is learned to be no pointer
 * slot (bits: struct layout's notptr in launch.c, NULL: none known). */
static inline bool wo_notptr_word(const uint64_t *bits, uint32_t w)
{
    return bits && w < WO_NOTPTR_WORDS &&
           (__atomic_load_n(&bits[w / 64], __ATOMIC_RELAXED) >> (w % 64) & 1);
}

struct wo_redirect_buf {
    void *params[WO_REDIRECT_PARAMS];
    void *extra[5];
    size_t extra_size;
    _Alignas(16) unsigned char bytes[WO_REDIRECT_BYTES];
};

/* Pins the slot of every hit in a range with a published assignment (none
 * when the launch is captured, the stream is not the slot's one this step,
 * or the current context is not the slots'); also publishes the engine's
 * position. Returns how many slots are pinned (rd->n). */
unsigned wo_redirect_begin(struct wo_redirect *rd, const struct wo_ev_hit *hits, unsigned nhits,
                           uint64_t stream, bool captured);
/* Adds a move to a picked staging buffer (uvm/hotpath.h: wo_picks_stage)
 * after the pinned slots: [from, to) reads [dev, ...), only the words at
 * from + a multiple of row (an expert's rows: another word that falls in
 * the tensor is a constant or left-over stack bytes that happen to look
 * like an address, and keeps its value; a real pointer left so reads the
 * tensor in place, which is correct), and of those past from only the
 * words whose parameter slot of the function (rd->key) has held another
 * value in an earlier such launch: a weight pointer moves from layer to
 * layer and expert to expert, a constant (a float beside padding that
 * holds the top of a host address) never does. Nothing to release; wait,
 * end and the check look at the slots only. */
void wo_redirect_add(struct wo_redirect *rd, uint64_t from, uint64_t to, uint64_t dev,
                     uint64_t row);
/* The parameter array to launch with: params with every pointer word into
 * a pinned range moved into its slot (the rewritten parameters copied into
 * b), scanning the same 8-byte words as the launch scan; NULL when it does
 * not fit in b (then release with wo_redirect_cancel). notptr (NULL: none):
 * bit w set for a word that is no pointer slot (launch.c), left as it is. */
void **wo_redirect_params(const struct wo_redirect *rd, void **params, const uint16_t *sizes,
                          int nparams, uint32_t max_words, const uint64_t *notptr,
                          struct wo_redirect_buf *b);
/* The same for the `extra` form (CU_LAUNCH_PARAM_BUFFER_POINTER). */
void **wo_redirect_extra(const struct wo_redirect *rd, void **extra, struct wo_redirect_buf *b);
/* Orders the launch stream after each pinned slot's staging copy. False
 * (and every slot released) when the driver refuses: launch as is. */
bool wo_redirect_wait(struct wo_redirect *rd, uint64_t stream);
/* Releases the slots without a launch (counted as read in place). */
void wo_redirect_cancel(struct wo_redirect *rd);
/* WOFFLOAD_STREAM_CHECK (debugging, slow): after the launch and before
 * wo_redirect_end, waits for the stream and compares each pinned slot with
 * the host bytes it stands for (sampled: 32 chunks of 256 KiB), and each
 * picked buffer's picked experts (the ids read back) with the tensor's
 * rows (the first and last 256 KiB of each, 16 experts at most), counting
 * and telling mismatches; names each kernel the first time it is
 * redirected (key: the launch key, core/kernel-name.h). */
void wo_redirect_check(const struct wo_redirect *rd, uint64_t stream, uint64_t key);
/* After the launch: read_done recorded on the stream, slots released. */
void wo_redirect_end(struct wo_redirect *rd, uint64_t stream);
/* After a blind launch (uvm/hotpath.h: wo_stream_blind_begin returned true
 * before it): its fence recorded on stream, the end counted, with the
 * real driver's event functions. */
void wo_hook_blind_end(uint64_t stream);
/* The real driver's event functions, for the table's fences. */
struct wo_stream_evfns;
void wo_hook_evfns(struct wo_stream_evfns *fn);
