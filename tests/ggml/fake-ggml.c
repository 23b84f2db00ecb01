/* tests/ggml/fake-ggml.c: a fake libggml-base.so for the ggml hook's CI
 * tests. It exports the functions of ggml/ggml-abi.h with ggml's signatures,
 * over a private tensor struct of its own (so a hook reading ggml's struct
 * offsets would read garbage), and a few fggml_* calls the test client
 * builds a "model" with. Device buffers come from cudaMalloc of the fake
 * runtime (tests/fake), so the preloaded shim sees them as it sees
 * ggml-cuda's; host buffers from malloc, as ggml-cpu's.
 *
 * Built twice: as libggml-base.so, and into ggml-client-static (the
 * functions linked into the executable, as a static llama.cpp build).
 *
 * WOFAKE_GGML_SKEW=NAME: ggml_get_data of tensor NAME answers 256 bytes past
 * its data, as a hook that guessed a wrong offset would see it: the client's
 * checks must then fail (tests/meson.build runs that case). */
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake-ggml.h"

#define ALIGN 128 /* ggml-cuda's buffer alignment */

struct ggml_backend_buffer_type {
    const char *name;
    bool host;
};

struct ggml_tensor {
    uint64_t magic; /* first, where ggml has its type: reading it as ggml's struct fails */
    char name[128];
    size_t nbytes;
    void *data;
    ggml_backend_buffer_t buffer;
    struct ggml_tensor *next;
    /* a graph node's shape (fggml_node): ne0 elements of elsize bytes a
     * row, rows rows; contiguous false for a view of the first ne0 columns */
    long long ne0, rows;
    size_t elsize;
    bool contiguous;
};

struct ggml_cgraph {
    struct ggml_tensor *nodes[256];
    int n;
};

struct ggml_context {
    struct ggml_tensor *first, *last;
};

struct ggml_backend_buffer {
    ggml_backend_buffer_type_t buft;
    void *base;
    size_t size;
    int usage;
    /* a multi buffer (ggml_backend_multi_buffer_alloc_buffer): its buffers */
    struct ggml_backend_buffer **subs;
    size_t nsubs;
};

static struct ggml_backend_buffer_type buft_cuda = {"CUDA0", false};
static struct ggml_backend_buffer_type buft_cpu = {"CPU", true};

FGGML_EXPORT ggml_backend_buffer_type_t fggml_buft_device(void)
{
    return &buft_cuda;
}
FGGML_EXPORT ggml_backend_buffer_type_t fggml_buft_host(void)
{
    return &buft_cpu;
}

FGGML_EXPORT struct ggml_context *fggml_ctx_new(void)
{
    return calloc(1, sizeof(struct ggml_context));
}

/* A tensor named name, of nbytes, in no context yet. */
static struct ggml_tensor *tensor_new(const char *name, size_t nbytes)
{
    struct ggml_tensor *t = calloc(1, sizeof(*t));
    if (!t)
        return NULL;
    t->magic = 0x66616b6567676d6cull;
    snprintf(t->name, sizeof(t->name), "%s", name);
    t->nbytes = nbytes;
    return t;
}

FGGML_EXPORT struct ggml_tensor *fggml_new_tensor(struct ggml_context *ctx, const char *name,
                                                  size_t nbytes)
{
    struct ggml_tensor *t = tensor_new(name, nbytes);
    if (!t)
        return NULL;
    if (ctx->last)
        ctx->last->next = t;
    else
        ctx->first = t;
    ctx->last = t;
    return t;
}

/* The true data pointer, whatever WOFAKE_GGML_SKEW says. */
FGGML_EXPORT void *fggml_data(const struct ggml_tensor *t)
{
    return t->data;
}

/* The buffer ggml put the tensor in (a multi buffer's own buffer). */
FGGML_EXPORT ggml_backend_buffer_t fggml_tensor_buffer(const struct ggml_tensor *t)
{
    return t->buffer;
}

FGGML_EXPORT void fggml_ctx_free(struct ggml_context *ctx)
{
    struct ggml_tensor *t = ctx->first;
    while (t) {
        struct ggml_tensor *n = t->next;
        free(t);
        t = n;
    }
    free(ctx);
}

/* ggml_backend_buft_alloc_buffer(buft, 0): the dummy buffer of a no_alloc
 * load (llama.cpp's common_fit_params measures a model that way first). */
FGGML_EXPORT ggml_backend_buffer_t fggml_dummy_buffer(ggml_backend_buffer_type_t buft)
{
    struct ggml_backend_buffer *b = calloc(1, sizeof(*b));
    if (b)
        b->buft = buft;
    return b;
}

FGGML_EXPORT void fggml_buffer_free(ggml_backend_buffer_t b)
{
    if (!b)
        return;
    for (size_t i = 0; i < b->nsubs; i++)
        fggml_buffer_free(b->subs[i]);
    if (b->subs)
        free(b->subs); /* a multi buffer has no memory of its own */
    else if (b->buft->host)
        free(b->base);
    else if (b->base)
        cudaFree(b->base);
    free(b);
}

