/* policy/tree.c: raw bytes -> a small YAML node tree with locations.
 *
 * Owns everything that protects the parser from hostile input: NUL and
 * UTF-8 checks on the raw bytes (before libyaml sees them), a bound on the
 * nodes after alias expansion (aliases are shared, never copied, so a
 * "billion laughs" costs one pointer per alias and is stopped by the count),
 * a bound on nesting, and ${VAR} expansion of scalar values. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "policy/policy-internal.h"

#define MAX_ANCHORS 1000
#define MAX_EXPANDED_VALUE (64 * 1024)

/* ---- raw bytes ---- */

/* Length of the valid UTF-8 sequence at p, or 0. */
static size_t utf8_seq(const unsigned char *p, size_t left)
{
    unsigned c = p[0];
    size_t n;
    uint32_t cp;

    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf)
        n = 2, cp = c & 0x1f;
    else if (c >= 0xe0 && c <= 0xef)
        n = 3, cp = c & 0x0f;
    else if (c >= 0xf0 && c <= 0xf4)
        n = 4, cp = c & 0x07;
    else
        return 0;
    if (left < n)
        return 0;
    for (size_t i = 1; i < n; i++) {
        if ((p[i] & 0xc0) != 0x80)
            return 0;
        cp = (cp << 6) | (p[i] & 0x3f);
    }
    /* overlong forms, surrogates, beyond U+10FFFF */
    if ((n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) || cp > 0x10ffff ||
        (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return n;
}

static int check_bytes(const char *buf, size_t len, const char *file, struct wo_diags *diags)
{
    const unsigned char *p = (const unsigned char *)buf;
    unsigned line = 1, col = 1;

    if (len >= 2 && ((p[0] == 0xff && p[1] == 0xfe) || (p[0] == 0xfe && p[1] == 0xff))) {
        wo_diag_add(diags, file, 1, 1, WO_DIAG_ERROR,
                    "found a UTF-16 byte order mark, expected UTF-8 text (convert with iconv -t UTF-8)");
        return -EINVAL;
    }
    for (size_t i = 0; i < len;) {
        size_t n;
        if (p[i] == 0) {
            wo_diag_add(diags, file, line, col, WO_DIAG_ERROR,
                        "found a NUL byte (offset %zu), expected UTF-8 text", i);
            return -EINVAL;
        }
        n = utf8_seq(p + i, len - i);
        if (!n) {
            wo_diag_add(diags, file, line, col, WO_DIAG_ERROR,
                        "found byte 0x%02x (offset %zu) that is not valid UTF-8, expected UTF-8 text",
                        p[i], i);
            return -EINVAL;
        }
        if (p[i] == '\n') {
            line++;
            col = 1;
        } else {
            col++;
        }
        i += n;
    }
    return 0;
}

/* ---- variables ---- */

static const char *lookup_one(const struct wo_vars *v, const char *name)
{
    if (v->lookup)
        return v->lookup(v->ud, name);
    return getenv(name);
}

/* RANK and friends under the launchers that do not set them. */
static const char *lookup_var(const struct wo_vars *v, const char *name, const char *def)
{
    static const struct {
        const char *name;
        const char *alt[3];
        const char *single;
    } fb[] = {
        {"RANK", {"SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"}, "0"},
        {"LOCAL_RANK", {"SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"}, "0"},
        {"WORLD_SIZE", {"SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}, "1"},
    };
    const char *r = lookup_one(v, name);

    if (r)
        return r;
    for (size_t i = 0; i < WO_ARRAY_SIZE(fb); i++) {
        if (strcmp(name, fb[i].name) != 0)
            continue;
        for (size_t j = 0; j < WO_ARRAY_SIZE(fb[i].alt); j++)
            if ((r = lookup_one(v, fb[i].alt[j])))
                return r;
        return def ? def : fb[i].single;
    }
    return def;
}

static bool name_start(char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_';
}

static bool name_char(char c)
{
    return name_start(c) || (c >= '0' && c <= '9');
}

struct sbuf {
    char *s;
    size_t n, cap;
    bool oom, big;
};

static void sb_add(struct sbuf *b, const char *s, size_t n)
{
    if (b->oom || b->big)
        return;
    if (b->n + n + 1 > MAX_EXPANDED_VALUE) {
        b->big = true;
        return;
    }
    if (b->n + n + 1 > b->cap) {
        size_t cap = (b->n + n + 1) * 2;
        char *p = realloc(b->s, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->s = p;
        b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = '\0';
}

char *wo_expand(const char *s, const struct wo_vars *vars, char *errbuf, size_t errlen)
{
    struct sbuf b = {0};

    sb_add(&b, "", 0);
    while (*s) {
        const char *d = strchr(s, '$');
        if (!d) {
            sb_add(&b, s, strlen(s));
            break;
        }
        sb_add(&b, s, (size_t)(d - s));
        if (d[1] == '$') {
            sb_add(&b, "$", 1);
            s = d + 2;
        } else if (d[1] == '{') {
            const char *n = d + 2, *e = n, *def = NULL, *close, *val;
            char name[128], defv[1024];
            size_t nl;
            if (!name_start(*e)) {
                snprintf(errbuf, errlen, "found '${' not followed by a variable name, "
                         "expected ${NAME} or ${NAME:-default} (write $$ for a literal $)");
                goto fail;
            }
            while (name_char(*e))
                e++;
            nl = (size_t)(e - n);
            if (nl >= sizeof(name)) {
                snprintf(errbuf, errlen, "found a variable name longer than %zu characters",
                         sizeof(name) - 1);
                goto fail;
            }
            if (e[0] == ':' && e[1] == '-') {
                def = e + 2;
                close = strchr(def, '}');
            } else if (*e == '}') {
                close = e;
            } else if (!*e) {
                close = NULL;
            } else {
                snprintf(errbuf, errlen, "found '%.1s' in ${%.*s...}, expected '}' or ':-default}'",
                         *e ? e : "end of value", (int)nl, n);
                goto fail;
            }
            if (!close) {
                snprintf(errbuf, errlen, "found an unterminated ${%.*s, expected '}'", (int)nl, n);
                goto fail;
            }
            memcpy(name, n, nl);
            name[nl] = '\0';
            if (def) {
                size_t dl = (size_t)(close - def);
                if (dl >= sizeof(defv))
                    dl = sizeof(defv) - 1;
                memcpy(defv, def, dl);
                defv[dl] = '\0';
            }
            val = lookup_var(vars, name, def ? defv : NULL);
            if (!val) {
                snprintf(errbuf, errlen, "variable '%s' is not set, expected it in the environment "
                         "(or --var %s=VALUE), or a default: ${%s:-VALUE}", name, name, name);
                goto fail;
            }
            sb_add(&b, val, strlen(val));
            s = close + 1;
        } else {
            /* a lone $ is literal: regexes end with it */
            sb_add(&b, "$", 1);
            s = d + 1;
        }
    }
    if (b.oom) {
        snprintf(errbuf, errlen, "out of memory expanding variables");
        goto fail;
    }
    if (b.big) {
        snprintf(errbuf, errlen, "the value after expanding variables is longer than %d bytes",
                 MAX_EXPANDED_VALUE);
        goto fail;
    }
    return b.s;
fail:
    free(b.s);
    return NULL;
}

/* ---- the tree ---- */

struct anchor {
    char *name;
    struct wo_node *node;
};

struct builder {
    struct wo_tree *t;
    const char *file;
    struct wo_diags *diags;
    struct wo_vars vars;
    unsigned max_nodes, max_depth;
    size_t expanded;
    struct wo_node *stack[WO_POLICY_MAX_DEPTH * 2 + 2];
    unsigned depth;
    struct anchor anchors[MAX_ANCHORS];
    size_t nanchors;
    int ndocs;
};

static void berr(struct builder *b, const yaml_mark_t *m, const char *fmt, ...) WO_PRINTF(3, 4);
static void berr(struct builder *b, const yaml_mark_t *m, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    wo_diag_addv(b->diags, b->file, (unsigned)m->line + 1, (unsigned)m->column + 1,
                 WO_DIAG_ERROR, fmt, ap);
    va_end(ap);
}

static struct wo_node *node_new(struct builder *b, enum wo_node_kind kind, const yaml_mark_t *m)
{
    struct wo_node *n = calloc(1, sizeof(*n));
    if (!n)
        return NULL;
    n->kind = kind;
    n->line = (unsigned)m->line + 1;
    n->column = (unsigned)m->column + 1;
    n->weight = 1;
    n->next_all = b->t->all;
    b->t->all = n;
    return n;
}

static int add_child(struct wo_node *parent, struct wo_node *child)
{
    if (parent->n == parent->cap) {
        size_t cap = parent->cap ? parent->cap * 2 : 4;
        struct wo_node **v = realloc(parent->items, cap * sizeof(*v));
        if (!v)
            return -ENOMEM;
        parent->items = v;
        parent->cap = cap;
    }
    parent->items[parent->n++] = child;
    parent->weight += child->weight;
    if (child->height + 1 > parent->height)
        parent->height = child->height + 1;
    return 0;
}

static const char *kind_name(enum wo_node_kind k)
{
    return k == WO_NODE_SCALAR ? "a scalar" : k == WO_NODE_SEQ ? "a sequence" : "a mapping";
}

/* Attaches a finished node (or an alias target) to the open collection or
 * makes it the document root. */
static int attach(struct builder *b, struct wo_node *n, const yaml_mark_t *m)
{
    struct wo_node *parent = b->depth ? b->stack[b->depth - 1] : NULL;

    if (!parent) {
        b->t->root = n;
        return 0;
    }
    if (parent->kind == WO_NODE_MAP && parent->n % 2 == 0 && n->kind != WO_NODE_SCALAR) {
        berr(b, m, "found %s as a mapping key, expected a plain key name", kind_name(n->kind));
        return -EINVAL;
    }
    if (add_child(parent, n) < 0) {
        berr(b, m, "out of memory");
        return -ENOMEM;
    }
    return 0;
}

static int count_node(struct builder *b, size_t w, const yaml_mark_t *m)
{
    b->expanded += w;
    if (b->expanded > b->max_nodes) {
        berr(b, m, "found more than %u YAML nodes (aliases expanded), expected a policy "
             "of at most that size (an alias bomb?)", b->max_nodes);
        return -EINVAL;
    }
    return 0;
}

static int remember_anchor(struct builder *b, const yaml_char_t *anchor, struct wo_node *n,
                           const yaml_mark_t *m)
{
    if (!anchor)
        return 0;
    for (size_t i = 0; i < b->nanchors; i++)
        if (strcmp(b->anchors[i].name, (const char *)anchor) == 0) {
            b->anchors[i].node = n; /* YAML: a redefined anchor replaces the old one */
            return 0;
        }
    if (b->nanchors == MAX_ANCHORS) {
        berr(b, m, "found more than %d anchors, expected fewer", MAX_ANCHORS);
        return -EINVAL;
    }
    b->anchors[b->nanchors].name = strdup((const char *)anchor);
    if (!b->anchors[b->nanchors].name) {
        berr(b, m, "out of memory");
        return -ENOMEM;
    }
    b->anchors[b->nanchors++].node = n;
    return 0;
}

static int on_event(struct builder *b, yaml_event_t *ev)
{
    const yaml_mark_t *m = &ev->start_mark;
    struct wo_node *n;
    int r;

    switch (ev->type) {
    case YAML_DOCUMENT_START_EVENT:
        if (++b->ndocs > 1) {
            berr(b, m, "found a second YAML document, expected one policy per file");
            return -EINVAL;
        }
        return 0;
    case YAML_SCALAR_EVENT: {
        struct wo_node *parent = b->depth ? b->stack[b->depth - 1] : NULL;
        bool key = parent && parent->kind == WO_NODE_MAP && parent->n % 2 == 0;
        const char *v = (const char *)ev->data.scalar.value;
        if ((r = count_node(b, 1, m)) < 0)
            return r;
        n = node_new(b, WO_NODE_SCALAR, m);
        if (!n) {
            berr(b, m, "out of memory");
            return -ENOMEM;
        }
        n->plain = ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
        n->null = n->plain && (!*v || !strcmp(v, "~") || !strcmp(v, "null") ||
                               !strcmp(v, "Null") || !strcmp(v, "NULL"));
        if (key || n->null) {
            n->value = strdup(v);
        } else {
            char err[512];
            n->value = wo_expand(v, &b->vars, err, sizeof(err));
            if (!n->value) {
                berr(b, m, "%s", err);
                return -EINVAL;
            }
        }
        if (!n->value) {
            berr(b, m, "out of memory");
            return -ENOMEM;
        }
        if ((r = remember_anchor(b, ev->data.scalar.anchor, n, m)) < 0)
            return r;
        return attach(b, n, m);
    }
    case YAML_SEQUENCE_START_EVENT:
    case YAML_MAPPING_START_EVENT: {
        bool seq = ev->type == YAML_SEQUENCE_START_EVENT;
        if (b->depth + 1 > b->max_depth) {
            berr(b, m, "found nesting deeper than %u levels, expected a shallower document",
                 b->max_depth);
            return -EINVAL;
        }
        if ((r = count_node(b, 1, m)) < 0)
            return r;
        n = node_new(b, seq ? WO_NODE_SEQ : WO_NODE_MAP, m);
        if (!n) {
            berr(b, m, "out of memory");
            return -ENOMEM;
        }
        if (b->depth) {
            struct wo_node *parent = b->stack[b->depth - 1];
            if (parent->kind == WO_NODE_MAP && parent->n % 2 == 0) {
                berr(b, m, "found %s as a mapping key, expected a plain key name",
                     kind_name(n->kind));
                return -EINVAL;
            }
        }
        /* the anchor is usable only once the node is complete (remembered at
         * the end), so an alias can never refer to a node that contains it */
        {
            const yaml_char_t *anchor = seq ? ev->data.sequence_start.anchor
                                            : ev->data.mapping_start.anchor;
            n->value = anchor ? strdup((const char *)anchor) : NULL;
        }
        b->stack[b->depth++] = n;
        return 0;
    }
    case YAML_SEQUENCE_END_EVENT:
    case YAML_MAPPING_END_EVENT: {
        char *anchor;
        n = b->stack[--b->depth];
        anchor = n->value;
        n->value = NULL;
        r = anchor ? remember_anchor(b, (const yaml_char_t *)anchor, n, m) : 0;
        free(anchor);
        if (r < 0)
            return r;
        return attach(b, n, m);
    }
    case YAML_ALIAS_EVENT: {
        struct wo_node *target = NULL;
        for (size_t i = 0; i < b->nanchors; i++)
            if (strcmp(b->anchors[i].name, (const char *)ev->data.alias.anchor) == 0)
                target = b->anchors[i].node;
        if (!target) {
            berr(b, m, "found alias '*%.64s' to an anchor that is not defined before it "
                 "(or that contains the alias), expected a defined anchor",
                 (const char *)ev->data.alias.anchor);
            return -EINVAL;
        }
        if (b->depth + target->height + 1 > b->max_depth) {
            berr(b, m, "found nesting deeper than %u levels (through alias '*%.64s'), "
                 "expected a shallower document", b->max_depth, (const char *)ev->data.alias.anchor);
            return -EINVAL;
        }
        if ((r = count_node(b, target->weight, m)) < 0)
            return r;
        return attach(b, target, m);
    }
    default:
        return 0;
    }
}

int wo_tree_parse(struct wo_tree *t, const char *buf, size_t len, const char *file,
                  const struct wo_policy_opts *opts, struct wo_diags *diags)
{
    yaml_parser_t parser;
    struct builder *b;
    int r = 0;

    memset(t, 0, sizeof(*t));
    if ((r = check_bytes(buf, len, file, diags)) < 0)
        return r;
    b = calloc(1, sizeof(*b));
    if (!b)
        return -ENOMEM;
    b->t = t;
    b->file = file;
    b->diags = diags;
    b->vars.lookup = opts ? opts->lookup : NULL;
    b->vars.ud = opts ? opts->lookup_ud : NULL;
    b->max_nodes = opts && opts->max_nodes ? opts->max_nodes : WO_POLICY_MAX_NODES;
    b->max_depth = opts && opts->max_depth ? opts->max_depth : WO_POLICY_MAX_DEPTH;
    if (b->max_depth > WO_ARRAY_SIZE(b->stack) - 1)
        b->max_depth = (unsigned)WO_ARRAY_SIZE(b->stack) - 1;

    if (!yaml_parser_initialize(&parser)) {
        free(b);
        return -ENOMEM;
    }
    yaml_parser_set_input_string(&parser, (const unsigned char *)buf, len);
    for (;;) {
        yaml_event_t ev;
        bool done;
        if (!yaml_parser_parse(&parser, &ev)) {
            const char *problem = parser.problem ? parser.problem : "invalid YAML";
            yaml_mark_t m = parser.problem_mark;
            /* libyaml says "found character that cannot start any token" of
             * a tab where an indentation or a token is expected */
            if (m.index < len && buf[m.index] == '\t')
                berr(b, &m, "found a tab, expected spaces: tabs cannot indent YAML; use spaces");
            else if (parser.context)
                berr(b, &m, "%s %s", problem, parser.context);
            else
                berr(b, &m, "%s", problem);
            r = -EINVAL;
            break;
        }
        done = ev.type == YAML_STREAM_END_EVENT;
        r = on_event(b, &ev);
        yaml_event_delete(&ev);
        if (r < 0 || done)
            break;
    }
    yaml_parser_delete(&parser);
    /* collections left open by an error carry an anchor name in value */
    while (b->depth) {
        struct wo_node *n = b->stack[--b->depth];
        if (n->kind != WO_NODE_SCALAR) {
            free(n->value);
            n->value = NULL;
        }
    }
    for (size_t i = 0; i < b->nanchors; i++)
        free(b->anchors[i].name);
    free(b);
    if (r < 0) {
        wo_tree_free(t);
        return r == -ENOMEM ? r : -EINVAL;
    }
    return 0;
}

void wo_tree_free(struct wo_tree *t)
{
    struct wo_node *n = t->all;
    while (n) {
        struct wo_node *next = n->next_all;
        free(n->value);
        free(n->items);
        free(n);
        n = next;
    }
    t->all = NULL;
    t->root = NULL;
}
