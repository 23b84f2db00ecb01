/* policy/policy.h: the YAML placement policy: loading (libyaml), validation
 * with located diagnostics, matching a name to a rule, and the normalized
 * dump. No CUDA. docs/policy.md documents every key.
 *
 * A loaded policy is immutable: every function taking a const policy is
 * reentrant and may be called from any thread without a lock. */
#pragma once

#include <stdio.h>

#include "core/macro.h"

/* ---- placements ------------------------------------------------------- */

enum wo_placement {
    WO_PLACE_UNSET = 0, /* no decision (never the result of a match) */
    WO_PLACE_DEVICE,    /* ordinary device memory */
    WO_PLACE_HOST,      /* host memory read in place over PCIe */
    WO_PLACE_MANAGED,   /* host-resident managed memory, prefetched within the device budget */
    WO_PLACE_MAX
};

/* "unset", "device", "host", "managed"; "?" for anything else. Never NULL. */
const char *wo_placement_to_string(enum wo_placement p);
/* The enum value for "device", "host", "managed" (exact, lower case), or -EINVAL. */
int wo_placement_from_string(const char *s);

/* ---- globals ------------------------------------------------------------ */

enum wo_budget_kind {
    WO_BUDGET_UNLIMITED = 0, /* host_budget default */
    WO_BUDGET_AUTO,          /* device_budget default: see wo_policy_device_budget() */
    WO_BUDGET_BYTES,
    WO_BUDGET_PERCENT,       /* device_budget only: of the device's total memory */
};

struct wo_budget {
    enum wo_budget_kind kind;
    uint64_t bytes; /* WO_BUDGET_BYTES */
    uint32_t ppm;   /* WO_BUDGET_PERCENT: parts per million of the device total (50% = 500000) */
};

enum wo_pin_fallback {
    WO_PIN_FALLBACK_MANAGED = 0, /* pinning failed: managed memory advised to stay on host */
    WO_PIN_FALLBACK_STOP,        /* pinning failed: the placement fails (seal returns the error) */
};

/* When the placeable window opens / closes. Events happen in the order
 * start < first tag < seal; `api` means only woffload_window_open()/close(). */
enum wo_window_open {
    WO_WINDOW_OPEN_AT_START = 0,
    WO_WINDOW_OPEN_ON_FIRST_TAG,
    WO_WINDOW_OPEN_API,
};
enum wo_window_close {
    WO_WINDOW_CLOSE_AT_SEAL = 0,
    WO_WINDOW_CLOSE_ON_FIRST_TAG,
    WO_WINDOW_CLOSE_API,
};

enum wo_lookahead_kind {
    WO_LOOKAHEAD_RANGES = 0, /* lookahead counts upcoming managed ranges (bare integer) */
    WO_LOOKAHEAD_BYTES,      /* lookahead counts upcoming bytes (a size with a unit) */
};

enum wo_eviction {
    WO_EVICT_AUTO = 0,     /* the prefetcher chooses per range */
    WO_EVICT_READ_MOSTLY,  /* read-mostly duplicate, collapse to drop the GPU copy */
    WO_EVICT_COPY_BACK,    /* prefetch back to host */
};

/* What the prefetcher does with host and managed ranges (prefetch.mode). */
enum wo_prefetch_mode {
    WO_PREFETCH_MODE_AUTO = 0, /* stream a range read >= 1.5x its bytes a step, else hot set */
    WO_PREFETCH_MODE_HOT_SET,  /* managed: the hot set; host: read in place (before issue 18) */
    WO_PREFETCH_MODE_STREAM,   /* every host and managed range staged into device slots */
};

/* prefetch.pinned_copies: auto (while the host keeps memory available) */
#define WO_PIN_COPIES_AUTO UINT64_MAX
/* prefetch.hot_experts: auto (the free device memory when the first set is
 * made, less the managed margin) */
#define WO_HOT_EXPERTS_AUTO UINT64_MAX

enum wo_slices {
    WO_SLICES_AUTO = 0, /* track sub-ranges (per-expert slices) where launches touch them */
    WO_SLICES_NONE,     /* whole ranges only */
};

#define WO_PIECE_SIZE_MIN (16 * WO_MiB)
#define WO_PIECE_SIZE_DEFAULT (64 * WO_MiB)
#define WO_WINDOW_MIN_SIZE_DEFAULT (1 * WO_MiB)
#define WO_LOOKAHEAD_DEFAULT 4
#define WO_STREAM_SLOTS_DEFAULT 4
#define WO_STREAM_SLOTS_MIN 2
#define WO_STREAM_SLOTS_MAX 8

