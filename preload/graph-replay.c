/* preload/graph-replay.c: CUDA graph launches replayed kernel by kernel.
 *
 * A graph's kernels run without the launch hook: their parameters were fixed at capture, and a
 * captured launch reads its weights in place (the streaming executor's slots change every step;
 * capture.c). llama.cpp runs every step as a graph by default, so its host experts were read in
 * place over PCIe even in the steps where a whole copy on the copy engine pays (a batch that picks
 * nearly every expert).
 *
 * So the shim keeps, per graph exec, what it needs to launch the exec's work itself: the graph's
 * nodes in an order its edges allow, each kernel's function, dimensions, cluster and cooperative
 * attributes and a copy of its parameter bytes, each copy's and memset's parameters, its memory
 * allocation and free nodes (a replay makes its own allocation and moves the words that point into
 * the graph's: struct rp_alloc). It is read when a graph the shim saw captured, whose launches
 * reached registered ranges, is instantiated or an exec is updated from it (cuGraphExecUpdate):
 * the graph is alive then. A graph with any other node (host, event, child graph, conditional) or
 * more than RP_NODES nodes is launched whole.
 *
 * At a graph launch, when the exec has such a copy, nothing captures, and one of the ranges its
 * kernels read is streamed and not claimed read in place (woffload_read_in_place: the ggml hook
 * claims the steps that read a small share of the experts), or is an expert tensor with picks
 * registered and hot experts on (WOFFLOAD_PICKS_HOT: the replayed launches copy the picked rows,
 * the hot ones from the device), each node is launched on the launch's stream in that order, a
 * kernel through the launch hook's own path (preload/launch.c: scanned, redirected into the slots,
 * its event pushed). The stream runs them one after another: an order the graph allows. Otherwise
 * the graph is launched whole, as before.
 *
 * What could make the copy differ from the exec is watched (the hooks are graph-exec.c's): an
 * exec whose nodes are changed in place (cuGraphExecKernelNodeSetParams and the other exec
 * setters, cuGraphNodeSetEnabled) loses its copy until it is updated or instantiated again; an
 * update that fails keeps the exec as it was and loses the copy all the same; a destroyed exec's
 * copy is freed.
 *
 * Locking: one mutex over the table; a replay holds a reference to its copy, not the lock, while
 * it launches. Nothing here runs unless WOFFLOAD_GRAPH_REPLAY is on and something is placed (an
 * empty policy pays one relaxed load per graph launch). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/settings.h"
#include "preload/hook.h"
#include "uvm/hotpath.h"

#define RP_EXECS 1024  /* execs with a copy at once; later ones run whole */
#define RP_NODES 65536 /* larger graphs run whole */
#define RP_HITS 1024   /* distinct ranges one graph's kernels may reach */
#define RP_MAX_PARAMS 1024
#define RP_ALIGN 16

/* memory allocation nodes in one graph (a library that allocates its
 * scratch per call, as cuBLAS can in a capture, makes one per call) */
#define RP_ALLOCS 4096

enum { RP_KERNEL = 1, RP_COPY, RP_SET, RP_ALLOC, RP_FREE };

struct rp_node {
    int kind;
    union {
        struct {
            CUfunction f;
            uint32_t grid[3], block[3], cluster[3];
            unsigned shmem;
            bool coop;
            bool packed;    /* the `extra` form: one buffer, blob[first, first + size) */
            uint32_t first; /* its parameter pointers: ptrs[first, first + nparams) */
            size_t size;
        } k;
        struct {
            CUDA_MEMCPY3D c;
            int src_a, dst_a; /* the allocations its addresses are in, or -1 */
        } cp;
        struct {
            CUdeviceptr dst;
            unsigned value, esz;
            size_t n;
            int a; /* the allocation dst is in, or -1 */
        } set;
        unsigned mem; /* RP_ALLOC, RP_FREE: the allocation's index */
    };
};

/* A graph's memory allocation node: the address it has in the graph, its
 * size. A replay makes its own (cuMemAllocAsync on the launch's stream,
 * freed at the free node) and moves every parameter word, copy and memset
 * address inside it there. */
struct rp_alloc {
    CUdeviceptr gptr;
    size_t size;
    bool freed; /* the graph frees it (required); while reading: before this node */
};

/* A parameter word (blob[off], 8 bytes) that points into allocation a. */
struct rp_reloc {
    uint32_t off;
    uint16_t a;
};

struct rp_snap {
    uint64_t exec;
    uint64_t graph;   /* read from this graph, recorded by this capture (capture.c's */
    uint32_t capture; /* ids): an update from the same one reads nothing again */
    unsigned refs;    /* replays launching from it now */
    bool retired;     /* no longer the exec's: freed by the last replay */
    uint32_t n;
    struct rp_node *nodes;
    void **ptrs;
    unsigned char *blob;
    unsigned nhits;
    struct wo_ev_hit *hits;
    size_t blob_len, blob_cap, nptrs, ptrs_cap;
    unsigned nalloc;
    size_t alloc_cap;
    struct rp_alloc *alloc;
    size_t nreloc, reloc_cap;
    struct rp_reloc *reloc;
};

