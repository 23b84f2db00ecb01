/* uvm/api.c: the logic behind include/woffload.h's tag range, window and
 * seal (tag scopes are in names.c, stats in stats.c). Every misuse gets a
 * defined errno and one log line naming the call and the reason. */
#include "uvm/internal.h"
#include "uvm/place-int.h"

#include <string.h>

#include "core/event.h"
#include "core/log.h"
#include "core/registry.h"
#include "core/settings.h"
#include "uvm/hotpath.h"
#include "uvm/picks.h"

static void misuse(void)
{
    __atomic_add_fetch(&wo_uvm.misuse, 1, __ATOMIC_RELAXED);
}

static void first_tag(void)
{
    if (wo_uvm.first_tag_seen || !wo_uvm.policy)
        return;
    wo_uvm.first_tag_seen = true;
    if (wo_uvm.g->window.open == WO_WINDOW_OPEN_ON_FIRST_TAG && !wo_uvm.sealed)
        __atomic_store_n(&wo_uvm.window_open, 1, __ATOMIC_RELEASE);
    if (wo_uvm.g->window.close == WO_WINDOW_CLOSE_ON_FIRST_TAG)
        __atomic_store_n(&wo_uvm.window_open, 0, __ATOMIC_RELEASE);
}

void wo_api_note_tag(void)
{
    pthread_mutex_lock(&wo_uvm.lock);
    first_tag();
    pthread_mutex_unlock(&wo_uvm.lock);
}

int wo_api_tag_push(const char *name)
{
    int r = wo_scope_push(name);

    if (r == 0) {
        wo_uvm_ensure_init();
        wo_api_note_tag();
    }
    return r;
}

int wo_api_tag_pop(void)
{
    return wo_scope_pop();
}

/* A name longer than a tag may hold: said, and counted as misuse. */
static bool too_long(const char *fn, const char *name)
{
    if (strnlen(name, WO_TAG_NAME_MAX + 1) <= WO_TAG_NAME_MAX)
        return false;
    wo_warn("%s: name '%.40s...' is longer than %d bytes (-EINVAL)", fn, name, WO_TAG_NAME_MAX);
    misuse();
    return true;
}

int wo_api_tag(const void *ptr, size_t size, const char *name)
{
    uint64_t addr = (uint64_t)(uintptr_t)ptr;
    const struct wo_tag *clash = NULL;
    struct wo_alloc *a;
    struct wo_name *n;
    struct wo_tag *t;
    int r;

    if (!ptr || !name || !*name || size == 0) {
        wo_warn("woffload_tag(%p, %zu, %s%s%s): %s (-EINVAL)", ptr, size, name ? "'" : "",
                name ? name : "NULL", name ? "'" : "",
                !ptr ? "NULL pointer" : !name ? "NULL name" : !*name ? "empty name" : "size 0");
        misuse();
        return -EINVAL;
    }
    if (too_long("woffload_tag", name))
        return -EINVAL;
    wo_uvm_ensure_init();
    pthread_mutex_lock(&wo_uvm.lock);
    first_tag();
    a = wo_alloc_find_addr(addr);
    if (!a) {
        wo_warn("woffload_tag(%p, %zu, '%s'): the pointer is not in any allocation the shim saw "
                "(-ENOENT)",
                ptr, size, name);
        misuse();
        r = -ENOENT;
        goto out;
    }
    if (size > a->size - (addr - a->base)) {
        wo_warn("woffload_tag(%p, %zu, '%s'): the range ends %llu bytes past the end of its "
                "allocation [0x%llx, +%llu) (-ERANGE)",
                ptr, size, name, (unsigned long long)(size - (a->size - (addr - a->base))),
                (unsigned long long)a->base, (unsigned long long)a->size);
        misuse();
        r = -ERANGE;
        goto out;
    }
    n = wo_name_get(name);
    if (!n) {
        r = -ENOMEM;
        goto out;
    }
    wo_name_ref(n); /* keeps a fresh name alive through a clash */
    r = wo_alloc_add_tag(a, addr - a->base, size, n, &t, &clash);
    if (r == -EEXIST) {
        wo_warn("woffload_tag(%p, %zu, '%s'): overlaps the earlier tag '%s' [0x%llx, +%llu); the "
                "earlier tag is kept (-EEXIST)",
                ptr, size, name, clash->name->s, (unsigned long long)(a->base + clash->off),
                (unsigned long long)clash->size);
        misuse();
    } else if (r == 1) {
        r = 0; /* the same name on a range it covers already */
    } else if (r == 0) {
        wo_place_decide(a, t);
        if (a->kind == WO_KIND_OBSERVED) {
            n->unplaceable = true;
            wo_uvm.unplaceable_tags++;
            wo_report_unplaceable(a, name);
        } else if (a->kind == WO_KIND_PINNED) {
            /* Pinned memory was placed by its scope, or by the managed cap
             * while the engine loaded; it never moves. */
            if (a->capped)
                wo_place_count_stuck(n, t->place, t->size);
            wo_place_expect_tagged(a, t);
            t->place = WO_PLACE_HOST;
            t->applied = true;
        } else if (wo_uvm.sealed) {
            /* After seal a tag takes effect at once (same address). */
            (void)wo_place_apply_tag(a, t, true);
        } else {
            /* Before seal: what can be applied already (place.c). */
            (void)wo_place_tag_early(a, t);
        }
        wo_consumer_push_tag(a, t);
    }
    wo_name_unref(n);
out:
    pthread_mutex_unlock(&wo_uvm.lock);
    return r;
}

