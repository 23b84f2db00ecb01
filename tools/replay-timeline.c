/* tools/replay-timeline.c: the predicted timeline as Chrome trace JSON
 * (woffload-replay --timeline): one event a kernel, copy, stage or step,
 * written as the simulation makes them. */
#include "tools/replay-int.h"

#define MAX_TIMELINE_EVENTS 400000u

void wo_replay_tl_event(struct sim *s, int tid, const char *name, double t0, double t1)
{
    FILE *f = s->o->timeline;

    if (!f || s->oracle || s->tl_n >= MAX_TIMELINE_EVENTS)
        return;
    fprintf(f, "%s{\"name\":\"", s->tl_n++ ? ",\n" : "");
    for (const char *c = name; *c; c++) {
        if (*c == '"' || *c == '\\')
            fputc('\\', f);
        if ((unsigned char)*c >= 0x20)
            fputc(*c, f);
    }
    if (t1 < t0)
        fprintf(f, "\",\"ph\":\"i\",\"s\":\"g\",\"pid\":1,\"tid\":%d,\"ts\":%.3f}", tid, t0 * 1e6);
    else
        fprintf(f, "\",\"ph\":\"X\",\"pid\":1,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f}", tid, t0 * 1e6,
                (t1 - t0) * 1e6);
}

void wo_replay_tl_open(const struct sim *s)
{
    if (s->o->timeline && !s->oracle)
        fprintf(s->o->timeline, "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n");
}

void wo_replay_tl_close(const struct sim *s)
{
    if (s->o->timeline && !s->oracle)
        fprintf(s->o->timeline, "%s{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":1,\"args\":{\"name\":\"GPU compute\"}},\n"
                "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":2,\"args\":{\"name\":\"UVM (prefetch thread)\"}}\n]}\n",
                s->tl_n ? ",\n" : "");
}
