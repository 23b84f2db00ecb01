/* tests/fake/fake-behind.c: streams that fall behind their callers
 * (WOFAKE_STREAMS_BEHIND=1).
 *
 * By default the fake runs work when it is enqueued, and a stream wait for
 * a value (cuStreamWaitValue32) blocks its caller until another thread
 * writes the value. A GPU does neither: the wait returns at once, the work
 * after it waits on the device, and the caller goes on to its next call
 * (PyTorch's .item(), a free, a synchronize) while the stream is still
 * behind. The H200's hang under the shim's copy engine had that shape: the
 * engine's thread waited for the context's work inside a driver call that
 * held the lock the copy thread needed to write the value the stream
 * waited for (docs/picks.md, the copy engine's gate).
 *
 * In this mode a wait not met when it is enqueued puts its stream behind:
 * it and every later operation on that stream go into the stream's queue,
 * in order, and a device thread runs each queue's head once it may (a wait
 * once its word holds the value, an event wait once the record it waits
 * for ran: the event's last when the wait was made). Operations on streams with an empty queue still run at once. What
 * waits for "the context's work" (fk_quiet_wait) waits for every queue;
 * a stream or event synchronize waits for its own. A wait never met within
 * WOFAKE_WAIT_MS is reported ("a GPU stream would hang here") and dropped,
 * so that the test ends and fails instead of hanging.
 *
 * WOFAKE_QUEUES=N: the driver's work queues (CUDA_DEVICE_MAX_CONNECTIONS,
 * 8 by default on a GPU). With more streams than queues a GPU puts several
 * streams in one queue, in the order their work was enqueued, so a wait at
 * the queue's head holds every stream of it. Here the k-th stream made
 * shares queue k % N, and the default streams queue 0: they share one
 * queue of this file. A synchronize waits for its whole queue. Unset or 0:
 * a queue for each stream.
 *
 * WOFAKE_COPY_QUEUE=1: the copy engines' queue. A GPU sends the async
 * copies (and memsets) of every stream through a few copy queues, each copy behind a wait
 * for its own stream's earlier work: a copy enqueued on a stream that waits
 * holds every later copy of every stream. Here they share one queue; a
 * copy on a stream behind, or while that queue holds work, goes in it
 * behind an event its stream records, and the stream waits for the copy.
 * (transformers' mid-step copies behind a job's wait held the shim's copy
 * engine so on the H200.)
 *
 * Not modelled: synchronous copies wait only for their own default
 * stream's queue, not for other blocking streams'. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fake-priv.h"

struct node {
    struct fk_item it;
    uint64_t since; /* a wait at the head: when first found unmet, 0 not yet */
    struct node *next;
};

struct fk_behind {
    struct node *head, *tail;
    struct fk_behind *all; /* every queue ever made (never freed: a
                            * destroyed stream's queue still runs) */
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t moved = PTHREAD_COND_INITIALIZER; /* a head was run or pushed */
static struct fk_behind *queues;
static unsigned long pending; /* items in all queues */
static uint64_t queued;       /* items ever pushed */
static bool running;          /* the device thread */
static int enabled = -1;
#define HW_MAX 64u
static struct fk_behind *hw[HW_MAX]; /* WOFAKE_QUEUES's */

bool fk_behind_enabled(void)
{
    int e = __atomic_load_n(&enabled, __ATOMIC_RELAXED);
    if (e < 0) {
        const char *v = getenv("WOFAKE_STREAMS_BEHIND");
        e = !(v && strcmp(v, "0") == 0); /* on unless "0" */
        __atomic_store_n(&enabled, e, __ATOMIC_RELAXED);
    }
    return e;
}

/* A new queue, on the device thread's list (under mu). */
static struct fk_behind *queue_new_locked(void)
{
    struct fk_behind *q = calloc(1, sizeof(*q));
    if (q) {
        q->all = queues;
        queues = q;
    }
    return q;
}

struct fk_behind *fk_behind_hw(unsigned long k)
{
    const char *v = getenv("WOFAKE_QUEUES");
    unsigned long n = v && *v ? strtoul(v, NULL, 10) : 0;

