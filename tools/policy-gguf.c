/* tools/policy-gguf.c: `woffload-policy gguf`: where a policy puts each
 * tensor of a GGUF model, before it is loaded. The names and bytes come
 * from the file's header (tools/gguf.c): they are the names the ggml hook
 * tags llama.cpp's tensors with, announced before their bytes, so `fit:`
 * sees all of them at seal as it does here. The matching is policy/'s,
 * fit's choice policy/fit.c's (by tensor kind: a GGUF says nothing of how
 * often a tensor is read). Then the bytes a decode step reads off the
 * device at a few batch sizes, with a uniform router, and the time they
 * take at the link's rate: the bound a placement can reach. */
#include "tools/policy-gguf.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/macro.h"
#include "core/settings.h"
#include "policy/policy.h"
#include "tools/gguf.h"
#include "uvm/fit-split.h"
#include "uvm/picks-geom.h"

#define MAX_BATCHES 16
#define LINK_GBPS 55.0 /* the copy engine's rate on the lent H100 and H200 (device-facts) */

struct gargs {
    const char *gguf, *policy;
    uint64_t gpu, engine;
    bool has_gpu, list, compare;
    double link;
    unsigned nb;
    unsigned batch[MAX_BATCHES];
};

static void gguf_usage(FILE *f)
{
    fprintf(f,
            "usage: woffload-policy gguf MODEL.gguf [POLICY] [--gpu SIZE] [--engine SIZE]\n"
            "                            [--batch N[,N...]] [--link GBPS] [--list] [--compare]\n"
            "Where POLICY puts each tensor of MODEL.gguf (by the GGUF names the ggml hook\n"
            "tags llama.cpp's tensors with), the bytes each placement holds, and the bytes a\n"
            "decode step reads off the device at each batch size (a uniform router) with the\n"
            "time they take at the link's rate. Reads the file's header only.\n"
            "  POLICY          a policy file (none: every tensor on the device)\n"
            "  --gpu SIZE      the GPU's memory, for a policy with fit: (its N%% and its budget)\n"
            "  --engine SIZE   device memory the engine holds beside the weights (KV cache,\n"
            "                  compute buffers: llama.cpp's log says them; under fit also the\n"
            "                  process's CUDA context, about 0.5 GiB: the shim's seal line\n"
            "                  says it); default 0\n"
            "  --batch LIST    decode batch sizes (default 1,8,32)\n"
            "  --link GBPS     host-to-device rate for the bound (default 55, the copy engine's)\n"
            "  --list          one line a tensor: name, type, bytes, placement, rule\n"
            "  --compare       beside the policy, llama.cpp's own offloads within the same device\n"
            "                  memory for weights (fit's budget, else --gpu less --engine):\n"
            "                  -ot exps=CPU and the fewest --n-cpu-moe layers that fit\n"
            "With fit:, its split as the shim makes it at seal: the reserve, the staging\n"
            "slots' room (lent to managed weights while they are empty), the picked copies'\n"
            "buffers and the weights on the device.\n"
            "With prefetch.hot_experts, the hot experts each expert tensor off the device holds\n"
            "(auto: from --gpu) and the rows they serve from the device.\n"
            "Exit status: 0 done, 2 bad input (each message names the option or file).\n");
}

static int parse_batches(struct gargs *a, const char *s)
{
    char *end;

    a->nb = 0;
    while (*s) {
        unsigned long v = strtoul(s, &end, 10);
        if (end == s || v == 0 || v > 65536 || a->nb == MAX_BATCHES || (*end && *end != ','))
            return -1;
        a->batch[a->nb++] = (unsigned)v;
        s = *end ? end + 1 : end;
    }
    return a->nb ? 0 : -1;
}