static pthread_mutex_t rp_lock = PTHREAD_MUTEX_INITIALIZER;
static struct rp_snap *snaps[RP_EXECS];
static unsigned nsnaps; /* written under rp_lock; read without it only to skip it */

static void snap_free(struct rp_snap *s)
{
    if (!s)
        return;
    free(s->nodes);
    free(s->ptrs);
    free(s->blob);
    free(s->hits);
    free(s->reloc);
    free(s->alloc);
    free(s);
}

static bool any_snaps(void)
{
    return __atomic_load_n(&nsnaps, __ATOMIC_RELAXED) != 0;
}

/* exec's copy (lock held), or NULL. */
static struct rp_snap *find_locked(uint64_t exec, unsigned *at)
{
    for (unsigned i = 0; i < nsnaps; i++)
        if (snaps[i]->exec == exec) {
            *at = i;
            return snaps[i];
        }
    return NULL;
}

/* Takes exec's copy out of the table (lock held); freed now, or by the
 * last replay using it. Whether there was one. */
static bool drop_locked(uint64_t exec)
{
    unsigned i;
    struct rp_snap *s = find_locked(exec, &i);

    if (!s)
        return false;
    snaps[i] = snaps[nsnaps - 1];
    __atomic_store_n(&nsnaps, nsnaps - 1, __ATOMIC_RELAXED);
    if (s->refs)
        s->retired = true;
    else
        snap_free(s);
    return true;
}

/* --- reading a graph -------------------------------------------------------- */

typedef CUresult (*nodes_fn)(CUgraph, CUgraphNode *, size_t *);
typedef CUresult (*edges_fn)(CUgraph, CUgraphNode *, CUgraphNode *, CUgraphEdgeData *, size_t *);
typedef CUresult (*type_fn)(CUgraphNode, CUgraphNodeType *);
typedef CUresult (*kparams_fn)(CUgraphNode, CUDA_KERNEL_NODE_PARAMS *);
typedef CUresult (*kattr_fn)(CUgraphNode, CUkernelNodeAttrID, CUkernelNodeAttrValue *);
typedef CUresult (*cparams_fn)(CUgraphNode, CUDA_MEMCPY3D *);
typedef CUresult (*sparams_fn)(CUgraphNode, CUDA_MEMSET_NODE_PARAMS *);

static int cmp_node(const void *a, const void *b)
{
    uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
    return x < y ? -1 : x > y;
}

/* The index of node h in the sorted (handle, index) pairs, -1 if absent. */
static long node_index(const uintptr_t *pairs, size_t n, CUgraphNode h)
{
    size_t lo = 0, hi = n;

    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (pairs[2 * mid] < (uintptr_t)h)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n && pairs[2 * lo] == (uintptr_t)h ? (long)pairs[2 * lo + 1] : -1;
}

/* The graph's nodes in an order its edges allow (Kahn's): order[0, n).
 * False when the driver cannot say or the edges name unknown nodes. */
static bool topo_order(const struct wo_real *r, CUgraph g, CUgraphNode *nodes, size_t n,
                       uint32_t *order)
{
    edges_fn edges = (edges_fn)r->cuGraphGetEdges_v2;
    size_t ne = 0;
    CUgraphNode *from = NULL, *to = NULL;
    CUgraphEdgeData *data = NULL;
    uintptr_t *pairs = NULL;
    uint32_t *indeg = NULL, *start = NULL, *adj = NULL, *queue = order;
    bool ok = false;
    size_t head = 0, tail = 0;

    if (!edges || edges(g, NULL, NULL, NULL, &ne) != CUDA_SUCCESS)
        return false;
    pairs = malloc(2 * n * sizeof(*pairs));
    indeg = calloc(n, sizeof(*indeg));
    start = calloc(n + 1, sizeof(*start));
    if (ne) {
        from = malloc(ne * sizeof(*from));
        to = malloc(ne * sizeof(*to));
        data = calloc(ne, sizeof(*data));
        adj = malloc(ne * sizeof(*adj));
    }
    if (!pairs || !indeg || !start || (ne && (!from || !to || !data || !adj)))
        goto out;
    if (ne) {
        size_t got = ne;
        if (edges(g, from, to, data, &got) != CUDA_SUCCESS || got != ne)
            goto out;
    }
    for (size_t i = 0; i < n; i++) {
        pairs[2 * i] = (uintptr_t)nodes[i];
        pairs[2 * i + 1] = i;
    }
    qsort(pairs, n, 2 * sizeof(*pairs), cmp_node);
    /* adjacency (CSR by source); the edge data (a programmatic edge) only
     * lets the destination start earlier: the stream's order is stricter */
    for (size_t e = 0; e < ne; e++) {
        long a = node_index(pairs, n, from[e]), b = node_index(pairs, n, to[e]);
        if (a < 0 || b < 0)
            goto out;
        start[a + 1]++;
        indeg[b]++;
    }
    for (size_t i = 0; i < n; i++)
        start[i + 1] += start[i];
    {
        uint32_t *fill = calloc(n, sizeof(*fill));
        if (!fill)
            goto out;
        for (size_t e = 0; e < ne; e++) {
            long a = node_index(pairs, n, from[e]), b = node_index(pairs, n, to[e]);
            adj[start[a] + fill[a]++] = (uint32_t)b;
        }
        free(fill);
    }
    for (size_t i = 0; i < n; i++)
        if (!indeg[i])
            queue[tail++] = (uint32_t)i;
    while (head < tail) {
        uint32_t v = queue[head++];
        for (uint32_t k = start[v]; k < start[v + 1]; k++)
            if (--indeg[adj[k]] == 0)
                queue[tail++] = adj[k];
    }
    ok = tail == n; /* else a cycle: no graph has one */
out:
    free(pairs);
    free(indeg);
    free(start);
    free(adj);
    free(from);
    free(to);
    free(data);
    return ok;
}

