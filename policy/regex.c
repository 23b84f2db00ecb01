/* policy/regex.c: what makes a POSIX regular expression safe to hand to
 * glibc. regcomp copies the operand of '+' and of {n,m} (a{3} becomes aaa),
 * so nested counted repetitions multiply and a few dozen bytes can take
 * gigabytes; stacked quantifiers ("a??", "a+*", undefined in POSIX) make its
 * epsilon closures explode. Found by fuzzing (tests/fuzz-policy.c). */
#include <string.h>

#include "policy/policy-internal.h"

/* An upper estimate of the nodes regcomp builds for s, walking groups,
 * bracket expressions and quantifiers; capped just above the limit. */
uint64_t wo_regex_cost(const char *s)
{
    uint64_t sum[64], last[64]; /* per open group: total so far, size of the last item */
    unsigned depth = 0;
    bool quantified = false; /* the last item already carries a quantifier */

    sum[0] = last[0] = 0;
    for (const char *p = s; *p;) {
        uint64_t item = 1, mult = 0;
        if (quantified &&
            (*p == '+' || *p == '*' || *p == '?' || (*p == '{' && p[1] >= '0' && p[1] <= '9')))
            return WO_REGEX_STACKED; /* "a??", "a+*": undefined in POSIX, slow in glibc */
        quantified = false;
        if (*p == '(') {
            if (++depth >= 64)
                return WO_REGEX_MAX_NODES + 1;
            sum[depth] = last[depth] = 0;
            p++;
            continue;
        }
        if (*p == ')' && depth > 0) {
            item = sum[depth] + 1;
            depth--;
            sum[depth] += item;
            last[depth] = item;
            p++;
            continue;
        }
        if (*p == '+') {
            mult = 2;
            p++;
        } else if (*p == '{') {
            uint64_t a = 0, bnd = 0;
            bool comma = false;
            for (p++; *p && *p != '}'; p++) {
                if (*p == ',')
                    comma = true;
                else if (*p >= '0' && *p <= '9') {
                    uint64_t *v = comma ? &bnd : &a;
                    *v = *v * 10 + (uint64_t)(*p - '0');
                    if (*v > WO_REGEX_MAX_NODES)
                        return WO_REGEX_MAX_NODES + 1;
                }
            }
            if (*p)
                p++;
            mult = (comma ? (bnd ? bnd : a + 1) : a) + 1;
        } else if (*p == '*' || *p == '?') {
            mult = 1;
            p++;
        }
        if (mult) {
            quantified = true;
            /* the last item is repeated: its copies replace it */
            sum[depth] += last[depth] * (mult - 1) + 1;
            last[depth] = last[depth] * mult + 1;
        } else {
            if (*p == '\\' && p[1])
                p += 2;
            else if (*p == '[') {
                /* a bracket expression is one node: skip to its end */
                p++;
                if (*p == '^')
                    p++;
                if (*p == ']')
                    p++;
                while (*p && *p != ']') {
                    if (*p == '[' && (p[1] == ':' || p[1] == '.' || p[1] == '=')) {
                        const char *e =
                            strstr(p + 2, p[1] == ':' ? ":]" : p[1] == '.' ? ".]" : "=]");
                        p = e ? e + 2 : p + 1;
                    } else {
                        p++;
                    }
                }
                if (*p)
                    p++;
            } else {
                p++;
            }
            sum[depth] += item;
            last[depth] = item;
        }
        if (sum[depth] > WO_REGEX_MAX_NODES || last[depth] > WO_REGEX_MAX_NODES)
            return WO_REGEX_MAX_NODES + 1;
    }
    return sum[0];
}
