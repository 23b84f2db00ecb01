/* tests/ggml/real-ggml.c: the fake ggml's own calls (tests/ggml/fake-ggml.h)
 * over a real libggml-base.so, so that ggml-client runs the ggml hook in front
 * of ggml's own allocation code (ggml-alloc.c: the packing by the largest
 * buffer size, the multi buffer, the nested ggml_backend_buffer_set_usage)
 * instead of the fake's copy of it. Built only when meson's option ggml-real
 * names a llama.cpp (or ggml) tree whose libggml-base.so is built
 * (tests/ggml/real-ggml.sh does both; docs/llamacpp.md, "Tests").
 *
 * What stays the test's: the buffer types (a device one as ggml-cuda's:
 * "CUDA0", cudaMalloc, 128-byte alignment, no largest size, writes by
 * cudaMemcpyAsync on the per-thread stream then a sync; a host one as
 * ggml-cpu's: "CPU", malloc), the backend that ggml_backend_dev_init returns
 * (a token the client never uses), and the graph compute, which calls the
 * client's callback (fggml_set_compute) as the fake's does: the hook's
 * interposed ggml_backend_sched_graph_compute(_async) and
 * ggml_backend_dev_init find these through RTLD_NEXT, this library being
 * before libggml-base.so in the client's NEEDED list. Everything else the
 * hook and the client call (tensors, contexts, names, buffers, the
 * allocation, graphs and their nodes) is ggml's. */
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml-alloc.h"
#include "ggml-backend-impl.h"
#include "ggml-backend.h"
#include "ggml.h"
#include "real-buffers.h"

#define FGGML_EXPORT __attribute__((visibility("default")))

/* tests/ggml/fake-ggml.h's calls (that header declares ggml's functions
 * itself, ggml/ggml-abi.h, which ggml's own headers declare here) */
ggml_backend_buffer_type_t fggml_buft_device(void);
ggml_backend_buffer_type_t fggml_buft_host(void);
struct ggml_context *fggml_ctx_new(void);
struct ggml_tensor *fggml_new_tensor(struct ggml_context *ctx, const char *name, size_t nbytes);
void *fggml_data(const struct ggml_tensor *t);
ggml_backend_buffer_t fggml_tensor_buffer(const struct ggml_tensor *t);
void fggml_ctx_free(struct ggml_context *ctx);
ggml_backend_buffer_t fggml_dummy_buffer(ggml_backend_buffer_type_t buft);
void fggml_buffer_free(ggml_backend_buffer_t b);
struct ggml_tensor *fggml_node(const char *name, void *data, long long ne0, long long rows,
                               size_t elsize, bool contiguous);
struct ggml_cgraph *fggml_graph_new(void);
void fggml_graph_add(struct ggml_cgraph *g, struct ggml_tensor *t);
void fggml_graph_free(struct ggml_cgraph *g);
void fggml_set_compute(void (*fn)(struct ggml_cgraph *, void *), void *ud);

FGGML_EXPORT ggml_backend_buffer_type_t fggml_buft_device(void)
{
    return wofake_buft_device();
}

FGGML_EXPORT ggml_backend_buffer_type_t fggml_buft_host(void)
{
    return wofake_buft_host();
}

FGGML_EXPORT ggml_backend_buffer_t fggml_dummy_buffer(ggml_backend_buffer_type_t buft)
{
    return ggml_backend_buft_alloc_buffer(buft, 0);
}

FGGML_EXPORT void fggml_buffer_free(ggml_backend_buffer_t b)
{
    ggml_backend_buffer_free(b);
}

/* ---- contexts and tensors ---------------------------------------------- */

#define CTX_TENSORS 1024

static struct ggml_context *ctx_new(size_t tensors, size_t extra)
{
    struct ggml_init_params p = {
        .mem_size = tensors * ggml_tensor_overhead() + extra,
        .mem_buffer = NULL,
        .no_alloc = true,
    };
    return ggml_init(p);
}

FGGML_EXPORT struct ggml_context *fggml_ctx_new(void)
{
    return ctx_new(CTX_TENSORS, 0);
}