/* Adds the ranges a kernel's parameters reach to s's set (merged by range). */
static void add_hits(struct rp_snap *s, const struct wo_ev_hit *h, unsigned nh)
{
    for (unsigned i = 0; i < nh; i++) {
        unsigned j;
        for (j = 0; j < s->nhits; j++) {
            struct wo_ev_hit *e = &s->hits[j];
            if (e->id == h[i].id && e->gen == h[i].gen) {
                e->offset = WO_MIN(e->offset, h[i].offset);
                e->hi = WO_MAX(e->hi, h[i].hi);
                break;
            }
        }
        if (j == s->nhits && s->nhits < RP_HITS)
            s->hits[s->nhits++] = h[i];
    }
}

/* The dimensions and attributes of kernel node `node` (p: its parameters). */
static void kernel_common(const struct wo_real *r, CUgraphNode node,
                          const CUDA_KERNEL_NODE_PARAMS *p, CUfunction f, struct rp_node *out)
{
    kattr_fn attr = (kattr_fn)r->cuGraphKernelNodeGetAttribute;
    CUkernelNodeAttrValue v;

    memset(out, 0, sizeof(*out));
    out->kind = RP_KERNEL;
    out->k.f = f;
    out->k.grid[0] = p->gridDimX;
    out->k.grid[1] = p->gridDimY;
    out->k.grid[2] = p->gridDimZ;
    out->k.block[0] = p->blockDimX;
    out->k.block[1] = p->blockDimY;
    out->k.block[2] = p->blockDimZ;
    out->k.shmem = p->sharedMemBytes;
    if (!attr)
        return;
    memset(&v, 0, sizeof(v));
    if (attr(node, CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, &v) == CUDA_SUCCESS) {
        out->k.cluster[0] = v.clusterDim.x;
        out->k.cluster[1] = v.clusterDim.y;
        out->k.cluster[2] = v.clusterDim.z;
    }
    memset(&v, 0, sizeof(v));
    if (attr(node, CU_LAUNCH_ATTRIBUTE_COOPERATIVE, &v) == CUDA_SUCCESS)
        out->k.coop = v.cooperative != 0;
}

/* Room for size more bytes in s's blob, at an aligned offset (*at). */
static bool blob_room(struct rp_snap *s, size_t size, size_t *at)
{
    *at = (s->blob_len + RP_ALIGN - 1) & ~(size_t)(RP_ALIGN - 1);
    if (*at + size > s->blob_cap) {
        size_t cap = WO_MAX(s->blob_cap * 2, *at + size + 4096);
        unsigned char *nb = realloc(s->blob, cap);
        if (!nb)
            return false;
        s->blob = nb;
        s->blob_cap = cap;
    }
    s->blob_len = *at + size;
    return true;
}

/* The allocation of s live at the node being read (allocated, not yet
 * freed, in the nodes' order) whose graph address range holds v, or -1.
 * Live ones only: the driver may give an allocation the addresses of one
 * the graph freed before it (scratch allocated and freed per call, each at
 * the same address), and a word means the allocation live where it is
 * used. Its edges order a use before the free, the free before the next
 * allocation: so does the order read in. */
static int alloc_of(const struct rp_snap *s, uint64_t v)
{
    for (unsigned a = s->nalloc; a-- > 0;)
        if (!s->alloc[a].freed && v >= s->alloc[a].gptr && v - s->alloc[a].gptr < s->alloc[a].size)
            return (int)a;
    return -1;
}

/* The words of blob[at, at + size) (8-byte steps) that point into one of
 * the graph's allocations, noted for the replay to move. */
static bool note_relocs(struct rp_snap *s, size_t at, size_t size)
{
    for (size_t off = 0; s->nalloc && off + 8 <= size; off += 8) {
        uint64_t v;
        int a;

        memcpy(&v, s->blob + at + off, sizeof(v));
        a = alloc_of(s, v);
        if (a < 0)
            continue;
        if (wo_grow((void **)&s->reloc, &s->reloc_cap, s->nreloc + 1, sizeof(*s->reloc)) < 0)
            return false;
        s->reloc[s->nreloc++] = (struct rp_reloc){(uint32_t)(at + off), (uint16_t)a};
    }
    return true;
}

