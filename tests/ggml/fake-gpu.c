/* tests/ggml/fake-gpu.c: libwofake-ggml-gpu.so, a GPU for an unmodified
 * llama.cpp built for the CPU. Preloaded (after the shim and the ggml hook,
 * or alone for the plain run), its constructor registers with ggml a backend
 * "WOFAKE" of one device of type GPU, "WOFAKE0":
 *   - its buffer type is real-buffers.c's device one: cudaMalloc of the fake
 *     CUDA runtime (tests/fake), which the preloaded shim serves and places
 *     as it does ggml-cuda's, copies by cudaMemcpyAsync;
 *   - its backend computes a graph with ggml's CPU backend, one kernel
 *     launch a node (cudaLaunchKernel of the fake runtime, which the shim
 *     interposes as it does ggml-cuda's): the launch's parameters are the
 *     node's sources' and its own data pointers, and the kernel computes the
 *     node with the pointers it is given, so a launch the shim redirects
 *     (a staged or picked copy of a host expert tensor) reads the shim's
 *     buffer. The fake driver's device memory, and whatever the shim made
 *     of it (pinned host memory, managed memory), is host memory the CPU
 *     reads in place. WOFAKE_GPU_LAUNCH=0: the whole graph at once, no
 *     launch;
 *   - it supports the ops the CPU device supports.
 * llama.cpp then offloads layers to it (llama_model_params.n_gpu_layers,
 * llama-server -ngl) as to a CUDA device: its model buffers are allocated by
 * ggml_backend_alloc_ctx_tensors_from_buft on a device buffer type, marked
 * WEIGHTS, written by ggml_backend_tensor_set, computed by the scheduler,
 * which the ggml hook interposes (tests/ggml/real-llama.py; docs/llamacpp.md,
 * "Tests"). Unlike ggml-cuda: one launch a node, whatever the op (no fused
 * kernels, no CUDA graphs), its pointers the tensors' data as they are. */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>

#include "fakecuda.h"
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

/* ---- one launch a node -------------------------------------------------------
 *
 * The kernel's parameters: the launch (the graph, the CPU backend), the
 * node's index, then the data pointers of its first NSRC sources and its
 * own: the ones the shim may redirect. */

#define NSRC 4
#define NPARAMS (2 + NSRC + 1)

struct launch {
    ggml_backend_t cpu;
    struct ggml_cgraph *g, *one;
    enum ggml_status status;
};

static void k_node(void **params, const uint32_t grid[3], const uint32_t block[3])
{
    struct launch *l = *(struct launch **)params[0];
    int i = (int)*(int64_t *)params[1];
    struct ggml_tensor *node = ggml_graph_node(l->g, i);
    void *saved[NSRC], *own = node->data;

    (void)grid;
    (void)block;
    for (int k = 0; k < NSRC; k++)
        if (node->src[k]) {
            saved[k] = node->src[k]->data;
            node->src[k]->data = *(void **)params[2 + k];
        }
    node->data = *(void **)params[2 + NSRC];
    /* a graph of this node alone (its sources are data, not nodes) */
    ggml_graph_clear(l->one);
    ggml_graph_add_node(l->one, node);
    if (l->status == GGML_STATUS_SUCCESS)
        l->status = ggml_backend_graph_compute(l->cpu, l->one);
    node->data = own;
    for (int k = 0; k < NSRC; k++)
        if (node->src[k])
            node->src[k]->data = saved[k];
}

__attribute__((noinline)) static void stub_node(void) {}

static pthread_once_t once = PTHREAD_ONCE_INIT;
static bool launching;
/* the one-node graph a launch computes (llama.cpp computes from one thread) */
static struct ggml_cgraph *one;

static void register_kernel(void)
{
    const char *v = getenv("WOFAKE_GPU_LAUNCH");
    void *cu;
    CUfunction (*kernel)(const char *, int, const size_t *, fakecuda_kernel_fn);
    size_t sizes[NPARAMS];
    struct ggml_init_params p = {.mem_size = ggml_graph_overhead_custom(1, false) + 4096,
                                 .no_alloc = true};
    struct ggml_context *ctx;

    if (v && strcmp(v, "0") == 0)
        return;
    if (!(ctx = ggml_init(p)) || !(one = ggml_new_graph_custom(ctx, 1, false))) {
        fprintf(stderr, "wofake-gpu: no one-node graph: whole graphs, no launch\n");
        return;
    }
    (void)cudaFree(NULL); /* the runtime loads the driver */
    cu = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    *(void **)&kernel = cu ? dlsym(cu, "fakecuda_kernel") : NULL;
    for (int k = 0; k < NPARAMS; k++)
        sizes[k] = 8;
    if (!kernel || fakecudart_register((const void *)stub_node,
                                       kernel("wofake_ggml_node", NPARAMS, sizes, k_node)) != 0) {
        fprintf(stderr, "wofake-gpu: the node kernel could not be registered: whole graphs, "
                        "no launch\n");
        return;
    }
    launching = true;
}

static enum ggml_status be_compute(ggml_backend_t b, struct ggml_cgraph *g)
{
    struct launch l, *lp = &l;

    pthread_once(&once, register_kernel);
    l = (struct launch){.cpu = b->context, .g = g, .one = one, .status = GGML_STATUS_SUCCESS};
    if (!launching)
        return ggml_backend_graph_compute(b->context, g);
    for (int i = 0; i < ggml_graph_n_nodes(g); i++) {
        struct ggml_tensor *node = ggml_graph_node(g, i);
        int64_t ix = i;
        void *ptr[NSRC + 1];
        void *args[NPARAMS] = {&lp, &ix};

        for (int k = 0; k < NSRC; k++) {
            ptr[k] = node->src[k] ? node->src[k]->data : NULL;
            args[2 + k] = &ptr[k];
        }
        ptr[NSRC] = node->data;
        args[2 + NSRC] = &ptr[NSRC];
        if (cudaLaunchKernel((const void *)stub_node, (dim3){1, 1, 1}, (dim3){1, 1, 1}, args, 0,
                             NULL) != cudaSuccess)
            return GGML_STATUS_FAILED;
    }
    return cudaDeviceSynchronize() == cudaSuccess ? l.status : GGML_STATUS_FAILED;
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
