/* tests/preload-check.h: what the end-to-end programs that run under the
 * preloaded shim and the fake driver share (test-uvm-preload.c,
 * test-stream-preload.c, test-bigload.c): CHECK(), which counts a failure
 * and goes on so one run reports every broken promise; need(), a dlsym()
 * that stops the program when a symbol is missing; slurp(), which reads
 * what a child left in a file; want(), which says whether a case named on
 * the command line runs; wait_child(), a waitpid() that tells what a
 * child stuck past its time was doing. Each program returns
 * `failures ? 1 : 0`. */
#pragma once

#include <dirent.h>
#include <dlfcn.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int failures;
static int failed_lines[8]; /* the first few, for check_summary() */

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);               \
            if (failures < 8)                                                                      \
                failed_lines[failures] = __LINE__;                                                 \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

/* One last line naming the failed checks: a CI log keeps the tail, and the
 * dumps a failing program prints before it can push the first lines out. */
static inline void check_summary(const char *who)
{
    if (!failures)
        return;
    fprintf(stderr, "%s: %d check(s) failed, at line", who, failures);
    for (int i = 0; i < failures && i < 8; i++)
        fprintf(stderr, " %d", failed_lines[i]);
    fprintf(stderr, "\n");
}

static inline void *need(void *h, const char *name)
{
    void *p = dlsym(h, name);
    if (!p) {
        fprintf(stderr, "missing symbol %s\n", name);
        exit(1);
    }
    return p;
}

/* Reads up to len - 1 bytes of path into buf, NUL-terminated; returns the
 * bytes read (0 when the file cannot be opened: buf is then ""). */
static inline size_t slurp(const char *path, char *buf, size_t len)
{
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, len - 1, f) : 0;

    buf[n] = '\0';
    if (f)
        fclose(f);
    return n;
}

/* Whether case name runs: every one when the program got no arguments,
 * else those named (meson.build runs subsets under ThreadSanitizer). */
static inline bool want(int argc, char **argv, const char *name)
{
    if (argc < 2)
        return true;
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], name) == 0)
            return true;
    return false;
}

/* Prints what child pid's threads are doing: each one's name, state and
 * kernel wait channel (/proc), then their stacks where gdb is installed
 * (the frames' functions only: a CI log keeps a few dozen lines), run
 * without the test's preloads (a sanitizer's runtime or the shim in gdb). */
static inline void child_threads(pid_t pid)
{
    char path[320], cmd[256], line[512];
    DIR *dir;
    struct dirent *e;
    FILE *f;

    snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
    dir = opendir(path);
    while (dir && (e = readdir(dir))) {
        char comm[64] = "", stat[256] = "", wchan[64] = "";

        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof(path), "/proc/%d/task/%s/comm", (int)pid, e->d_name);
        slurp(path, comm, sizeof(comm));
        comm[strcspn(comm, "\n")] = '\0';
        snprintf(path, sizeof(path), "/proc/%d/task/%s/stat", (int)pid, e->d_name);
        slurp(path, stat, sizeof(stat));
        snprintf(path, sizeof(path), "/proc/%d/task/%s/wchan", (int)pid, e->d_name);
        slurp(path, wchan, sizeof(wchan));
        /* the state follows the name's closing parenthesis */
        const char *st = strrchr(stat, ')');
        fprintf(stderr, "  thread %s %-16s state %c wchan %s\n", e->d_name, comm,
                st && st[1] && st[2] ? st[2] : '?', wchan[0] ? wchan : "-");
    }
    if (dir)
        closedir(dir);
    snprintf(cmd, sizeof(cmd),
             "command -v gdb >/dev/null && env -u LD_PRELOAD -u LD_LIBRARY_PATH timeout 60 "
             "gdb -q -p %d -batch -ex 'thread apply all bt 10' 2>/dev/null",
             (int)pid);
    f = popen(cmd, "r");
    /* "Thread 3 (Thread 0x... (LWP 7) \"name\"):" as it is; of "#1  0x... in
     * fn (args) at file:line" or "#0  fn (args) at ..." the function */
    while (f && fgets(line, sizeof(line), f)) {
        char *fn = line, *end;

        if (strncmp(line, "Thread ", 7) == 0) {
            fputs(line, stderr);
            continue;
        }
        if (line[0] != '#')
            continue;
        fn = strstr(line, " in ") ? strstr(line, " in ") + 4 : line + strcspn(line, " ");
        fn += strspn(fn, " ");
        end = fn + strcspn(fn, " \n");
        fprintf(stderr, "  %.*s %.*s\n", (int)strcspn(line, " "), line, (int)(end - fn), fn);
    }
    if (f)
        pclose(f);
}

/* waitpid(pid, st, 0), but past limit_s seconds the child is taken as
 * stuck: what its threads were doing is printed and it is killed; -1
 * then. A test whose child hangs thus fails with a reason before meson's
 * timeout kills it silently (a CI log keeps only what the test printed;
 * the test prints the shim's log itself). */
static inline pid_t wait_child(pid_t pid, int *st, unsigned limit_s)
{
    struct timespec t0, now, nap = {0, 20 * 1000 * 1000};
    pid_t r;

    clock_gettime(CLOCK_MONOTONIC, &t0);
    while ((r = waitpid(pid, st, WNOHANG)) == 0) {
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - t0.tv_sec >= (time_t)limit_s) {
            fprintf(stderr, "the child (pid %d) is still running after %u s: its threads:\n",
                    (int)pid, limit_s);
            child_threads(pid);
            kill(pid, SIGKILL);
            (void)waitpid(pid, st, 0);
            return -1;
        }
        nanosleep(&nap, NULL);
    }
    return r;
}
