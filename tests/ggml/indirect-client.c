/* A program that needs ggml only through a library of its own (indirect.c). */
#include <stddef.h>

struct ggml_tensor;
const char *wo_indirect_name(const struct ggml_tensor *tensor);

int main(int argc, char **argv)
{
    (void)argv;
    return argc > 99 && wo_indirect_name(NULL) != NULL;
}