    if (!n || !fk_behind_enabled())
        return NULL;
    n = n > HW_MAX ? HW_MAX : n;
    pthread_mutex_lock(&mu);
    if (!hw[k % n])
        hw[k % n] = queue_new_locked();
    struct fk_behind *q = hw[k % n];
    pthread_mutex_unlock(&mu);
    return q;
}

bool fk_behind_busy(const struct fk_behind *q)
{
    if (!q)
        return false;
    pthread_mutex_lock(&mu);
    bool busy = q->head != NULL;
    pthread_mutex_unlock(&mu);
    return busy;
}

bool fk_behind_any(void)
{
    return __atomic_load_n(&pending, __ATOMIC_ACQUIRE) != 0;
}

/* Says to f what each queue with work waits on at its head (a hang's
 * report: which wait holds the context's work). */
void fk_behind_describe(FILE *f)
{
    static const char *const kind[] = {"?", "an operation", "an event's record",
                                       "a value wait", "a value write", "an event wait"};
    unsigned k = 0;

    pthread_mutex_lock(&mu);
    for (struct fk_behind *q = queues; q; q = q->all, k++) {
        const struct node *n = q->head;
        unsigned len = 0;

        if (!n)
            continue;
        for (const struct node *m = n; m; m = m->next)
            len++;
        fprintf(f, "fakecuda:   queue %u: %u items, at its head %s", k, len,
                n->it.kind >= 1 && n->it.kind <= FK_ITEM_WAIT_EVENT ? kind[n->it.kind] : kind[0]);
        if (n->it.kind == FK_ITEM_WAIT_VALUE)
            fprintf(f, " on %p for %u (holds %u)", (void *)n->it.addr, n->it.value,
                    __atomic_load_n(n->it.addr, __ATOMIC_ACQUIRE));
        else if (n->it.kind == FK_ITEM_WAIT_EVENT)
            fprintf(f, " on %p's record %u", (void *)n->it.ev, n->it.value);
        fprintf(f, n->since ? ", unmet for %.1f s\n" : "\n",
                n->since ? (double)(fk_now_ns() - n->since) / 1e9 : 0.0);
    }
    pthread_mutex_unlock(&mu);
}

/* May the head run now? A value wait not met in the fake's limit is
 * reported and let through (a GPU would hang). */
static bool ready(struct fk_item *it, uint64_t *since)
{
    switch (it->kind) {
    case FK_ITEM_WAIT_VALUE:
        if (fk_value_met(__atomic_load_n(it->addr, __ATOMIC_ACQUIRE), it->value, it->flags))
            return true;
        if (!*since) {
            *since = fk_now_ns();
        } else if (fk_now_ns() - *since > fk_wait_limit_ns()) {
            fprintf(stderr,
                    "fakecuda: a stream behind its caller waited on %p for %u (holds %u) "
                    "past WOFAKE_WAIT_MS: a GPU stream would hang here\n",
                    (void *)it->addr, it->value, *it->addr);
            return true;
        }
        return false;
    case FK_ITEM_WAIT_EVENT:
        return !fk_event_pending(it->ev, it->value);
    default:
        return true;
    }
}

static void run(struct fk_item *it)
{
    switch (it->kind) {
    case FK_ITEM_OP:
        if (it->op.type == FK_OP_COPY)
            fk_op_copy_words(&it->op);
        else
            fk_exec_op(&it->op);
        fk_op_release(&it->op);
        break;
    case FK_ITEM_EVENT:
        fk_event_done(it->ev, it->value);
        break;
    case FK_ITEM_WRITE_VALUE:
        __atomic_store_n(it->addr, it->value, __ATOMIC_RELEASE);
        break;
    default: /* the waits: met */
        break;
    }
}

/* The device: runs each queue's head while it may, in order. An item stays
 * at its queue's head while it runs, so that an operation enqueued
 * meanwhile on that stream still queues behind it. */
static void *device_thread(void *arg)
{
    (void)arg;
    struct timespec nap = {0, 20000};

    pthread_mutex_lock(&mu);
    for (;;) {
        bool progress = false;
        for (struct fk_behind *q = queues; q; q = q->all) {
            while (q->head) {
                struct node *n = q->head;
                pthread_mutex_unlock(&mu);
                bool go = ready(&n->it, &n->since);
                if (go)
                    run(&n->it);
                pthread_mutex_lock(&mu);
                if (!go)
                    break;
                q->head = n->next;
                if (!q->head)
                    q->tail = NULL;
                free(n);
                __atomic_sub_fetch(&pending, 1, __ATOMIC_ACQ_REL);
                progress = true;
            }
        }
        if (progress)
            pthread_cond_broadcast(&moved);
        if (!pending) {
            pthread_cond_wait(&moved, &mu);
        } else if (!progress) {
            pthread_mutex_unlock(&mu);
            nanosleep(&nap, NULL);
            pthread_mutex_lock(&mu);
        }
    }
    return NULL;
}

/* fork() keeps the queues but not the thread: the child starts its own. */
static void after_fork_child(void)
{
    running = false;
}

CUresult fk_behind_push(struct fk_behind **qp, const struct fk_item *it)
{
    struct node *n = malloc(sizeof(*n));
    if (!n)
        return CUDA_ERROR_OUT_OF_MEMORY;
    n->it = *it;
    n->since = 0;
    n->next = NULL;
    pthread_mutex_lock(&mu);
    if (!*qp && !(*qp = queue_new_locked())) {
        pthread_mutex_unlock(&mu);
        free(n);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (!running) {
        static bool atfork;
        pthread_t t;
        pthread_attr_t a;
        if (!atfork)
            atfork = pthread_atfork(NULL, NULL, after_fork_child) == 0;
        pthread_attr_init(&a);
        pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
        running = pthread_create(&t, &a, device_thread, NULL) == 0;
        pthread_attr_destroy(&a);
        if (!running) {
            pthread_mutex_unlock(&mu);
            free(n);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    struct fk_behind *q = *qp;
    if (q->tail)
        q->tail->next = n;
    else
        q->head = n;
    q->tail = n;
    __atomic_add_fetch(&pending, 1, __ATOMIC_ACQ_REL);
    queued++;
    pthread_cond_broadcast(&moved);
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}

/* Until q (NULL: an empty queue) is empty; CUDA_ERROR_LAUNCH_TIMEOUT past
 * twice WOFAKE_WAIT_MS (the device thread drops a wait past one). */
CUresult fk_behind_drain(const struct fk_behind *q)
{
    uint64_t t0 = fk_now_ns(), limit = 2 * fk_wait_limit_ns();
    CUresult r = CUDA_SUCCESS;

    pthread_mutex_lock(&mu);
    while (q && q->head) {
        if (fk_now_ns() - t0 > limit) {
            r = CUDA_ERROR_LAUNCH_TIMEOUT;
            break;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 1000000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&moved, &mu, &ts);
    }
    pthread_mutex_unlock(&mu);
    return r;
}

FK_EXPORT uint64_t fakecuda_behind_queued(void)
{
    pthread_mutex_lock(&mu);
    uint64_t n = queued;
    pthread_mutex_unlock(&mu);
    return n;
}

static struct fk_behind *copyq; /* WOFAKE_COPY_QUEUE's */

bool fk_copy_queue_on(void)
{
    const char *v = getenv("WOFAKE_COPY_QUEUE");
    return v && strcmp(v, "1") == 0 && fk_behind_enabled();
}

bool fk_copy_queue_took(CUstream s, bool pt, const struct fk_capture *cap, struct fk_op *op,
                        CUresult *r)
{
    size_t n = op->type == FK_OP_COPY ? op->cp.n : op->set.n;
    if (!n || !fk_copy_queue_on() || (cap && !fk_capture_deferred(cap)))
        return false;
    struct fk_behind **sq = fk_stream_queue(s, pt);
    if (!sq) {
        *r = CUDA_ERROR_INVALID_HANDLE;
        return true;
    }
    pthread_mutex_lock(&mu);
    bool busy = copyq && copyq->head;
    pthread_mutex_unlock(&mu);
    *r = CUDA_SUCCESS;
    if (!fk_capture_deferred(cap) && !busy) { /* nothing to wait for: now */
        fk_op_copy_words(op);
        fk_op_release(op);
        return true;
    }
    CUevent reached = fk_event_queued(), copied = fk_event_queued();
    if (!reached || !copied) {
        fk_op_release(op);
        *r = CUDA_ERROR_OUT_OF_MEMORY;
        return true;
    }
    /* the fake's own events: one record each, seq 1 (fk_event_queued) */
    struct fk_item its[] = {{.kind = FK_ITEM_EVENT, .ev = reached, .value = 1},
                            {.kind = FK_ITEM_WAIT_EVENT, .ev = copied, .value = 1}};
    struct fk_item cps[] = {{.kind = FK_ITEM_WAIT_EVENT, .ev = reached, .value = 1},
                            {.kind = FK_ITEM_OP, .op = *op},
                            {.kind = FK_ITEM_EVENT, .ev = copied, .value = 1}};
    for (unsigned k = 0; k < 2 && *r == CUDA_SUCCESS; k++)
        *r = fk_behind_push(sq, &its[k]);
    for (unsigned k = 0; k < 3 && *r == CUDA_SUCCESS; k++)
        *r = fk_behind_push(&copyq, &cps[k]);
    return true;
}
