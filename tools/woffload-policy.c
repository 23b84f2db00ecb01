/* tools/woffload-policy.c: check, show and explain a placement policy with
 * the same policy/ code the shim loads. Exit 0: fine (warnings allowed),
 * 2: any error in a policy or on the command line. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "policy/policy.h"
#include "tools/policy-fit.h"
#include "tools/policy-gguf.h"

#define MAX_VARS 64

struct vars {
    const char *name[MAX_VARS];
    const char *value[MAX_VARS];
    char *owned[MAX_VARS];
    size_t n;
};

/* --var first (the last one given wins), then the real environment. */
static const char *lookup(void *ud, const char *name)
{
    struct vars *v = ud;
    for (size_t i = v->n; i-- > 0;)
        if (strcmp(v->name[i], name) == 0)
            return v->value[i];
    return getenv(name);
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: woffload-policy [--var NAME=VALUE]... check FILE...\n"
            "       woffload-policy [--var NAME=VALUE]... show FILE\n"
            "       woffload-policy [--var NAME=VALUE]... explain FILE NAME[:SIZE]... | -\n"
            "       woffload-policy fit --trace T --device SIZE|PCT%% [--keep-free SIZE]\n"
            "                       [--rest host|managed] [--model M] [--policy BASE] [-o OUT]\n"
            "       woffload-policy gguf MODEL.gguf [POLICY] [--gpu SIZE] [--engine SIZE]\n"
            "                       [--batch N,...] [--link GBPS] [--list]\n"
            "\n"
            "check    validate each policy; print every error and warning as\n"
            "         file:line:column: severity: message\n"
            "show     print the normalized policy (every setting with its effective value)\n"
            "explain  for each tensor name (with an optional size such as :512MiB), the rule\n"
            "         that places it, and why each earlier rule did not match; - reads\n"
            "         NAME[:SIZE] lines from stdin (such as a model's parameter names)\n"
            "fit      the policy the automatic fit (fit:) would use for a recorded run, as\n"
            "         explicit rules, and its predicted step time (fit --help)\n"
            "gguf     where a policy puts each tensor of a GGUF model (llama.cpp's names), the\n"
            "         bytes of each placement and a decode step's bytes off the device at each\n"
            "         batch size, from the file's header (gguf --help)\n"
            "\n"
            "--var NAME=VALUE  value for ${NAME} in the policy (default: the environment;\n"
            "                  RANK, LOCAL_RANK, WORLD_SIZE default to 0, 0, 1)\n"
            "-q, --quiet       check: print nothing for a policy without diagnostics\n"
            "\n"
            "Exit status: 0 when every policy is valid (warnings allowed); 2 on a usage or input\n"
            "error (any error in a policy); 1 on a failure.\n"
            "Keys and examples: docs/policy.md.\n");
}

static int load(const char *path, struct vars *vars, struct wo_policy **ret)
{
    struct wo_policy_opts opts = {.lookup = lookup, .lookup_ud = vars};
    struct wo_diags d = {0};
    int r = wo_policy_load_file(path, &opts, ret, &d);
    wo_diags_print(&d, stderr);
    wo_diags_clear(&d);
    return r;
}

static int cmd_check(int argc, char **argv, struct vars *vars, bool quiet)
{
    int status = 0;
    if (argc < 1) {
        fprintf(stderr, "woffload-policy check: expected at least one FILE\n");
        return 2;
    }
    for (int i = 0; i < argc; i++) {
        struct wo_policy_opts opts = {.lookup = lookup, .lookup_ud = vars};
        struct wo_diags d = {0};
        struct wo_policy *p = NULL;
        int r = wo_policy_load_file(argv[i], &opts, &p, &d);
        wo_diags_print(&d, stderr);
        if (r < 0) {
            status = 2;
            fprintf(stderr, "%s: invalid: %zu error%s, %zu warning%s\n", argv[i], d.nerrors,
                    d.nerrors == 1 ? "" : "s", d.nwarnings, d.nwarnings == 1 ? "" : "s");
        } else if (!quiet || d.nwarnings) {
            printf("%s: ok: %zu rule%s, %zu warning%s\n", argv[i], wo_policy_nrules(p),
                   wo_policy_nrules(p) == 1 ? "" : "s", d.nwarnings, d.nwarnings == 1 ? "" : "s");
        }
        wo_diags_clear(&d);
        wo_policy_free(p);
    }
    return status;
}

