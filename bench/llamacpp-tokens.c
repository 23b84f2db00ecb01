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
 * usage: llamacpp-tokens MODEL.gguf N_PREDICT [mmap|nommap]
 * prints one line: "tokens: id id ..." (prompt: ids 1..16 times 97 mod vocab).
 * WO_TOKENS_STATS=FILE: the shim's woffload_stats() JSON written there after
 * the last token, while the model is loaded (the names are the live ones:
 * the exit snapshot of WOFFLOAD_STATS comes after llama_model_free). */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL.gguf N_PREDICT [mmap|nommap]\n", argv[0]);
        return 2;
    }
    int npredict = atoi(argv[2]);
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
    cp.n_ctx = 512;
    cp.n_batch = 64;
    cp.n_ubatch = 64;
    cp.n_seq_max = 1;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "cannot make a context\n");
        return 1;
    }
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    int nv = llama_vocab_n_tokens(vocab);
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
        const float *logits = llama_get_logits_ith(ctx, -1);
        llama_token best = 0;
        for (int i = 1; i < nv; i++)
            if (logits[i] > logits[best])
                best = (llama_token)i;
        printf(" %d", best);
        fflush(stdout);
        static llama_token next;
        next = best;
        b = llama_batch_get_one(&next, 1);
    }
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
