// bench/cuda-check.h: CK(call), the one error check of the stand-alone
// CUDA probes in bench/ (each built by itself with nvcc): a failing driver
// call prints the probe's file, the call, the error and the line, and
// exits 1.
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