/* `fit:` (docs/policy.md, policy/fit.c): the shim chooses which weights stay
 * on the device within a budget and places the rest. */
#define WO_FIT_KEEP_FREE_DEFAULT (2ull * WO_GiB)
/* What the engine allocates after seal (activations, a growing KV cache,
 * kernels loaded on their first launch, library workspaces), kept out of
 * the weights' share of the fit budget. Measured for transformers at batch
 * 1 on the lent H100 (bench/results/bigload-20261125-h100.md): the process
 * grew 0.23-0.35 GiB past its weights after seal. */
#define WO_FIT_RESERVE_DEFAULT (256ull * WO_MiB)
/* `reserve: auto`: the engine's high water after seal in the runs before
 * (uvm/fit-memo.c keeps it); WO_FIT_RESERVE_DEFAULT until one ended. */
#define WO_FIT_RESERVE_AUTO UINT64_MAX

struct wo_fit {
    bool enabled;            /* a fit: key is present */
    struct wo_budget device; /* WO_BUDGET_BYTES or WO_BUDGET_PERCENT (of the device total) */
    uint64_t keep_free;      /* bytes; default WO_FIT_KEEP_FREE_DEFAULT (2 GiB) */
    uint64_t reserve;        /* bytes, or WO_FIT_RESERVE_AUTO; default WO_FIT_RESERVE_DEFAULT
                              * (wo_fit_reserve) */
    enum wo_placement rest;  /* WO_PLACE_HOST (default) or WO_PLACE_MANAGED */
    /* not a policy key: the caller sets it from WOFFLOAD_FIT_SPREAD=0 (A/B
     * runs). true: tensors of equal value are chosen in the given order,
     * not spread through it (wo_fit_choose) */
    bool in_order;
    /* not a policy key either: WOFFLOAD_FIT_LAYERS (1, the default, at
     * seal and in the tools). true (and not in_order): the spread takes a
     * layer's equal-value tensors together, so that whole layers go off
     * the device (wo_fit_choose); false: tensor by tensor */
    bool by_layer;
};

struct wo_policy_globals {
    enum wo_placement default_place; /* `default:`; DEVICE when absent; never UNSET */
    /* `host_budget:` UNLIMITED or BYTES. Applies to `host` placements only, in
     * the order the engine tags/seals its names (its parameter order, as vLLM's
     * cpu_offload_gb): a match that would exceed it, and every match after
     * that, stays on the device. See struct wo_host_budget. */
    struct wo_budget host_budget;
    /* `device_budget:` AUTO, BYTES or PERCENT (unresolved: see
     * wo_policy_device_budget()). Bytes of managed memory the prefetcher may
     * keep resident on the device. */
    struct wo_budget device_budget;
    enum wo_pin_fallback pin_fallback;
    struct {
        /* default AT_START; API when the policy is pass-through
         * (wo_policy_passthrough()): then nothing needs to be placeable */
        enum wo_window_open open;
        enum wo_window_close close; /* default AT_SEAL */
        uint64_t min_size; /* allocations smaller than this are never placeable by the window */
    } window;
    struct {
        bool enabled;
        enum wo_lookahead_kind lookahead_kind;
        uint64_t lookahead;   /* ranges or bytes, per lookahead_kind */
        uint64_t piece_size;  /* >= WO_PIECE_SIZE_MIN */
        bool hot_set;         /* keep the most-used ranges resident too */
        enum wo_eviction eviction;
        enum wo_prefetch_mode mode; /* default AUTO (docs/policy.md says why) */
        uint32_t slots;             /* device staging slots for streamed ranges (2..8) */
        uint64_t pinned_copies;     /* host bytes of pinned staging sources: WO_PIN_COPIES_AUTO
                                     * (the default), 0 (off) or a cap (docs/policy.md) */
        uint64_t hot_experts;       /* device bytes for hot experts of picked tensors, 0: none,
                                     * WO_HOT_EXPERTS_AUTO (WOFFLOAD_PICKS_HOT overrides;
                                     * docs/placement.md) */
    } prefetch;
    struct wo_fit fit; /* `fit:`; enabled false when absent */
};

/* ---- rules ----------------------------------------------------------------- */

struct wo_matchers; /* private to policy/ */

