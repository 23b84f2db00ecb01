/* core/meminfo.h: one field of /proc/meminfo. */
#pragma once

#include <stdint.h>

/* The value of /proc/meminfo's `key` ("MemAvailable", "MemTotal", ...) in
 * bytes, 0 when it cannot be read. */
uint64_t wo_meminfo_bytes(const char *key);