static int parse_args(int argc, char **argv, struct gargs *a)
{
    static const struct option opts[] = {
        {"gpu", required_argument, NULL, 'g'},   {"engine", required_argument, NULL, 'e'},
        {"batch", required_argument, NULL, 'b'}, {"link", required_argument, NULL, 'l'},
        {"list", no_argument, NULL, 'L'},        {"help", no_argument, NULL, 'h'},
        {"compare", no_argument, NULL, 'C'},     {NULL, 0, NULL, 0},
    };
    int c;

    *a = (struct gargs){.link = LINK_GBPS, .nb = 3, .batch = {1, 8, 32}};
    optind = 0; /* GNU getopt starts afresh (main's own parse came before) */
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        char *end;
        switch (c) {
        case 'g':
        case 'e':
            if (wo_parse_size(optarg, c == 'g' ? &a->gpu : &a->engine) != 0) {
                fprintf(stderr,
                        "woffload-policy gguf: --%s '%s': expected a size such as 80GiB "
                        "or 512MiB\n",
                        c == 'g' ? "gpu" : "engine", optarg);
                return 2;
            }
            a->has_gpu |= c == 'g';
            break;
        case 'b':
            if (parse_batches(a, optarg) != 0) {
                fprintf(stderr,
                        "woffload-policy gguf: --batch '%s': expected batch sizes 1-65536 "
                        "separated by commas (at most %d), such as 1,8,32\n",
                        optarg, MAX_BATCHES);
                return 2;
            }
            break;
        case 'l':
            a->link = strtod(optarg, &end);
            if (end == optarg || *end || !(a->link > 0) || a->link > 1e6) {
                fprintf(stderr,
                        "woffload-policy gguf: --link '%s': expected GB/s above 0, such "
                        "as 55\n",
                        optarg);
                return 2;
            }
            break;
        case 'L':
            a->list = true;
            break;
        case 'C':
            a->compare = true;
            break;
        case 'h':
            gguf_usage(stdout);
            return 0;
        default:
            gguf_usage(stderr);
            return 2;
        }
    }
    if (argc - optind < 1 || argc - optind > 2) {
        fprintf(stderr, "woffload-policy gguf: expected MODEL.gguf and at most one POLICY\n");
        gguf_usage(stderr);
        return 2;
    }
    a->gguf = argv[optind];
    a->policy = argc - optind == 2 ? argv[optind + 1] : NULL;
    return -1;
}

static const char *place_name(enum wo_placement p)
{
    return p == WO_PLACE_HOST ? "host" : p == WO_PLACE_MANAGED ? "managed" : "device";
}

/* A routed-expert tensor, by fit's rule for names (ffn_*_exps in a GGUF:
 * what llama.cpp's -ot exps=CPU and --n-cpu-moe select). */
static bool experts(const char *name)
{
    return wo_fit_class(name) == WO_FIT_CLASS_EXPERTS;
}

/* The bytes of t a decode step of b tokens reads: an expert tensor's
 * experts the router picks (uniform: 1 - (1 - k/E)^b of them; all when the
 * file does not say k and E), every other tensor whole. */
static double step_bytes(const struct wo_gguf *g, const struct wo_gguf_tensor *t, unsigned b)
{
    if (experts(t->name) && g->expert_count && g->expert_used &&
        g->expert_used <= g->expert_count && g->expert_count <= UINT32_MAX)
        return (double)t->bytes * wo_picks_share(b, g->expert_used, (unsigned)g->expert_count);
    return (double)t->bytes;
}

/* Hot experts (prefetch.hot_experts, docs/picks.md "Hot experts"):
 * each expert tensor off the device gets an equal share of their bytes for
 * the rows of its most copied experts, cap[i] of E. With them on, the
 * ggml hook registers the picks of every compute, a single token's too, and
 * a picked copy takes a hot expert's row from the device: under a uniform
 * router cap/E of the picked rows (a skewed router's more). */
struct hot {
    uint64_t bytes; /* the sets' device memory, in all */
    uint64_t bufs;  /* the picked copies' two buffers of the largest such tensor */
    unsigned *cap;  /* per tensor: experts held (0: none) */
    unsigned n;     /* tensors with a set */
};