static int cmd_show(int argc, char **argv, struct vars *vars)
{
    struct wo_policy *p = NULL;
    int r;
    if (argc != 1) {
        fprintf(stderr, "woffload-policy show: expected exactly one FILE\n");
        return 2;
    }
    if (load(argv[0], vars, &p) < 0)
        return 2;
    r = wo_policy_dump(p, stdout);
    wo_policy_free(p);
    return r < 0 ? 2 : 0;
}

/* Under fit:, a name no rule matches is decided at seal by its class
 * (policy/fit.c): say which, so GGUF or PyTorch names can be checked
 * before a run (blk.3.ffn_up_exps.weight: routed experts). */
static void fit_line(const struct wo_policy *p, const char *name, uint64_t size)
{
    static const char *const classes[] = {
        "norms, biases, routers", "attention", "shared experts and dense MLPs",
        "the output head", "routed experts", "token embeddings",
    };
    const struct wo_policy_globals *g = wo_policy_globals(p);
    struct wo_match m;
    int c;

    if (!g || !g->fit.enabled || wo_policy_match(p, name, size, &m) != 0)
        return;
    c = wo_fit_class(name);
    printf("  fit: class %d of 0-5 (%s): on the device while the budget lasts, "
           "lower classes first, else %s\n",
           c, c >= 0 && c <= 5 ? classes[c] : "?", wo_placement_to_string(g->fit.rest));
}

/* One NAME[:SIZE]: 0, or 2 for a size that does not parse. */
static int explain_one(const struct wo_policy *p, const char *arg, bool first)
{
    char *name = strdup(arg);
    char *colon;
    uint64_t size = WO_SIZE_UNKNOWN;

    if (!name)
        return 2;
    /* NAME:SIZE; a suffix that is no size is part of the name */
    colon = strrchr(name, ':');
    if (colon && colon != name) {
        uint64_t v;
        if (wo_parse_size(colon + 1, &v) == 0) {
            size = v;
            *colon = '\0';
        } else if (colon[1] >= '0' && colon[1] <= '9') {
            fprintf(stderr, "woffload-policy explain: found size '%s' in '%s', expected a "
                    "size such as 4096, 512MiB or 1.5GiB\n", colon + 1, arg);
            free(name);
            return 2;
        }
    }
    if (!first)
        printf("\n");
    wo_policy_explain_print(p, name, size, stdout);
    fit_line(p, name, size);
    free(name);
    return 0;
}

