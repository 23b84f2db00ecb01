/* core/meminfo.c: see meminfo.h. */
#include "core/meminfo.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

uint64_t wo_meminfo_bytes(const char *key)
{
    char line[256];
    uint64_t kib = 0;
    size_t n = strlen(key);
    FILE *f = fopen("/proc/meminfo", "re");

    if (!f)
        return 0;
    while (fgets(line, sizeof(line), f))
        if (strncmp(line, key, n) == 0 && line[n] == ':') {
            kib = strtoull(line + n + 1, NULL, 10);
            break;
        }
    fclose(f);
    return kib << 10;
}
