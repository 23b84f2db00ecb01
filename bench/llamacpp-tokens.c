/* bench/llamacpp-tokens.c: greedy token ids from a GGUF through libllama.so,
 * for bench/llamacpp-hook.sh's "tokens identical" check (plain against the
 * shim with the ggml hook). llama-server's /completion parses random
 * models' text as a chat format and can answer 500 (peers/llamacpp/README),
 * so the ids come from llama_decode and an argmax over the logits, nothing
 * else. A ggml program: it links libllama.so, so woffload-run loads the hook.
 *
 * Built on the GPU machine against the llama.cpp tree (its include/ and
 * ggml/include/) and the built libllama.so:
 *   cc -O2 -I$SRC/include -I$SRC/ggml/include llamacpp-tokens.c -L$LIBDIR -lllama \
 *      -Wl,-rpath,$LIBDIR -o llamacpp-tokens
 * usage: llamacpp-tokens MODEL.gguf N_PREDICT [mmap|nommap] [SEQS]
 * prints one line: "tokens: id id ..." (prompt: ids 1..16 times 97 mod vocab).
 * SEQS > 1: that many sequences decoded side by side, a batch of SEQS
 * tokens a step (sequence s's prompt: ids (i + 1) * 97 + s * 131 mod vocab),
 * their ids printed one sequence after another, " |" between: at 32 a step
 * reads 99% of a 32-expert top-4 model's experts, so the shim stages them
 * (through its graph replay with llama.cpp's CUDA graphs on).
 * WO_TOKENS_STATS=FILE: the shim's woffload_stats() JSON written there after
 * the last token, while the model is loaded (the names are the live ones:
 * the exit snapshot of WOFFLOAD_STATS comes after llama_model_free). */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

/* The end of a run: a newline after the ids, WO_TOKENS_STATS (above), then
 * the context and the model freed. */
static int finish(struct llama_context *ctx, struct llama_model *model)
{
    printf("\n");
    fflush(stdout); /* before the hook's and the shim's exit lines on stderr */
    const char *sp = getenv("WO_TOKENS_STATS");
    long (*stats)(char *, size_t) = (long (*)(char *, size_t))dlsym(RTLD_DEFAULT, "woffload_stats");
    if (sp && stats) {
        long n = stats(NULL, 0);
        char *js = n > 0 ? malloc((size_t)n + 1) : NULL;
        FILE *f = fopen(sp, "w");
        if (js && f && stats(js, (size_t)n + 1) >= 0)
            fputs(js, f);
        if (f)
            fclose(f);
        free(js);
    }
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}

static llama_token argmax(const float *logits, int nv)
{
    llama_token best = 0;
    for (int i = 1; i < nv; i++)
        if (logits[i] > logits[best])
            best = (llama_token)i;
    return best;
}

/* SEQS sequences decoded side by side (greedy), their ids printed one
 * sequence after another. */
static int side_by_side(struct llama_context *ctx, struct llama_model *model, int nv,
                        int npredict, int seqs)
{
    struct llama_batch b = llama_batch_init(16 * seqs, 0, 1);
    llama_token *ids = calloc((size_t)seqs * (size_t)npredict, sizeof(*ids));
    llama_token *last = calloc((size_t)seqs, sizeof(*last));

    if (!ids || !last)
        return 1;
    b.n_tokens = 0;
    for (int s = 0; s < seqs; s++)
        for (int i = 0; i < 16; i++) {
            int k = b.n_tokens++;
            b.token[k] = (llama_token)(((i + 1) * 97 + s * 131) % nv);
            b.pos[k] = i;
            b.n_seq_id[k] = 1;
            b.seq_id[k][0] = s;
            b.logits[k] = i == 15;
        }
    for (int t = 0; t < npredict; t++) {
        if (llama_decode(ctx, b) != 0) {
            fprintf(stderr, "llama_decode failed at step %d\n", t);
            return 1;
        }
        /* by batch index: each prompt's last token, then each step's one */
        for (int s = 0; s < seqs; s++) {
            last[s] = argmax(llama_get_logits_ith(ctx, t == 0 ? s * 16 + 15 : s), nv);
            ids[(size_t)s * (size_t)npredict + (size_t)t] = last[s];
        }
        b.n_tokens = 0;
        for (int s = 0; s < seqs; s++) {
            int k = b.n_tokens++;
            b.token[k] = last[s];
            b.pos[k] = 16 + t;
            b.n_seq_id[k] = 1;
            b.seq_id[k][0] = s;
            b.logits[k] = 1;
        }
    }
    printf("tokens:");
    for (int s = 0; s < seqs; s++) {
        if (s)
            printf(" |");
        for (int t = 0; t < npredict; t++)
            printf(" %d", ids[(size_t)s * (size_t)npredict + (size_t)t]);
    }
    llama_batch_free(b);
    free(ids);
    free(last);
    return finish(ctx, model);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL.gguf N_PREDICT [mmap|nommap] [SEQS]\n", argv[0]);
        return 2;
    }
    int npredict = atoi(argv[2]);
    int seqs = argc > 4 ? atoi(argv[4]) : 1;
    if (seqs < 1 || seqs > 64 || npredict < 1 || npredict > 256) {
        fprintf(stderr, "N_PREDICT: 1 to 256; SEQS: 1 to 64\n");
        return 2;
    }
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 999;
    if (argc > 3 && strcmp(argv[3], "nommap") == 0)
        mp.load_mode = LLAMA_LOAD_MODE_NONE;
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "cannot load %s\n", argv[1]);
        return 1;
    }
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = seqs > 1 ? (uint32_t)(seqs * (16 + npredict) + 256) : 512;
    cp.n_batch = seqs > 1 ? (uint32_t)(16 * seqs) : 64;
    cp.n_ubatch = cp.n_batch;
    cp.n_seq_max = (uint32_t)seqs;
    cp.kv_unified = true;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "cannot make a context\n");
        return 1;
    }
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    int nv = llama_vocab_n_tokens(vocab);
    if (seqs > 1)
        return side_by_side(ctx, model, nv, npredict, seqs);
    llama_token prompt[16];
    for (int i = 0; i < 16; i++)
        prompt[i] = (llama_token)((i + 1) * 97 % nv);
    struct llama_batch b = llama_batch_get_one(prompt, 16);
    printf("tokens:");
    for (int t = 0; t < npredict; t++) {
        if (llama_decode(ctx, b) != 0) {
            fprintf(stderr, "llama_decode failed at token %d\n", t);
            return 1;
        }
        llama_token best = argmax(llama_get_logits_ith(ctx, -1), nv);
        printf(" %d", best);
        fflush(stdout);
        static llama_token next;
        next = best;
        b = llama_batch_get_one(&next, 1);
    }
    return finish(ctx, model);
}