FGGML_EXPORT struct ggml_tensor *ggml_get_first_tensor(const struct ggml_context *ctx)
{
    return ctx->first;
}

FGGML_EXPORT struct ggml_tensor *ggml_get_next_tensor(const struct ggml_context *ctx,
                                                      struct ggml_tensor *tensor)
{
    (void)ctx;
    return tensor->next;
}

FGGML_EXPORT const char *ggml_get_name(const struct ggml_tensor *tensor)
{
    return tensor->name;
}

FGGML_EXPORT void *ggml_get_data(const struct ggml_tensor *tensor)
{
    const char *skew = getenv("WOFAKE_GGML_SKEW");
    if (tensor->data && skew && strcmp(skew, tensor->name) == 0)
        return (char *)tensor->data + 256;
    return tensor->data;
}

FGGML_EXPORT size_t ggml_nbytes(const struct ggml_tensor *tensor)
{
    return tensor->nbytes;
}

FGGML_EXPORT void *ggml_backend_buffer_get_base(ggml_backend_buffer_t buffer)
{
    return buffer->base;
}
FGGML_EXPORT size_t ggml_backend_buffer_get_size(ggml_backend_buffer_t buffer)
{
    return buffer->size;
}
FGGML_EXPORT ggml_backend_buffer_type_t ggml_backend_buffer_get_type(ggml_backend_buffer_t buffer)
{
    return buffer->buft;
}
FGGML_EXPORT bool ggml_backend_buft_is_host(ggml_backend_buffer_type_t buft)
{
    return buft->host;
}
FGGML_EXPORT const char *ggml_backend_buft_name(ggml_backend_buffer_type_t buft)
{
    return buft->name;
}

FGGML_EXPORT size_t ggml_backend_buft_get_alloc_size(ggml_backend_buffer_type_t buft,
                                                     const struct ggml_tensor *tensor)
{
    (void)buft;
    return tensor->nbytes;
}
FGGML_EXPORT size_t ggml_backend_buft_get_alignment(ggml_backend_buffer_type_t buft)
{
    (void)buft;
    return ALIGN;
}
FGGML_EXPORT bool ggml_backend_buffer_is_multi_buffer(ggml_backend_buffer_t buffer)
{
    return buffer->subs != NULL;
}

static size_t padded(ggml_backend_buffer_type_t buft, const struct ggml_tensor *t)
{
    size_t a = ggml_backend_buft_get_alignment(buft);
    return (ggml_backend_buft_get_alloc_size(buft, t) + a - 1) / a * a;
}

/* ggml-alloc.c's alloc_tensor_range: a buffer of size for [first, last). */
static struct ggml_backend_buffer *alloc_range(struct ggml_tensor *first, struct ggml_tensor *last,
                                               ggml_backend_buffer_type_t buft, size_t size)
{
    struct ggml_backend_buffer *b = calloc(1, sizeof(*b));
    size_t off = 0;

    if (!b)
        return NULL;
    b->buft = buft;
    b->size = size;
    if (buft->host)
        b->base = aligned_alloc(ALIGN, size);
    else if (cudaMalloc(&b->base, size) != cudaSuccess)
        b->base = NULL;
    if (!b->base) {
        free(b);
        return NULL;
    }
    for (struct ggml_tensor *t = first; t != last; t = t->next) {
        if (t->data)
            continue;
        t->data = (char *)b->base + off;
        t->buffer = b;
        off += padded(buft, t);
    }
    return b;
}

/* ggml-alloc.c: the tensors of ctx without data, in context order, each at
 * an offset aligned to the buffer type's alignment, in one buffer; or, where
 * they pass the buffer type's largest allocation (asked through
 * ggml_backend_buft_get_max_size, an exported call the ggml hook
 * interposes; defined in fake-ggml-backend.c, as ggml's is in another
 * translation unit), in several: a new buffer begins where the next tensor
 * would pass it, and they are returned as one multi buffer. */
FGGML_EXPORT ggml_backend_buffer_t
ggml_backend_alloc_ctx_tensors_from_buft(struct ggml_context *ctx, ggml_backend_buffer_type_t buft)
{
    size_t max_size = ggml_backend_buft_get_max_size(buft), cur = 0, n = 0, total = 0;
    struct ggml_backend_buffer **subs = NULL, *b, *m;
    struct ggml_tensor *first = ctx->first;

    for (struct ggml_tensor *t = ctx->first;; t = t->next) {
        size_t this_size = t && !t->data ? padded(buft, t) : 0;
        if (cur > 0 && (!t || cur + this_size > max_size)) {
            struct ggml_backend_buffer **v = realloc(subs, (n + 1) * sizeof(*v));
            if (!v || !(b = alloc_range(first, t, buft, cur))) {
                free(v ? v : subs);
                return NULL; /* (ggml frees the ones before; a test never gets here) */
            }
            subs = v;
            subs[n++] = b;
            total += cur;
            first = t;
            cur = this_size;
        } else {
            cur += this_size;
        }
        if (!t)
            break;
    }
    if (n <= 1) {
        b = n ? subs[0] : NULL;
        free(subs);
        return b;
    }
    if (!(m = calloc(1, sizeof(*m)))) {
        free(subs);
        return NULL;
    }
    m->buft = buft;
    m->size = total;
    m->subs = subs;
    m->nsubs = n;
    return m;
}

