/* core/settings.h: the one table of WOFFLOAD_* environment variables.
 * Every variable is read once (wo_settings() parses the environment on first
 * call under pthread_once); nothing else in the project calls getenv() for a
 * WOFFLOAD_* name. A bad value is reported naming the variable, the value and
 * what is accepted, and the default is used instead. */
#pragma once

#include <stdio.h>

#include "core/macro.h"

#define WO_SETTINGS_MAX 256 /* the table's rows at most (settings.c checks) */

struct wo_settings {
    int log_level;           /* WOFFLOAD_LOG */
    const char *log_file;    /* WOFFLOAD_LOG_FILE, NULL = stderr */
    const char *policy;      /* WOFFLOAD_POLICY, NULL = no policy (pass-through) */
    const char *trace;       /* WOFFLOAD_TRACE, NULL = no trace */
    const char *device_model; /* WOFFLOAD_DEVICE_MODEL, NULL = device-facts.md's H100 */
    const char *stats;       /* WOFFLOAD_STATS, NULL = no stats file at exit */
    uint32_t stats_every;    /* WOFFLOAD_STATS_EVERY: seconds between refreshes of it, 0 = at exit only */
    const char *cuda_lib;    /* WOFFLOAD_CUDA_LIB */
    const char *nvml_lib;    /* WOFFLOAD_NVML_LIB */
    bool disable;            /* WOFFLOAD_DISABLE */
    bool prefetch;           /* WOFFLOAD_PREFETCH */
    bool prefetch_own_ctx;   /* WOFFLOAD_PREFETCH_OWN_CONTEXT */
    bool summary;            /* WOFFLOAD_SUMMARY */
    bool observe;            /* WOFFLOAD_OBSERVE */
    uint32_t ring_events;    /* WOFFLOAD_RING_EVENTS, power of two */
    uint32_t scan_words;     /* WOFFLOAD_SCAN_WORDS: max 8-byte words scanned per launch */
    uint32_t ggml_picks;     /* WOFFLOAD_GGML_PICKS: read by the ggml hook (ggml/woffload-ggml.c) */
    uint32_t ggml_stream;    /* WOFFLOAD_GGML_STREAM: read by the ggml hook */
    uint32_t ggml_picks_from; /* WOFFLOAD_GGML_PICKS_FROM: read by the ggml hook */
    uint32_t ggml_split;      /* WOFFLOAD_GGML_SPLIT: read by the ggml hook */
    uint32_t picks_engine;   /* WOFFLOAD_PICKS_ENGINE: percent picked from which copies use the copy engine */
    uint32_t picks_whole;    /* WOFFLOAD_PICKS_WHOLE: percent picked from which host tensors may be
                                staged whole */
    uint32_t picks_buffers;  /* WOFFLOAD_PICKS_BUFFERS: picked-copy buffers a stream, 1 or 2 */
    uint32_t picks_early;    /* WOFFLOAD_PICKS_EARLY: a layer's tensors copied with its first */
    uint32_t picks_stall_ms; /* WOFFLOAD_PICKS_STALL_MS: the copy engine's stall report after */
    bool picks_lazy;         /* WOFFLOAD_PICKS_LAZY: the copy engine under lazy module loading */
    uint32_t managed_margin_mib; /* WOFFLOAD_MANAGED_MARGIN */
    bool quiet;              /* WOFFLOAD_QUIET */
    bool progress;           /* WOFFLOAD_PROGRESS */
    bool stream_check;       /* WOFFLOAD_STREAM_CHECK */
    uint32_t
        stream_recheck; /* WOFFLOAD_STREAM_RECHECK: streamed steps to auto's recheck, 0 never */
    bool graph_replay;       /* WOFFLOAD_GRAPH_REPLAY */
    bool write_checks;       /* WOFFLOAD_WRITE_CHECKS */
    bool late_bind;          /* WOFFLOAD_LATE_BIND */
    bool fit_bind;           /* WOFFLOAD_FIT_BIND */
    bool fit_squeeze;        /* WOFFLOAD_FIT_SQUEEZE */
    bool fit_squeeze_lent;   /* WOFFLOAD_FIT_SQUEEZE_LENT */
    bool fit_spread;         /* WOFFLOAD_FIT_SPREAD */
    bool fit_lend;           /* WOFFLOAD_FIT_LEND */
    bool fit_layers;         /* WOFFLOAD_FIT_LAYERS */
    bool bind_copies;        /* WOFFLOAD_BIND_COPIES */
    const char *fit_memo;    /* WOFFLOAD_FIT_MEMO, NULL = by command line */
    bool picks;              /* WOFFLOAD_PICKS */
    bool prepin;             /* WOFFLOAD_PREPIN */
    bool keep_warmup;        /* WOFFLOAD_KEEP_WARMUP: read by the Python hook (python/woffload/_auto.py) */
    uint32_t picks_hot_mib;  /* WOFFLOAD_PICKS_HOT: MiB for hot experts, 0 none */
    bool readonly;           /* WOFFLOAD_READONLY */
    bool departure_fences;   /* WOFFLOAD_DEPARTURE_FENCES */
    uint32_t
        departure_lag; /* WOFFLOAD_DEPARTURE_LAG: ranges past before a departure fence, 1 or 2 */
    int nerrors;             /* number of variables that had a bad value */
    /* bit i: wo_setting_defs[i] was given a valid value (wo_settings_given) */
    uint64_t given[WO_SETTINGS_MAX / 64];
};

enum wo_setting_type {
    WO_SETTING_BOOL,
    WO_SETTING_LEVEL,
    WO_SETTING_PATH,
    WO_SETTING_UINT_POW2,
    WO_SETTING_UINT,
};

struct wo_setting_def {
    const char *name;
    enum wo_setting_type type;
    const char *def;     /* default, as the user would write it ("" = unset) */
    const char *doc;     /* one line */
    size_t offset;       /* into struct wo_settings */
    uint64_t min, max;   /* for integer types */
};

extern const struct wo_setting_def wo_setting_defs[];
extern const size_t wo_setting_ndefs;

/* Parsed once from the process environment. Never NULL. */
const struct wo_settings *wo_settings(void);

/* Parse from an explicit environment (NULL-terminated "K=V" array) into *out.
 * Errors are reported through `report` (or wo_log when NULL). Returns the
 * number of bad values. Used by wo_settings() and by tests. */
int wo_settings_parse(char *const *envp, struct wo_settings *out,
                      void (*report)(void *ud, const char *msg), void *ud);

/* Whether the environment s was parsed from gave setting `name` a valid
 * value (false: its default holds; fit's default for some differs:
 * uvm/place-fit.c). */
bool wo_settings_given(const struct wo_settings *s, const char *name);

/* Prints the table: name, default, current value, documentation. */
void wo_settings_print(FILE *f, const struct wo_settings *s);

/* "error" -> WO_LOG_ERROR ...; -EINVAL when not a level. */
int wo_log_level_from_string(const char *s);
const char *wo_log_level_to_string(int level);
/* A boolean setting's value: 1, yes, true, on / 0, no, false, off (any
 * case); -EINVAL for anything else. */
int wo_setting_bool(const char *s, bool *ret);
