/* tests/linkage-loader.c: the tiny loader test-linkage.sh runs in a process
 * without a CUDA driver: dlopen(LIB) with RTLD_NOW (every symbol resolvable
 * without libcuda), call woffload_version(), and check that loading mapped
 * neither libcuda nor libcudart. A C program rather than python3 so that it
 * also runs under sanitizer runtimes that python3 cannot start with. */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    const char *(*version)(void);
    char line[4096];
    void *h;
    FILE *maps;
    int bad = 0;

    if (argc != 2) {
        fprintf(stderr, "usage: linkage-loader LIB\n");
        return 2;
    }
    h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 1;
    }
    *(void **)&version = dlsym(h, "woffload_version");
    if (!version) {
        fprintf(stderr, "dlsym(woffload_version): %s\n", dlerror());
        return 1;
    }
    if (!version() || !*version()) {
        fprintf(stderr, "woffload_version() returned NULL or \"\"\n");
        return 1;
    }
    maps = fopen("/proc/self/maps", "r");
    if (!maps) {
        perror("/proc/self/maps");
        return 1;
    }
    while (fgets(line, sizeof(line), maps)) {
        if (strstr(line, "/libcuda.so") || strstr(line, "/libcudart.so")) {
            fprintf(stderr, "loading mapped %s", strchr(line, '/'));
            bad = 1;
        }
    }
    fclose(maps);
    if (bad)
        return 1;
    printf("loaded, version %s\n", version());
    return 0;
}
