/* preload/exports-dl.c: the exported dlsym and dlvsym. cuBLAS, cuBLASLt and
 * NCCL reach the driver only through them (their static CUDA runtimes
 * dlopen libcuda.so.1). Nothing but forwarding.
 *
 * dlsym(RTLD_NEXT, ...) means "the next definition after the caller": glibc
 * finds the caller from its own return address. So on x86-64 the exports are
 * a few instructions of assembly that, for RTLD_NEXT, jump (not call) into
 * libc's dlsym/dlvsym: the return address libc sees is the caller's, and the
 * answer is exactly glibc's (versions, IFUNCs, dlerror) with no work of ours.
 * Sanitizer runtimes preloaded before us use this path while they start, so
 * it must not touch instrumented code (wo_libc_dl_init is uninstrumented).
 * Every other handle goes to the C hook, which may substitute a wrapper. On
 * other architectures the C hook redoes the RTLD_NEXT search (resolve.c). */
#include <dlfcn.h>

#include "preload/hook.h"

#if defined(__x86_64__)
__asm__(".text\n"
        ".globl dlsym\n"
        ".type dlsym, @function\n"
        "dlsym:\n"
        "    endbr64\n"
        "    cmpq $-1, %rdi\n"
        "    jne wo_dlsym_c\n"
        "    movq wo_libc_dlsym_ptr(%rip), %rax\n"
        "    testq %rax, %rax\n"
        "    jz 1f\n"
        "    jmp *%rax\n"
        "1:  pushq %rdi\n"
        "    pushq %rsi\n"
        "    subq $8, %rsp\n"
        "    call wo_libc_dl_init\n"
        "    addq $8, %rsp\n"
        "    popq %rsi\n"
        "    popq %rdi\n"
        "    movq wo_libc_dlsym_ptr(%rip), %rax\n"
        "    testq %rax, %rax\n"
        "    jz wo_dlsym_c\n"
        "    jmp *%rax\n"
        ".size dlsym, .-dlsym\n"
        "\n"
        ".globl dlvsym\n"
        ".type dlvsym, @function\n"
        "dlvsym:\n"
        "    endbr64\n"
        "    cmpq $-1, %rdi\n"
        "    jne wo_dlvsym_c\n"
        "    movq wo_libc_dlvsym_ptr(%rip), %rax\n"
        "    testq %rax, %rax\n"
        "    jz 1f\n"
        "    jmp *%rax\n"
        "1:  pushq %rdi\n"
        "    pushq %rsi\n"
        "    pushq %rdx\n"
        "    call wo_libc_dl_init\n"
        "    popq %rdx\n"
        "    popq %rsi\n"
        "    popq %rdi\n"
        "    movq wo_libc_dlvsym_ptr(%rip), %rax\n"
        "    testq %rax, %rax\n"
        "    jz wo_dlvsym_c\n"
        "    jmp *%rax\n"
        ".size dlvsym, .-dlvsym\n");
#else
WO_EXPORT void *dlsym(void *restrict handle, const char *restrict name)
{
    return wo_h_dlsym(handle, name, __builtin_return_address(0));
}

WO_EXPORT void *dlvsym(void *restrict handle, const char *restrict name,
                       const char *restrict version)
{
    return wo_h_dlvsym(handle, name, version, __builtin_return_address(0));
}
#endif

/* Reached by a jump from the exports: the return address is the caller's. */
WO_RAW void *wo_dlsym_c(void *handle, const char *name)
{
    return wo_h_dlsym(handle, name, __builtin_return_address(0));
}

WO_RAW void *wo_dlvsym_c(void *handle, const char *name, const char *version)
{
    return wo_h_dlvsym(handle, name, version, __builtin_return_address(0));
}
