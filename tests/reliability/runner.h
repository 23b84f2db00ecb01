/* tests/reliability/runner.h: runs many small child processes at once, each
 * with a timeout, capturing stdout and stderr, for the reliability tests.
 *
 * A child gets the runner's environment minus LD_PRELOAD, WOFFLOAD_*,
 * WOFAKE_* and the names the job sets, plus the job's own "K=V" strings; LD_PRELOAD only when the job
 * asks for the shim. Each child leads its own process group, so a timeout
 * kills it and anything it forked. Header-only (static functions): each test
 * program includes it once. */
#pragma once

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#define JOB_MAX_ENV 16
#define JOB_MAX_ARGS 8

struct job {
    /* input */
    const char *argv[JOB_MAX_ARGS + 1];
    const char *env[JOB_MAX_ENV + 1];
    bool shim;              /* LD_PRELOAD the shim */
    int timeout_ms;
    long memlock;           /* > 0: RLIMIT_MEMLOCK (soft) for the child */
    const char *cwd;        /* working directory of the child (NULL: ours) */
    int sigterm_after_ms;   /* > 0: SIGTERM that long after "ready" on stdout */
    /* output */
    int status;             /* waitpid status */
    bool timed_out;
    bool sent_term;
    double secs;
    char *out, *err;
    size_t outlen, errlen;
    /* private */
    pid_t pid;
    int fdo, fde;
    double t0, t_ready;
    size_t outcap, errcap;
};

static const char *runner_shim;  /* the LD_PRELOAD value for shim jobs */

static __attribute__((unused)) double runner_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static __attribute__((unused)) void job_set_env(struct job *j, const char *kv)
{
    for (int i = 0; i < JOB_MAX_ENV; i++)
        if (!j->env[i]) {
            j->env[i] = kv;
            return;
        }
    fprintf(stderr, "runner: too many environment entries\n");
    abort();
}

static __attribute__((unused)) bool runner_keep(const char *kv)
{
    return strncmp(kv, "LD_PRELOAD=", 11) && strncmp(kv, "WOFFLOAD_", 9) &&
           strncmp(kv, "WOFAKE_", 7);
}

static __attribute__((unused)) void runner_exec(struct job *j)
{
    size_t n = 0, k = 0;
    char **envp;
    char *pre = NULL;

    for (char **e = environ; *e; e++)
        n++;
    envp = calloc(n + JOB_MAX_ENV + 2, sizeof(*envp));
    if (!envp)
        _exit(126);
    for (char **e = environ; *e; e++) {
        bool overridden = false;
        size_t kl = strcspn(*e, "=");
        for (int i = 0; j->env[i]; i++)
            overridden |= strncmp(j->env[i], *e, kl + 1) == 0;
        if (runner_keep(*e) && !overridden)
            envp[k++] = *e;
    }
    for (int i = 0; j->env[i]; i++)
        envp[k++] = (char *)j->env[i];
    if (j->shim && runner_shim) {
        if (asprintf(&pre, "LD_PRELOAD=%s", runner_shim) < 0)
            _exit(126);
        envp[k++] = pre;
    }
    envp[k] = NULL;
    if (j->cwd && chdir(j->cwd) != 0)
        _exit(126);
    if (j->memlock > 0) {
        struct rlimit rl;
        getrlimit(RLIMIT_MEMLOCK, &rl);
        rl.rlim_cur = (rlim_t)j->memlock;
        if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < rl.rlim_cur)
            rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_MEMLOCK, &rl);
    }
    execve(j->argv[0], (char *const *)j->argv, envp);
    _exit(127);
}

static __attribute__((unused)) int runner_start(struct job *j)
{
    int po[2], pe[2];

    if (pipe2(po, O_CLOEXEC) || pipe2(pe, O_CLOEXEC))
        return -errno;
    j->t0 = runner_now();
    j->t_ready = 0;
    j->pid = fork();
    if (j->pid < 0)
        return -errno;
    if (j->pid == 0) {
        setpgid(0, 0);
        dup2(po[1], 1);
        dup2(pe[1], 2);
        runner_exec(j);
    }
    setpgid(j->pid, j->pid); /* both sides: no race with the kill below */
    close(po[1]);
    close(pe[1]);
    j->fdo = po[0];
    j->fde = pe[0];
    fcntl(j->fdo, F_SETFL, O_NONBLOCK);
    fcntl(j->fde, F_SETFL, O_NONBLOCK);
    return 0;
}

static __attribute__((unused)) void runner_append(char **buf, size_t *len, size_t *cap, const char *d, size_t n)
{
    if (*len + n + 1 > *cap) {
        size_t nc = *cap ? *cap * 2 : 4096;
        while (nc < *len + n + 1)
            nc *= 2;
        *buf = realloc(*buf, nc);
        if (!*buf)
            abort();
        *cap = nc;
    }
    memcpy(*buf + *len, d, n);
    *len += n;
    (*buf)[*len] = 0;
}

