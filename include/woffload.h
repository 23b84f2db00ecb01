/* woffload.h: the public API of libwoffload.
 *
 * libwoffload is an LD_PRELOAD shim that places named CUDA allocations (model
 * weights, MoE experts) on the device, in host memory read in place over PCIe,
 * or in managed memory prefetched ahead of use, according to a YAML policy
 * (WOFFLOAD_POLICY). A CUDA allocation carries no name: this header is how an
 * engine, or a small hook loaded into it, supplies names.
 *
 * Every function is safe to call whether or not the library is preloaded
 * through dlsym(RTLD_DEFAULT, ...) (python/woffload does that), from any
 * thread, before or after CUDA is initialised. Every function returns 0 (or a
 * documented non-negative value) on success and a negative errno value on
 * misuse or failure; misuse is also reported with one log line. Nothing here
 * aborts the process.
 */
#ifndef WOFFLOAD_H
#define WOFFLOAD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define WOFFLOAD_VERSION_MAJOR 0
#define WOFFLOAD_VERSION_MINOR 1
#define WOFFLOAD_VERSION_PATCH 0

/* The library version, "MAJOR.MINOR.PATCH". Never NULL. */
const char *woffload_version(void);

/* Tag scope (per thread): allocations made by this thread between push and
 * pop are placeable and carry `name`. Scopes nest; the innermost name wins.
 * The name is copied. Returns 0, -EINVAL (NULL or empty name), -E2BIG (name
 * longer than 1023 bytes, or nesting deeper than 64). */
int woffload_tag_push(const char *name);
/* Ends the innermost scope: 0, or -EPERM when no scope is open. */
int woffload_tag_pop(void);

/* Tag range: names [ptr, ptr+size) of memory that already exists (a PyTorch
 * parameter inside an allocation). When the memory is placeable (allocated in
 * a tag scope or while the window was open), the placement the policy gives
 * `name` takes effect at seal, at the same address. Otherwise the name is kept
 * for stats and traces and the reason is reported once.
 * Returns 0; -EINVAL (NULL ptr or name, size 0); -ENOENT (ptr is not in any
 * allocation the shim saw); -ERANGE (the range crosses the end of its
 * allocation); -EEXIST (overlaps an earlier tag with another name: the earlier
 * tag is kept). Tagging the same range with the same name again returns 0. */
int woffload_tag(const void *ptr, size_t size, const char *name);

/* Expect: announces a tensor before the engine allocates it: its full name and
 * its size in bytes (a loader that builds the model's structure first, as
 * transformers does on the meta device, knows both before the first byte
 * arrives). Before the next allocation the policy places every announced name
 * (under fit: fit chooses among them, by the same rules as at seal); an
 * allocation made in the window without a tag scope is then matched by size
 * (rounded up by at most 2 MiB, as PyTorch's caching allocator asks) to an
 * announced name not yet claimed, and one the plan puts on the host is served
 * as pinned host memory at once, so the memory that stays movable until seal
 * is what the plan keeps on the device, whatever order the bytes arrive in
 * (docs/placement.md, "Names before bytes"). Names still come from
 * woffload_tag: a match decides where the bytes are served, never a name; a
 * wrong one costs placement, never data. Tensors under 1 MiB are never
 * matched. Returns 0; -EINVAL (NULL or empty name, a name longer than the
 * tag limit, size 0); -EBUSY (after seal: nothing left to decide); -ENOMEM. */
int woffload_expect(const char *name, size_t bytes);
/* The names announced so far are all there are for now: they are placed at
 * once (else at the next allocation), and a worker starts pinning host memory
 * for those the plan puts on the host while the engine reads its checkpoint
 * (WOFFLOAD_PREPIN). Returns 0. */
int woffload_expect_end(void);

/* The placeable window: while open, every allocation of at least the policy's
 * window.min_size bytes is placeable. The policy may open it itself (window:
 * open: at-start); these calls let a loader open it around model loading.
 * Return 0, or -EALREADY (open twice / close while closed). */
int woffload_window_open(void);
int woffload_window_close(void);

/* End of loading: placements of tagged ranges take effect, rules that matched
 * nothing are reported, one summary line is logged. Closes the window.
 * Returns 0, -EALREADY (sealed before), or a negative errno from the driver
 * path (the message says which range and why; memory stays where it was). */
int woffload_seal(void);

