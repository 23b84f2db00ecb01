/* ggml/ggml-abi.h: the part of ggml's C ABI (ggml.h, ggml-alloc.h,
 * ggml-backend.h at llama.cpp 34af94cd) that the ggml hook interposes or
 * calls, written out so that neither the hook nor the test double in
 * tests/ggml needs ggml's headers. Types stay opaque: only pointers, sizes
 * and the two enums cross, so no struct layout of ggml is assumed. */
#ifndef WO_GGML_ABI_H
#define WO_GGML_ABI_H

#include <stdbool.h>
#include <stddef.h>

struct ggml_context;
struct ggml_tensor;
struct ggml_cgraph;
typedef struct ggml_backend_buffer *ggml_backend_buffer_t;
typedef struct ggml_backend_buffer_type *ggml_backend_buffer_type_t;
typedef struct ggml_backend *ggml_backend_t;
typedef struct ggml_backend_device *ggml_backend_dev_t;
typedef struct ggml_backend_sched *ggml_backend_sched_t;

/* ggml-backend.h; an int in the C ABI */
enum ggml_backend_buffer_usage {
    GGML_BACKEND_BUFFER_USAGE_ANY = 0,
    GGML_BACKEND_BUFFER_USAGE_WEIGHTS = 1,
    GGML_BACKEND_BUFFER_USAGE_COMPUTE = 2,
};
/* ggml.h; only passed back */
enum ggml_status {
    GGML_STATUS_ALLOC_FAILED = -2,
    GGML_STATUS_FAILED = -1,
    GGML_STATUS_SUCCESS = 0,
    GGML_STATUS_ABORTED = 1,
};

/* interposed by libwoffload-ggml.so */
ggml_backend_buffer_t ggml_backend_alloc_ctx_tensors_from_buft(struct ggml_context *ctx,
                                                               ggml_backend_buffer_type_t buft);
void ggml_backend_buffer_set_usage(ggml_backend_buffer_t buffer,
                                   enum ggml_backend_buffer_usage usage);
void ggml_backend_tensor_set(struct ggml_tensor *tensor, const void *data, size_t offset,
                             size_t size);
void ggml_backend_tensor_set_async(ggml_backend_t backend, struct ggml_tensor *tensor,
                                   const void *data, size_t offset, size_t size);
ggml_backend_t ggml_backend_dev_init(ggml_backend_dev_t device, const char *params);
enum ggml_status ggml_backend_sched_graph_compute(ggml_backend_sched_t sched,
                                                  struct ggml_cgraph *graph);
enum ggml_status ggml_backend_sched_graph_compute_async(ggml_backend_sched_t sched,
                                                        struct ggml_cgraph *graph);
size_t ggml_backend_buft_get_max_size(ggml_backend_buffer_type_t buft);

/* accessors the hook calls */
struct ggml_tensor *ggml_get_first_tensor(const struct ggml_context *ctx);
struct ggml_tensor *ggml_get_next_tensor(const struct ggml_context *ctx,
                                         struct ggml_tensor *tensor);
const char *ggml_get_name(const struct ggml_tensor *tensor);
void *ggml_get_data(const struct ggml_tensor *tensor);
size_t ggml_nbytes(const struct ggml_tensor *tensor);
void *ggml_backend_buffer_get_base(ggml_backend_buffer_t buffer);
size_t ggml_backend_buffer_get_size(ggml_backend_buffer_t buffer);
ggml_backend_buffer_type_t ggml_backend_buffer_get_type(ggml_backend_buffer_t buffer);
bool ggml_backend_buft_is_host(ggml_backend_buffer_type_t buft);
const char *ggml_backend_buft_name(ggml_backend_buffer_type_t buft);
/* ... for the model buffer split by tensor (ggml-backend.h; the last in
 * ggml-backend-impl.h, exported) */
size_t ggml_backend_buft_get_alloc_size(ggml_backend_buffer_type_t buft,
                                        const struct ggml_tensor *tensor);
size_t ggml_backend_buft_get_alignment(ggml_backend_buffer_type_t buft);
bool ggml_backend_buffer_is_multi_buffer(ggml_backend_buffer_t buffer);
/* ... and for the picks (ggml.h) */
int ggml_graph_n_nodes(struct ggml_cgraph *cgraph);
struct ggml_tensor *ggml_graph_node(struct ggml_cgraph *cgraph, int i);
long long ggml_nelements(const struct ggml_tensor *tensor); /* int64_t in ggml.h */
long long ggml_nrows(const struct ggml_tensor *tensor);
bool ggml_is_contiguous(const struct ggml_tensor *tensor);
size_t ggml_element_size(const struct ggml_tensor *tensor);

#endif /* WO_GGML_ABI_H */
