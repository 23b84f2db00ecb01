/* policy/parse-int.h: what the schema's files share: the parse context,
 * the readers of scalars and mappings with their located diagnostics
 * (parse-value.c), and a rule's reader (parse-rule.c), which the document's
 * reader (parse.c) calls. Inside policy/ only. */
#pragma once

#include "policy/policy-internal.h"

struct ctx {
    const char *file;
    struct wo_diags *diags;
    struct wo_policy *p;
    uint64_t regex_nodes; /* estimated regcomp nodes of every regex so far */
    /* While a rule is parsed: the error count at its start. Its first error
     * is reported, the rest dropped: they follow from the first (a key
     * misspelt makes the rule lack it too). SIZE_MAX outside a rule. */
    size_t rule_errors_from;
};

/* Located diagnostics (an error inside a rule after its first is dropped). */
void wo_schema_err(struct ctx *c, const struct wo_node *n, const char *fmt, ...) WO_PRINTF(3, 4);
void wo_schema_warn(struct ctx *c, const struct wo_node *n, const char *fmt, ...) WO_PRINTF(3, 4);
/* "'value'", "an empty value", "a sequence", "a mapping": the X of "found X". */
const char *wo_schema_found(const struct wo_node *n, char *buf, size_t len);

/* ---- scalars (parse-value.c): 0, or -EINVAL with the error reported ---- */

const char *wo_schema_scalar(struct ctx *c, const struct wo_node *n, const char *expected);
int wo_schema_bool(struct ctx *c, const struct wo_node *n, bool *ret);
int wo_schema_uint(struct ctx *c, const struct wo_node *n, uint64_t lo, uint64_t hi,
                   const char *what, uint64_t *ret);
int wo_schema_size(struct ctx *c, const struct wo_node *n, uint64_t *ret);
/* 1 when the value is meant as a percentage (*r: 0 or -EINVAL), 0 when not. */
int wo_schema_percent(struct ctx *c, const struct wo_node *n, uint32_t *ppm, int *r);
int wo_schema_enum(struct ctx *c, const struct wo_node *n, const char *const *names, size_t nn,
                   int *ret);
/* Checks a mapping's keys against keys[], fills out[i] with keys[i]'s value. */
int wo_schema_map(struct ctx *c, const struct wo_node *n, const char *const *keys, size_t nkeys,
                  const char *where, const struct wo_node **out);

/* ---- rules (parse-rule.c) ---- */

/* The placements a rule (and `default:`) may name, in enum order. */
extern const char *const wo_schema_place_names[3];
int wo_schema_place(struct ctx *c, const struct wo_node *n, const char *const *names, size_t nn,
                    enum wo_placement *ret);
int wo_schema_rule(struct ctx *c, const struct wo_node *n, struct wo_rule *rule,
                   struct wo_matchers *m);
/* Warns about rules no name can reach (an earlier rule takes them all). */
void wo_schema_check_shadowed(struct ctx *c, const struct wo_node *rules);
