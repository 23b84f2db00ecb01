// uvm/stream-copy.cu: the staging copy the streaming executor (uvm/stream.c)
// runs on its copy stream when the source is managed memory advised to the
// host: the GPU reads the pages in place over PCIe (~50 GB/s) where
// cuMemcpyAsync from the same memory moves 7-9 GB/s
// (bench/results/stream-mechanisms-20261125-h100-kernel-copy.txt). The shim
// is built without nvcc: uvm/stream-copy-ptx.h holds this file's PTX,
// regenerated with
//   nvcc -ptx -arch=compute_75 -o /tmp/sc.ptx uvm/stream-copy.cu &&
//   python3 uvm/ptx2h.py /tmp/sc.ptx > uvm/stream-copy-ptx.h
#include <stdint.h>

extern "C" __global__ void wo_stream_copy(unsigned char *dst, const unsigned char *src,
                                          unsigned long long n)
{
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;

    if ((((uintptr_t)dst | (uintptr_t)src) & 15) == 0) {
        unsigned long long n16 = n / 16;
        uint4 *d = (uint4 *)dst;
        const uint4 *s = (const uint4 *)src;
        for (unsigned long long k = i; k < n16; k += step)
            d[k] = s[k];
        for (unsigned long long k = n16 * 16 + i; k < n; k += step)
            dst[k] = src[k];
    } else {
        for (unsigned long long k = i; k < n; k += step)
            dst[k] = src[k];
    }
}
