/* policy/load.c: loading a policy: a file or a buffer, parsed into a tree
 * (tree.c), checked against the schema and turned into a policy (parse.c),
 * the diagnostics collected or logged. */
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "policy/policy-internal.h"

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