/* size bytes from src into s's blob (at an aligned offset, *at), the
 * words among them that point into the graph's allocations noted. */
static bool copy_in(struct rp_snap *s, const void *src, size_t size, size_t *at)
{
    if (!blob_room(s, size, at))
        return false;
    memcpy(s->blob + *at, src, size);
    return note_relocs(s, *at, size);
}

/* A kernel node into s: its parameters copied into the blob, as separate
 * parameters (their blob offsets in ptrs until the blob is final) or as
 * one packed buffer (the `extra` form: CU_LAUNCH_PARAM_BUFFER_POINTER and
 * _SIZE, as cuBLAS launches). False: it cannot be replayed. */
static bool read_kernel(const struct wo_real *r, CUgraphNode node, struct rp_snap *s,
                        struct rp_node *out, const char **why)
{
    kparams_fn get = (kparams_fn)r->cuGraphKernelNodeGetParams_v2;
    CUDA_KERNEL_NODE_PARAMS p;
    uint16_t sizes[RP_MAX_PARAMS];
    struct wo_ev_hit hits[WO_EV_MAX_HITS];
    CUfunction f;
    size_t at;
    int n;

    memset(&p, 0, sizeof(p));
    *why = "whose parameters the driver did not give";
    if (!get || get(node, &p) != CUDA_SUCCESS)
        return false;
    f = p.func ? p.func : (CUfunction)p.kern;
    *why = "with no function";
    if (!f)
        return false;
    *why = "whose parameters could not be copied";
    if (!p.kernelParams && p.extra) {
        const void *buf;
        size_t size;

        wo_launch_extra(p.extra, &buf, &size);
        kernel_common(r, node, &p, f, out);
        if (!buf || !copy_in(s, buf, size, &at))
            return false;
        out->k.packed = true;
        out->k.first = (uint32_t)at;
        out->k.size = size;
        add_hits(s, hits, wo_launch_hits(f, NULL, p.extra, hits, WO_EV_MAX_HITS));
        return true;
    }
    n = wo_launch_param_sizes(f, sizes, RP_MAX_PARAMS);
    *why = n < 0 ? "whose parameter layout is unknown" : "with no parameter array";
    if (n < 0 || (n && !p.kernelParams))
        return false;
    *why = "whose parameters could not be copied";
    kernel_common(r, node, &p, f, out);
    if (wo_grow((void **)&s->ptrs, &s->ptrs_cap, s->nptrs + (size_t)n, sizeof(*s->ptrs)) < 0)
        return false;
    out->k.first = (uint32_t)s->nptrs;
    for (int i = 0; i < n; i++) {
        if (!copy_in(s, p.kernelParams[i], sizes[i], &at))
            return false;
        s->ptrs[s->nptrs++] = (void *)(uintptr_t)at;
    }
    add_hits(s, hits, wo_launch_hits(f, p.kernelParams, NULL, hits, WO_EV_MAX_HITS));
    return true;
}

/* Says why a graph is launched whole (info; the first 8 graphs). */
static void say_whole(const char *why, int type)
{
    static const char *const names[] = {"kernel",
                                        "memcpy",
                                        "memset",
                                        "host",
                                        "child graph",
                                        "empty",
                                        "event wait",
                                        "event record",
                                        "external semaphore signal",
                                        "external semaphore wait",
                                        "memory allocation",
                                        "memory free",
                                        "batch memory op",
                                        "conditional"};
    static unsigned said;

    if (__atomic_fetch_add(&said, 1, __ATOMIC_RELAXED) >= 8)
        return;
    if (type >= 0)
        wo_info("graph replay: a graph holds a %s node (type %d): it is launched whole, reading "
                "in place",
                type < (int)(sizeof(names) / sizeof(names[0])) ? names[type] : "newer", type);
    else
        wo_info("graph replay: a graph %s: it is launched whole, reading in place", why);
}

/* Reads graph g into a copy for exec; NULL when it cannot be replayed (or
 * reaches no registered range: nothing to gain). */
static struct rp_snap *snap_read(uint64_t exec, CUgraph g)
{
    const struct wo_real *r = wo_real_driver_peek();
    nodes_fn get_nodes = r ? (nodes_fn)r->cuGraphGetNodes : NULL;
    type_fn get_type = r ? (type_fn)r->cuGraphNodeGetType : NULL;
    CUgraphNode *nodes = NULL;
    uint32_t *order = NULL;
    struct rp_snap *s = NULL;
    size_t n = 0;
    bool ok = false, readable = false;