int wo_api_expect(const char *name, size_t bytes)
{
    int r;

    if (!name || !*name || bytes == 0) {
        wo_warn("woffload_expect(%s%s%s, %zu): %s (-EINVAL)", name ? "'" : "",
                name ? name : "NULL", name ? "'" : "", bytes,
                !name ? "NULL name" : !*name ? "empty name" : "size 0");
        misuse();
        return -EINVAL;
    }
    if (too_long("woffload_expect", name))
        return -EINVAL;
    wo_uvm_ensure_init();
    pthread_mutex_lock(&wo_uvm.lock);
    if (wo_uvm.sealed) {
        /* placement was decided at seal: an announcement now changes nothing */
        wo_log_once(WO_LOG_WARN, "woffload_expect('%s'): after seal, names announced before "
                                 "their bytes change nothing (-EBUSY)",
                    name);
        misuse();
        r = -EBUSY;
    } else {
        r = wo_place_expect_add(name, bytes);
        if (r < 0)
            wo_error("woffload_expect('%s'): out of memory; the allocation is served as if it "
                     "had not been announced",
                     name);
    }
    pthread_mutex_unlock(&wo_uvm.lock);
    return r;
}

int wo_api_expect_end(void)
{
    wo_uvm_ensure_init();
    pthread_mutex_lock(&wo_uvm.lock);
    wo_place_expect_plan(wo_uvm_driver());
    pthread_mutex_unlock(&wo_uvm.lock);
    return 0;
}

int wo_api_window_open(void)
{
    wo_uvm_ensure_init();
    if (__atomic_exchange_n(&wo_uvm.window_open, 1, __ATOMIC_ACQ_REL)) {
        wo_warn("woffload_window_open: the placeable window is open already (-EALREADY)");
        misuse();
        return -EALREADY;
    }
    if (!wo_uvm.placing)
        wo_log_once(WO_LOG_INFO, "woffload_window_open: no policy places anything off the "
                                 "device; allocations still pass through");
    return 0;
}

int wo_api_window_close(void)
{
    wo_uvm_ensure_init();
    if (!__atomic_exchange_n(&wo_uvm.window_open, 0, __ATOMIC_ACQ_REL)) {
        wo_warn("woffload_window_close: the placeable window is not open (-EALREADY)");
        misuse();
        return -EALREADY;
    }
    return 0;
}

