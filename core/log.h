/* core/log.h: the one logging path. Messages are prefixed "woffload: ",
 * formatted into a stack buffer and written with one write(2) to stderr (or
 * WOFFLOAD_LOG_FILE). No allocation, recursion-safe (a thread-local guard drops
 * messages logged while logging), usable before settings are read. */
#pragma once

#include "core/macro.h"

enum wo_log_level {
    WO_LOG_OFF = 0,
    WO_LOG_ERROR = 1,
    WO_LOG_WARN = 2,
    WO_LOG_INFO = 3,
    WO_LOG_DEBUG = 4,
    WO_LOG_TRACE = 5,
};

/* Current threshold; messages above it are dropped before formatting. */
extern int wo_log_level_current;

void wo_log_set_level(int level);
void wo_log_set_fd(int fd);
void wo_log_write(int level, const char *fmt, ...) WO_PRINTF(2, 3);

/* Logs at most once per call site (for per-launch or per-allocation reports). */
#define wo_log_once(level, ...)                                                                    \
    do {                                                                                           \
        static int once_;                                                                          \
        if (!__atomic_exchange_n(&once_, 1, __ATOMIC_RELAXED))                                     \
            wo_log_write(level, __VA_ARGS__);                                                      \
    } while (0)

#define wo_log(level, ...)                                                                         \
    do {                                                                                           \
        if (WO_UNLIKELY((level) <= __atomic_load_n(&wo_log_level_current, __ATOMIC_RELAXED)))      \
            wo_log_write(level, __VA_ARGS__);                                                      \
    } while (0)

#define wo_error(...) wo_log(WO_LOG_ERROR, __VA_ARGS__)
#define wo_warn(...) wo_log(WO_LOG_WARN, __VA_ARGS__)
#define wo_info(...) wo_log(WO_LOG_INFO, __VA_ARGS__)
#define wo_debug(...) wo_log(WO_LOG_DEBUG, __VA_ARGS__)
#define wo_trace(...) wo_log(WO_LOG_TRACE, __VA_ARGS__)