/* a weight as llama.cpp's loader makes one: named, no data until the buffer */
FGGML_EXPORT struct ggml_tensor *fggml_new_tensor(struct ggml_context *ctx, const char *name,
                                                  size_t nbytes)
{
    struct ggml_tensor *t = ggml_new_tensor_1d(ctx, GGML_TYPE_I8, (int64_t)nbytes);
    if (t)
        ggml_set_name(t, name);
    return t;
}

FGGML_EXPORT void *fggml_data(const struct ggml_tensor *t)
{
    return t->data;
}

FGGML_EXPORT ggml_backend_buffer_t fggml_tensor_buffer(const struct ggml_tensor *t)
{
    return t->buffer;
}

FGGML_EXPORT void fggml_ctx_free(struct ggml_context *ctx)
{
    ggml_free(ctx);
}

/* ---- graphs ----------------------------------------------------------------
 *
 * A graph and its nodes live in a context of their own, the newest graph's
 * (the client makes one graph at a time and its nodes right after it). */

#define GRAPH_NODES 256

struct graph_ctx {
    struct ggml_cgraph *g;
    struct ggml_context *ctx;
};
static struct graph_ctx graphs[8];
static struct ggml_context *newest;
/* the last contiguous node: a view of its first columns (the top-k of an
 * argsort) has its row stride */
static const void *last_data;
static size_t last_row;

FGGML_EXPORT struct ggml_cgraph *fggml_graph_new(void)
{
    struct ggml_context *ctx = ctx_new(GRAPH_NODES, ggml_graph_overhead_custom(GRAPH_NODES, false));
    if (!ctx)
        return NULL;
    for (size_t i = 0; i < sizeof(graphs) / sizeof(graphs[0]); i++)
        if (!graphs[i].g) {
            graphs[i].g = ggml_new_graph_custom(ctx, GRAPH_NODES, false);
            graphs[i].ctx = ctx;
            newest = ctx;
            return graphs[i].g;
        }
    ggml_free(ctx);
    return NULL;
}

FGGML_EXPORT struct ggml_tensor *fggml_node(const char *name, void *data, long long ne0,
                                            long long rows, size_t elsize, bool contiguous)
{
    enum ggml_type type = elsize == 8 ? GGML_TYPE_I64 : elsize == 2 ? GGML_TYPE_F16 : GGML_TYPE_I32;
    struct ggml_tensor *t;

    if (!newest || !(t = ggml_new_tensor_2d(newest, type, ne0, rows)))
        return NULL;
    ggml_set_name(t, name);
    t->data = data;
    if (contiguous) {
        last_data = data;
        last_row = t->nb[1];
    } else {
        /* the first ne0 columns of the wider rows before (or of rows one
         * element wider) */
        t->nb[1] = last_data == data && last_row > t->nb[1] ? last_row : t->nb[1] + elsize;
        t->nb[2] = t->nb[1] * (size_t)rows;
        t->nb[3] = t->nb[2];
    }
    return t;
}

FGGML_EXPORT void fggml_graph_add(struct ggml_cgraph *g, struct ggml_tensor *t)
{
    if (g && t)
        ggml_graph_add_node(g, t);
}

FGGML_EXPORT void fggml_graph_free(struct ggml_cgraph *g)
{
    for (size_t i = 0; i < sizeof(graphs) / sizeof(graphs[0]); i++)
        if (graphs[i].g == g) {
            if (newest == graphs[i].ctx)
                newest = NULL;
            ggml_free(graphs[i].ctx);
            graphs[i].g = NULL;
            graphs[i].ctx = NULL;
        }
}

/* ---- the backend and the compute: the test's ----------------------------- */

static void (*compute_fn)(struct ggml_cgraph *, void *);
static void *compute_ud;

FGGML_EXPORT void fggml_set_compute(void (*fn)(struct ggml_cgraph *, void *), void *ud)
{
    compute_fn = fn;
    compute_ud = ud;
}

static int backend_token;

FGGML_EXPORT ggml_backend_t ggml_backend_dev_init(ggml_backend_dev_t device, const char *params)
{
    (void)device;
    (void)params;
    return (ggml_backend_t)&backend_token;
}

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
