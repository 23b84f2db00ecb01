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
void fggml_ctx_free(struct ggml_context *ctx);
ggml_backend_buffer_t fggml_dummy_buffer(ggml_backend_buffer_type_t buft); /* size 0 */
void fggml_buffer_free(ggml_backend_buffer_t b);

#endif
