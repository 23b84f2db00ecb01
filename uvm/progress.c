/* uvm/progress.c: see progress.h. */
#include "uvm/progress.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/event.h"
#include "core/log.h"
#include "core/settings.h"
#include "policy/policy.h"

enum { MODE_OFF, MODE_TTY, MODE_LINES };

static int mode(void)
{
    const struct wo_settings *s = wo_settings();

    if (s->quiet)
        return MODE_OFF;
    if (s->progress)
        return MODE_LINES;
    /* A log file takes the log lines; a TTY on stderr still shows progress. */
    return isatty(STDERR_FILENO) ? MODE_TTY : MODE_OFF;
}

void wo_progress_begin(struct wo_progress *p, const char *what)
{
    if (p->t0_ns)
        return;
    memset(p, 0, sizeof(*p));
    p->what = what;
    p->t0_ns = p->last_ns = wo_now_ns();
}

static void line(struct wo_progress *p, uint64_t now, bool final)
{
    double s = (double)(now - p->t0_ns) / 1e9;
    double gibs = s > 0 ? (double)p->done / (double)(1ull << 30) / s : 0;
    char done[32], buf[256];
    int m = mode(), n;

    wo_format_size(p->done, done, sizeof(done));
    if (s < 0.05) /* one call did it all: a rate would be noise */
        n = snprintf(buf, sizeof(buf), "%s: %s", p->what, done);
    else if (final)
        n = snprintf(buf, sizeof(buf), "%s: %s in %.1f s, %.1f GiB/s", p->what, done, s, gibs);
    else
        n = snprintf(buf, sizeof(buf), "%s: %s so far, %.1f GiB/s", p->what, done, gibs);
    if (n < 0)
        return;
    if (m == MODE_TTY) {
        /* \r and clear to the end of the line: the next report overwrites it. */
        char out[300];
        int k = snprintf(out, sizeof(out), "\rwoffload: %s\033[K%s", buf, final ? "\n" : "");
        if (k > 0 && write(STDERR_FILENO, out, (size_t)WO_MIN(k, (int)sizeof(out) - 1)) < 0)
            return;
    } else if (m == MODE_LINES) {
        wo_log_write(WO_LOG_OFF, "%s", buf);
    }
}

void wo_progress_add(struct wo_progress *p, uint64_t bytes)
{
    uint64_t now;
    int m;

    if (!p->t0_ns)
        return;
    p->done += bytes;
    if (p->done < WO_PROGRESS_MIN || (m = mode()) == MODE_OFF)
        return;
    now = wo_now_ns();
    if (p->printed && now - p->last_ns < (m == MODE_TTY ? 500000000ull : 5000000000ull))
        return;
    p->last_ns = now;
    p->printed = true;
    line(p, now, false);
}

void wo_progress_end(struct wo_progress *p)
{
    if (p->t0_ns && p->printed)
        line(p, wo_now_ns(), true);
    p->printed = false;
    p->t0_ns = 0;
}
