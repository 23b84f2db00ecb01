/* tests/fuzz-policy.c: the policy parser's fuzz target (libFuzzer entry
 * point; fuzz-policy-replay.c drives it without libFuzzer, for AFL++ and for
 * replaying the committed corpus as a test).
 *
 * Beyond "never crash": a policy that loads must dump to a normalized form
 * that loads again without errors, and matching and explaining must work
 * on it. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "policy/policy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *lookup(void *ud, const char *name)
{
    (void)ud;
    if (strcmp(name, "RANK") == 0)
        return "1";
    if (strcmp(name, "BIG") == 0)
        return "1GiB";
    if (strcmp(name, "X") == 0)
        return "${X}"; /* expansion is not recursive */
    return NULL;
}

static const char *const names[] = {
    "model.layers.3.mlp.experts.w2_weight",
    "model.layers.0.self_attn.qkv_proj.weight",
    "blk.7.ffn_up_exps.weight",
    "lm_head.weight",
    "",
};

static void exercise(const struct wo_policy *p)
{
    FILE *null = fopen("/dev/null", "w");
    struct wo_rule_counts *c = calloc(wo_policy_nrules(p) + 1, sizeof(*c));
    struct wo_host_budget b;

    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        struct wo_match m;
        if (wo_policy_match(p, names[i], 4096, &m) < 0 || m.place == WO_PLACE_UNSET)
            abort();
        if (m.rule >= 0 && c)
            c[m.rule].names++;
        if (null)
            wo_policy_explain_print(p, names[i], WO_SIZE_UNKNOWN, null);
    }
    if (null && c)
        wo_policy_print_counts(p, c, null);
    wo_host_budget_init(&b, p);
    wo_host_budget_take(&b, 1 << 20);
    (void)wo_policy_device_budget(p, UINT64_MAX, UINT64_MAX);
    free(c);
    if (null)
        fclose(null);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct wo_policy_opts opts = {.lookup = lookup};
    struct wo_diags d = {0};
    struct wo_policy *p = NULL;
    char line[1400];
    int r = wo_policy_load_buffer((const char *)data, size, "fuzz.yaml", &opts, &p, &d);

    if ((r == 0) != (p != NULL) || (r == 0 && d.nerrors) || (r < 0 && !d.nerrors))
        abort(); /* the result and the diagnostics must agree */
    for (size_t i = 0; i < d.n; i++)
        wo_diag_format(&d.v[i], line, sizeof(line));
    wo_diags_clear(&d);
    if (p) {
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        struct wo_policy *q = NULL;
        exercise(p);
        if (f) {
            if (wo_policy_dump(p, f) < 0)
                abort();
            fclose(f);
            /* the normalized form must load back; it spells out every
             * default, so it may hold more nodes than the input did */
            struct wo_policy_opts big = opts;
            big.max_nodes = 16 * WO_POLICY_MAX_NODES;
            if (wo_policy_load_buffer(buf, len, "dump.yaml", &big, &q, &d) != 0) {
                fprintf(stderr, "the dump does not load:\n%s\n", buf);
                wo_diags_print(&d, stderr);
                abort();
            }
            if (wo_policy_nrules(q) != wo_policy_nrules(p))
                abort();
            wo_diags_clear(&d);
            wo_policy_free(q);
            free(buf);
        }
        wo_policy_free(p);
    }
    return 0;
}
