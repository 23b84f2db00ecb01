/* tests/ggml/fake-ggml-backend.c: the part of the fake libggml-base.so that
 * ggml keeps in ggml-backend.cpp, in a translation unit of its own as there:
 * ggml-alloc.c's call to it (fake-ggml.c's allocation) then goes through the
 * library's PLT, where the preloaded ggml hook comes first, whatever the
 * compiler (clang binds a call inside one translation unit directly). */
#include <stdint.h>

#include "fake-ggml.h"

/* no largest allocation (SIZE_MAX), as ggml-cuda's buffer type */
FGGML_EXPORT size_t ggml_backend_buft_get_max_size(ggml_backend_buffer_type_t buft)
{
    (void)buft;
    return SIZE_MAX;
}