    if (!get_nodes || !get_type || get_nodes(g, NULL, &n) != CUDA_SUCCESS || n == 0)
        return NULL;
    if (n > RP_NODES) {
        say_whole("has more than 65,536 nodes", -1);
        wo_count(WO_CTR_graph_snapshot_unsupported, 1);
        return NULL;
    }
    nodes = malloc(n * sizeof(*nodes));
    order = malloc(n * sizeof(*order));
    s = calloc(1, sizeof(*s));
    if (s) {
        s->nodes = calloc(n, sizeof(*s->nodes));
        s->hits = calloc(RP_HITS, sizeof(*s->hits));
    }
    if (!nodes || !order || !s || !s->nodes || !s->hits)
        goto out;
    {
        size_t got = n;
        if (get_nodes(g, nodes, &got) != CUDA_SUCCESS || got != n)
            goto out;
    }
    if (!topo_order(r, g, nodes, n, order)) {
        say_whole("whose edges could not be read", -1);
        goto out;
    }
    s->exec = exec;
    for (size_t i = 0; i < n; i++) {
        CUgraphNode node = nodes[order[i]];
        struct rp_node *out = &s->nodes[s->n];
        CUgraphNodeType t;

        if (get_type(node, &t) != CUDA_SUCCESS)
            goto out;
        switch (t) {
        case CU_GRAPH_NODE_TYPE_EMPTY:
            continue;
        case CU_GRAPH_NODE_TYPE_KERNEL: {
            const char *why = "";
            char line[96];
            if (!read_kernel(r, node, s, out, &why)) {
                snprintf(line, sizeof(line), "holds a kernel %s", why);
                say_whole(line, -1);
                goto out;
            }
            break;
        }
        case CU_GRAPH_NODE_TYPE_MEMCPY: {
            cparams_fn get = (cparams_fn)r->cuGraphMemcpyNodeGetParams;
            CUDA_MEMCPY3D *c = &out->cp.c;
            out->kind = RP_COPY;
            if (!get || get(node, c) != CUDA_SUCCESS) {
                say_whole("holds a copy whose parameters could not be read", -1);
                goto out;
            }
            out->cp.src_a = c->srcMemoryType == CU_MEMORYTYPE_DEVICE ||
                                    c->srcMemoryType == CU_MEMORYTYPE_UNIFIED
                                ? alloc_of(s, c->srcDevice)
                                : -1;
            out->cp.dst_a = c->dstMemoryType == CU_MEMORYTYPE_DEVICE ||
                                    c->dstMemoryType == CU_MEMORYTYPE_UNIFIED
                                ? alloc_of(s, c->dstDevice)
                                : -1;
            break;
        }
        case CU_GRAPH_NODE_TYPE_MEMSET: {
            sparams_fn get = (sparams_fn)r->cuGraphMemsetNodeGetParams;
            CUDA_MEMSET_NODE_PARAMS p;
            memset(&p, 0, sizeof(p));
            if (!get || get(node, &p) != CUDA_SUCCESS || p.height > 1 ||
                (p.elementSize != 1 && p.elementSize != 2 && p.elementSize != 4)) {
                say_whole("holds a memset of more than one row (or unreadable)", -1);
                goto out;
            }
            out->kind = RP_SET;
            out->set.dst = p.dst;
            out->set.value = p.value;
            out->set.esz = p.elementSize;
            out->set.n = p.width;
            out->set.a = alloc_of(s, p.dst);
            break;
        }
        case CU_GRAPH_NODE_TYPE_MEM_ALLOC: {
            CUresult (*get)(CUgraphNode, CUDA_MEM_ALLOC_NODE_PARAMS *) = (CUresult(*)(
                CUgraphNode, CUDA_MEM_ALLOC_NODE_PARAMS *))r->cuGraphMemAllocNodeGetParams;
            CUDA_MEM_ALLOC_NODE_PARAMS p;
            memset(&p, 0, sizeof(p));
            if (!get || get(node, &p) != CUDA_SUCCESS || s->nalloc == RP_ALLOCS ||
                p.poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE || !p.dptr) {
                say_whole("holds a memory allocation it cannot make (not on the device, "
                          "unreadable, or too many)",
                          -1);
                goto out;
            }
            if (wo_grow((void **)&s->alloc, &s->alloc_cap, s->nalloc + 1, sizeof(*s->alloc)) < 0)
                goto out;
            out->kind = RP_ALLOC;
            out->mem = s->nalloc;
            s->alloc[s->nalloc++] = (struct rp_alloc){p.dptr, p.bytesize, false};
            break;
        }
        case CU_GRAPH_NODE_TYPE_MEM_FREE: {
            CUresult (*get)(CUgraphNode, CUdeviceptr *) =
                (CUresult(*)(CUgraphNode, CUdeviceptr *))r->cuGraphMemFreeNodeGetParams;
            CUdeviceptr d = 0;
            int a;
            if (!get || get(node, &d) != CUDA_SUCCESS || (a = alloc_of(s, d)) < 0 ||
                s->alloc[a].gptr != d) {
                say_whole("frees memory it did not allocate (or unreadable)", -1);
                goto out;
            }
            out->kind = RP_FREE;
            out->mem = (unsigned)a;
            s->alloc[a].freed = true;
            break;
        }
        default: /* host, event, child graph, conditional: run whole */
            say_whole(NULL, (int)t);
            goto out;
        }
        s->n++;
    }
    /* memory the graph allocates and leaves to the engine to free: the
     * replay's would be another address */
    for (unsigned a = 0; a < s->nalloc; a++)
        if (!s->alloc[a].freed) {
            char line[96];
            snprintf(line, sizeof(line), "allocates memory it does not free (%zu bytes, %u of %u)",
                     (size_t)s->alloc[a].size, a + 1, s->nalloc);
            say_whole(line, -1);
            goto out;
        }
    /* the blob is final: offsets become pointers */
    for (size_t i = 0; i < s->nptrs; i++)
        s->ptrs[i] = s->blob + (uintptr_t)s->ptrs[i];
    readable = true;
    ok = s->nhits > 0; /* else it reaches no registered range: nothing to move */
out:
    free(nodes);
    free(order);
    if (!ok) {
        if (!readable)
            wo_count(WO_CTR_graph_snapshot_unsupported, 1);
        snap_free(s);
        return NULL;
    }
    return s;
}