int wo_api_seal(void)
{
    char label[256];
    uint64_t t0;
    int r = 0;

    wo_uvm_ensure_init();
    pthread_mutex_lock(&wo_uvm.lock);
    if (wo_uvm.sealed) {
        pthread_mutex_unlock(&wo_uvm.lock);
        wo_warn("woffload_seal: sealed already (-EALREADY)");
        misuse();
        return -EALREADY;
    }
    wo_uvm.sealed = true;
    __atomic_store_n(&wo_uvm.window_open, 0, __ATOMIC_RELEASE);
    t0 = wo_now_ns();
    wo_progress_end(&wo_uvm.pin_progress);
    if (wo_uvm.policy) {
        if (wo_uvm.placing)
            r = wo_place_seal();
        else
            wo_place_context_for_trace(); /* a run recorded for woffload-policy fit */
        for (size_t i = 0; i + 1 < wo_uvm.nrule_counts; i++)
            if (wo_uvm.rule_counts[i].names == 0)
                wo_warn("seal: %s matched nothing",
                        wo_policy_rule_label(wo_uvm.policy, i, label, sizeof(label)));
        if (wo_uvm.over_budget_tags) {
            char u[32], l[32], o[32];
            wo_warn("seal: host budget %s spent (%s used): %llu tensors (%s) stay on the device",
                    wo_format_size(wo_uvm.host_budget.limit, l, sizeof(l)),
                    wo_format_size(wo_uvm.host_budget.used, u, sizeof(u)),
                    (unsigned long long)wo_uvm.over_budget_tags,
                    wo_format_size(wo_uvm.over_budget_bytes, o, sizeof(o)));
        }
        if (wo_uvm.cap.pinned || wo_uvm.cap.passed || wo_uvm.cap.failed) {
            char pb[32], sb[32], mb[32], lb[32];
            bool fit = wo_uvm.g && wo_uvm.g->fit.enabled;
            /* fit chooses among what can still move: an allocation the cap
             * served as host memory cannot, and one engine buffer larger than
             * the free memory (llama.cpp's model buffer) holds every weight */
            wo_warn("seal: managed cap (free device memory minus %s): %llu allocations (%s, the "
                    "largest %s) were served as pinned host memory and %llu passed through as "
                    "device memory; %llu tensors (%s) the policy places on the device or managed "
                    "stay in host memory. %s",
                    wo_format_size(wo_uvm.cap.margin, mb, sizeof(mb)),
                    (unsigned long long)wo_uvm.cap.pinned,
                    wo_format_size(wo_uvm.cap.pinned_bytes, pb, sizeof(pb)),
                    wo_format_size(wo_uvm.cap.pinned_largest, lb, sizeof(lb)),
                    (unsigned long long)wo_uvm.cap.passed, (unsigned long long)wo_uvm.cap.stuck_tags,
                    wo_format_size(wo_uvm.cap.stuck_bytes, sb, sizeof(sb)),
                    !fit ? "Use fit: (docs/policy.md) to choose what stays on the device"
                    : wo_settings()->late_bind
                        ? "fit chose among the rest"
                        : "fit chose among the rest, and cannot move these; late binding "
                          "(WOFFLOAD_LATE_BIND=1, docs/placement.md) serves an allocation "
                          "whose 2 MiB granules fit can place one by one");
        }
    }
    wo_uvm.seal_ns = wo_now_ns() - t0;
    wo_summary_log("seal");
    if (wo_events) {
        struct wo_event ev;
        memset(&ev, 0, sizeof(ev));
        ev.t_ns = wo_now_ns();
        ev.type = WO_EV_SEAL;
        (void)wo_ring_push(wo_events, &ev);
    }
    pthread_mutex_unlock(&wo_uvm.lock);
    return r;
}

int wo_api_readonly(const void *ptr, size_t size)
{
    struct wo_range rg;
    uint64_t p = (uint64_t)(uintptr_t)ptr;
    const char *why = NULL;
    int r = 0;

    if (!ptr) {
        wo_warn("woffload_readonly(NULL, %zu): NULL pointer (-EINVAL)", size);
        misuse();
        return -EINVAL;
    }
    if (wo_settings()->disable || !wo_settings()->readonly)
        return 0; /* the shim passes everything through, or WOFFLOAD_READONLY=0 */
    wo_uvm_ensure_init();
    if (wo_registry_find(p, &rg) < 0) {
        why = "the pointer is not in any allocation the shim saw";
        r = -ENOENT;
    } else if (rg.base != p || (size && size != rg.size)) {
        why = "not a whole allocation (its base, and its size or 0)";
        r = -EINVAL;
    } else if (rg.id >= WO_STREAM_IDS) {
        why = "more allocations live than the table holds";
        r = -ENOSPC;
    }
    if (r) {
        wo_warn("woffload_readonly(%p, %zu): %s (%s)", ptr, size, why,
                r == -ENOENT ? "-ENOENT" : r == -EINVAL ? "-EINVAL" : "-ENOSPC");
        misuse();
        return r;
    }
    if (__atomic_exchange_n(&wo_readonly_gen[rg.id], rg.gen + 1, __ATOMIC_RELEASE) != rg.gen + 1) {
        /* one info line; the others (a model buffer split by tensor declares
         * each of its ~150 buffers) at debug, counted in the stats */
        uint64_t n = __atomic_add_fetch(&wo_uvm.readonly_allocs, 1, __ATOMIC_RELAXED);
        wo_log(n == 1 ? WO_LOG_INFO : WO_LOG_DEBUG,
               "woffload_readonly: no kernel writes the allocation at %p (%llu MiB): graphs "
               "reading it are no blind launches, its staged copies are not checked for writes%s",
               ptr, (unsigned long long)(rg.size >> 20),
               n == 1
                   ? " (the next ones at debug level, counted in the stats: allocations.readonly)"
                   : "");
    }
    return 0;
}

