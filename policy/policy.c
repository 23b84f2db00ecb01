/* policy/policy.c: loading a policy (file or buffer -> tree -> schema),
 * freeing it, accessors, the placement names and the budget helpers. */
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "policy/policy-internal.h"


static const char *const place_str[] = {"unset", "device", "host", "managed"};

const char *wo_placement_to_string(enum wo_placement p)
{
    if ((unsigned)p >= WO_ARRAY_SIZE(place_str))
        return "?";
    return place_str[p];
}

int wo_placement_from_string(const char *s)
{
    if (!s)
        return -EINVAL;
    for (size_t i = WO_PLACE_DEVICE; i < WO_ARRAY_SIZE(place_str); i++)
        if (strcmp(s, place_str[i]) == 0)
            return (int)i;
    return -EINVAL;
}

static void matchers_free(struct wo_matchers *m)
{
    for (size_t i = 0; i < m->nmatch; i++)
        free(m->match[i]);
    free(m->match);
    for (size_t i = 0; i < m->nglob; i++)
        free(m->glob[i]);
    free(m->glob);
    for (size_t i = 0; i < m->nregex; i++) {
        if (m->regex)
            regfree(&m->regex[i]);
        free(m->regex_src[i]);
    }
    free(m->regex);
    free(m->regex_src);
    free(m->layers);
}

struct wo_policy *wo_policy_free(struct wo_policy *p)
{
    if (!p)
        return NULL;
    for (size_t i = 0; i < p->nrules; i++) {
        free((char *)p->rules[i].name);
        matchers_free(&p->m[i]);
    }
    free(p->rules);
    free(p->m);
    free(p->source);
    free(p);
    return NULL;
}

/* Collects into the caller's diags, or into a local set that is logged. */
static int finish(struct wo_diags *mine, struct wo_diags *theirs, int r)
{
    if (!theirs) {
        wo_diags_log(mine);
        wo_diags_clear(mine);
    }
    return r;
}

int wo_policy_load_buffer(const char *buf, size_t len, const char *display_name,
                          const struct wo_policy_opts *opts, struct wo_policy **ret,
                          struct wo_diags *diags)
{
    struct wo_diags local = {0};
    struct wo_diags *d = diags ? diags : &local;
    const char *file = display_name ? display_name : "<buffer>";
    size_t errors_before = d->nerrors;
    struct wo_tree t;
    struct wo_policy *p;
    bool blank = true;
    int r;

    if (!ret)
        return -EINVAL;
    *ret = NULL;
    if (!buf && len)
        return -EINVAL;
    for (size_t i = 0; i < len && blank; i++)
        blank = buf[i] == ' ' || buf[i] == '\n' || buf[i] == '\t' || buf[i] == '\r';
    if (blank) {
        wo_diag_add(d, file, 0, 0, WO_DIAG_ERROR, "found an empty file, expected a YAML policy "
                    "(a policy with 'rules: []' passes everything through)");
        return finish(&local, diags, -EINVAL);
    }
    if (len > WO_POLICY_MAX_FILE) {
        wo_diag_add(d, file, 0, 0, WO_DIAG_ERROR, "found %zu bytes, expected a policy of at most %llu bytes",
                    len, (unsigned long long)WO_POLICY_MAX_FILE);
        return finish(&local, diags, -EFBIG);
    }
    r = wo_tree_parse(&t, buf, len, file, opts, d);
    if (r < 0)
        return finish(&local, diags, r);
    if (!t.root) {
        wo_tree_free(&t);
        wo_diag_add(d, file, 0, 0, WO_DIAG_ERROR, "found no YAML document (only comments), expected "
                    "a YAML policy (a policy with 'rules: []' passes everything through)");
        return finish(&local, diags, -EINVAL);
    }
    p = calloc(1, sizeof(*p));
    if (!p || !(p->source = strdup(file))) {
        free(p);
        wo_tree_free(&t);
        return finish(&local, diags, -ENOMEM);
    }
    r = wo_policy_from_tree(p, t.root, file, d);
    wo_tree_free(&t);
    if (r == 0 && d->nerrors != errors_before)
        r = -EINVAL; /* an error reported without failing its step still fails the load */
    if (r < 0) {
        wo_policy_free(p);
        return finish(&local, diags, r == -ENOMEM ? r : -EINVAL);
    }
    *ret = p;
    return finish(&local, diags, 0);
}

int wo_policy_load_file(const char *path, const struct wo_policy_opts *opts,
                        struct wo_policy **ret, struct wo_diags *diags)
{
    struct wo_diags local = {0};
    struct wo_diags *d = diags ? diags : &local;
    struct stat st;
    char *buf = NULL;
    size_t len = 0;
    int fd, r;

