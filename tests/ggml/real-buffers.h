/* tests/ggml/real-buffers.h: ggml buffer types over the fake CUDA runtime
 * (tests/fake), for the tests that put a real ggml in front of the ggml hook
 * (real-ggml.c, fake-gpu.c): a device one as ggml-cuda's and a host one as
 * ggml-cpu's. */
#pragma once

#include "ggml-backend.h"

/* "CUDA0": cudaMalloc, 128-byte alignment, no largest size, writes and reads
 * by cudaMemcpyAsync on the per-thread stream then a sync, as ggml-cuda's */
ggml_backend_buffer_type_t wofake_buft_device(void);
/* "CPU": malloc, is_host */
ggml_backend_buffer_type_t wofake_buft_host(void);
/* the device buffer type's device (ggml_backend_buft_get_device): NULL
 * until set (fake-gpu.c sets its device) */
void wofake_buft_set_device(ggml_backend_dev_t dev);