int wo_api_read_in_place(const void *ptr, size_t bytes, int on)
{
    static int said;
    uint64_t p = (uint64_t)(uintptr_t)ptr;
    int r;

    if (!ptr || !bytes) {
        wo_warn("woffload_read_in_place(%p, %zu, %d): %s (-EINVAL)", ptr, bytes, on,
                !ptr ? "NULL pointer" : "0 bytes");
        misuse();
        return -EINVAL;
    }
    if (wo_settings()->disable)
        return 0;
    wo_uvm_ensure_init();
    r = wo_stream_claim_in_place(p, bytes, on != 0);
    if (r < 0) {
        wo_warn("woffload_read_in_place(%p, %zu, %d): %s (%s)", ptr, bytes, on,
                r == -ENOENT ? "the pointer is not in any allocation the shim saw"
                             : "the bytes run past the allocation",
                r == -ENOENT ? "-ENOENT" : "-ERANGE");
        misuse();
        return r;
    }
    if (on && r && !__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
        wo_info("woffload_read_in_place: the engine says which steps read its streamed ranges "
                "only in part: those read them in place, the others may stage them whole "
                "(under prefetch.mode auto they are streamed for that)");
    return r;
}

int wo_api_departure_lag(unsigned ranges)
{
    if (ranges != 1 && ranges != 2) {
        wo_warn("woffload_departure_lag(%u): expected 1 or 2 ranges (-EINVAL)", ranges);
        misuse();
        return -EINVAL;
    }
    if (wo_settings()->disable)
        return 0;
    wo_stream_engine_lag(ranges);
    if (wo_settings_given(wo_settings(), "WOFFLOAD_DEPARTURE_LAG") &&
        wo_settings()->departure_lag != ranges)
        wo_info("woffload_departure_lag(%u): WOFFLOAD_DEPARTURE_LAG=%u is given and wins", ranges,
                wo_settings()->departure_lag);
    return 0;
}

int wo_api_moe_picks(const void *experts, size_t bytes, unsigned n_experts, const void *ids,
                     size_t per_row, size_t n_rows, size_t row_stride, unsigned id_bytes,
                     bool rows)
{
    const char *why = !experts                          ? "NULL experts"
                      : !bytes || !n_experts            ? "bytes or n_experts 0"
                      : n_experts > WO_PICKS_EXPERTS    ? "more than 1024 experts"
                      : bytes % n_experts               ? "bytes not a multiple of n_experts"
                      : ids && id_bytes != 4 && id_bytes != 8 ? "id_bytes not 4 or 8"
                      : ids && (!per_row || !n_rows)    ? "ids with n_ids (per_row or n_rows) 0"
                      : ids && row_stride < per_row     ? "row_stride below per_row"
                      : ids && per_row > SIZE_MAX / n_rows ? "per_row * n_rows overflows"
                                                        : NULL;
    size_t n_ids = ids ? per_row * n_rows : 0;
    int r;

    if (why) {
        wo_warn("woffload_moe_picks(%p, %zu, %u, %p, %zu x %zu ids, stride %zu, %u): %s (-EINVAL)",
                experts, bytes, n_experts, ids, n_rows, per_row, row_stride, id_bytes, why);
        misuse();
        return -EINVAL;
    }
    if (!wo_settings()->picks || wo_settings()->disable)
        return 0; /* WOFFLOAD_PICKS=0, or the shim passes everything through */
    wo_uvm_ensure_init();
    if (ids && rows) {
        /* rows come from a hook that found them in an engine's graph (the
         * ggml hook), one row or many: the mark kernel reads them on the
         * device, so they must be device memory the shim saw allocated,
         * never a CPU backend's buffer */
        struct wo_range ir;
        uint64_t lo = (uint64_t)(uintptr_t)ids;
        uint64_t len = ((uint64_t)(n_rows - 1) * row_stride + per_row) * id_bytes;

        if (wo_registry_find(lo, &ir) != 0 || len > ir.size - (lo - ir.base)) {
            wo_log_once(WO_LOG_WARN,
                        "woffload_moe_picks_rows(%p, ...): the ids at %p (%zu rows of %zu, "
                        "stride %zu) are not in device memory the shim saw allocated (-EFAULT); "
                        "further such calls are counted in the stats (allocations.misuse)",
                        experts, ids, n_rows, per_row, row_stride);
            misuse();
            return -EFAULT;
        }
    }
    r = wo_picks_set((uint64_t)(uintptr_t)experts, bytes, n_experts, (uint64_t)(uintptr_t)ids,
                     n_ids, n_rows > 1 ? per_row : 0, n_rows > 1 ? row_stride : 0, id_bytes,
                     !rows);
    if (r == -ENOENT || r == -ERANGE || r == -ENOSPC) {
        /* once: an engine calls it every layer and step */
        wo_log_once(WO_LOG_WARN,
                    "woffload_moe_picks(%p, %zu, ...): %s (%s); further such calls are counted "
                    "in the stats (allocations.misuse)",
                    experts, bytes,
                    r == -ENOENT   ? "the pointer is not in any allocation the shim saw"
                    : r == -ERANGE ? "the tensor crosses the end of its allocation"
                                   : "more than 1024 expert tensors have picks",
                    r == -ENOENT ? "-ENOENT" : r == -ERANGE ? "-ERANGE" : "-ENOSPC");
        misuse();
    }
    return r;
}