/* The bytes of tensor i a decode step of b tokens reads over the link
 * (step_bytes less the rows its hot set serves). */
static double link_bytes(const struct wo_gguf *g, const struct hot *h, size_t i, unsigned b)
{
    double v = step_bytes(g, &g->t[i], b);

    if (h && h->cap && h->cap[i])
        v *= 1.0 - (double)h->cap[i] / (double)g->expert_count;
    return v;
}

/* A tensor of llama.cpp's input layer (llama-arch.cpp, LLM_TENSOR_LAYER_INPUT),
 * which its loader keeps in a CPU buffer whatever -ngl says. */
static bool input_layer(const char *name)
{
    static const char *const in[] = {
        "token_embd",           "position_embd",         "token_types",
        "per_layer_token_embd", "masked_embd_centroids", "masked_embd_ordering"};
    size_t n = strcspn(name, ".");

    for (size_t i = 0; i < sizeof(in) / sizeof(in[0]); i++)
        if (strlen(in[i]) == n && strncmp(name, in[i], n) == 0)
            return true;
    return false;
}

/* g's tensors as llama.cpp's GPU buffers hold them (-ngl 99): the input
 * layer's taken out (counted in *cpu_n, *cpu_bytes), and, for a model with
 * tied embeddings (no output.weight), the copy of token_embd.weight its
 * loader puts in the output layer's buffer under the same name added
 * (*tied). 0 or -ENOMEM. */
static int gpu_buffers(struct wo_gguf *g, uint64_t *cpu_n, uint64_t *cpu_bytes, bool *tied)
{
    struct wo_gguf_tensor embd = {0}, *v;
    bool output = false;
    size_t n = 0;

    *cpu_n = *cpu_bytes = 0;
    *tied = false;
    for (size_t i = 0; i < g->n; i++) {
        struct wo_gguf_tensor *t = &g->t[i];
        output |= strcmp(t->name, "output.weight") == 0;
        if (!input_layer(t->name)) {
            g->t[n++] = *t;
            continue;
        }
        ++*cpu_n;
        *cpu_bytes += t->bytes;
        if (strcmp(t->name, "token_embd.weight") == 0 && !embd.name)
            embd = *t;
        else
            free(t->name);
    }
    g->n = n;
    if (!embd.name)
        return 0;
    if (output) {
        free(embd.name);
        return 0;
    }
    if (!(v = realloc(g->t, (n + 1) * sizeof(*v)))) {
        free(embd.name);
        return -ENOMEM;
    }
    g->t = v;
    g->t[g->n++] = embd; /* its output layer comes last */
    *tied = true;
    return 0;
}

/* fit's choice at seal from every name (the ggml hook announces them
 * before their bytes): out[i] set for each tensor, by the shim's own split
 * (uvm/fit-split.c: the reserve, the streaming executor's slots, the
 * picked copies' buffers, the weights, the slots' room lent), with every
 * tensor in llama.cpp's one model buffer (managed memory, so lendable);
 * prints its budget line. */
