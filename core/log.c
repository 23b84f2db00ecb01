/* core/log.c: see log.h. */
#include "core/log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int wo_log_level_current = WO_LOG_WARN;
static int log_fd = 2;
static __thread int in_log;

void wo_log_set_level(int level)
{
    __atomic_store_n(&wo_log_level_current, level, __ATOMIC_RELAXED);
}

void wo_log_set_fd(int fd)
{
    __atomic_store_n(&log_fd, fd, __ATOMIC_RELAXED);
}

static const char *level_tag(int level)
{
    switch (level) {
    case WO_LOG_ERROR:
        return "error: ";
    case WO_LOG_WARN:
        return "warning: ";
    case WO_LOG_DEBUG:
        return "debug: ";
    case WO_LOG_TRACE:
        return "trace: ";
    default:
        return "";
    }
}

void wo_log_write(int level, const char *fmt, ...)
{
    char buf[1024];
    int saved_errno = errno;
    va_list ap;
    int n, m;

    if (level > __atomic_load_n(&wo_log_level_current, __ATOMIC_RELAXED) || in_log)
        return;
    in_log = 1;

    n = snprintf(buf, sizeof(buf), "woffload: %s", level_tag(level));
    if (n < 0)
        n = 0;
    va_start(ap, fmt);
    m = vsnprintf(buf + n, sizeof(buf) - (size_t)n, fmt, ap);
    va_end(ap);
    if (m < 0)
        m = 0;
    n += m;
    if ((size_t)n >= sizeof(buf)) {
        /* vsnprintf truncated (sizeof(buf) - 1 bytes kept): end the kept
         * text with "..." so a reader knows, then the newline fits in the
         * byte the terminating NUL took. */
        n = (int)sizeof(buf) - 1;
        memcpy(buf + n - 3, "...", 3);
    }
    if (n > 0 && buf[n - 1] != '\n')
        buf[n++] = '\n';

    {
        const char *p = buf;
        size_t left = (size_t)n;
        int fd = __atomic_load_n(&log_fd, __ATOMIC_RELAXED);
        while (left > 0) {
            ssize_t w = write(fd, p, left);
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0)
                break;
            p += w;
            left -= (size_t)w;
        }
    }
    in_log = 0;
    errno = saved_errno;
}