struct wo_rule {
    const char *name;       /* the rule's `name:`, or NULL */
    unsigned line, column;  /* 1-based, where the rule starts */
    enum wo_placement place;
    bool pin;               /* host: pinned host memory (default true); false:
                             * managed memory advised preferred=host */
    int priority;           /* managed: 0..100, higher is kept resident first (default 0) */
    enum wo_slices slices;  /* managed: default AUTO */
    const struct wo_matchers *m;
};

struct wo_policy;

/* ---- diagnostics ---------------------------------------------------------- */

enum wo_diag_severity {
    WO_DIAG_ERROR = 0,
    WO_DIAG_WARNING,
    WO_DIAG_NOTE,
};

struct wo_diag {
    char *file;         /* display name; never NULL */
    unsigned line;      /* 1-based; 0 when the message is about the whole file */
    unsigned column;    /* 1-based; 0 when unknown */
    enum wo_diag_severity severity;
    char *message;      /* without the location and severity prefix */
};

struct wo_diags {
    struct wo_diag *v;
    size_t n, cap;
    size_t nerrors, nwarnings;
};

/* Frees the messages; the struct may be reused afterwards. NULL is fine. */
void wo_diags_clear(struct wo_diags *d);
/* One line each: "file:line:column: error: message" (line/column left out when 0). */
void wo_diag_format(const struct wo_diag *d, char *buf, size_t len);
void wo_diags_print(const struct wo_diags *d, FILE *f);
/* Through core/log.h: errors at WO_LOG_ERROR, warnings at WO_LOG_WARN, notes at info. */
void wo_diags_log(const struct wo_diags *d);

/* ---- loading ----------------------------------------------------------------- */

/* Looks up a variable for ${NAME} expansion: returns its value (owned by the
 * callee, valid until load returns) or NULL when it is not set. */
typedef const char *(*wo_policy_lookup_fn)(void *ud, const char *name);

struct wo_policy_opts {
    wo_policy_lookup_fn lookup; /* NULL: getenv() */
    void *lookup_ud;
    unsigned max_nodes;         /* YAML nodes after alias expansion; 0: 10000 */
    unsigned max_depth;         /* nesting of collections; 0: 32 */
};

#define WO_POLICY_MAX_NODES 10000
#define WO_POLICY_MAX_DEPTH 32
#define WO_POLICY_MAX_FILE (4 * WO_MiB)

/* Variables: every scalar value may hold ${NAME} or ${NAME:-default}; $$ is a
 * literal $. RANK, LOCAL_RANK and WORLD_SIZE fall back to the SLURM and Open
 * MPI equivalents, then to 0, 0 and 1 (a single process). Any other unset
 * variable without a default is an error.
 *
 * Loads and validates. Returns 0 and *ret (warnings may have been added to
 * diags), or a negative errno with *ret = NULL: -EINVAL for any error in the
 * contents, -ENOENT, -EACCES, -EISDIR, -EFBIG (larger than WO_POLICY_MAX_FILE),
 * -ENOMEM. Every problem, including file errors, is added to diags as a
 * located diagnostic; with diags NULL they are logged (wo_diags_log) instead.
 * opts may be NULL. Never crashes, never hangs, on any input. */
int wo_policy_load_file(const char *path, const struct wo_policy_opts *opts,
                        struct wo_policy **ret, struct wo_diags *diags);
/* The same from memory; display_name is used in diagnostics (NULL: "<buffer>").
 * buf need not be NUL-terminated; NUL bytes inside it are an error. */
int wo_policy_load_buffer(const char *buf, size_t len, const char *display_name,
                          const struct wo_policy_opts *opts, struct wo_policy **ret,
                          struct wo_diags *diags);

/* Returns NULL. NULL is fine. */
struct wo_policy *wo_policy_free(struct wo_policy *p);

/* The display name given at load ("" for NULL). */
const char *wo_policy_source(const struct wo_policy *p);
/* Never NULL; for a NULL policy, the globals of `rules: []` (pass-through). */
const struct wo_policy_globals *wo_policy_globals(const struct wo_policy *p);
size_t wo_policy_nrules(const struct wo_policy *p);
/* NULL when i is out of range. */
const struct wo_rule *wo_policy_rule(const struct wo_policy *p, size_t i);
/* "rule 3 'experts' (moe.yaml:12)" or "rule 3 (moe.yaml:12)"; i == nrules:
 * "the default". Returns buf. */
