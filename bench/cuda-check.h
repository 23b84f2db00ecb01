// bench/cuda-check.h: CK(call) and CR(call), the error checks of the
// stand-alone CUDA probes in bench/ (each built by itself with nvcc): a
// failing driver (CK) or runtime (CR) call prints the probe's file, the
// line, the call and the error, and exits 1.
#pragma once

#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>

#define CK(x)                                                                                     \
    do {                                                                                          \
        CUresult r_ = (x);                                                                        \
        if (r_ != CUDA_SUCCESS) {                                                                 \
            const char *s_;                                                                       \
            cuGetErrorString(r_, &s_);                                                            \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, s_);                       \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)

#ifdef __CUDA_RUNTIME_H__
#define CR(x)                                                                                     \
    do {                                                                                          \
        cudaError_t e_ = (x);                                                                     \
        if (e_ != cudaSuccess) {                                                                  \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));   \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)
#endif
