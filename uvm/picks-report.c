/* uvm/picks-report.c: picked staging's figures (uvm/picks.h:
 * wo_picks_report), read from its state (uvm/picks-int.h). */
#include <string.h>

#include "core/macro.h"
#include "uvm/internal.h"
#include "uvm/picks-int.h"
#include "uvm/picks-pool.h"
#include "uvm/picks-time.h"
#include "uvm/picks.h"
#include "uvm/uvm.h"

void wo_picks_report(struct wo_picks_totals *t, void (*fn)(void *ud, const struct wo_picks_figs *f),
                     void *ud)
{
    memset(t, 0, sizeof(*t));
    pthread_mutex_lock(&wo_pk.lock);
    t->c = wo_pk.c;
    t->const_words = __atomic_load_n(&wo_picks_const_words, __ATOMIC_RELAXED);
    t->buffer_bytes = wo_picks_reserved() - wo_pk.hot_bytes;
    {
        const struct wo_driver *d = wo_uvm_driver();
        struct wo_pool_figs pf;
        struct wo_picks_time_figs tf;

        wo_pool_figs(&pf);
        t->buffer_cap = pf.cap;
        t->buffers_lent = pf.lent;
        t->buffers_reclaimed = pf.reclaimed;
        if (d && wo_pk.ready)
            wo_picks_time_poll(d);
        wo_picks_time_figs(&tf);
        t->kernel_copies = tf.copies;
        t->timed_copies = tf.timed;
        t->timed_ms = tf.timed_ms;
        t->copy_span_s = tf.last_ns > tf.first_ns ? (double)(tf.last_ns - tf.first_ns) / 1e9 : 0;
    }
    t->hot_bytes = wo_pk.hot_bytes;
    t->hot_given_back = wo_pk.given_back;
    t->hot_fills = wo_pk.fills_gone;
    for (unsigned i = 0; i < wo_pk.n; i++) {
        const struct span *s = &wo_pk.s[i];
        uint64_t engine_rows = __atomic_load_n(&wo_pk.dma_rows[i], __ATOMIC_RELAXED);
        uint64_t rows =
            (wo_pk.rows_host ? __atomic_load_n(&wo_pk.rows_host[i], __ATOMIC_RELAXED) : 0) +
            engine_rows;
        uint64_t hot_rows = wo_pk.rows_host ? __atomic_load_n(&wo_pk.rows_host[WO_PICKS_SPANS + i],
                                                              __ATOMIC_RELAXED)
                                            : 0;
        struct wo_hot_figs hf;
        struct wo_picks_figs f;

        /* a tensor on the device (under fit the hook registers every
         * expert tensor: one may yield to the host later) is no picked
         * tensor until it is copied */
        if (s->ondev && !s->staged && !s->reused)
            continue;
        t->spans++;
        wo_hot_figs(s->hot, &hf);
        /* read back apart: never more from the hot set than in all */
        hot_rows = WO_MIN(hot_rows, rows);
        engine_rows = WO_MIN(engine_rows, rows - hot_rows);
        f = (struct wo_picks_figs){.name = s->name,
                                   .kerns = &s->kerns,
                                   .k = {.id = s->rid,
                                         .gen = s->rgen,
                                         .offset = s->off,
                                         .bytes = s->hi - s->lo,
                                         .n_experts = s->n_experts,
                                         .regs = s->regs,
                                         .staged = s->staged,
                                         .reused = s->reused,
                                         .rows = rows,
                                         .resident = s->resident,
                                         .hot = hf.held,
                                         .hot_rows = hot_rows,
                                         .engine_rows = engine_rows},
                                   .hot_slots = hf.cap,
                                   .hot_fills = hf.fills,
                                   .hot_bytes = hf.bytes};
        t->rows += rows;
        /* over the link: the kernels' rows less those from hot sets */
        if (wo_pk.rows_host) {
            uint64_t kr = __atomic_load_n(&wo_pk.rows_host[i], __ATOMIC_RELAXED);
            uint64_t kh = __atomic_load_n(&wo_pk.rows_host[WO_PICKS_SPANS + i], __ATOMIC_RELAXED);
            t->kernel_bytes += (kr > kh ? kr - kh : 0) * s->row;
        }
        t->hot_rows += hot_rows;
        t->bytes_copied += rows * s->row;
        t->hot_fills += hf.fills;
        if (fn)
            fn(ud, &f);
    }
    pthread_mutex_unlock(&wo_pk.lock);
}
