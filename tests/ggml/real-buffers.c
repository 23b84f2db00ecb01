/* tests/ggml/real-buffers.c: the buffer types of real-buffers.h. One buffer
 * interface for both: a host buffer's bytes are copied by the CPU, a device
 * buffer's by CUDA (the fake runtime, which the preloaded shim sees as it
 * sees ggml-cuda's). */
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml-backend-impl.h"
#include "real-buffers.h"

#define ALIGN 128 /* ggml-cuda's buffer alignment */

static struct ggml_backend_buffer_type buft_cuda, buft_cpu;

static bool on_host(ggml_backend_buffer_t b)
{
    return b->buft == &buft_cpu;
}

static void *base(ggml_backend_buffer_t b)
{
    return b->context;
}

static void release(ggml_backend_buffer_t b)
{
    if (on_host(b))
        free(b->context);
    else
        (void)cudaFree(b->context);
}

/* ggml-cuda's set_tensor and get_tensor: an async copy on the per-thread
 * stream, then a sync */
static void copy(ggml_backend_buffer_t b, void *dst, const void *src, size_t size,
                 enum cudaMemcpyKind kind, const char *what)
{
    if (on_host(b))
        memcpy(dst, src, size);
    else if (cudaMemcpyAsync(dst, src, size, kind, cudaStreamPerThread) != cudaSuccess ||
             cudaStreamSynchronize(cudaStreamPerThread) != cudaSuccess)
        fprintf(stderr, "real-ggml: copying %s failed\n", what);
}

static void set_tensor(ggml_backend_buffer_t b, struct ggml_tensor *t, const void *data, size_t off,
                       size_t size)
{
    copy(b, (char *)t->data + off, data, size, cudaMemcpyHostToDevice, t->name);
}

static void get_tensor(ggml_backend_buffer_t b, const struct ggml_tensor *t, void *data, size_t off,
                       size_t size)
{
    copy(b, data, (const char *)t->data + off, size, cudaMemcpyDeviceToHost, t->name);
}

static void fill(ggml_backend_buffer_t b, void *p, uint8_t v, size_t size)
{
    if (on_host(b))
        memset(p, v, size);
    else
        (void)cudaMemset(p, v, size);
}

static void memset_tensor(ggml_backend_buffer_t b, struct ggml_tensor *t, uint8_t v, size_t off,
                          size_t size)
{
    fill(b, (char *)t->data + off, v, size);
}

static void clear(ggml_backend_buffer_t b, uint8_t v)
{
    fill(b, b->context, v, b->size);
}

static const struct ggml_backend_buffer_i buffer_i = {
    .free_buffer = release,
    .get_base = base,
    .memset_tensor = memset_tensor,
    .set_tensor = set_tensor,
    .get_tensor = get_tensor,
    .clear = clear,
};

static const char *buft_name(ggml_backend_buffer_type_t t)
{
    return t->context;
}

static ggml_backend_buffer_t alloc(ggml_backend_buffer_type_t t, size_t size)
{
    void *p = NULL;

    if (t == &buft_cpu)
        p = aligned_alloc(ALIGN, (size + ALIGN - 1) / ALIGN * ALIGN + ALIGN);
    else if (cudaMalloc(&p, size ? size : 1) != cudaSuccess)
        p = NULL;
    return p ? ggml_backend_buffer_init(t, buffer_i, p, size) : NULL;
}

static size_t alignment(ggml_backend_buffer_type_t t)
{
    (void)t;
    return ALIGN;
}

static bool is_host(ggml_backend_buffer_type_t t)
{
    return t == &buft_cpu;
}

/* get_max_size and get_alloc_size left out: ggml's defaults (SIZE_MAX,
 * ggml_nbytes), as ggml-cuda's for unquantized tensors */
#define BUFT(name)                                                                                 \
    {                                                                                              \
        .iface = {.get_name = buft_name,                                                           \
                  .alloc_buffer = alloc,                                                           \
                  .get_alignment = alignment,                                                      \
                  .is_host = is_host},                                                             \
        .context = (void *)(name),                                                                 \
    }
static struct ggml_backend_buffer_type buft_cuda = BUFT("CUDA0"), buft_cpu = BUFT("CPU");

ggml_backend_buffer_type_t wofake_buft_device(void)
{
    return &buft_cuda;
}

ggml_backend_buffer_type_t wofake_buft_host(void)
{
    return &buft_cpu;
}

void wofake_buft_set_device(ggml_backend_dev_t dev)
{
    buft_cuda.device = dev;
}
