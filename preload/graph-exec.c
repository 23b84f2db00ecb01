/* preload/graph-exec.c: the hooks on graph execs: instantiate, update,
 * launch, the exec setters and destroy. Each tells the two files that keep
 * books on graphs what happened: capture.c (which capture a graph came
 * from, what its launches reached: attribution and blind launches) and
 * graph-replay.c (the copy of an exec's nodes that a replay launches from).
 * Neither of those calls the other's hooks, nor this file. */
#include "preload/hook.h"
#include "preload/redirect.h"

/* exec runs graph's nodes now: attributed to the capture that recorded
 * it, then its nodes read for a replay while the graph is alive. */
static void instantiated(CUgraphExec e, CUgraph g)
{
    uint64_t exec = (uint64_t)(uintptr_t)e, graph = (uint64_t)(uintptr_t)g;

    wo_replay_note(exec, graph, wo_capture_instantiated(exec, graph));
}

/* --- driver --------------------------------------------------------------- */

CUresult wo_h_graph_instantiate(wo_pfn_cuGraphInstantiateWithFlags real, int id, void *ra,
                                CUgraphExec *e, CUgraph g, unsigned long long flags)
{
    CUresult res;
    (void)ra;

    WO_HOOK_ENTER(real(e, g, flags));
    res = real(e, g, flags);
    if (res == CUDA_SUCCESS && e)
        instantiated(*e, g);
    wo_leave();
    return res;
}

CUresult wo_h_graph_instantiate_params(wo_pfn_cuGraphInstantiateWithParams real, int id, void *ra,
                                       CUgraphExec *e, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p)
{
    CUresult res;
    (void)ra;

    WO_HOOK_ENTER(real(e, g, p));
    res = real(e, g, p);
    if (res == CUDA_SUCCESS && e)
        instantiated(*e, g);
    wo_leave();
    return res;
}

/* An exec updated from graph g (cuGraphExecUpdate): it runs g's nodes now,
 * as if instantiated from it. A failed update leaves the exec as it was,
 * but its replay copy is dropped all the same (the engine instantiates
 * again). Noted whatever the nesting: a copy must never outlive its exec's
 * contents. */
static void exec_updated(CUgraphExec e, CUgraph g, bool ok)
{
    if (ok)
        instantiated(e, g);
    else
        wo_replay_forget((uint64_t)(uintptr_t)e, false);
}

CUresult wo_h_graph_exec_update(wo_pfn_cuGraphExecUpdate_v2 real, int id, void *ra, CUgraphExec e,
                                CUgraph g, CUgraphExecUpdateResultInfo *info)
{
    CUresult res;
    (void)ra;

    wo_count_call(id);
    if (WO_UNLIKELY(!real))
        return CUDA_ERROR_NOT_FOUND;
    res = real(e, g, info);
    exec_updated(e, g, res == CUDA_SUCCESS);
    return res;
}

CUresult wo_h_graph_exec_update_v1(wo_pfn_cuGraphExecUpdate real, int id, void *ra, CUgraphExec e,
                                   CUgraph g, CUgraphNode *err, CUgraphExecUpdateResult *out)
{
    CUresult res;
    (void)ra;

    wo_count_call(id);
    if (WO_UNLIKELY(!real))
        return CUDA_ERROR_NOT_FOUND;
    res = real(e, g, err, out);
    exec_updated(e, g, res == CUDA_SUCCESS);
    return res;
}

CUresult wo_h_graph_launch(wo_pfn_cuGraphLaunch real, int id, void *ra, CUgraphExec e, CUstream s)
{
    uint64_t sid;
    bool blind;
    CUresult res;
    int rp;

    WO_HOOK_ENTER(real(e, s));
    sid = wo_stream_id(s, wo_hook_pt[id]);
    /* replayed kernel by kernel when that stages what it reads */
    rp = wo_replay_launch((uint64_t)(uintptr_t)e, sid, ra, &res);
    if (rp) {
        wo_leave();
        return rp > 0 ? CUDA_SUCCESS : res;
    }
    blind = wo_capture_graph_launch_begin((uint64_t)(uintptr_t)e, sid);
    res = real(e, s);
    if (blind)
        wo_hook_blind_end(sid);
    if (res == CUDA_SUCCESS) {
        wo_count_caller(ra, WO_CALLER_LAUNCH);
        wo_capture_graph_launch((uint64_t)(uintptr_t)e, sid, WO_API_GRAPH);
    }
    wo_leave();
    return res;
}

/* --- runtime -------------------------------------------------------------- */

