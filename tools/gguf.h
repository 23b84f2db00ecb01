/* tools/gguf.h: a GGUF file's header, read without the tensors' data:
 * each tensor's name, ggml type, shape and bytes, and the metadata a
 * placement plan needs (architecture, layers, experts, top-k). The names
 * are the ones llama.cpp's tensors carry and the ggml hook tags
 * (docs/llamacpp.md), so a policy can be matched against a model before
 * it is loaded. Versions 2 and 3 (little-endian); the GGUF spec is
 * ggml's docs/gguf.md. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define WO_GGUF_MAX_DIMS 4

struct wo_gguf_tensor {
    char *name;
    uint32_t type; /* ggml_type */
    uint32_t n_dims;
    uint64_t ne[WO_GGUF_MAX_DIMS]; /* elements along each dimension (1 past n_dims) */
    uint64_t offset;               /* of its data, from the data section's start */
    uint64_t bytes;                /* ggml_nbytes: the bytes llama.cpp's buffer holds */
};

struct wo_gguf {
    uint32_t version;
    char *arch;            /* general.architecture, or NULL */
    uint64_t block_count;  /* <arch>.block_count, 0: absent */
    uint64_t expert_count; /* <arch>.expert_count, 0: absent */
    uint64_t expert_used;  /* <arch>.expert_used_count, 0: absent */
    uint64_t alignment;    /* general.alignment (32 when absent) */
    uint64_t data_start;   /* file offset of the data section */
    uint64_t file_bytes;
    size_t n;
    struct wo_gguf_tensor *t;
};

/* Reads path's header. 0, or -errno with err (cap bytes) saying what was
 * wrong and where: the file, the byte offset, what was expected there
 * ("model.gguf: at byte 24: a key's length of 9000000000 bytes, expected at
 * most 65536"). A file cut short of a tensor's data is an error too. */
int wo_gguf_read(const char *path, struct wo_gguf *g, char *err, size_t cap);
/* The same from f (at its start), size bytes long; name for the messages. */
int wo_gguf_read_stream(FILE *f, uint64_t size, const char *name, struct wo_gguf *g, char *err,
                        size_t cap);
void wo_gguf_free(struct wo_gguf *g);

/* The ggml type's name ("q4_K", "bf16") and its block (elements) and block
 * bytes; false for a type this reader does not know. */
bool wo_gguf_type(uint32_t type, const char **name, uint32_t *block, uint32_t *block_bytes);