static int fit_choose(const struct gargs *a, const struct wo_policy *p, const struct wo_gguf *g,
                      const long *rule, enum wo_placement *out, uint64_t *room)
{
    const struct wo_policy_globals *pg = wo_policy_globals(p);
    const struct wo_fit *fit = &pg->fit;
    struct wo_fit_item *v = calloc(g->n ? g->n : 1, sizeof(*v));
    bool *lendable = calloc(g->n ? g->n : 1, sizeof(*lendable));
    struct wo_fit_split sp;
    uint64_t budget, slot = 0;
    char s1[32], s2[32], s3[32], s4[32], s5[32], s6[32], s7[32], s8[32], s9[32];

    if (!v || !lendable) {
        free(v);
        free(lendable);
        return -ENOMEM;
    }
    /* reserve: auto without the shim's memo of an earlier run: the default
     * (wo_fit_reserve, inside the split) */
    budget = wo_fit_budget(fit, a->gpu, a->gpu > a->engine ? a->gpu - a->engine : 0, a->engine);
    for (size_t i = 0; i < g->n; i++) {
        v[i] = (struct wo_fit_item){.name = g->t[i].name,
                                    .size = g->t[i].bytes,
                                    .weight = -1,
                                    .fixed = rule[i] >= 0 ? out[i] : WO_PLACE_UNSET,
                                    .movable = true};
        lendable[i] = true;
    }
    wo_place_fit_split(pg, fit, v, lendable, true, g->n, budget, UINT64_MAX, &sp);
    *room = budget - sp.reserve;
    for (size_t i = 0; i < g->n; i++) {
        out[i] = v[i].out;
        if (out[i] != WO_PLACE_DEVICE && sp.staging && g->t[i].bytes > slot)
            slot = g->t[i].bytes;
    }
    printf("fit: %s of weights on the device: the budget %s (the fit size of the GPU's %s, less "
           "the engine's %s, at most its free memory less keep_free %s) less the reserve %s, ",
           wo_format_size(sp.chosen, s1, sizeof(s1)), wo_format_size(budget, s2, sizeof(s2)),
           wo_format_size(a->gpu, s3, sizeof(s3)), wo_format_size(a->engine, s4, sizeof(s4)),
           wo_format_size(fit->keep_free, s5, sizeof(s5)),
           wo_format_size(sp.reserve, s6, sizeof(s6)));
    if (sp.staging && slot)
        printf("%s for %" PRIu64 " staging slots of %s", wo_format_size(sp.staging, s7, sizeof(s7)),
               (sp.staging + slot - 1) / slot, wo_format_size(slot, s8, sizeof(s8)));
    else
        printf("no room for staging slots");
    printf(" and %s for the picked copies' buffers, as at seal (docs/placement.md, fit)",
           wo_format_size(sp.picks, s9, sizeof(s9)));
    if (sp.lent)
        printf("; %s of it lent to managed weights while the slots are empty (WOFFLOAD_FIT_LEND)",
               wo_format_size(sp.lent, s1, sizeof(s1)));
    printf("\n");
    free(v);
    free(lendable);
    return 0;
}

static void header(const char *path, const struct wo_gguf *g)
{
    uint64_t all = 0, exps = 0, nexps = 0;
    char s1[32], s2[32];

    for (size_t i = 0; i < g->n; i++) {
        all += g->t[i].bytes;
        if (experts(g->t[i].name)) {
            exps += g->t[i].bytes;
            nexps++;
        }
    }
    printf("%s: GGUF v%" PRIu32 ", %s", path, g->version, g->arch ? g->arch : "no architecture");
    if (g->block_count)
        printf(", %" PRIu64 " layers", g->block_count);
    if (g->expert_count)
        printf(", %" PRIu64 " experts", g->expert_count);
    if (g->expert_used)
        printf(" top-%" PRIu64, g->expert_used);
    printf("; %zu tensors, %s", g->n, wo_format_size(all, s1, sizeof(s1)));
    if (nexps)
        printf(" (routed experts %s in %" PRIu64 " tensors)", wo_format_size(exps, s2, sizeof(s2)),
               nexps);
    printf("\n");
}

/* The bytes a decode step of b tokens reads off the device under out (h:
 * its hot experts, or NULL). */
static double off_bytes(const struct wo_gguf *g, const enum wo_placement *out, const struct hot *h,
                        unsigned b)
{
    double bytes = 0;

    for (size_t i = 0; i < g->n; i++)
        if (out[i] != WO_PLACE_DEVICE)
            bytes += link_bytes(g, h, i, b);
    return bytes;
}

