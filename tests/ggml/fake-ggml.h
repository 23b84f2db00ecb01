/* tests/ggml/fake-ggml.h: the fake libggml-base.so's own calls, beside the
 * ggml functions of ggml/ggml-abi.h it exports (fake-ggml.c). */
#ifndef WO_FAKE_GGML_H
#define WO_FAKE_GGML_H

#include "ggml-abi.h"

#define FGGML_EXPORT __attribute__((visibility("default")))

ggml_backend_buffer_type_t fggml_buft_device(void); /* "CUDA0", cudaMalloc */
ggml_backend_buffer_type_t fggml_buft_host(void);   /* "CPU", malloc */
struct ggml_context *fggml_ctx_new(void);
struct ggml_tensor *fggml_new_tensor(struct ggml_context *ctx, const char *name, size_t nbytes);
void *fggml_data(const struct ggml_tensor *t);
ggml_backend_buffer_t fggml_tensor_buffer(const struct ggml_tensor *t);
void fggml_ctx_free(struct ggml_context *ctx);
ggml_backend_buffer_t fggml_dummy_buffer(ggml_backend_buffer_type_t buft); /* size 0 */
void fggml_buffer_free(ggml_backend_buffer_t b);
/* a graph node: ne0 x rows elements of elsize bytes at data (a view of the
 * first ne0 columns of a wider tensor when not contiguous) */
struct ggml_tensor *fggml_node(const char *name, void *data, long long ne0, long long rows,
                               size_t elsize, bool contiguous);
struct ggml_cgraph *fggml_graph_new(void);
void fggml_graph_add(struct ggml_cgraph *g, struct ggml_tensor *t); /* the graph frees it */
void fggml_graph_free(struct ggml_cgraph *g);
/* ggml_backend_sched_graph_compute(_async) calls fn(graph, ud) */
void fggml_set_compute(void (*fn)(struct ggml_cgraph *, void *), void *ud);

#endif
