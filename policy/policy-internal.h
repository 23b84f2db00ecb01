/* policy/policy-internal.h: what the files of policy/ share and nothing
 * outside policy/ may use: the YAML node tree (tree.c), diagnostics helpers
 * (diag.c), and the private layout of a loaded policy. */
#pragma once

#include <regex.h>
#include <stdarg.h>

#include "policy/policy.h"

/* ---- the defaults ---- */

/* Every global setting's default, written once (docs/policy.md): a policy
 * file starts from them (parse.c) with the window open from the start, the
 * pass-through policy (policy.c) with it opened by the API. */
#define WO_POLICY_DEFAULTS(window_open)                                                            \
    {                                                                                              \
        .default_place = WO_PLACE_DEVICE,                                                          \
        .host_budget = {.kind = WO_BUDGET_UNLIMITED},                                              \
        .device_budget = {.kind = WO_BUDGET_AUTO},                                                 \
        .pin_fallback = WO_PIN_FALLBACK_MANAGED,                                                   \
        .window = {.open = (window_open),                                                          \
                   .close = WO_WINDOW_CLOSE_AT_SEAL,                                               \
                   .min_size = WO_WINDOW_MIN_SIZE_DEFAULT},                                        \
        .prefetch = {.enabled = true,                                                              \
                     .lookahead_kind = WO_LOOKAHEAD_RANGES,                                        \
                     .lookahead = WO_LOOKAHEAD_DEFAULT,                                            \
                     .piece_size = WO_PIECE_SIZE_DEFAULT,                                          \
                     .hot_set = true,                                                              \
                     .eviction = WO_EVICT_AUTO,                                                    \
                     /* docs/policy.md, prefetch.mode: why, and its limits */                      \
                     .mode = WO_PREFETCH_MODE_AUTO,                                                \
                     .slots = WO_STREAM_SLOTS_DEFAULT,                                             \
                     /* measured: docs/prefetch.md, Pinned copies */                               \
                     .pinned_copies = WO_PIN_COPIES_AUTO},                                         \
        .fit = {.enabled = false,                                                                  \
                .device = {.kind = WO_BUDGET_BYTES},                                               \
                .keep_free = WO_FIT_KEEP_FREE_DEFAULT,                                             \
                .reserve = WO_FIT_RESERVE_DEFAULT,                                                 \
                .rest = WO_PLACE_HOST},                                                            \
    }

/* ---- diagnostics ---- */

/* Adds one diagnostic; on allocation failure the message is dropped (the
 * error count still rises so a load still fails). */
void wo_diag_add(struct wo_diags *d, const char *file, unsigned line, unsigned column,
                 enum wo_diag_severity sev, const char *fmt, ...) WO_PRINTF(6, 7);
void wo_diag_addv(struct wo_diags *d, const char *file, unsigned line, unsigned column,
                  enum wo_diag_severity sev, const char *fmt, va_list ap) WO_PRINTF(6, 0);

/* ---- the YAML tree ---- */

enum wo_node_kind { WO_NODE_SCALAR, WO_NODE_SEQ, WO_NODE_MAP };

struct wo_node {
    enum wo_node_kind kind;
    unsigned line, column;  /* 1-based */
    bool plain;             /* plain (unquoted) scalar */
    bool null;              /* plain empty, ~ or null */
    char *value;            /* scalar, NUL-terminated, variables expanded in values */
    struct wo_node **items; /* seq: n items; map: n pairs as key, value, key, value... */
    size_t n, cap;
    size_t weight;          /* nodes below and including this one, aliases expanded */
    unsigned height;        /* nesting below this node */
    struct wo_node *next_all; /* every node, for freeing */
};

struct wo_tree {
    struct wo_node *root; /* NULL: no document */
    struct wo_node *all;
};

/* Variable lookup with the RANK/LOCAL_RANK/WORLD_SIZE fallbacks. */
struct wo_vars {
    wo_policy_lookup_fn lookup;
    void *ud;
};

/* Checks the raw bytes (NUL, UTF-8), parses, expands variables in scalar
 * values, bounds nodes and depth. 0 or -EINVAL (diagnostics added). */
int wo_tree_parse(struct wo_tree *t, const char *buf, size_t len, const char *file,
                  const struct wo_policy_opts *opts, struct wo_diags *diags);
void wo_tree_free(struct wo_tree *t);

/* Expands ${NAME}, ${NAME:-default} and $$ in s. Returns a malloc'ed string,
 * or NULL with *err set to a message (static or in errbuf). */
char *wo_expand(const char *s, const struct wo_vars *vars, char *errbuf, size_t errlen);

/* ---- the policy ---- */

enum wo_layer_kind { WO_LAYER_RANGE, WO_LAYER_GROUP };

struct wo_layer_item {
    enum wo_layer_kind kind;
    long lo, hi;       /* RANGE: inclusive */
    long every, last;  /* GROUP: index % every >= every - last */
};

struct wo_matchers {
    char **match;
    size_t nmatch;
    char **glob;
    size_t nglob;
    char **regex_src;
    regex_t *regex;
    size_t nregex;
    struct wo_layer_item *layers;
    size_t nlayers;
    bool has_min, has_max;
    uint64_t min_size, max_size;
};

struct wo_policy {
    char *source;
    struct wo_policy_globals g;
    struct wo_rule *rules;
    struct wo_matchers *m;
    size_t nrules;
};

/* The schema (parse.c): fills p from the document root. 0, -EINVAL, -ENOMEM. */
int wo_policy_from_tree(struct wo_policy *p, const struct wo_node *root, const char *file,
                        struct wo_diags *diags);

/* regex.c: the estimated nodes regcomp builds for s, capped just above
 * WO_REGEX_MAX_NODES; WO_REGEX_STACKED for a quantifier on a quantifier. */
#define WO_REGEX_MAX_LEN 1024
#define WO_REGEX_MAX_NODES 4000
#define WO_REGEX_MAX_TOTAL_NODES 40000
#define WO_REGEX_STACKED UINT64_MAX
uint64_t wo_regex_cost(const char *s);

/* shadow.c: true when every name `later` matches is matched by `earlier`. */
bool wo_matchers_shadow(const struct wo_matchers *earlier, const struct wo_matchers *later);

/* Levenshtein distance, capped (returns cap+1 when larger). */
unsigned wo_edit_distance(const char *a, const char *b, unsigned cap);