static uint64_t device_bytes(const struct wo_gguf *g, const enum wo_placement *out)
{
    uint64_t n = 0;

    for (size_t i = 0; i < g->n; i++)
        n += out[i] == WO_PLACE_DEVICE ? g->t[i].bytes : 0;
    return n;
}

/* The picked copies' buffers beside largest, the largest tensor they copy:
 * WOFFLOAD_PICKS_BUFFERS of it, as the shim's pool (uvm/picks-pool.h). */
static uint64_t picks_bufs(uint64_t largest)
{
    return (uint64_t)wo_settings()->picks_buffers * largest;
}

/* The expert tensors off the device under out: how many, the largest. */
static unsigned offdev_experts(const struct wo_gguf *g, const enum wo_placement *out,
                               uint64_t *largest)
{
    unsigned n = 0;

    *largest = 0;
    for (size_t i = 0; i < g->n; i++)
        if (out[i] != WO_PLACE_DEVICE && experts(g->t[i].name)) {
            n++;
            *largest = WO_MAX(*largest, g->t[i].bytes);
        }
    return n;
}

/* want bytes of hot experts over the n expert tensors off the device under
 * out, an equal share each (the shim's split, uvm/picks.c make_hot): h's
 * caps and bytes. 0, or -ENOMEM. */
static int hot_fill(const struct wo_gguf *g, const enum wo_placement *out, unsigned n,
                    uint64_t want, uint64_t largest, struct hot *h)
{
    uint64_t share = n ? want / n : 0, map = wo_hot_map_bytes((unsigned)g->expert_count);

    *h = (struct hot){.bufs = picks_bufs(largest)};
    if (!(h->cap = calloc(g->n ? g->n : 1, sizeof(*h->cap))))
        return -ENOMEM;
    for (size_t i = 0; i < g->n; i++) {
        uint64_t row = g->t[i].bytes / g->expert_count;
        if (out[i] == WO_PLACE_DEVICE || !experts(g->t[i].name) || !row)
            continue;
        h->cap[i] = wo_hot_cap(share, (unsigned)g->expert_count, row);
        if (h->cap[i]) {
            h->bytes += map + (uint64_t)h->cap[i] * row;
            h->n++;
        }
    }
    return 0;
}

/* The hot experts p asks for, over the expert tensors off the device:
 * prefetch.hot_experts' bytes, or with `auto` the GPU's memory left after
 * the engine, the weights on the device, two picked copies' buffers of the
 * largest such tensor and the managed cap's margin (what the shim finds
 * free when it makes the first set). Prints what it found. 0, or -ENOMEM. */
static int hot_plan(const struct gargs *a, const struct wo_policy *p, const struct wo_gguf *g,
                    const enum wo_placement *out, struct hot *h)
{
    uint64_t want = p ? wo_policy_globals(p)->prefetch.hot_experts : 0, largest;
    unsigned n, lo, hi = 0;
    char s1[32], s2[32], s3[32];

    *h = (struct hot){0};
    if (!want || !g->expert_count || g->expert_count > UINT32_MAX ||
        !(n = offdev_experts(g, out, &largest)))
        return 0;
    if (want == WO_HOT_EXPERTS_AUTO) {
        uint64_t taken = a->engine + device_bytes(g, out) + picks_bufs(largest) +
                         ((uint64_t)wo_settings()->managed_margin_mib << 20);
        if (!a->has_gpu) {
            printf("hot experts: auto (the device memory free when the first set is made, less "
                   "the managed cap's margin): give --gpu SIZE to see how much\n");
            return 0;
        }
        want = a->gpu > taken ? a->gpu - taken : 0;
    }
    if (hot_fill(g, out, n, want, largest, h) != 0)
        return -ENOMEM;
    lo = (unsigned)g->expert_count;
    for (size_t i = 0; i < g->n; i++)
        if (h->cap[i]) {
            lo = WO_MIN(lo, h->cap[i]);
            hi = WO_MAX(hi, h->cap[i]);
        }
    printf("hot experts: %s asked, %s held by %u of the %u expert tensors off the device (an "
           "equal share each, %s): %u-%u of %" PRIu64 " experts each, which serve that share of "
           "a uniform router's picked rows from the device (a skewed router's more)\n",
           wo_format_size(want, s1, sizeof(s1)), wo_format_size(h->bytes, s2, sizeof(s2)), h->n, n,
           wo_format_size(want / n, s3, sizeof(s3)), h->n ? lo : 0, hi, g->expert_count);
    return 0;
}

