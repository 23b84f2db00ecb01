/* tests/test-reliability-input.c: bad input. Each case runs rel-client under
 * the shim (many at once, a timeout each) and checks that the client is
 * unharmed (exit 0, "done clean": its data, leak and registry checks) and
 * that the shim said so once, clearly.
 *
 *   env     every WOFFLOAD_* variable (the names `woffload doctor --env`
 *           prints: the wo_setting_defs table) with garbage values: one
 *           message naming the variable (or, for a path, the path), never
 *           repeated; the CUDA work goes on.
 *   corpus  every file of the policy fuzz corpus through WOFFLOAD_POLICY: a
 *           policy that does not load is reported naming the file and the
 *           shim then serves nothing (passes through); no crash, no hang.
 *   misuse  rel-client misuse: every misuse of include/woffload.h gives the
 *           documented result (the client checks each one).
 *   memlock RLIMIT_MEMLOCK 64 KiB with a host+pin policy: one error naming
 *           RLIMIT_MEMLOCK and the bytes; pin_fallback: managed serves the
 *           allocation as managed memory, pin_fallback: stop fails it with
 *           CUDA_ERROR_OUT_OF_MEMORY.
 *   trace   WOFFLOAD_TRACE=/dev/full and an unwritable path: one message,
 *           recording stops, the client finishes.
 *
 * usage: test-reliability-input CLIENT SHIM_PRELOAD WOFFLOAD_TOOL RELDIR CORPUSDIR
 *                               [CORPUS_STRIDE] [--unloadable-cuda-lib]
 * RELDIR holds managed.yaml and pin-stop.yaml. --unloadable-cuda-lib runs
 * only the cases where WOFFLOAD_CUDA_LIB names a library that cannot be
 * loaded (test reliability-input-unloadable-cuda-lib); without it they are
 * skipped (and counted), so each case runs in one test. */
#include <dirent.h>
#include <stdint.h>

#include "reliability/runner.h"

enum kind { K_ENV, K_CORPUS, K_MISUSE, K_MEMLOCK, K_TRACE };

struct tcase {
    enum kind kind;
    char label[300];
    char var[64];       /* K_ENV: the variable */
    char value[300];    /* the value given */
    char envkv[700];
    bool path;          /* the variable takes a path */
    bool unloadable_lib; /* K_ENV: WOFFLOAD_CUDA_LIB that cannot be loaded */
    int expect_pin;     /* K_MEMLOCK: expected allocation result */
};

static int failures;

/* WOFFLOAD_CUDA_LIB naming a library that cannot be loaded: the shim still
 * hands out its wrappers (the fake driver's cuGetProcAddress returns our
 * interposed exports), and they must reach the libcuda.so.1 the process
 * loaded, not fail with CUDA_ERROR_NOT_FOUND (docs/reliability.md, fixed
 * bug 1). */
static bool is_unloadable_cuda_lib(const char *var, const char *value)
{
    return strcmp(var, "WOFFLOAD_CUDA_LIB") == 0 && value[0];
}

/* Lines of s mentioning `word` as a whole name (not a prefix of a longer
 * WOFFLOAD_* name). */
static int lines_naming(const char *s, const char *word)
{
    int n = 0;
    size_t wl = strlen(word);
    if (!wl)
        return 0;
    while (s && *s) {
        const char *e = strchr(s, '\n');
        size_t l = e ? (size_t)(e - s) : strlen(s);
        for (const char *p = s; p + wl <= s + l; p++) {
            if (memcmp(p, word, wl) == 0) {
                char c = p + wl < s + l ? p[wl] : 0;
                if (!(c == '_' || (c >= 'A' && c <= 'Z'))) {
                    n++;
                    break;
                }
            }
        }
        s = e ? e + 1 : s + l;
    }
    return n;
}

static bool sanitizer_report(const char *err)
{
    return strstr(err, "Sanitizer") || strstr(err, "runtime error:");
}

