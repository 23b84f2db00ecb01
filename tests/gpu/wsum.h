/* tests/gpu/wsum.h: the position-weighted checksum kernel the GPU tests read
 * memory with (PTX, loaded with cuModuleLoadData: no nvcc), its host
 * reference, and its stand-in for the fake driver of tests/fake (which runs
 * kernels as host functions registered by name). Included by one test
 * program each; every definition is static. */
#ifndef WO_TESTS_GPU_WSUM_H
#define WO_TESTS_GPU_WSUM_H

#include <stddef.h>
#include <stdint.h>

#include <cuda.h>

static const char ptx[] =
    ".version 7.8\n"
    ".target sm_80\n"
    ".address_size 64\n"
    "\n"
    "// out += sum over words i of (p[i] ^ (i * 0x9E3779B97F4A7C15)), 16-byte loads,\n"
    "// grid-stride; nwords even.\n"
    ".visible .entry wsum(.param .u64 p_ptr, .param .u64 p_n, .param .u64 p_out)\n"
    "{\n"
    "    .reg .pred %p<2>;\n"
    "    .reg .b64 %rd<20>;\n"
    "    .reg .b32 %r<6>;\n"
    "    ld.param.u64 %rd1, [p_ptr];\n"
    "    ld.param.u64 %rd2, [p_n];\n"
    "    ld.param.u64 %rd3, [p_out];\n"
    "    cvta.to.global.u64 %rd1, %rd1;\n"
    "    cvta.to.global.u64 %rd3, %rd3;\n"
    "    mov.u32 %r1, %ctaid.x;\n"
    "    mov.u32 %r2, %ntid.x;\n"
    "    mov.u32 %r3, %tid.x;\n"
    "    mov.u32 %r4, %nctaid.x;\n"
    "    mul.wide.u32 %rd4, %r1, %r2;\n"
    "    cvt.u64.u32 %rd5, %r3;\n"
    "    add.u64 %rd4, %rd4, %rd5;\n"
    "    mul.wide.u32 %rd6, %r4, %r2;\n"
    "    shr.u64 %rd7, %rd2, 1;\n"
    "    mov.u64 %rd8, 0;\n"
    "    mov.u64 %rd15, 0x9E3779B97F4A7C15;\n"
    "LOOP:\n"
    "    setp.ge.u64 %p1, %rd4, %rd7;\n"
    "    @%p1 bra DONE;\n"
    "    shl.b64 %rd9, %rd4, 4;\n"
    "    add.u64 %rd10, %rd1, %rd9;\n"
    "    ld.global.v2.u64 {%rd11, %rd12}, [%rd10];\n"
    "    shl.b64 %rd13, %rd4, 1;\n"
    "    mul.lo.u64 %rd14, %rd13, %rd15;\n"
    "    xor.b64 %rd11, %rd11, %rd14;\n"
    "    add.u64 %rd14, %rd14, %rd15;\n"
    "    xor.b64 %rd12, %rd12, %rd14;\n"
    "    add.u64 %rd8, %rd8, %rd11;\n"
    "    add.u64 %rd8, %rd8, %rd12;\n"
    "    add.u64 %rd4, %rd4, %rd6;\n"
    "    bra LOOP;\n"
    "DONE:\n"
    "    red.global.add.u64 [%rd3], %rd8;\n"
    "    ret;\n"
    "}\n";

/* The fake driver (tests/fake) runs kernels as host functions registered by
 * name; this is wsum's, so CI runs this whole program without a GPU. */
__attribute__((unused)) static void wsum_host(void **params, const uint32_t g[3], const uint32_t b[3])
{
    const uint64_t *p = (const uint64_t *)(uintptr_t)*(CUdeviceptr *)params[0];
    uint64_t n = *(uint64_t *)params[1];
    uint64_t *out = (uint64_t *)(uintptr_t)*(CUdeviceptr *)params[2];
    const uint64_t gold = UINT64_C(0x9E3779B97F4A7C15);
    uint64_t s = 0;

    (void)g;
    (void)b;
    for (uint64_t i = 0; i < n; i++)
        s += p[i] ^ (i * gold);
    *out += s;
}

/* The checksum the kernel computes, on the host. */
__attribute__((unused)) static uint64_t host_sum(const uint64_t *w, size_t nwords)
{
    const uint64_t g = UINT64_C(0x9E3779B97F4A7C15);
    uint64_t s = 0;

    for (size_t i = 0; i < nwords; i++)
        s += w[i] ^ (i * g);
    return s;
}

/* The tests' random data: xorshift64, one state per stream of numbers. */
__attribute__((unused)) static uint64_t xorshift(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

__attribute__((unused)) static void fill_random(uint64_t *w, size_t nwords, uint64_t seed)
{
    uint64_t s = seed | 1;

    for (size_t i = 0; i < nwords; i++)
        w[i] = xorshift(&s);
}

#endif /* WO_TESTS_GPU_WSUM_H */
