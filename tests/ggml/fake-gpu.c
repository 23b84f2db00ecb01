/* tests/ggml/fake-gpu.c: libwofake-ggml-gpu.so, a GPU for an unmodified
 * llama.cpp built for the CPU. Preloaded (after the shim and the ggml hook,
 * or alone for the plain run), its constructor registers with ggml a backend
 * "WOFAKE" of one device of type GPU, "WOFAKE0":
 *   - its buffer type is real-buffers.c's device one: cudaMalloc of the fake
 *     CUDA runtime (tests/fake), which the preloaded shim serves and places
 *     as it does ggml-cuda's, copies by cudaMemcpyAsync;
 *   - its backend computes a graph with ggml's CPU backend: the fake
 *     driver's device memory, and whatever the shim made of it (pinned host
 *     memory, managed memory), is host memory the CPU reads in place;
 *   - it supports the ops the CPU device supports.
 * llama.cpp then offloads layers to it (llama_model_params.n_gpu_layers,
 * llama-server -ngl) as to a CUDA device: its model buffers are allocated by
 * ggml_backend_alloc_ctx_tensors_from_buft on a device buffer type, marked
 * WEIGHTS, written by ggml_backend_tensor_set, computed by the scheduler,
 * which the ggml hook interposes. What it does not give is a kernel launch:
 * the shim sees no launch of the model's graphs, so nothing is streamed or
 * copied picked; placement, names, the split by tensor, fit and the bytes
 * are llama.cpp's own path (tests/ggml/real-llama.sh; docs/llamacpp.md,
 * "Tests"). */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml-backend-impl.h"
#include "ggml-cpu.h"
#include "real-buffers.h"

static struct ggml_backend_device dev;
static struct ggml_backend_reg reg;

/* ---- the backend: the CPU backend's compute ------------------------------ */

static const char *be_name(ggml_backend_t b)
{
    (void)b;
    return "WOFAKE0";
}

static void be_free(ggml_backend_t b)
{
    ggml_backend_free(b->context);
    free(b);
}

static enum ggml_status be_compute(ggml_backend_t b, struct ggml_cgraph *g)
{
    return ggml_backend_graph_compute(b->context, g);
}

static ggml_guid_t guid(void)
{
    static ggml_guid g = {0x77, 0x6f, 0x66, 0x61, 0x6b, 0x65, 0x2d, 0x67,
                          0x70, 0x75, 0x2d, 0x62, 0x61, 0x63, 0x6b, 0x31};
    return &g;
}

static const struct ggml_backend_i be_i = {
    .get_name = be_name,
    .free = be_free,
    .graph_compute = be_compute,
};

/* ---- the device ----------------------------------------------------------- */

static const char *dev_name(ggml_backend_dev_t d)
{
    (void)d;
    return "WOFAKE0";
}

static const char *dev_description(ggml_backend_dev_t d)
{
    (void)d;
    return "the fake CUDA driver's memory, computed by the CPU backend";
}

static void dev_memory(ggml_backend_dev_t d, size_t *free_b, size_t *total)
{
    (void)d;
    if (cudaMemGetInfo(free_b, total) != cudaSuccess)
        *free_b = *total = 0;
}

static enum ggml_backend_dev_type dev_type(ggml_backend_dev_t d)
{
    (void)d;
    return GGML_BACKEND_DEVICE_TYPE_GPU;
}

static void dev_props(ggml_backend_dev_t d, struct ggml_backend_dev_props *p)
{
    memset(p, 0, sizeof(*p));
    p->name = dev_name(d);
    p->description = dev_description(d);
    dev_memory(d, &p->memory_free, &p->memory_total);
    p->type = GGML_BACKEND_DEVICE_TYPE_GPU;
}

static ggml_backend_t dev_init(ggml_backend_dev_t d, const char *params)
{
    ggml_backend_t b = calloc(1, sizeof(*b));
    (void)params;
    if (!b || !(b->context = ggml_backend_cpu_init())) {
        free(b);
        return NULL;
    }
    b->guid = guid();
    b->iface = be_i;
    b->device = d;
    return b;
}

static ggml_backend_buffer_type_t dev_buft(ggml_backend_dev_t d)
{
    (void)d;
    return wofake_buft_device();
}

/* what the CPU can compute (it reads the fake's device memory in place) */
static bool dev_supports_op(ggml_backend_dev_t d, const struct ggml_tensor *op)
{
    ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    (void)d;
    return cpu && ggml_backend_dev_supports_op(cpu, op);
}

static bool dev_supports_buft(ggml_backend_dev_t d, ggml_backend_buffer_type_t buft)
{
    (void)d;
    return buft == wofake_buft_device() || ggml_backend_buft_is_host(buft);
}

static const struct ggml_backend_device_i dev_i = {
    .get_name = dev_name,
    .get_description = dev_description,
    .get_memory = dev_memory,
    .get_type = dev_type,
    .get_props = dev_props,
    .init_backend = dev_init,
    .get_buffer_type = dev_buft,
    .supports_op = dev_supports_op,
    .supports_buft = dev_supports_buft,
};

/* ---- the registration ------------------------------------------------------ */

static const char *reg_name(ggml_backend_reg_t r)
{
    (void)r;
    return "WOFAKE";
}

static size_t reg_count(ggml_backend_reg_t r)
{
    (void)r;
    return 1;
}

static ggml_backend_dev_t reg_device(ggml_backend_reg_t r, size_t i)
{
    (void)r;
    return i == 0 ? &dev : NULL;
}

__attribute__((constructor)) static void wofake_gpu_register(void)
{
    dev = (struct ggml_backend_device){.iface = dev_i, .reg = &reg};
    reg = (struct ggml_backend_reg){
        .api_version = GGML_BACKEND_API_VERSION,
        .iface = {.get_name = reg_name, .get_device_count = reg_count, .get_device = reg_device},
    };
    wofake_buft_set_device(&dev);
    ggml_backend_register(&reg);
}
