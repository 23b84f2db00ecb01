/* uvm/graph.c: the launches each event stands for, with CUDA graphs
 * expanded (see graph.h). */
#include "uvm/graph.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* Launches one capture keeps: a capture longer than this (no engine records
 * a million kernels into one graph) replays its first ones only. */
#define MAX_GRAPH_LAUNCHES (1u << 20)

struct gcap {
    uint64_t stream, handle; /* capturing stream; graph (after end) */
    uint64_t id;             /* capture id (0: none given) */
    int active;
    struct wo_event *ev;
    size_t n, cap;
};

struct wo_graphs {
    struct gcap *c;
    size_t nc, capc;
    struct {
        uint64_t exec, graph;
    } *x;
    size_t nx, capx;
};


struct wo_graphs *wo_graphs_new(void)
{
    return calloc(1, sizeof(struct wo_graphs));
}

void wo_graphs_free(struct wo_graphs *g)
{
    if (!g)
        return;
    for (size_t i = 0; i < g->nc; i++)
        free(g->c[i].ev);
    free(g->c);
    free(g->x);
    free(g);
}

/* The active capture a launch or capture end belongs to: by capture id
 * when the event carries one, else by stream. */
static struct gcap *cap_active(struct wo_graphs *g, uint64_t stream, uint64_t id)
{
    for (size_t i = g->nc; i-- > 0;)
        if (g->c[i].active && g->c[i].id == id && (id || g->c[i].stream == stream))
            return &g->c[i];
    return NULL;
}

ssize_t wo_graphs_expand(struct wo_graphs *g, const struct wo_event *ev,
                         const struct wo_event **ret)
{
    struct gcap *c;

    *ret = NULL;
    if (!g) {
        if (ev->type != WO_EV_LAUNCH)
            return 0;
        *ret = ev;
        return 1;
    }
    switch (ev->type) {
    case WO_EV_CAPTURE_BEGIN:
        if (wo_grow((void **)&g->c, &g->capc, g->nc + 1, sizeof(*g->c)) < 0)
            return -ENOMEM;
        c = &g->c[g->nc++];
        memset(c, 0, sizeof(*c));
        c->stream = ev->stream;
        c->id = ev->g.handle; /* the capture id launches carry (event.h) */
        c->active = 1;
        return 0;
    case WO_EV_CAPTURE_END:
        c = cap_active(g, ev->stream, ev->g.aux);
        if (c) {
            c->active = 0;
            c->handle = ev->g.handle;
        }
        return 0;
    case WO_EV_GRAPH_INSTANTIATE:
        if (wo_grow((void **)&g->x, &g->capx, g->nx + 1, sizeof(*g->x)) < 0)
            return -ENOMEM;
        g->x[g->nx].exec = ev->g.handle;
        g->x[g->nx].graph = ev->g.aux;
        g->nx++;
        return 0;
    case WO_EV_GRAPH_LAUNCH:
        /* the latest instantiation of this exec, the latest capture of its graph */
        for (size_t i = g->nx; i-- > 0;) {
            if (g->x[i].exec != ev->g.handle)
                continue;
            for (size_t j = g->nc; j-- > 0;) {
                if (!g->c[j].active && g->c[j].handle == g->x[i].graph) {
                    *ret = g->c[j].ev;
                    return (ssize_t)g->c[j].n;
                }
            }
            break;
        }
        return 0;
    case WO_EV_LAUNCH:
        c = cap_active(g, ev->stream, ev->capture);
        if (!c) {
            *ret = ev;
            return 1;
        }
        if (c->n >= MAX_GRAPH_LAUNCHES)
            return 0;
        if (wo_grow((void **)&c->ev, &c->cap, c->n + 1, sizeof(*c->ev)) < 0)
            return -ENOMEM;
        c->ev[c->n++] = *ev;
        return 0;
    default:
        return 0;
    }
}
