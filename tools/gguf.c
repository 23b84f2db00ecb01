/* tools/gguf.c: see gguf.h. Reads only what the header says, with every
 * length and count bounded before it is used: a corrupt or hostile file
 * gets an error naming the byte, never a crash or a huge allocation. */
#include "tools/gguf.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/macro.h"

#define MAX_KEY 65536u         /* a key's bytes */
#define MAX_STRING (64u << 20) /* a string value's bytes */
#define MAX_TENSORS (1u << 20) /* tensors in one file */
#define MAX_KV (1u << 20)      /* metadata pairs */
#define MAX_ARRAY_DEPTH 4      /* arrays of arrays */

/* ggml_type: name, elements a block, bytes a block (ggml's type traits;
 * 0 bytes: removed from GGUF files, or not a type) */
static const struct {
    const char *name;
    uint32_t block, bytes;
} types[] = {
    [0] = {"f32", 1, 4},         [1] = {"f16", 1, 2},         [2] = {"q4_0", 32, 18},
    [3] = {"q4_1", 32, 20},      [6] = {"q5_0", 32, 22},      [7] = {"q5_1", 32, 24},
    [8] = {"q8_0", 32, 34},      [9] = {"q8_1", 32, 36},      [10] = {"q2_K", 256, 84},
    [11] = {"q3_K", 256, 110},   [12] = {"q4_K", 256, 144},   [13] = {"q5_K", 256, 176},
    [14] = {"q6_K", 256, 210},   [15] = {"q8_K", 256, 292},   [16] = {"iq2_xxs", 256, 66},
    [17] = {"iq2_xs", 256, 74},  [18] = {"iq3_xxs", 256, 98}, [19] = {"iq1_s", 256, 50},
    [20] = {"iq4_nl", 32, 18},   [21] = {"iq3_s", 256, 110},  [22] = {"iq2_s", 256, 82},
    [23] = {"iq4_xs", 256, 136}, [24] = {"i8", 1, 1},         [25] = {"i16", 1, 2},
    [26] = {"i32", 1, 4},        [27] = {"i64", 1, 8},        [28] = {"f64", 1, 8},
    [29] = {"iq1_m", 256, 56},   [30] = {"bf16", 1, 2},       [34] = {"tq1_0", 256, 54},
    [35] = {"tq2_0", 256, 66},   [39] = {"mxfp4", 32, 17},    [40] = {"nvfp4", 64, 36},
    [41] = {"q1_0", 128, 18},    [42] = {"q2_0", 64, 18},
};

bool wo_gguf_type(uint32_t type, const char **name, uint32_t *block, uint32_t *block_bytes)
{
    if (type >= sizeof(types) / sizeof(types[0]) || !types[type].bytes)
        return false;
    if (name)
        *name = types[type].name;
    if (block)
        *block = types[type].block;
    if (block_bytes)
        *block_bytes = types[type].bytes;
    return true;
}

/* ---- reading ---------------------------------------------------------------- */

struct rd {
    FILE *f;
    const char *path;
    uint64_t at, size;
    char *err;
    size_t cap;
};