/* exec now runs graph's nodes (instantiated from it, or updated to it);
 * capture: the capture that recorded it (capture.c's id; 0: not captured
 * through the shim, or its launches reached no registered range). */
void wo_replay_note(uint64_t exec, uint64_t graph, uint32_t capture)
{
    struct rp_snap *s = NULL, *old;
    unsigned at;
    uint64_t t0;

    if (!wo_settings()->graph_replay)
        return;
    if (capture && any_snaps()) {
        /* updated from the graph it was read from (llama.cpp updates its
         * exec right after instantiating it): nothing changed */
        bool same;
        pthread_mutex_lock(&rp_lock);
        old = find_locked(exec, &at);
        same = old && old->graph == graph && old->capture == capture;
        pthread_mutex_unlock(&rp_lock);
        if (same)
            return;
    }
    if (capture && graph && __atomic_load_n(&wo_launch_scan, __ATOMIC_RELAXED)) {
        t0 = wo_now_ns();
        s = snap_read(exec, (CUgraph)(uintptr_t)graph);
        wo_count(WO_CTR_graph_snapshots, 1);
        wo_count(WO_CTR_graph_snapshot_ns, wo_now_ns() - t0);
    }
    if (!s && !any_snaps())
        return;
    pthread_mutex_lock(&rp_lock);
    drop_locked(exec); /* the copy of what the exec ran before */
    if (s && nsnaps < RP_EXECS) {
        s->graph = graph;
        s->capture = capture;
        snaps[nsnaps] = s;
        __atomic_store_n(&nsnaps, nsnaps + 1, __ATOMIC_RELAXED);
        s = NULL;
    }
    pthread_mutex_unlock(&rp_lock);
    if (s) {
        wo_log_once(WO_LOG_INFO,
                    "graph replay: more than %d graph execs at once read streamed "
                    "weights; later ones run whole (in place)",
                    RP_EXECS);
        snap_free(s);
    }
}

/* exec's nodes changed in place, or it is gone: its copy is dropped. */
void wo_replay_forget(uint64_t exec, bool changed)
{
    bool dropped;

    if (!any_snaps())
        return;
    pthread_mutex_lock(&rp_lock);
    dropped = drop_locked(exec);
    pthread_mutex_unlock(&rp_lock);
    if (dropped && changed)
        wo_count(WO_CTR_graph_exec_changed, 1);
}

/* The child of fork: the parent's handles are not ours. Registered from
 * this file's constructor (the life cycle, init.c, needs no list of the
 * parts); only a process whose shim was active has anything to forget. */
static void replay_atfork_child(void)
{
    if (wo_preload_state != WO_STATE_ACTIVE)
        return;
    pthread_mutex_init(&rp_lock, NULL);
    for (unsigned i = 0; i < nsnaps; i++)
        snap_free(snaps[i]);
    nsnaps = 0;
}

__attribute__((constructor)) static void replay_ctor(void)
{
    (void)pthread_atfork(NULL, NULL, replay_atfork_child);
}

/* --- the launch ------------------------------------------------------------- */

/* Whether a copy that reads s's ranges pays: one of them is streamed and
 * not claimed read in place now, or has picked staging with hot experts
 * (their rows come from the device, not over the link) or on the copy
 * engine (wo_picks_replay_wanted). */
static bool stages(const struct rp_snap *s)
{
    if (wo_picks_replay_wanted(s->hits, s->nhits))
        return true;
    for (unsigned i = 0; i < s->nhits; i++) {
        const struct wo_ev_hit *h = &s->hits[i];
        const struct wo_stream_entry *e;
        uint32_t it = 0, sid;

        while ((e = wo_stream_span_next(h, &it, &sid)))
            if (wo_stream_hit_in_span(e, h, true) && !wo_stream_inplace_now(e))
                return true;
    }
    return false;
}

