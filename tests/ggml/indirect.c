/* A library between a program and libggml-base.so, as llama.cpp's
 * libllama-batched-bench-impl.so stands between llama-batched-bench and
 * libllama.so: woffload-run must find ggml through it (tests/test-launcher.py).
 * Built only to be read; nothing runs it. */
#include <stddef.h>

struct ggml_tensor;
const char *ggml_get_name(const struct ggml_tensor *tensor);
__attribute__((visibility("default"))) const char *
wo_indirect_name(const struct ggml_tensor *tensor);

const char *wo_indirect_name(const struct ggml_tensor *tensor)
{
    return ggml_get_name(tensor);
}
