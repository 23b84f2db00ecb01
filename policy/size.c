/* policy/size.c: sizes as people write them ("512MiB", "1.5GiB", "350GB")
 * and back, exact to the byte (128-bit intermediate, no floating point). */
#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "policy/policy-internal.h"

__extension__ typedef unsigned __int128 u128;

static const struct {
    const char *name;
    uint64_t mult;
} units[] = {
    {"B", 1},
    {"KB", UINT64_C(1000)},
    {"MB", UINT64_C(1000000)},
    {"GB", UINT64_C(1000000000)},
    {"TB", UINT64_C(1000000000000)},
    {"KiB", UINT64_C(1) << 10},
    {"MiB", UINT64_C(1) << 20},
    {"GiB", UINT64_C(1) << 30},
    {"TiB", UINT64_C(1) << 40},
};

int wo_parse_size(const char *s, uint64_t *ret)
{
    u128 ip = 0, frac = 0, fscale = 1, v;
    uint64_t mult = 0;
    bool digits = false;
    const char *p = s;

    if (!s)
        return -EINVAL;
    while (*p == ' ')
        p++;
    if (!isdigit((unsigned char)*p))
        return -EINVAL; /* includes '-', '+', '.5' and empty */
    for (; isdigit((unsigned char)*p); p++) {
        ip = ip * 10 + (unsigned)(*p - '0');
        digits = true;
        if (ip > UINT64_MAX)
            return -ERANGE;
    }
    if (*p == '.') {
        int nd = 0;
        p++;
        if (!isdigit((unsigned char)*p))
            return -EINVAL;
        for (; isdigit((unsigned char)*p); p++) {
            if (++nd > 12)
                return -EINVAL; /* more precision than any byte count needs */
            frac = frac * 10 + (unsigned)(*p - '0');
            fscale *= 10;
        }
    }
    if (!digits)
        return -EINVAL;
    while (*p == ' ')
        p++;
    if (*p == '\0') {
        if (fscale != 1)
            return -EINVAL; /* "1.5" bytes: a unit is needed for a fraction */
        mult = 1;
    } else {
        for (size_t i = 0; i < WO_ARRAY_SIZE(units); i++)
            if (strcasecmp(p, units[i].name) == 0) {
                /* "kib" is fine, but "mb" vs "MiB" decides powers of ten vs two */
                mult = units[i].mult;
                break;
            }
        if (!mult)
            return -EINVAL;
    }
    v = ip * mult + frac * mult / fscale;
    if (v > UINT64_MAX)
        return -ERANGE;
    *ret = (uint64_t)v;
    return 0;
}

const char *wo_format_size(uint64_t bytes, char *buf, size_t len)
{
    static const char *const names[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    unsigned u = 0;
    double v = (double)bytes;

    if (bytes < 1024) {
        snprintf(buf, len, "%llu B", (unsigned long long)bytes);
        return buf;
    }
    while (v >= 1024.0 && u + 1 < WO_ARRAY_SIZE(names)) {
        v /= 1024.0;
        u++;
    }
    snprintf(buf, len, "%.2f %s", v, names[u]);
    return buf;
}
