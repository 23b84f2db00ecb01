/* uvm/graph.h: CUDA graphs in the event stream. A launch made while its
 * stream captures does not run: it is recorded into the capture, and the
 * graph's every launch replays the recorded launches in their order. One
 * table and one expansion, used by everything that follows launches: the
 * consumer's per-name accounting (uvm/consumer.c), the prefetch planner
 * (uvm/plan.c) and the replay tool (tools/replay-*.c). */
#pragma once

#include <sys/types.h>

#include "core/event.h"

/* Captures (their recorded launches) and instantiations (exec -> graph). */
struct wo_graphs;

struct wo_graphs *wo_graphs_new(void);
void wo_graphs_free(struct wo_graphs *g);

/* Feeds one event and sets *ret to the launches it stands for, in the order
 * they run; returns how many:
 *   - an ordinary launch: 1, the event itself;
 *   - a launch on a capturing stream: 0 (it is recorded, and runs when its
 *     graph is launched);
 *   - a graph launch: the launches recorded by the latest capture of the
 *     latest instantiation of that exec (0 for an unknown exec);
 *   - capture begin and end, instantiation, every other event: 0.
 * g NULL (no table, e.g. no memory for one): a launch is 1, the event
 * itself, whatever its stream did; a graph launch is 0.
 * *ret stays valid until the next call. -ENOMEM: the table could not take
 * the event (it then knows less: a capture without a launch, an exec it
 * cannot expand); *ret is then NULL. */
ssize_t wo_graphs_expand(struct wo_graphs *g, const struct wo_event *ev,
                         const struct wo_event **ret);