    if (!ret)
        return -EINVAL;
    *ret = NULL;
    if (!path || !*path) {
        wo_diag_add(d, "<policy>", 0, 0, WO_DIAG_ERROR, "no policy file given");
        return finish(&local, diags, -EINVAL);
    }
    /* O_NONBLOCK: opening a FIFO with no writer must not hang */
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        r = -errno;
        wo_diag_add(d, path, 0, 0, WO_DIAG_ERROR, "cannot open the policy: %s%s", strerror(-r),
                    r == -ENOENT ? " (check WOFFLOAD_POLICY or the path given)" : "");
        return finish(&local, diags, r);
    }
    if (fstat(fd, &st) < 0) {
        r = -errno;
        wo_diag_add(d, path, 0, 0, WO_DIAG_ERROR, "cannot stat the policy: %s", strerror(-r));
        goto out;
    }
    if (S_ISDIR(st.st_mode)) {
        r = -EISDIR;
        wo_diag_add(d, path, 0, 0, WO_DIAG_ERROR, "found a directory, expected a policy file");
        goto out;
    }
    if (!S_ISREG(st.st_mode)) {
        r = -EINVAL;
        wo_diag_add(d, path, 0, 0, WO_DIAG_ERROR, "found a special file, expected a regular policy file");
        goto out;
    }
    if ((uint64_t)st.st_size > WO_POLICY_MAX_FILE) {
        r = -EFBIG;
        wo_diag_add(d, path, 0, 0, WO_DIAG_ERROR, "found %llu bytes, expected a policy of at most %llu bytes",
                    (unsigned long long)st.st_size, (unsigned long long)WO_POLICY_MAX_FILE);
        goto out;
    }
    buf = malloc((size_t)st.st_size + 1);
    if (!buf) {
        r = -ENOMEM;
        goto out;
    }
    /* read to EOF, bounded: the file may change size while we read */
    while (len <= (size_t)st.st_size) {
        ssize_t n = read(fd, buf + len, (size_t)st.st_size + 1 - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            r = -errno;
            wo_diag_add(d, path, 0, 0, WO_DIAG_ERROR, "cannot read the policy: %s", strerror(-r));
            goto out;
        }
        if (n == 0)
            break;
        len += (size_t)n;
    }
    if (len > (size_t)st.st_size) {
        r = -EAGAIN;
        wo_diag_add(d, path, 0, 0, WO_DIAG_ERROR, "the file grew while being read; try again");
        goto out;
    }
    close(fd);
    fd = -1;
    r = wo_policy_load_buffer(buf, len, path, opts, ret, d);
out:
    if (fd >= 0)
        close(fd);
    free(buf);
    return finish(&local, diags, r);
}

const char *wo_policy_source(const struct wo_policy *p)
{
    return p ? p->source : "";
}

/* What `rules: []` gives: nothing placeable, everything passes through
 * (the window opens only when the API asks). */
static const struct wo_policy_globals passthrough_globals =
    WO_POLICY_DEFAULTS(WO_WINDOW_OPEN_API);

const struct wo_policy_globals *wo_policy_globals(const struct wo_policy *p)
{
    return p ? &p->g : &passthrough_globals;
}

size_t wo_policy_nrules(const struct wo_policy *p)
{
    return p ? p->nrules : 0;
}

const struct wo_rule *wo_policy_rule(const struct wo_policy *p, size_t i)
{
    if (!p || i >= p->nrules)
        return NULL;
    return &p->rules[i];
}

const char *wo_policy_rule_label(const struct wo_policy *p, size_t i, char *buf, size_t len)
{
    const char *base;
    if (!p || i >= p->nrules) {
        snprintf(buf, len, "the default");
        return buf;
    }
    base = strrchr(p->source, '/');
    base = base ? base + 1 : p->source;
    if (p->rules[i].name)
        snprintf(buf, len, "rule %zu '%s' (%s:%u)", i + 1, p->rules[i].name, base, p->rules[i].line);
    else
        snprintf(buf, len, "rule %zu (%s:%u)", i + 1, base, p->rules[i].line);
    return buf;
}

bool wo_policy_passthrough(const struct wo_policy *p)
{
    if (!p)
        return true;
    if (p->g.default_place != WO_PLACE_DEVICE || p->g.fit.enabled)
        return false;
    for (size_t i = 0; i < p->nrules; i++)
        if (p->rules[i].place != WO_PLACE_DEVICE)
            return false;
    return true;
}

void wo_host_budget_init(struct wo_host_budget *b, const struct wo_policy *p)
{
    b->limit = p && p->g.host_budget.kind == WO_BUDGET_BYTES ? p->g.host_budget.bytes : UINT64_MAX;
    b->used = 0;
    b->spent = false;
}

int wo_host_budget_take(struct wo_host_budget *b, uint64_t bytes)
{
    if (b->spent || bytes > b->limit - b->used) {
        b->spent = true;
        return 0;
    }
    b->used += bytes;
    return 1;
}

void wo_host_budget_release(struct wo_host_budget *b, uint64_t bytes)
{
    b->used = bytes > b->used ? 0 : b->used - bytes;
}

uint64_t wo_budget_resolve(const struct wo_budget *b, uint64_t device_total, uint64_t device_free)
{
    __extension__ typedef unsigned __int128 u128;
    switch (b->kind) {
    case WO_BUDGET_UNLIMITED:
        return UINT64_MAX;
    case WO_BUDGET_AUTO:
        return device_free / 2;
    case WO_BUDGET_BYTES:
        return b->bytes;
    case WO_BUDGET_PERCENT:
        return (uint64_t)((u128)device_total * b->ppm / 1000000u);
    }
    return 0;
}

uint64_t wo_policy_device_budget(const struct wo_policy *p, uint64_t device_total,
                                 uint64_t device_free)
{
    return wo_budget_resolve(&wo_policy_globals(p)->device_budget, device_total, device_free);
}