static int remove_tree_files(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char p[4096];
    if (!d)
        return -1;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
            unlink(p);
        }
    closedir(d);
    return rmdir(dir);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(int argc, char **argv)
{
    const char *client, *tool, *reldir, *corpus;
    int stride = 1, par = runner_parallel();
    bool unloadable = false;
    char tmpdir[] = "/tmp/wo-rel-input-XXXXXX";
    static char managed_env[600], stop_env[600];
    struct tcase *tc;
    struct job *jobs;
    size_t n = 0, cap = 2048;
    int nvars = 0, ncorpus = 0, ncorpus_bad = 0, skipped_unloadable = 0;
    double t0 = runner_now();

    if (argc < 6) {
        fprintf(stderr, "usage: %s CLIENT SHIM_PRELOAD WOFFLOAD_TOOL RELDIR CORPUSDIR [STRIDE] "
                        "[--unloadable-cuda-lib]\n", argv[0]);
        return 2;
    }
    client = argv[1];
    runner_shim = argv[2];
    tool = argv[3];
    reldir = argv[4];
    corpus = argv[5];
    for (int i = 6; i < argc; i++) {
        if (strcmp(argv[i], "--unloadable-cuda-lib") == 0)
            unloadable = true;
        else
            stride = atoi(argv[i]) > 0 ? atoi(argv[i]) : 1;
    }
    if (!mkdtemp(tmpdir))
        return 1;
    snprintf(managed_env, sizeof(managed_env), "WOFFLOAD_POLICY=%s/managed.yaml", reldir);
    snprintf(stop_env, sizeof(stop_env), "WOFFLOAD_POLICY=%s/pin-stop.yaml", reldir);
    tc = calloc(cap, sizeof(*tc));
    if (!tc)
        return 1;

    /* env: the variable names from `woffload doctor --env`. */
    {
        struct job d;
        static const char *const garbage[] = {"garbage", "-1", "99999999999999999999999",
                                              "1e3", "%s%n%x", "\x01\x7f"};
        static const char *const badpath[] = {"/dev/null/x", "/proc/version/x", ""};
        memset(&d, 0, sizeof(d));
        d.argv[0] = tool;
        d.argv[1] = "doctor";
        d.argv[2] = "--env";
        d.timeout_ms = 30000;
        run_jobs(&d, 1, 1);
        if (d.timed_out || !WIFEXITED(d.status)) {
            printf("FAIL woffload doctor --env did not finish\n");
            return 1;
        }
        for (const char *s = d.out; s && *s;) {
            char name[64], def[256];
            const char *e = strchr(s, '\n');
            if (sscanf(s, "%63s default %255s", name, def) == 2 &&
                strncmp(name, "WOFFLOAD_", 9) == 0) {
                /* Path variables: no default, or a library name. */
                bool path = strcmp(def, "(unset)") == 0 || strstr(def, ".so");
                const char *const *vals = path ? badpath : garbage;
                size_t nv = path ? sizeof(badpath) / sizeof(*badpath)
                                 : sizeof(garbage) / sizeof(*garbage);
                nvars++;
                for (size_t v = 0; v < nv && n < cap; v++) {
                    struct tcase *c = &tc[n];
                    c->kind = K_ENV;
                    c->path = path;
                    snprintf(c->var, sizeof(c->var), "%s", name);
                    snprintf(c->value, sizeof(c->value), "%s", vals[v]);
                    snprintf(c->envkv, sizeof(c->envkv), "%s=%s", name, vals[v]);
                    snprintf(c->label, sizeof(c->label), "env %s=\"%s\"", name,
                             vals[v][0] == 1 ? "\\x01\\x7f" : vals[v]);
                    c->unloadable_lib = is_unloadable_cuda_lib(name, vals[v]);
                    if (c->unloadable_lib != unloadable) {
                        skipped_unloadable += c->unloadable_lib;
                        continue;
                    }
                    n++;
                }
            }
            s = e ? e + 1 : s + strlen(s);
        }
        job_free(&d);
        if (nvars < 5) {
            printf("FAIL only %d WOFFLOAD_* variables found in `woffload doctor --env`\n", nvars);
            return 1;
        }
    }

    if (!unloadable) {
        /* corpus */
        DIR *dd = opendir(corpus);
        struct dirent *e;
        char **names = NULL;
        size_t nn = 0, nc = 0;
        while (dd && (e = readdir(dd))) {
            if (e->d_name[0] == '.')
                continue;
            if (nn == nc) {
                nc = nc ? nc * 2 : 256;
                names = realloc(names, nc * sizeof(*names));
                if (!names)
                    return 1;
            }
            names[nn++] = strdup(e->d_name);
        }
        if (dd)
            closedir(dd);
        if (nn == 0) {
            printf("FAIL empty policy corpus %s\n", corpus);
            return 1;
        }
        qsort(names, nn, sizeof(*names), cmp_str);
        if (n + nn + 16 > cap) {
            cap = n + nn + 16;
            tc = realloc(tc, cap * sizeof(*tc));
            if (!tc)
                return 1;
        }
        for (size_t i = 0; i < nn; i++) {
            if (i % (size_t)stride == 0) {
                struct tcase *c = &tc[n++];
                memset(c, 0, sizeof(*c));
                c->kind = K_CORPUS;
                snprintf(c->value, sizeof(c->value), "%s", names[i]);
                snprintf(c->envkv, sizeof(c->envkv), "WOFFLOAD_POLICY=%s/%s", corpus, names[i]);
                snprintf(c->label, sizeof(c->label), "corpus %s", names[i]);
                ncorpus++;
            }
            free(names[i]);
        }
        free(names);

        memset(&tc[n], 0, sizeof(tc[n]));
        tc[n].kind = K_MISUSE;
        snprintf(tc[n++].label, sizeof(tc[0].label), "misuse of include/woffload.h");
        for (int k = 0; k < 2; k++) {
            memset(&tc[n], 0, sizeof(tc[n]));
            tc[n].kind = K_MEMLOCK;
            tc[n].expect_pin = k == 0 ? 0 : 2; /* CUDA_ERROR_OUT_OF_MEMORY */
            snprintf(tc[n].envkv, sizeof(tc[n].envkv), "%s", k == 0 ? managed_env : stop_env);
            snprintf(tc[n++].label, sizeof(tc[0].label), "RLIMIT_MEMLOCK 64 KiB, pin_fallback: %s",
                     k == 0 ? "managed" : "stop");
        }
        for (int k = 0; k < 3; k++) {
            static const char *const paths[] = {"/dev/full", "/dev/null/trace.wot",
                                                "/proc/version"};
            memset(&tc[n], 0, sizeof(tc[n]));
            tc[n].kind = K_TRACE;
            snprintf(tc[n].value, sizeof(tc[n].value), "%s", paths[k]);
            snprintf(tc[n].envkv, sizeof(tc[n].envkv), "WOFFLOAD_TRACE=%s", paths[k]);
            snprintf(tc[n++].label, sizeof(tc[0].label), "trace to %s", paths[k]);
        }
    }

    jobs = calloc(n, sizeof(*jobs));
    if (!jobs)
        return 1;
    for (size_t i = 0; i < n; i++) {
        struct job *j = &jobs[i];
        int k = 0;
        j->argv[0] = client;
        j->argv[1] = tc[i].kind == K_MISUSE ? "misuse" : tc[i].kind == K_MEMLOCK ? "pin" : "work";
        j->shim = true;
        j->timeout_ms = 30000;
        j->cwd = tmpdir; /* relative garbage paths land here */
        if (tc[i].kind == K_MEMLOCK)
            j->memlock = 64 * 1024;
        if (tc[i].envkv[0])
            j->env[k++] = tc[i].envkv;
        if (tc[i].kind != K_CORPUS && tc[i].kind != K_MEMLOCK &&
            !(tc[i].kind == K_ENV && strcmp(tc[i].var, "WOFFLOAD_POLICY") == 0))
            j->env[k++] = managed_env;
    }
    run_jobs(jobs, n, par);

    for (size_t i = 0; i < n; i++) {
        struct tcase *c = &tc[i];
        struct job *j = &jobs[i];
        char o[32], why[512] = "";
        bool ok = !j->timed_out && WIFEXITED(j->status) && !sanitizer_report(j->err);

        job_outcome(j, o, sizeof(o));
        if (!ok) {
            snprintf(why, sizeof(why), "%s", o);
        } else if (WEXITSTATUS(j->status) != 0 ||
                   (c->kind != K_MISUSE && c->kind != K_MEMLOCK && !strstr(j->out, "done clean"))) {
            snprintf(why, sizeof(why), "the client was harmed (%s)", o);
        } else if (c->kind == K_ENV) {
            int by_name = lines_naming(j->err, c->var);
            int by_value = c->path && c->value[0] ? count_lines_with(j->err, c->value) : 0;
            int said = by_name > by_value ? by_name : by_value;
            if (c->path && c->value[0] && (said < 1 || said > 2))
                snprintf(why, sizeof(why), "%d lines name %s or its value (want 1, at most 2)",
                         said, c->var);
            else if (!c->path && c->value[0] && by_name != 1)
                snprintf(why, sizeof(why), "%d lines name %s (want exactly 1)", by_name, c->var);
            else if (!c->value[0] && by_name > 1)
                snprintf(why, sizeof(why), "%d lines name %s for an empty value", by_name, c->var);
        } else if (c->kind == K_CORPUS) {
            if (strstr(j->out, "policy loaded=false")) {
                ncorpus_bad++;
                if (count_lines_with(j->err, c->value) < 1)
                    snprintf(why, sizeof(why), "a policy that did not load: no message names it");
                else if (!strstr(j->out, "served=0\n"))
                    snprintf(why, sizeof(why), "a policy that did not load, yet the shim served "
                                               "allocations");
            } else if (!strstr(j->out, "policy loaded=true")) {
                snprintf(why, sizeof(why), "no policy line from the client");
            }
        } else if (c->kind == K_MEMLOCK) {
            char want[64];
            snprintf(want, sizeof(want), "pin result %d ", c->expect_pin);
            if (!strstr(j->out, want))
                snprintf(why, sizeof(why), "expected \"%s\"", want);
            else if (count_lines_with(j->err, "RLIMIT_MEMLOCK") != 1 ||
                     (!strstr(j->err, "8388608") && !strstr(j->err, "8.00 MiB")))
                snprintf(why, sizeof(why), "want one error naming RLIMIT_MEMLOCK and the bytes");
            else if (c->expect_pin == 0 && !strstr(j->out, "managed 8388608 failures 1 fallbacks 1"))
                snprintf(why, sizeof(why), "fallback to managed memory not seen");
        } else if (c->kind == K_TRACE) {
            int said = count_lines_with(j->err, c->value);
            if (said != 1)
                snprintf(why, sizeof(why), "%d lines name the trace path (want exactly 1)", said);
        }
        if (why[0]) {
            failures++;
            printf("FAIL %-60s %s\n  stdout:\n%.1500s\n  stderr:\n%.3000s\n", c->label, why, j->out,
                   j->err);
        } else if (c->kind != K_CORPUS) {
            /* the first line the shim printed about it */
            const char *m = NULL;
            if (c->kind == K_ENV) {
                m = strstr(j->err, c->var);
                if (!m && c->value[0])
                    m = strstr(j->err, c->value);
            }
            else if (c->kind == K_MEMLOCK)
                m = strstr(j->err, "RLIMIT_MEMLOCK");
            else if (c->kind == K_TRACE)
                m = strstr(j->err, c->value);
            if (m)
                while (m > j->err && m[-1] != '\n')
                    m--;
            printf("ok   %-52s %.*s\n", c->label, m ? (int)strcspn(m, "\n") : 0, m ? m : "");
        }
    }
    printf("\nfigures: %d WOFFLOAD_* variables, %zu cases; policy corpus: %d files run (%d did not "
           "load), stride %d; %d unloadable-WOFFLOAD_CUDA_LIB cases %s; %.1f s; %d failures\n",
           nvars, n, ncorpus, ncorpus_bad, stride, unloadable ? (int)n : skipped_unloadable,
           unloadable ? "run" : "left to reliability-input-unloadable-cuda-lib",
           runner_now() - t0, failures);
    for (size_t i = 0; i < n; i++)
        job_free(&jobs[i]);
    free(jobs);
    free(tc);
    remove_tree_files(tmpdir);
    return failures ? 1 : 0;
}