/* A row of --compare: its device memory (weights, and with h its hot
 * experts' sets and picked copies' buffers) and a step's time on the link
 * at each batch. */
static void compare_row(const struct gargs *a, const struct wo_gguf *g, const char *label,
                        const enum wo_placement *out, const struct hot *h, uint64_t room)
{
    uint64_t dev = device_bytes(g, out) + (h ? h->bytes + h->bufs : 0);
    char s1[32];

    printf("  %-24s %12s%s", label, wo_format_size(dev, s1, sizeof(s1)),
           dev > room ? " (over)" : "       ");
    for (unsigned k = 0; k < a->nb; k++)
        printf(" %10.1f", off_bytes(g, out, h, a->batch[k]) / (a->link * 1e9) * 1e3);
    printf("\n");
}

/* The policy beside llama.cpp's own offloads, each within room bytes of
 * device memory for weights: -ot exps=CPU (every routed expert on the
 * host) and --n-cpu-moe N, the fewest first layers whose experts on the
 * host leave the rest within room. */
static int compare(const struct gargs *a, const struct wo_gguf *g, const enum wo_placement *out,
                   const struct hot *h, uint64_t room)
{
    enum wo_placement *v = calloc(g->n ? g->n : 1, sizeof(*v));
    long layers = 0;
    char s1[32], label[48];

    if (!v)
        return -ENOMEM;
    printf("beside llama.cpp's own, within %s of device memory for weights (a decode step's "
           "time on the link, ms):\n  %-24s %12s       ",
           wo_format_size(room, s1, sizeof(s1)), "placement", "device");
    for (unsigned k = 0; k < a->nb; k++)
        printf("   batch %-2u", a->batch[k]);
    printf("\n");
    compare_row(a, g, h && h->n ? "the policy (hot experts)" : "the policy", out, h, room);
    for (size_t i = 0; i < g->n; i++) {
        v[i] = experts(g->t[i].name) ? WO_PLACE_HOST : WO_PLACE_DEVICE;
        layers = WO_MAX(layers, wo_policy_layer_of(g->t[i].name) + 1);
    }
    compare_row(a, g, "-ot exps=CPU", v, NULL, room);
    {
        /* every expert host, the rest of the room hot: a fixed size, so no
         * margin; two picked copies' buffers of the largest beside it */
        uint64_t largest, dev = device_bytes(g, v), want;
        unsigned n = offdev_experts(g, v, &largest);
        struct hot hh;

        want = room > dev + picks_bufs(largest) ? room - dev - picks_bufs(largest) : 0;
        if (n && want && g->expert_count && g->expert_count <= UINT32_MAX) {
            if (hot_fill(g, v, n, want, largest, &hh) != 0) {
                free(v);
                return -ENOMEM;
            }
            compare_row(a, g, "exps host + hot experts", v, &hh, room);
            free(hh.cap);
        }
    }
    for (long n = 0; n <= layers; n++) {
        for (size_t i = 0; i < g->n; i++) {
            long l = wo_policy_layer_of(g->t[i].name);
            v[i] = experts(g->t[i].name) && l >= 0 && l < n ? WO_PLACE_HOST : WO_PLACE_DEVICE;
        }
        if (device_bytes(g, v) <= room || n == layers) {
            snprintf(label, sizeof(label), "--n-cpu-moe %ld", n);
            compare_row(a, g, label, v, NULL, room);
            break;
        }
    }
    free(v);
    return 0;
}

