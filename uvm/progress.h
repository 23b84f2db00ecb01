/* uvm/progress.h: a one-line progress report for pinning many GiB of host
 * memory while the engine loads (the managed cap, docs/placement.md).
 *
 * On a TTY the line is rewritten in place (at most twice a second); with
 * WOFFLOAD_PROGRESS=1 it is a log line every few seconds instead (logs,
 * tests); WOFFLOAD_QUIET=1 silences it. Work under WO_PROGRESS_MIN bytes (pinning that
 * takes ~0.1 s) never reports: small models load quietly. Not thread-safe: callers hold
 * wo_uvm.lock. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#define WO_PROGRESS_MIN (512ull << 20)

struct wo_progress {
    const char *what;  /* "pinning host memory", static */
    uint64_t done;
    uint64_t t0_ns, last_ns;
    bool printed;      /* a line went out: end() finishes it */
};

/* Starts p unless it runs already; before the work, so the rate counts it. */
void wo_progress_begin(struct wo_progress *p, const char *what);
/* Adds bytes done to a begun p; a line when due. */
void wo_progress_add(struct wo_progress *p, uint64_t bytes);
/* Ends p: the final line ("... 12.0 GiB in 3.9 s, 3.1 GiB/s") when a line
 * went out. Nothing when p was never begun. */
void wo_progress_end(struct wo_progress *p);