/* Reads what is there; returns false at EOF. */
static __attribute__((unused)) bool runner_drain(int fd, char **buf, size_t *len, size_t *cap)
{
    char tmp[8192];
    for (;;) {
        ssize_t n = read(fd, tmp, sizeof(tmp));
        if (n > 0) {
            runner_append(buf, len, cap, tmp, (size_t)n);
            continue;
        }
        if (n == 0)
            return false;
        return errno == EAGAIN || errno == EINTR;
    }
}

/* Runs every job, at most `par` at a time. Returns 0, or -errno when a child
 * could not be started. */
static __attribute__((unused)) int run_jobs(struct job *jobs, size_t n, int par)
{
    size_t next = 0, running = 0;
    struct job *act[64];

    if (par < 1)
        par = 1;
    if (par > 64)
        par = 64;
    for (size_t i = 0; i < n; i++) {
        jobs[i].out = jobs[i].err = NULL;
        jobs[i].outlen = jobs[i].errlen = jobs[i].outcap = jobs[i].errcap = 0;
        jobs[i].timed_out = jobs[i].sent_term = false;
        jobs[i].status = -1;
        runner_append(&jobs[i].out, &jobs[i].outlen, &jobs[i].outcap, "", 0);
        runner_append(&jobs[i].err, &jobs[i].errlen, &jobs[i].errcap, "", 0);
    }
    while (next < n || running) {
        struct pollfd pfd[128];
        int np = 0;

        while (running < (size_t)par && next < n) {
            int r = runner_start(&jobs[next]);
            if (r < 0)
                return r;
            act[running++] = &jobs[next++];
        }
        for (size_t i = 0; i < running; i++) {
            pfd[np++] = (struct pollfd){.fd = act[i]->fdo, .events = act[i]->fdo >= 0 ? POLLIN : 0};
            pfd[np++] = (struct pollfd){.fd = act[i]->fde, .events = act[i]->fde >= 0 ? POLLIN : 0};
        }
        poll(pfd, (nfds_t)np, 5);
        for (size_t i = 0; i < running; i++) {
            struct job *j = act[i];
            double now = runner_now();
            int st;

            if (j->fdo >= 0 && !runner_drain(j->fdo, &j->out, &j->outlen, &j->outcap)) {
                close(j->fdo);
                j->fdo = -1;
            }
            if (j->fde >= 0 && !runner_drain(j->fde, &j->err, &j->errlen, &j->errcap)) {
                close(j->fde);
                j->fde = -1;
            }
            if (j->sigterm_after_ms > 0 && !j->sent_term) {
                if (!j->t_ready && strstr(j->out, "ready\n"))
                    j->t_ready = now;
                if (j->t_ready && now - j->t_ready >= j->sigterm_after_ms / 1000.0) {
                    kill(j->pid, SIGTERM);
                    j->sent_term = true;
                }
            }
            if (!j->timed_out && now - j->t0 > j->timeout_ms / 1000.0) {
                j->timed_out = true;
                kill(-j->pid, SIGKILL);
            }
            if (waitpid(j->pid, &st, WNOHANG) == j->pid) {
                /* The pipes may still hold output: read it to EOF (a
                 * grandchild holding them open is killed with the group). */
                if (j->fdo >= 0 || j->fde >= 0)
                    kill(-j->pid, SIGKILL);
                if (j->fdo >= 0) {
                    fcntl(j->fdo, F_SETFL, 0);
                    while (runner_drain(j->fdo, &j->out, &j->outlen, &j->outcap))
                        ;
                    close(j->fdo);
                }
                if (j->fde >= 0) {
                    fcntl(j->fde, F_SETFL, 0);
                    while (runner_drain(j->fde, &j->err, &j->errlen, &j->errcap))
                        ;
                    close(j->fde);
                }
                j->status = st;
                j->secs = now - j->t0;
                act[i] = act[--running];
                i--;
            }
        }
    }
    return 0;
}

static __attribute__((unused)) void job_free(struct job *j)
{
    free(j->out);
    free(j->err);
    j->out = j->err = NULL;
}

/* "exit 0", "exit 3", "signal 11", "timeout" */
static __attribute__((unused)) const char *job_outcome(const struct job *j, char *buf, size_t len)
{
    if (j->timed_out)
        snprintf(buf, len, "timeout");
    else if (WIFSIGNALED(j->status))
        snprintf(buf, len, "signal %d", WTERMSIG(j->status));
    else
        snprintf(buf, len, "exit %d", WEXITSTATUS(j->status));
    return buf;
}

/* Lines of s that contain `needle`. */
static __attribute__((unused)) int count_lines_with(const char *s, const char *needle)
{
    int n = 0;
    while (s && *s) {
        const char *e = strchr(s, '\n');
        size_t l = e ? (size_t)(e - s) : strlen(s);
        const char *f = memmem(s, l, needle, strlen(needle));
        if (f)
            n++;
        s = e ? e + 1 : s + l;
    }
    return n;
}

/* Parallel jobs: the machine's CPUs (at least 2, at most 8), or REL_JOBS. */
static __attribute__((unused)) int runner_parallel(void)
{
    const char *e = getenv("REL_JOBS");
    long n = e ? atol(e) : sysconf(_SC_NPROCESSORS_ONLN);
    return n < 2 ? 2 : n > 8 ? 8 : (int)n;
}