static void bounds(const struct gargs *a, const struct wo_gguf *g, const enum wo_placement *out,
                   const struct hot *h)
{
    char s1[32];

    printf("a decode step off the device (%s%s; at %.0f GB/s):\n",
           g->expert_count && g->expert_used ? "a uniform router's picks"
                                             : "experts read whole: the file gives no top-k",
           h->n ? ", less the rows the hot experts serve" : "", a->link);
    for (unsigned k = 0; k < a->nb; k++) {
        double bytes = off_bytes(g, out, h, a->batch[k]);
        double s = bytes / (a->link * 1e9);
        printf("  batch %-5u %10s  %8.1f ms", a->batch[k],
               wo_format_size((uint64_t)bytes, s1, sizeof(s1)), s * 1e3);
        if (s > 0)
            printf("  (the link allows at most %.1f tok/s)", a->batch[k] / s);
        printf("\n");
    }
}

/* The device memory a run adds beside the weights when it stages: slots
 * of at most the largest tensor off the device (docs/prefetch.md, Slots),
 * picked copies' buffers two of it (docs/picks.md, Picked experts). */
static void staging(const struct wo_policy *p, const struct wo_gguf *g,
                    const enum wo_placement *out)
{
    uint64_t largest = 0;
    unsigned slots = wo_policy_globals(p)->prefetch.slots;
    char s1[32], s2[32], s3[32];

    for (size_t i = 0; i < g->n; i++)
        if (out[i] != WO_PLACE_DEVICE && g->t[i].bytes > largest)
            largest = g->t[i].bytes;
    if (!largest)
        return;
    printf("staging beside them, when the run stages: up to %u slots of the largest tensor off "
           "the device, %s (%s in all; prefetch.slots), and picked copies' buffers up to 2 x %s "
           "(%s)\n",
           slots, wo_format_size(largest, s1, sizeof(s1)),
           wo_format_size(largest * slots, s2, sizeof(s2)), s1,
           wo_format_size(largest * 2, s3, sizeof(s3)));
}

