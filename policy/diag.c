/* policy/diag.c: the located diagnostics of a policy load (collect, format,
 * print, log) and the edit distance behind "did you mean". */
#include <stdio.h>
#include <string.h>

#include "core/log.h"
#include "policy/policy-internal.h"

/* A file with thousands of bad lines helps nobody past the first screens. */
#define MAX_DIAGS 200

static const char *sev_name(enum wo_diag_severity s)
{
    switch (s) {
    case WO_DIAG_ERROR:
        return "error";
    case WO_DIAG_WARNING:
        return "warning";
    case WO_DIAG_NOTE:
        return "note";
    }
    return "?";
}

void wo_diag_addv(struct wo_diags *d, const char *file, unsigned line, unsigned column,
                  enum wo_diag_severity sev, const char *fmt, va_list ap)
{
    char msg[1024];
    struct wo_diag *x;

    if (sev == WO_DIAG_ERROR)
        d->nerrors++;
    else if (sev == WO_DIAG_WARNING)
        d->nwarnings++;
    if (d->n >= MAX_DIAGS) {
        return;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 8;
        struct wo_diag *v = realloc(d->v, cap * sizeof(*v));
        if (!v)
            return;
        d->v = v;
        d->cap = cap;
    }
    vsnprintf(msg, sizeof(msg), fmt, ap);
    x = &d->v[d->n];
    x->file = strdup(file ? file : "<buffer>");
    x->message = strdup(msg);
    if (!x->file || !x->message) {
        free(x->file);
        free(x->message);
        return;
    }
    x->line = line;
    x->column = column;
    x->severity = sev;
    d->n++;
    if (d->n == MAX_DIAGS) {
        /* say that more were dropped, once, at the end */
        d->n--;
        free(d->v[d->n].file);
        free(d->v[d->n].message);
        d->v[d->n].file = strdup(file ? file : "<buffer>");
        d->v[d->n].message = strdup("too many diagnostics; the rest are not shown");
        d->v[d->n].line = 0;
        d->v[d->n].column = 0;
        d->v[d->n].severity = WO_DIAG_NOTE;
        if (d->v[d->n].file && d->v[d->n].message)
            d->n++;
        else {
            free(d->v[d->n].file);
            free(d->v[d->n].message);
        }
        d->n = MAX_DIAGS; /* nothing more is ever added */
    }
}

void wo_diag_add(struct wo_diags *d, const char *file, unsigned line, unsigned column,
                 enum wo_diag_severity sev, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    wo_diag_addv(d, file, line, column, sev, fmt, ap);
    va_end(ap);
}

void wo_diags_clear(struct wo_diags *d)
{
    if (!d)
        return;
    for (size_t i = 0; i < d->n; i++) {
        free(d->v[i].file);
        free(d->v[i].message);
    }
    free(d->v);
    memset(d, 0, sizeof(*d));
}

void wo_diag_format(const struct wo_diag *d, char *buf, size_t len)
{
    if (d->line && d->column)
        snprintf(buf, len, "%s:%u:%u: %s: %s", d->file, d->line, d->column,
                 sev_name(d->severity), d->message);
    else if (d->line)
        snprintf(buf, len, "%s:%u: %s: %s", d->file, d->line, sev_name(d->severity), d->message);
    else
        snprintf(buf, len, "%s: %s: %s", d->file, sev_name(d->severity), d->message);
}

void wo_diags_print(const struct wo_diags *d, FILE *f)
{
    char buf[1400];
    if (!d)
        return;
    for (size_t i = 0; i < d->n; i++) {
        wo_diag_format(&d->v[i], buf, sizeof(buf));
        fprintf(f, "%s\n", buf);
    }
}

void wo_diags_log(const struct wo_diags *d)
{
    char buf[1400];
    if (!d)
        return;
    for (size_t i = 0; i < d->n; i++) {
        int level = d->v[i].severity == WO_DIAG_ERROR     ? WO_LOG_ERROR
                    : d->v[i].severity == WO_DIAG_WARNING ? WO_LOG_WARN
                                                          : WO_LOG_INFO;
        /* the level tag is printed by the logger: format without it */
        if (d->v[i].line && d->v[i].column)
            snprintf(buf, sizeof(buf), "%s:%u:%u: %s", d->v[i].file, d->v[i].line,
                     d->v[i].column, d->v[i].message);
        else if (d->v[i].line)
            snprintf(buf, sizeof(buf), "%s:%u: %s", d->v[i].file, d->v[i].line, d->v[i].message);
        else
            snprintf(buf, sizeof(buf), "%s: %s", d->v[i].file, d->v[i].message);
        wo_log(level, "%s", buf);
    }
}

unsigned wo_edit_distance(const char *a, const char *b, unsigned cap)
{
    /* Two rows; keys are short, so longer strings are simply "far". */
    unsigned row0[65], row1[65];
    size_t la = strlen(a), lb = strlen(b);

    if (la > 64 || lb > 64)
        return cap + 1;
    for (size_t j = 0; j <= lb; j++)
        row0[j] = (unsigned)j;
    for (size_t i = 1; i <= la; i++) {
        row1[0] = (unsigned)i;
        for (size_t j = 1; j <= lb; j++) {
            unsigned del = row0[j] + 1, ins = row1[j - 1] + 1;
            unsigned sub = row0[j - 1] + (a[i - 1] != b[j - 1]);
            unsigned m = del < ins ? del : ins;
            row1[j] = m < sub ? m : sub;
        }
        memcpy(row0, row1, (lb + 1) * sizeof(unsigned));
    }
    return row0[lb] > cap ? cap + 1 : row0[lb];
}