/* Mixture-of-experts picks: the launches that read the expert tensor
 * [experts, experts + bytes) of n_experts rows (one stacked tensor, expert e
 * at e * bytes / n_experts) read only the rows its router picked; ids are
 * those picks, n_ids integers of id_bytes (4 or 8, signed; values outside
 * [0, n_experts) are ignored) in device memory, written on the stream of
 * those launches before them. Call it before the layer's expert launches
 * (a forward pre-hook, with the router's top-k ids) and again with ids NULL
 * after them; until then the ids must stay where they are, and the
 * launches that read the tensor must read only the rows the ids name, and
 * only read. A tensor placed `host` or `managed` is then read from a device
 * buffer into which only the picked rows were copied, on the launch's own
 * stream (docs/picks.md, "Picked experts"); one on the device needs
 * nothing. Returns 0; -EINVAL (NULL experts, bytes or n_experts 0, bytes not
 * a multiple of n_experts, n_experts over 1024, id_bytes not 4 or 8, ids
 * given with n_ids 0); -ENOENT (experts is in no allocation the shim saw);
 * -ERANGE (the tensor crosses the end of its allocation); -ENOSPC (more than
 * 1024 expert tensors). */
int woffload_moe_picks(const void *experts, size_t bytes, unsigned n_experts, const void *ids,
                       size_t n_ids, unsigned id_bytes);

/* The same with the ids in rows: n_rows rows of per_row ids each (a token's
 * top-k), row r starting row_stride ids after row r - 1 (row_stride >=
 * per_row). llama.cpp's ffn_moe_topk is such a view: the first k columns of
 * an argsort over all the experts, a row a token (row_stride n_experts).
 * woffload_moe_picks(..., ids, n, b) is woffload_moe_picks_rows(..., ids, n,
 * 1, n, b). Returns as woffload_moe_picks; -EINVAL also for per_row or
 * n_rows 0 with ids, or row_stride < per_row; and -EFAULT when the ids are
 * not in memory the shim saw allocated on the device (a CPU backend's
 * buffer: the copy reads them on the GPU). */
int woffload_moe_picks_rows(const void *experts, size_t bytes, unsigned n_experts, const void *ids,
                            size_t per_row, size_t n_rows, size_t row_stride, unsigned id_bytes);

/* Read-only to kernels: no kernel writes the allocation at ptr (ptr its
 * base, size its size or 0) from now on, as an inference engine never
 * writes its weights (the ggml hook says so of llama.cpp's model buffers).
 * Copies into it are still seen. The streaming executor then keeps what it
 * staged across CUDA graph launches that read the allocation (otherwise
 * such a graph may have written it unseen: a blind launch), skips the write
 * checks of its slots, and keeps its pinned copies (docs/prefetch.md,
 * "Blind launches"). A kernel that does write it after all may then have
 * its write lost in a slot: declare only what holds. Returns 0 (also when
 * declared before); -EINVAL (NULL ptr, or not a whole allocation); -ENOENT
 * (no allocation the shim saw holds ptr); -ENOSPC (the allocation's id is
 * past the table: 16384 live allocations). */
int woffload_readonly(const void *ptr, size_t size);

/* Read in place, for now: from this call until the same call with on 0,
 * kernels read only a small share of the bytes [ptr, ptr + bytes) of a
 * streamed tensor, by index (an MoE layer's stacked experts in a step of
 * few tokens: llama.cpp's MUL_MAT_ID reads only the picked experts). The
 * streaming executor then copies none of it into a slot, launches read it
 * in place, and a copy staged before the claim is still read from its slot.
 * Without claims the executor would stage the whole tensor every step,
 * which costs more than the picked share read in place. Claims nest (each
 * on needs its off). Under prefetch.mode auto, a tensor once claimed is
 * streamed in the steps it is not claimed in: the engine says, step by
 * step, which read it whole enough for a copy to pay (the ggml hook does,
 * from its MoE layers' share of experts picked: docs/llamacpp.md). Returns
 * the streamed spans it found there (0: nothing is streamed there, nothing
 * to claim); -EINVAL (NULL ptr or bytes 0); -ENOENT (no allocation the
 * shim saw holds ptr); -ERANGE (the bytes run past the allocation). */
int woffload_read_in_place(const void *ptr, size_t bytes, int on);

/* How the engine's kernels read its weights, for the streaming executor's
 * departure fences (docs/prefetch.md, "The lag"): ranges 1 says that every
 * kernel reading a streamed weight, one that reads it through a table a
 * kernel of the same compute wrote included, is launched before the
 * engine's first launch at the next weight (llama.cpp's kernels; the ggml
 * hook says so). A slot's fence is then made when the engine leaves its
 * range, and the executor stages one range further ahead. ranges 2, the
 * default: kernels of the next weight may still read it (PyTorch's grouped
 * GEMM reads the experts through such a table). WOFFLOAD_DEPARTURE_LAG,
 * when given, wins. Returns 0; -EINVAL (ranges not 1 or 2). */
int woffload_departure_lag(unsigned ranges);

/* A JSON snapshot of the shim's state and counters into buf (always
 * NUL-terminated when len > 0). Returns the length the full snapshot needs,
 * excluding the NUL (like snprintf): call again with a larger buffer when the
 * result is >= len. -EINVAL when buf is NULL and len > 0. */
long woffload_stats(char *buf, size_t len);

#ifdef __cplusplus
}
#endif

#endif /* WOFFLOAD_H */