/* The bytes [lo, lo + n) a copy's destination spans. */
static void copy_dst(const CUDA_MEMCPY3D *p, uint64_t *lo, uint64_t *n)
{
    uint64_t base = p->dstMemoryType == CU_MEMORYTYPE_HOST ? (uint64_t)(uintptr_t)p->dstHost
                                                           : (uint64_t)p->dstDevice;
    uint64_t h = p->Height ? p->Height : 1, d = p->Depth ? p->Depth : 1;
    uint64_t pitch = p->dstPitch, hp = p->dstHeight;

    *lo = base + p->dstXInBytes + p->dstY * pitch + p->dstZ * pitch * hp;
    *n = p->WidthInBytes + (h - 1) * pitch + (d - 1) * pitch * hp;
}

/* One replay's own state: the parameter bytes it launches from (the
 * copy's, or its own copy when the graph allocates memory, with the
 * words into an allocation moved to the replay's), and its allocations. */
struct rp_run {
    const struct rp_snap *s;
    unsigned char *blob;
    void **ptrs;
    CUdeviceptr *dev; /* the replay's allocations (0: not made, or freed) */
};

/* v, an address in the graph's allocation a (-1: none), moved into the
 * replay's. */
static CUdeviceptr moved(const struct rp_run *x, int a, CUdeviceptr v)
{
    return a < 0 || !x->dev[a] ? v : x->dev[a] + (v - x->s->alloc[a].gptr);
}

static CUresult run_alloc(struct rp_run *x, unsigned a, CUstream cs)
{
    wo_pfn_cuMemAllocAsync al = (wo_pfn_cuMemAllocAsync)wo_real_hook(WO_HOOK_cuMemAllocAsync);
    CUdeviceptr d = 0;
    CUresult res = al ? al(&d, x->s->alloc[a].size, cs) : CUDA_ERROR_NOT_FOUND;

    if (res != CUDA_SUCCESS)
        return res;
    x->dev[a] = d;
    /* the parameter words that point into it now point into the replay's */
    for (size_t i = 0; i < x->s->nreloc; i++) {
        const struct rp_reloc *rl = &x->s->reloc[i];
        uint64_t v;
        if (rl->a != a)
            continue;
        memcpy(&v, x->blob + rl->off, sizeof(v));
        v = d + (v - x->s->alloc[a].gptr);
        memcpy(x->blob + rl->off, &v, sizeof(v));
    }
    return CUDA_SUCCESS;
}

static CUresult run_free(struct rp_run *x, unsigned a, CUstream cs)
{
    wo_pfn_cuMemFreeAsync fr = (wo_pfn_cuMemFreeAsync)wo_real_hook(WO_HOOK_cuMemFreeAsync);
    CUresult res;

    if (!x->dev[a])
        return CUDA_SUCCESS;
    res = fr ? fr(x->dev[a], cs) : CUDA_ERROR_NOT_FOUND;
    if (res == CUDA_SUCCESS)
        x->dev[a] = 0;
    return res;
}

static CUresult run_node(struct rp_run *x, const struct rp_node *nd, uint64_t stream, void *ra)
{
    const struct wo_real *r = wo_real_driver_peek();
    CUstream cs = (CUstream)(uintptr_t)stream;

    switch (nd->kind) {
    case RP_KERNEL:
        if (nd->k.packed) {
            size_t size = nd->k.size;
            void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, x->blob + nd->k.first,
                             CU_LAUNCH_PARAM_BUFFER_SIZE, &size, CU_LAUNCH_PARAM_END};
            return wo_launch_node(nd->k.f, nd->k.grid, nd->k.block, nd->k.shmem, nd->k.cluster,
                                  nd->k.coop, stream, NULL, extra, ra);
        }
        return wo_launch_node(nd->k.f, nd->k.grid, nd->k.block, nd->k.shmem, nd->k.cluster,
                              nd->k.coop, stream, x->ptrs + nd->k.first, NULL, ra);
    case RP_COPY: {
        wo_pfn_cuMemcpy3DAsync_v2 cp =
            (wo_pfn_cuMemcpy3DAsync_v2)wo_real_hook(WO_HOOK_cuMemcpy3DAsync_v2);
        CUDA_MEMCPY3D c = nd->cp.c;
        uint64_t lo, n;
        c.srcDevice = moved(x, nd->cp.src_a, c.srcDevice);
        c.dstDevice = moved(x, nd->cp.dst_a, c.dstDevice);
        copy_dst(&c, &lo, &n);
        if (__atomic_load_n(&wo_stream_tab.active, __ATOMIC_ACQUIRE) && n)
            wo_stream_note_write(lo, n); /* a slot of what it writes is dropped first */
        return cp ? cp(&c, cs) : CUDA_ERROR_NOT_FOUND;
    }
    case RP_SET: {
        uint64_t n = nd->set.n * nd->set.esz;
        CUdeviceptr dst = moved(x, nd->set.a, nd->set.dst);
        if (__atomic_load_n(&wo_stream_tab.active, __ATOMIC_ACQUIRE) && n)
            wo_stream_note_write(dst, n);
        if (!r)
            return CUDA_ERROR_NOT_FOUND;
        if (nd->set.esz == 1 && r->cuMemsetD8Async)
            return ((CUresult(*)(CUdeviceptr, unsigned char, size_t, CUstream))r->cuMemsetD8Async)(
                dst, (unsigned char)nd->set.value, nd->set.n, cs);
        if (nd->set.esz == 2 && r->cuMemsetD16Async)
            return (
                (CUresult(*)(CUdeviceptr, unsigned short, size_t, CUstream))r->cuMemsetD16Async)(
                dst, (unsigned short)nd->set.value, nd->set.n, cs);
        if (nd->set.esz == 4 && r->cuMemsetD32Async)
            return ((CUresult(*)(CUdeviceptr, unsigned int, size_t, CUstream))r->cuMemsetD32Async)(
                dst, nd->set.value, nd->set.n, cs);
        return CUDA_ERROR_NOT_FOUND;
    }
    case RP_ALLOC:
        return run_alloc(x, nd->mem, cs);
    case RP_FREE:
        return run_free(x, nd->mem, cs);
    default:
        return CUDA_SUCCESS;
    }
}