const char *wo_policy_rule_label(const struct wo_policy *p, size_t i, char *buf, size_t len);
/* True when no rule and no default can place anything off the device: the
 * shim may then pass every allocation through. */
bool wo_policy_passthrough(const struct wo_policy *p);

/* ---- matching -------------------------------------------------------------- */

/* Size unknown (tag scope before the allocation): size matchers do not match. */
#define WO_SIZE_UNKNOWN UINT64_MAX

struct wo_match {
    long rule;               /* index of the first matching rule, -1: the default */
    enum wo_placement place; /* the rule's placement or the default; never UNSET */
    const struct wo_rule *r; /* the rule, NULL for the default */
};

/* First match wins. Returns 1 when a rule matched, 0 when the default applies
 * (ret is filled in both cases), -EINVAL for NULL arguments. */
int wo_policy_match(const struct wo_policy *p, const char *name, uint64_t size,
                    struct wo_match *ret);

/* As wo_policy_match, and calls fn for every rule up to and including the
 * matching one: matched false with why = the first reason it failed
 * ("glob: no pattern matches (tried '*.bias')"), or matched true with why
 * describing what held. fn may be NULL. */
typedef void (*wo_explain_fn)(void *ud, size_t rule, bool matched, const char *why);
int wo_policy_explain(const struct wo_policy *p, const char *name, uint64_t size,
                      struct wo_match *ret, wo_explain_fn fn, void *ud);
/* The explanation as text: the name, one line per rule, the result. */
int wo_policy_explain_print(const struct wo_policy *p, const char *name, uint64_t size, FILE *f);

/* The layer index the `layers:` matcher sees in a name: the first integer
 * component after a component layers/layer/h/blocks/block/blk ("model.layers.3.mlp",
 * "blk.7.ffn_up_exps.weight"), or -1. */
long wo_policy_layer_of(const char *name);

/* ---- host budget accounting (vLLM cpu_offload_gb) --------------------------- */

/* Charge host placements in the engine's order; once one does not fit, it and
 * every later one stay on the device (so the offloaded set is a prefix). */
struct wo_host_budget {
    uint64_t limit;  /* UINT64_MAX when unlimited */
    uint64_t used;
    bool spent;      /* a charge did not fit: every later charge fails */
};
void wo_host_budget_init(struct wo_host_budget *b, const struct wo_policy *p);
/* 1 and charged when bytes fit; 0 when the caller must place it on the device. */
int wo_host_budget_take(struct wo_host_budget *b, uint64_t bytes);
/* Gives bytes back (a host-placed range was freed); does not reopen a spent budget. */
void wo_host_budget_release(struct wo_host_budget *b, uint64_t bytes);

/* The device budget in bytes: BYTES as given, PERCENT of device_total,
 * AUTO: half of device_free (room left for activations and the KV cache). */
uint64_t wo_policy_device_budget(const struct wo_policy *p, uint64_t device_total,
                                 uint64_t device_free);
uint64_t wo_budget_resolve(const struct wo_budget *b, uint64_t device_total, uint64_t device_free);

/* ---- automatic fit (policy/fit.c) ---------------------------------------------- */

/* The importance class of a tensor from its name, for fit without a trace:
 * lower is kept on the device first.
 * 0 norms, biases, routers/gates (small, read by every token); 1 attention
 * (q/k/v/o, qkv, attn, self_attn); 2 shared experts and dense MLPs; 3 lm_head /
 * output projection; 4 routed experts (mlp.experts., block_sparse_moe.experts,
 * ffn_*_exps); 5 token embeddings (embed_tokens, wte, tok_embeddings: a step
 * reads only its tokens' rows, so host costs little). llama.cpp's
 * `token_embd.weight` is 3: the one the shim sees is the tied output head
 * (policy/fit.c). Unknown: 2. NULL: 2. */
int wo_fit_class(const char *name);
#define WO_FIT_CLASS_EXPERTS 4 /* wo_fit_class of routed experts */
/* Whether name is a GGUF (llama.cpp) routed-experts tensor, a component
 * ffn_*_exps: blk.3.ffn_up_exps.weight. */
bool wo_gguf_experts_name(const char *name);

