/* tools/replay-pacing.c: the host work that carries over from the
 * recording to a replay that places differently (the pacing pass). */
#include "tools/replay-int.h"

#include <stdlib.h>

/* The pacing pass: the trace under the placements it recorded, to learn the
 * host's own work after each point where it waited for the GPU (the
 * recorded gap less the simulated wait, which stands for the recording
 * run's). Replays under other placements keep that work and wait for their
 * own GPU (replay-int.h). */
double *wo_replay_pacing(const struct wo_trace_data *d, const struct wo_replay_opts *o)
{
    struct wo_replay_opts po = *o;
    struct sim ps;
    uint64_t b, m;
    char msg[256];
    double *out;

    /* Under the recorded placements at the recorded host speed the main
     * pass is the pacing pass: it subtracts its own waits (post_sync NULL). */
    if (!(o->policy || o->all_device || o->no_prefetch || o->budget_frac > 0 || o->budget_bytes ||
          (o->host_scale > 0 && o->host_scale != 1)))
        return NULL;
    out = calloc(d->nevents ? d->nevents : 1, sizeof(*out));
    if (!out)
        return NULL;
    po.policy = NULL;
    po.all_device = false;
    po.no_prefetch = false;
    po.budget_frac = 0;
    po.budget_bytes = 0;
    po.no_bound = true;
    po.timeline = NULL;
    po.host_scale = 1; /* the recorded host work, as recorded */
    if (wo_replay_sim_once(d, &po, NULL, NULL, out, &ps, &b, &m, msg, sizeof(msg)) < 0) {
        free(out);
        out = NULL;
    }
    wo_replay_sim_free(&ps);
    return out;
}