/* A multi buffer's usage is its buffers', set through the exported call
 * (ggml_backend_multi_buffer_set_usage), which the hook sees too. */
FGGML_EXPORT void ggml_backend_buffer_set_usage(ggml_backend_buffer_t buffer,
                                                enum ggml_backend_buffer_usage usage)
{
    buffer->usage = usage;
    for (size_t i = 0; i < buffer->nsubs; i++)
        ggml_backend_buffer_set_usage(buffer->subs[i], usage);
}

FGGML_EXPORT void ggml_backend_tensor_set(struct ggml_tensor *tensor, const void *data,
                                          size_t offset, size_t size)
{
    if (tensor->buffer->buft->host)
        memcpy((char *)tensor->data + offset, data, size);
    else
        (void)cudaMemcpy((char *)tensor->data + offset, data, size, cudaMemcpyHostToDevice);
}

FGGML_EXPORT void ggml_backend_tensor_set_async(ggml_backend_t backend, struct ggml_tensor *tensor,
                                                const void *data, size_t offset, size_t size)
{
    (void)backend;
    ggml_backend_tensor_set(tensor, data, offset, size);
}

static int backend_dummy;

FGGML_EXPORT ggml_backend_t ggml_backend_dev_init(ggml_backend_dev_t device, const char *params)
{
    (void)device;
    (void)params;
    return (ggml_backend_t)&backend_dummy;
}

/* ---- graphs: nodes with a shape, computed by the client's callback ---------- */

FGGML_EXPORT struct ggml_tensor *fggml_node(const char *name, void *data, long long ne0,
                                            long long rows, size_t elsize, bool contiguous)
{
    struct ggml_tensor *t = tensor_new(name, (size_t)(ne0 * rows) * elsize);
    if (!t)
        return NULL;
    t->data = data;
    t->ne0 = ne0;
    t->rows = rows;
    t->elsize = elsize;
    t->contiguous = contiguous;
    return t;
}

FGGML_EXPORT struct ggml_cgraph *fggml_graph_new(void)
{
    return calloc(1, sizeof(struct ggml_cgraph));
}

FGGML_EXPORT void fggml_graph_add(struct ggml_cgraph *g, struct ggml_tensor *t)
{
    if (g->n < 256)
        g->nodes[g->n++] = t;
}

FGGML_EXPORT void fggml_graph_free(struct ggml_cgraph *g)
{
    for (int i = 0; g && i < g->n; i++)
        free(g->nodes[i]);
    free(g);
}

static void (*compute_fn)(struct ggml_cgraph *, void *);
static void *compute_ud;

FGGML_EXPORT void fggml_set_compute(void (*fn)(struct ggml_cgraph *, void *), void *ud)
{
    compute_fn = fn;
    compute_ud = ud;
}

FGGML_EXPORT int ggml_graph_n_nodes(struct ggml_cgraph *cgraph)
{
    return cgraph->n;
}

FGGML_EXPORT struct ggml_tensor *ggml_graph_node(struct ggml_cgraph *cgraph, int i)
{
    if (i < 0)
        i += cgraph->n;
    return i >= 0 && i < cgraph->n ? cgraph->nodes[i] : NULL;
}

FGGML_EXPORT long long ggml_nelements(const struct ggml_tensor *tensor)
{
    return tensor->ne0 * tensor->rows;
}

FGGML_EXPORT long long ggml_nrows(const struct ggml_tensor *tensor)
{
    return tensor->rows;
}

FGGML_EXPORT bool ggml_is_contiguous(const struct ggml_tensor *tensor)
{
    return tensor->contiguous;
}

FGGML_EXPORT size_t ggml_element_size(const struct ggml_tensor *tensor)
{
    return tensor->elsize;
}

/* The graph itself is the client's: its callback (fggml_set_compute)
 * launches the kernels, as ggml-cuda does inside the compute; without one
 * the client launches them after this. */
FGGML_EXPORT enum ggml_status ggml_backend_sched_graph_compute_async(ggml_backend_sched_t sched,
                                                                     struct ggml_cgraph *graph)
{
    (void)sched;
    if (compute_fn && graph)
        compute_fn(graph, compute_ud);
    return GGML_STATUS_SUCCESS;
}

FGGML_EXPORT enum ggml_status ggml_backend_sched_graph_compute(ggml_backend_sched_t sched,
                                                               struct ggml_cgraph *graph)
{
    return ggml_backend_sched_graph_compute_async(sched, graph);
}