/* The replay's parameter bytes: the copy's own, or (the graph allocates
 * memory: words move per replay) a copy of them. False without memory. */
static bool run_begin(struct rp_run *x, const struct rp_snap *s)
{
    memset(x, 0, sizeof(*x));
    x->s = s;
    x->blob = s->blob;
    x->ptrs = s->ptrs;
    if (!s->nalloc)
        return true;
    x->dev = calloc(s->nalloc, sizeof(*x->dev));
    if (!x->dev)
        return false;
    if (!s->nreloc)
        return true;
    x->blob = malloc(s->blob_len ? s->blob_len : 1);
    x->ptrs = malloc((s->nptrs ? s->nptrs : 1) * sizeof(*x->ptrs));
    if (!x->blob || !x->ptrs) {
        free(x->blob);
        free(x->ptrs);
        free(x->dev);
        return false;
    }
    memcpy(x->blob, s->blob, s->blob_len);
    for (size_t i = 0; i < s->nptrs; i++)
        x->ptrs[i] = x->blob + ((unsigned char *)s->ptrs[i] - s->blob);
    return true;
}

/* After the last node (or a failure): what the replay allocated and did
 * not free yet is freed on the stream; its own bytes freed. */
static void run_end(struct rp_run *x, uint64_t stream)
{
    for (unsigned a = 0; x->dev && a < x->s->nalloc; a++)
        (void)run_free(x, a, (CUstream)(uintptr_t)stream);
    free(x->dev);
    if (x->blob != x->s->blob) {
        free(x->blob);
        free(x->ptrs);
    }
}

int wo_replay_launch(uint64_t exec, uint64_t stream, void *ra, CUresult *err)
{
    struct rp_snap *s = NULL;
    struct rp_run x;
    CUresult res = CUDA_SUCCESS;
    uint32_t done = 0;
    uint64_t t0;
    unsigned at;

    /* something to replay for: the streaming executor (once active), or
     * picked staging (registered picks) */
    if (WO_LIKELY(!any_snaps()) || (!__atomic_load_n(&wo_stream_tab.active, __ATOMIC_ACQUIRE) &&
                                    !__atomic_load_n(&wo_picks_any, __ATOMIC_ACQUIRE)))
        return 0;
    /* launched into a capture, the graph becomes a node of another: whole */
    if (wo_capture_of(stream) || wo_capture_joined(stream))
        return 0;
    pthread_mutex_lock(&rp_lock);
    s = find_locked(exec, &at);
    if (s && stages(s))
        s->refs++;
    else
        s = NULL;
    pthread_mutex_unlock(&rp_lock);
    if (!s)
        return 0;
    t0 = wo_now_ns();
    if (!run_begin(&x, s)) {
        res = CUDA_ERROR_OUT_OF_MEMORY; /* nothing ran: launched whole below */
    } else {
        for (; done < s->n; done++) {
            res = run_node(&x, &s->nodes[done], stream, ra);
            if (res != CUDA_SUCCESS)
                break;
        }
        run_end(&x, stream);
    }
    pthread_mutex_lock(&rp_lock);
    if (--s->refs == 0 && s->retired)
        snap_free(s);
    pthread_mutex_unlock(&rp_lock);
    if (res != CUDA_SUCCESS && done == 0)
        return 0; /* nothing ran: the graph runs whole instead */
    if (res != CUDA_SUCCESS) {
        wo_count(WO_CTR_graph_replay_failed, 1);
        wo_log_once(WO_LOG_WARN,
                    "graph replay: node %u of a graph failed (%d): the graph "
                    "launch returns that error",
                    done, (int)res);
        *err = res;
        return -1;
    }
    wo_count(WO_CTR_graph_replays, 1);
    /* the engine thread's time in the replay (its launches, the copies
     * they stage), not the GPU's */
    wo_count(WO_CTR_graph_replay_ns, wo_now_ns() - t0);
    wo_capture_graph_replayed(exec);
    return 1;
}