static int fail(struct rd *r, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(struct rd *r, int code, const char *fmt, ...)
{
    va_list ap;
    int n = snprintf(r->err, r->cap, "%s: at byte %" PRIu64 ": ", r->path, r->at);

    if (n >= 0 && (size_t)n < r->cap) {
        va_start(ap, fmt);
        vsnprintf(r->err + n, r->cap - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return code;
}

static int get(struct rd *r, void *p, size_t n, const char *what)
{
    if (n > r->size - WO_MIN(r->at, r->size) || fread(p, 1, n, r->f) != n)
        return fail(r, -EINVAL, "the file ends (at %" PRIu64 " bytes) inside %s", r->size, what);
    r->at += n;
    return 0;
}

static int skip(struct rd *r, uint64_t n, const char *what)
{
    if (n > r->size - WO_MIN(r->at, r->size))
        return fail(r, -EINVAL, "the file ends (at %" PRIu64 " bytes) inside %s", r->size, what);
    if (fseeko(r->f, (off_t)n, SEEK_CUR) != 0)
        return fail(r, -errno, "cannot seek past %s: %s", what, strerror(errno));
    r->at += n;
    return 0;
}

static int u32(struct rd *r, uint32_t *v, const char *what)
{
    return get(r, v, sizeof(*v), what);
}

static int u64(struct rd *r, uint64_t *v, const char *what)
{
    return get(r, v, sizeof(*v), what);
}

/* A string: its length, then its bytes (into *out, NUL-terminated, when out). */
static int str(struct rd *r, uint64_t max, char **out, const char *what)
{
    uint64_t len;
    int ret = u64(r, &len, what);

    if (ret)
        return ret;
    if (len > max)
        return fail(r, -EINVAL, "%s of %" PRIu64 " bytes, expected at most %" PRIu64, what, len,
                    max);
    if (!out)
        return skip(r, len, what);
    if (len > r->size - WO_MIN(r->at, r->size)) /* before any allocation */
        return fail(r, -EINVAL, "the file ends (at %" PRIu64 " bytes) inside %s", r->size, what);
    if (!(*out = malloc(len + 1)))
        return fail(r, -ENOMEM, "no memory for %s", what);
    if ((ret = get(r, *out, len, what))) {
        free(*out);
        *out = NULL;
        return ret;
    }
    (*out)[len] = 0;
    return 0;
}

enum {
    V_U8,
    V_I8,
    V_U16,
    V_I16,
    V_U32,
    V_I32,
    V_F32,
    V_BOOL,
    V_STRING,
    V_ARRAY,
    V_U64,
    V_I64,
    V_F64,
};

static uint64_t scalar_bytes(uint32_t type)
{
    switch (type) {
    case V_U8:
    case V_I8:
    case V_BOOL:
        return 1;
    case V_U16:
    case V_I16:
        return 2;
    case V_U32:
    case V_I32:
    case V_F32:
        return 4;
    case V_U64:
    case V_I64:
    case V_F64:
        return 8;
    default:
        return 0;
    }
}

/* One value of type; an unsigned integer's value into *num (when num). */
static int value(struct rd *r, uint32_t type, uint64_t *num, char **s, int depth)
{
    uint64_t n = scalar_bytes(type);

    if (n) {
        uint64_t v = 0;
        int ret = get(r, &v, (size_t)n, "a value");
        if (!ret && num &&
            (type == V_U8 || type == V_U16 || type == V_U32 || type == V_U64 || type == V_I32 ||
             type == V_I64))
            *num = (type == V_I32 && (int32_t)v < 0) || (type == V_I64 && (int64_t)v < 0) ? 0 : v;
        return ret;
    }
    if (type == V_STRING)
        return str(r, MAX_STRING, s, "a string value");
    if (type == V_ARRAY) {
        uint32_t et;
        uint64_t count;
        int ret;
        if (depth >= MAX_ARRAY_DEPTH)
            return fail(r, -EINVAL, "arrays nested more than %d deep", MAX_ARRAY_DEPTH);
        if ((ret = u32(r, &et, "an array's type")) || (ret = u64(r, &count, "an array's length")))
            return ret;
        if ((n = scalar_bytes(et))) {
            if (count > (r->size - r->at) / n)
                return fail(r, -EINVAL,
                            "an array of %" PRIu64 " values of %" PRIu64
                            " bytes, past the file's end at %" PRIu64,
                            count, n, r->size);
            return skip(r, count * n, "an array");
        }
        if (et != V_STRING && et != V_ARRAY)
            return fail(r, -EINVAL, "an array of type %" PRIu32 ", expected 0-12", et);
        for (uint64_t i = 0; i < count; i++)
            if ((ret = value(r, et, NULL, NULL, depth + 1)))
                return ret;
        return 0;
    }
    return fail(r, -EINVAL, "a value of type %" PRIu32 ", expected 0-12", type);
}

/* key == "<arch>.suffix" */
static bool arch_key(const char *key, const char *arch, const char *suffix)
{
    size_t n = arch ? strlen(arch) : 0;

    return arch && strncmp(key, arch, n) == 0 && key[n] == '.' && strcmp(key + n + 1, suffix) == 0;
}

static int tensor(struct rd *r, struct wo_gguf_tensor *t)
{
    uint64_t elems = 1;
    uint32_t block, bb;
    int ret;

    if ((ret = str(r, MAX_KEY, &t->name, "a tensor's name")) ||
        (ret = u32(r, &t->n_dims, "a tensor's dimension count")))
        return ret;
    if (t->n_dims < 1 || t->n_dims > WO_GGUF_MAX_DIMS)
        return fail(r, -EINVAL, "tensor '%s' has %" PRIu32 " dimensions, expected 1-%d", t->name,
                    t->n_dims, WO_GGUF_MAX_DIMS);
    for (uint32_t d = 0; d < WO_GGUF_MAX_DIMS; d++) {
        t->ne[d] = 1;
        if (d < t->n_dims && (ret = u64(r, &t->ne[d], "a tensor's dimension")))
            return ret;
        if (t->ne[d] && elems > UINT64_MAX / t->ne[d])
            return fail(r, -EINVAL, "tensor '%s' has more elements than 64 bits count", t->name);
        elems *= t->ne[d];
    }
    if ((ret = u32(r, &t->type, "a tensor's type")) ||
        (ret = u64(r, &t->offset, "a tensor's data offset")))
        return ret;
    if (!wo_gguf_type(t->type, NULL, &block, &bb))
        return fail(r, -EINVAL,
                    "tensor '%s' has ggml type %" PRIu32 ", which this reader does not "
                    "know (tools/gguf.c)",
                    t->name, t->type);
    if (t->ne[0] % block)
        return fail(r, -EINVAL,
                    "tensor '%s': %" PRIu64 " elements a row, expected a multiple of "
                    "its type's block of %" PRIu32,
                    t->name, t->ne[0], block);
    if (elems / block > UINT64_MAX / bb)
        return fail(r, -EINVAL, "tensor '%s' has more bytes than 64 bits count", t->name);
    t->bytes = elems / block * bb;
    return 0;
}

static int read_all(struct rd *r, struct wo_gguf *g)
{
    char magic[4];
    uint64_t n_kv, n_t;
    int ret;

    if ((ret = get(r, magic, 4, "the magic")))
        return ret;
    if (memcmp(magic, "GGUF", 4) != 0) {
        r->at = 0;
        return fail(r, -EINVAL, "not a GGUF file (the first 4 bytes are not \"GGUF\")");
    }
    if ((ret = u32(r, &g->version, "the version")))
        return ret;
    if (g->version != 2 && g->version != 3)
        return fail(r, -EINVAL, "GGUF version %" PRIu32 ", expected 2 or 3", g->version);
    if ((ret = u64(r, &n_t, "the tensor count")) || (ret = u64(r, &n_kv, "the metadata count")))
        return ret;
    if (n_t > MAX_TENSORS || n_kv > MAX_KV)
        return fail(r, -EINVAL,
                    "%" PRIu64 " tensors and %" PRIu64 " metadata pairs, expected at "
                    "most %u of each",
                    n_t, n_kv, MAX_TENSORS);
    /* a pair takes at least 13 bytes (a key's length, a type, a byte), a
     * tensor's information 32 (a name's length, one dimension, a type, an
     * offset): counts the bytes left cannot hold are said before any
     * allocation */
    if (n_kv > (r->size - r->at) / 13 || n_t > (r->size - r->at - n_kv * 13) / 32)
        return fail(r, -EINVAL,
                    "%" PRIu64 " metadata pairs and %" PRIu64 " tensors cannot fit in "
                    "the %" PRIu64 " bytes left",
                    n_kv, n_t, r->size - r->at);
    g->alignment = 32;
    for (uint64_t i = 0; i < n_kv; i++) {
        char *key = NULL, *s = NULL;
        uint32_t type;
        uint64_t num = 0;
        if ((ret = str(r, MAX_KEY, &key, "a key")) || (ret = u32(r, &type, "a value's type"))) {
            free(key);
            return ret;
        }
        bool want_s = type == V_STRING && strcmp(key, "general.architecture") == 0;
        ret = value(r, type, &num, want_s ? &s : NULL, 0);
        if (!ret) {
            if (want_s) {
                free(g->arch);
                g->arch = s;
            } else if (strcmp(key, "general.alignment") == 0) {
                if (!num || (num & (num - 1)))
                    ret = fail(r, -EINVAL, "general.alignment %" PRIu64 ", expected a power of two",
                               num);
                g->alignment = num;
            } else if (arch_key(key, g->arch, "block_count")) {
                g->block_count = num;
            } else if (arch_key(key, g->arch, "expert_count")) {
                g->expert_count = num;
            } else if (arch_key(key, g->arch, "expert_used_count")) {
                g->expert_used = num;
            }
        }
        free(key);
        if (ret)
            return ret;
    }
    if (!(g->t = calloc(n_t ? (size_t)n_t : 1, sizeof(*g->t))))
        return fail(r, -ENOMEM, "no memory for %" PRIu64 " tensors", n_t);
    for (g->n = 0; g->n < n_t; g->n++)
        if ((ret = tensor(r, &g->t[g->n]))) {
            free(g->t[g->n].name);
            return ret;
        }
    g->data_start = (r->at + g->alignment - 1) / g->alignment * g->alignment;
    for (size_t i = 0; i < g->n; i++) {
        const struct wo_gguf_tensor *t = &g->t[i];
        if (t->offset > g->file_bytes || t->bytes > g->file_bytes - t->offset ||
            g->data_start > g->file_bytes - t->offset - t->bytes) {
            /* where its data would start, or the file's end */
            r->at = t->offset < g->file_bytes - WO_MIN(g->data_start, g->file_bytes)
                        ? g->data_start + t->offset
                        : g->file_bytes;
            return fail(r, -EINVAL,
                        "tensor '%s' (%" PRIu64 " bytes at data offset %" PRIu64
                        ") ends past the file's end at %" PRIu64 ": the file is cut short",
                        t->name, t->bytes, t->offset, g->file_bytes);
        }
    }
    return 0;
}

int wo_gguf_read_stream(FILE *f, uint64_t size, const char *name, struct wo_gguf *g, char *err,
                        size_t cap)
{
    struct rd r = {.f = f, .path = name, .size = size, .err = err, .cap = cap};
    int ret;

    memset(g, 0, sizeof(*g));
    if (cap)
        err[0] = 0;
    g->file_bytes = size;
    if ((ret = read_all(&r, g)))
        wo_gguf_free(g);
    return ret;
}

int wo_gguf_read(const char *path, struct wo_gguf *g, char *err, size_t cap)
{
    struct rd r = {.path = path, .err = err, .cap = cap};
    struct stat st;
    FILE *f;
    int ret;

    memset(g, 0, sizeof(*g));
    if (!(f = fopen(path, "rb")))
        return fail(&r, -errno, "cannot open: %s", strerror(errno));
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return fail(&r, -EINVAL, "not a regular file");
    }
    ret = wo_gguf_read_stream(f, (uint64_t)st.st_size, path, g, err, cap);
    fclose(f);
    return ret;
}

void wo_gguf_free(struct wo_gguf *g)
{
    for (size_t i = 0; i < g->n; i++)
        free(g->t[i].name);
    free(g->t);
    free(g->arch);
    memset(g, 0, sizeof(*g));
}