static int cmd_explain(int argc, char **argv, struct vars *vars)
{
    struct wo_policy *p = NULL;
    bool first = true;
    int status = 0;

    if (argc < 2) {
        fprintf(stderr, "woffload-policy explain: expected FILE and at least one NAME[:SIZE] "
                "(or - to read them from stdin, one per line)\n");
        return 2;
    }
    if (load(argv[0], vars, &p) < 0)
        return 2;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-") == 0) {
            char *line = NULL;
            size_t cap = 0;
            ssize_t n;
            while ((n = getline(&line, &cap, stdin)) > 0) {
                while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r' || line[n - 1] == ' '))
                    line[--n] = '\0';
                if (n == 0 || line[0] == '#')
                    continue;
                status |= explain_one(p, line, first);
                first = false;
            }
            free(line);
            continue;
        }
        status |= explain_one(p, argv[i], first);
        first = false;
    }
    wo_policy_free(p);
    return status;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"var", required_argument, NULL, 'v'},
        {"quiet", no_argument, NULL, 'q'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    struct vars vars = {0};
    bool quiet = false;
    int c, status = 2;
    const char *cmd;

    while ((c = getopt_long(argc, argv, "+qh", opts, NULL)) != -1) {
        switch (c) {
        case 'v': {
            char *eq = strchr(optarg, '=');
            if (!eq || eq == optarg) {
                fprintf(stderr, "woffload-policy: --var '%s': expected NAME=VALUE\n", optarg);
                goto out;
            }
            if (vars.n == MAX_VARS) {
                fprintf(stderr, "woffload-policy: more than %d --var options\n", MAX_VARS);
                goto out;
            }
            vars.owned[vars.n] = strndup(optarg, (size_t)(eq - optarg));
            if (!vars.owned[vars.n])
                goto out;
            vars.name[vars.n] = vars.owned[vars.n];
            vars.value[vars.n] = eq + 1;
            vars.n++;
            break;
        }
        case 'q':
            quiet = true;
            break;
        case 'h':
            usage(stdout);
            status = 0;
            goto out;
        default:
            usage(stderr);
            goto out;
        }
    }
    if (optind >= argc) {
        usage(stderr);
        goto out;
    }
    cmd = argv[optind++];
    if (strcmp(cmd, "gguf") == 0) {
        /* its own options (sizes, batches); --var does not apply */
        status = wo_policy_gguf_main(argc - optind + 1, argv + optind - 1);
        goto out;
    }
    if (strcmp(cmd, "fit") == 0) {
        /* its own options (a trace, sizes); --var does not apply */
        status = wo_policy_fit_main(argc - optind, argv + optind);
        goto out;
    }
    /* options may also follow the command: woffload-policy check --var X=1 f.yaml */
    {
        int rest = argc - optind;
        char **args = argv + optind;
        int n = 0;
        for (int i = 0; i < rest; i++) {
            if (strcmp(args[i], "--var") == 0 && i + 1 < rest) {
                char *eq = strchr(args[i + 1], '=');
                if (!eq || eq == args[i + 1] || vars.n == MAX_VARS) {
                    fprintf(stderr, "woffload-policy: --var '%s': expected NAME=VALUE\n", args[i + 1]);
                    goto out;
                }
                vars.owned[vars.n] = strndup(args[i + 1], (size_t)(eq - args[i + 1]));
                if (!vars.owned[vars.n])
                    goto out;
                vars.name[vars.n] = vars.owned[vars.n];
                vars.value[vars.n++] = eq + 1;
                i++;
            } else if (strncmp(args[i], "--var=", 6) == 0) {
                char *a = args[i] + 6, *eq = strchr(a, '=');
                if (!eq || eq == a || vars.n == MAX_VARS) {
                    fprintf(stderr, "woffload-policy: --var '%s': expected NAME=VALUE\n", a);
                    goto out;
                }
                vars.owned[vars.n] = strndup(a, (size_t)(eq - a));
                if (!vars.owned[vars.n])
                    goto out;
                vars.name[vars.n] = vars.owned[vars.n];
                vars.value[vars.n++] = eq + 1;
            } else if (strcmp(args[i], "-q") == 0 || strcmp(args[i], "--quiet") == 0) {
                quiet = true;
            } else {
                args[n++] = args[i];
            }
        }
        if (strcmp(cmd, "check") == 0)
            status = cmd_check(n, args, &vars, quiet);
        else if (strcmp(cmd, "show") == 0)
            status = cmd_show(n, args, &vars);
        else if (strcmp(cmd, "explain") == 0)
            status = cmd_explain(n, args, &vars);
        else if (strcmp(cmd, "help") == 0) {
            usage(stdout);
            status = 0;
        } else {
            fprintf(stderr,
                    "woffload-policy: unknown command '%s', expected check, show, explain, fit or "
                    "gguf\n",
                    cmd);
            usage(stderr);
        }
    }
out:
    for (size_t i = 0; i < vars.n; i++)
        free(vars.owned[i]);
    return status;
}