int wo_policy_gguf_main(int argc, char **argv)
{
    struct gargs a;
    struct wo_gguf g;
    struct wo_policy *p = NULL;
    struct wo_diags diags = {0};
    struct wo_rule_counts *counts = NULL;
    struct wo_host_budget hb;
    enum wo_placement *out = NULL;
    struct hot hot = {0};
    long *rule = NULL;
    uint64_t room, cpu_n, cpu_bytes;
    bool tied;
    char err[512], s1[32];
    int status = parse_args(argc, argv, &a);

    if (status >= 0)
        return status;
    if (wo_gguf_read(a.gguf, &g, err, sizeof(err)) != 0) {
        fprintf(stderr, "woffload-policy gguf: %s\n", err);
        return 2;
    }
    status = 2;
    if (a.policy && wo_policy_load_file(a.policy, NULL, &p, &diags) != 0) {
        wo_diags_print(&diags, stderr);
        goto out;
    }
    wo_diags_print(&diags, stderr);
    if (a.compare && !a.has_gpu) {
        fprintf(stderr,
                "woffload-policy gguf: --compare weighs placements within the GPU's memory: "
                "give --gpu SIZE (such as 141GB)\n");
        goto out;
    }
    if (p && wo_policy_globals(p)->fit.enabled && !a.has_gpu) {
        fprintf(stderr,
                "woffload-policy gguf: %s has fit:, whose budget needs the GPU's memory: "
                "give --gpu SIZE (such as 141GB)\n",
                a.policy);
        goto out;
    }
    header(a.gguf, &g);
    if (gpu_buffers(&g, &cpu_n, &cpu_bytes, &tied) != 0) {
        fprintf(stderr, "woffload-policy gguf: out of memory\n");
        status = 1;
        goto out;
    }
    out = calloc(g.n ? g.n : 1, sizeof(*out));
    rule = calloc(g.n ? g.n : 1, sizeof(*rule));
    counts = calloc(wo_policy_nrules(p) + 1, sizeof(*counts));
    if (!out || !rule || !counts) {
        fprintf(stderr, "woffload-policy gguf: out of memory\n");
        status = 1;
        goto out;
    }
    if (cpu_n)
        printf("in llama.cpp's CPU buffer whatever the policy (its input layer): %" PRIu64
               " tensors, %s; not counted below\n",
               cpu_n, wo_format_size(cpu_bytes, s1, sizeof(s1)));
    if (tied)
        printf("tied embeddings (no output.weight): llama.cpp's output layer on the GPU holds a "
               "copy of token_embd.weight under that name, read whole each step; counted below\n");
    wo_host_budget_init(&hb, p);
    for (size_t i = 0; i < g.n; i++) {
        struct wo_match m = {.rule = -1, .place = WO_PLACE_DEVICE};
        if (p)
            wo_policy_match(p, g.t[i].name, g.t[i].bytes, &m);
        rule[i] = m.rule;
        out[i] = m.place;
        /* host_budget: in the engine's order (a GGUF's is llama.cpp's) */
        if (out[i] == WO_PLACE_HOST && !wo_host_budget_take(&hb, g.t[i].bytes))
            out[i] = WO_PLACE_DEVICE;
    }
    room = a.gpu > a.engine ? a.gpu - a.engine : 0;
    if (p && wo_policy_globals(p)->fit.enabled && fit_choose(&a, p, &g, rule, out, &room) != 0) {
        status = 1;
        goto out;
    }
    for (size_t i = 0; i < g.n; i++) {
        size_t r = rule[i] >= 0 ? (size_t)rule[i] : wo_policy_nrules(p);
        counts[r].names++;
        counts[r].bytes += g.t[i].bytes;
    }
    if (p) {
        printf("rules of %s:\n", a.policy);
        wo_policy_print_counts(p, counts, stdout);
    }
    {
        uint64_t by[3] = {0}, nb[3] = {0};
        for (size_t i = 0; i < g.n; i++) {
            unsigned k = out[i] == WO_PLACE_HOST ? 1 : out[i] == WO_PLACE_MANAGED ? 2 : 0;
            by[k] += g.t[i].bytes;
            nb[k]++;
        }
        printf("placement:\n");
        for (unsigned k = 0; k < 3; k++)
            printf("  %-8s %6" PRIu64 " tensors %12s\n",
                   k == 0   ? "device"
                   : k == 1 ? "host"
                            : "managed",
                   nb[k], wo_format_size(by[k], s1, sizeof(s1)));
    }
    /* under fit its line above said the room, within the budget */
    if (!(p && wo_policy_globals(p)->fit.enabled))
        staging(p, &g, out);
    if (hot_plan(&a, p, &g, out, &hot) != 0) {
        fprintf(stderr, "woffload-policy gguf: out of memory\n");
        status = 1;
        goto out;
    }
    if (a.list)
        for (size_t i = 0; i < g.n; i++) {
            const char *tn = "?";
            char lab[200];
            wo_gguf_type(g.t[i].type, &tn, NULL, NULL);
            printf("  %-48s %-8s %12" PRIu64 " %-8s %s\n", g.t[i].name, tn, g.t[i].bytes,
                   place_name(out[i]),
                   p ? wo_policy_rule_label(p, rule[i] >= 0 ? (size_t)rule[i] : wo_policy_nrules(p),
                                            lab, sizeof(lab))
                     : "no policy");
        }
    bounds(&a, &g, out, &hot);
    if (a.compare && compare(&a, &g, out, &hot, room) != 0) {
        status = 1;
        goto out;
    }
    status = 0;
out:
    free(hot.cap);
    free(out);
    free(rule);
    free(counts);
    wo_diags_clear(&diags);
    wo_policy_free(p);
    wo_gguf_free(&g);
    return status;
}