struct wo_fit_item {
    const char *name;
    uint64_t size;
    double weight;           /* reads per step from a trace (>= 0); < 0: unknown, the class decides */
    enum wo_placement fixed; /* UNSET: fit decides; else an explicit rule placed it (DEVICE counts against the budget) */
    bool movable;            /* false: cannot go to the device (already in pinned host memory): gets HOST */
    enum wo_placement out;   /* result */
};

/* The device bytes for the router's picked copies (uvm/picks.c): `buffers`
 * buffers of the largest routed-experts tensor that v[].out sends off the
 * device, for one stream of the engine; GGUF ones (wo_gguf_experts_name)
 * only with gguf_picks (the ggml hook registers picks for them). */
uint64_t wo_fit_picks_room(const struct wo_fit_item *v, size_t n, unsigned buffers,
                           bool gguf_picks);

/* The device bytes fit may give to weights: device (bytes, or ppm of
 * device_total) minus engine_bytes (device memory the engine holds besides
 * the weights), capped at device_free_for_weights - keep_free; never
 * negative. 0 for a NULL fit. */
uint64_t wo_fit_budget(const struct wo_fit *fit, uint64_t device_total,
                       uint64_t device_free_for_weights, uint64_t engine_bytes);
/* The part of a fit budget kept for what the engine allocates after seal
 * (fit->reserve): at most half the budget, so that a small budget still
 * holds weights. The weights get the rest. Only fit at seal keeps it; a
 * recorded trace already counts the engine's later allocations. 0 for a
 * NULL fit. */
uint64_t wo_fit_reserve(const struct wo_fit *fit, uint64_t budget);
/* Sets out for every item: fixed ones keep theirs (DEVICE ones are charged
 * first, even over the budget); the others in order of importance go DEVICE
 * while the charged total stays within budget (an item that does not fit is
 * skipped and smaller later ones may still fit); the rest get fit->rest
 * (HOST for a NULL fit); unmovable ones never DEVICE (a fixed HOST or
 * MANAGED kept, else HOST). Importance: known weights above 0 first, higher
 * first (weights within 5% of each other count as equal: a trace's window
 * takes in a prefill step or two), then unknown weights, then weight 0
 * (never read); ties by class ascending. Items equal in all of that are
 * taken spread through the given order (bit-reversed ranks: every other
 * one first, then every fourth between them...), so that what goes off the
 * device is spread through the step too; with fit->by_layer the unit of
 * that spread is a layer's tensors of the run, taken together; with
 * fit->in_order, in the given order. Deterministic. Returns the device bytes charged. */
uint64_t wo_fit_choose(const struct wo_fit *fit, struct wo_fit_item *v, size_t n, uint64_t budget);

/* ---- normalized form and counters ---------------------------------------------- */

/* Canonical YAML: every global with its effective value, every rule with its
 * matchers in a fixed order and sizes in bytes. Loading the dump gives the
 * same policy (it spells out defaults, so a policy near max_nodes may need a
 * larger max_nodes to load back). Returns 0 or -errno of the stream. */
int wo_policy_dump(const struct wo_policy *p, FILE *f);
/* Its pieces, for tools that write a policy from another (woffload-policy
 * fit): the top-level keys but `rules:` from g (version first), and rule i as
 * one item of a `rules:` list. 0, -EINVAL, or -EIO. */
int wo_policy_dump_globals(const struct wo_policy_globals *g, FILE *f);
int wo_policy_dump_rule(const struct wo_policy *p, size_t i, FILE *f);

/* Per rule counters, filled by the placement code (uvm/) or the replay
 * tools: an array of nrules + 1, the last entry for the default. */
struct wo_rule_counts {
    uint64_t names;             /* names (tensors, scopes) that matched */
    uint64_t bytes;             /* their bytes */
    uint64_t over_budget_names; /* matched `host` but kept on the device: host budget spent */
    uint64_t over_budget_bytes;
};
/* One line per rule: label, placement, names, bytes (human units), over budget,
 * "matched nothing" for rules with zero names. */
void wo_policy_print_counts(const struct wo_policy *p, const struct wo_rule_counts *c, FILE *f);

/* ---- sizes (shared with tools) ------------------------------------------------- */

/* "512MiB", "1.5GiB", "350GB", "4096": 0 and *ret, -EINVAL (garbage, negative,
 * unknown unit, a fraction of a byte without a unit), -ERANGE (overflow). */
int wo_parse_size(const char *s, uint64_t *ret);
/* "1.50 GiB" style, for messages. Returns buf. */
const char *wo_format_size(uint64_t bytes, char *buf, size_t len);