cudaError_t wo_h_cuda_graph_instantiate(wo_pfn_cudaGraphInstantiate real, int id, void *ra,
                                        cudaGraphExec_t *e, cudaGraph_t g, unsigned long long flags)
{
    cudaError_t res;
    (void)ra;

    WO_RT_HOOK_ENTER(real(e, g, flags));
    res = real(e, g, flags);
    if (res == cudaSuccess && e)
        instantiated(*e, g);
    wo_leave();
    return res;
}

cudaError_t wo_h_cuda_graph_instantiate_params(wo_pfn_cudaGraphInstantiateWithParams real, int id,
                                               void *ra, cudaGraphExec_t *e, cudaGraph_t g,
                                               cudaGraphInstantiateParams *p)
{
    cudaError_t res;
    (void)ra;

    WO_RT_HOOK_ENTER(real(e, g, p));
    res = real(e, g, p);
    if (res == cudaSuccess && e)
        instantiated(*e, g);
    wo_leave();
    return res;
}

cudaError_t wo_h_cuda_graph_launch(wo_pfn_cudaGraphLaunch real, int id, void *ra, cudaGraphExec_t e,
                                   cudaStream_t s)
{
    uint64_t sid;
    bool blind;
    cudaError_t res;
    CUresult cres = CUDA_SUCCESS;
    int rp;

    WO_RT_HOOK_ENTER(real(e, s));
    sid = wo_stream_id(s, wo_rt_pt[id]);
    rp = wo_replay_launch((uint64_t)(uintptr_t)e, sid, ra, &cres);
    if (rp) {
        wo_leave();
        /* the driver's codes of launch failures are the runtime's */
        return rp > 0 ? cudaSuccess : (cudaError_t)cres;
    }
    blind = wo_capture_graph_launch_begin((uint64_t)(uintptr_t)e, sid);
    res = real(e, s);
    if (blind)
        wo_hook_blind_end(sid);
    if (res == cudaSuccess) {
        wo_count_caller(ra, WO_CALLER_LAUNCH);
        wo_capture_graph_launch((uint64_t)(uintptr_t)e, sid, WO_API_GRAPH);
    }
    wo_leave();
    return res;
}

/* --- exec mutators (hooks) ---------------------------------------------------
 * Forwarded untouched, whatever the nesting; after a success the exec's
 * copy is dropped (its nodes no longer are the graph's). */

#define EXEC_SETTER(name, pfn, PARAMS, ARGS)                                                       \
    CUresult name(pfn real, int id, void *ra, CUgraphExec e, WO_UNPACK PARAMS)                     \
    {                                                                                              \
        CUresult res;                                                                              \
        (void)ra;                                                                                  \
        wo_count_call(id);                                                                         \
        if (WO_UNLIKELY(!real))                                                                    \
            return CUDA_ERROR_NOT_FOUND;                                                           \
        res = real(e, WO_UNPACK ARGS);                                                             \
        if (res == CUDA_SUCCESS)                                                                   \
            wo_replay_forget((uint64_t)(uintptr_t)e, true);                                        \
        return res;                                                                                \
    }

EXEC_SETTER(wo_h_exec_kernel_set_v1, wo_pfn_cuGraphExecKernelNodeSetParams,
            (CUgraphNode n, const CUDA_KERNEL_NODE_PARAMS_v1 *p), (n, p))
EXEC_SETTER(wo_h_exec_kernel_set, wo_pfn_cuGraphExecKernelNodeSetParams_v2,
            (CUgraphNode n, const CUDA_KERNEL_NODE_PARAMS *p), (n, p))
EXEC_SETTER(wo_h_exec_memcpy_set, wo_pfn_cuGraphExecMemcpyNodeSetParams,
            (CUgraphNode n, const CUDA_MEMCPY3D *p, CUcontext c), (n, p, c))
EXEC_SETTER(wo_h_exec_memset_set, wo_pfn_cuGraphExecMemsetNodeSetParams,
            (CUgraphNode n, const CUDA_MEMSET_NODE_PARAMS *p, CUcontext c), (n, p, c))
EXEC_SETTER(wo_h_exec_node_set, wo_pfn_cuGraphExecNodeSetParams,
            (CUgraphNode n, CUgraphNodeParams *p), (n, p))
EXEC_SETTER(wo_h_exec_node_enable, wo_pfn_cuGraphNodeSetEnabled, (CUgraphNode n, unsigned int on),
            (n, on))

CUresult wo_h_graph_exec_destroy(wo_pfn_cuGraphExecDestroy real, int id, void *ra, CUgraphExec e)
{
    CUresult res;
    (void)ra;

    wo_count_call(id);
    if (WO_UNLIKELY(!real))
        return CUDA_ERROR_NOT_FOUND;
    res = real(e);
    if (res == CUDA_SUCCESS)
        wo_replay_forget((uint64_t)(uintptr_t)e, false);
    return res;
}
