/* tests/fuzz-policy-replay.c: runs the policy fuzz target without
 * libFuzzer: over every file of the directories or files given (the
 * committed corpus, replayed as a test), or over stdin when given none (so
 * AFL++ can drive it: afl-fuzz -i in -o out -- fuzz-policy-replay). */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define INPUT_LIMIT (8u << 20)

static int run_stream(FILE *f, const char *what)
{
    uint8_t *buf = malloc(INPUT_LIMIT);
    size_t n;
    if (!buf)
        return -1;
    n = fread(buf, 1, INPUT_LIMIT, f);
    if (ferror(f)) {
        fprintf(stderr, "%s: read error\n", what);
        free(buf);
        return -1;
    }
    LLVMFuzzerTestOneInput(buf, n);
    free(buf);
    return 0;
}

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    int r;
    if (!f) {
        perror(path);
        return -1;
    }
    r = run_stream(f, path);
    fclose(f);
    return r;
}

int main(int argc, char **argv)
{
    size_t files = 0;
    int bad = 0;

    if (argc < 2)
        return run_stream(stdin, "stdin") < 0 ? 1 : 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) < 0) {
            perror(argv[i]);
            return 1;
        }
        if (S_ISDIR(st.st_mode)) {
            struct dirent **ents;
            int n = scandir(argv[i], &ents, NULL, alphasort);
            if (n < 0) {
                perror(argv[i]);
                return 1;
            }
            for (int j = 0; j < n; j++) {
                char path[4096];
                struct stat fst;
                snprintf(path, sizeof(path), "%s/%s", argv[i], ents[j]->d_name);
                if (stat(path, &fst) == 0 && S_ISREG(fst.st_mode)) {
                    bad |= run_file(path) < 0;
                    files++;
                }
                free(ents[j]);
            }
            free(ents);
        } else {
            bad |= run_file(argv[i]) < 0;
            files++;
        }
    }
    printf("replayed %zu inputs\n", files);
    if (!files) {
        fprintf(stderr, "no inputs found\n");
        return 1;
    }
    return bad;
}
