/* preload/exports-api.c: the public API of include/woffload.h. Nothing but
 * forwarding to uvm/'s logic (uvm/uvm.h). */
#include "woffload.h"

#include "uvm/uvm.h"
#include "wo-config.h"

WO_EXPORT const char *woffload_version(void)
{
    return WO_VERSION;
}

WO_EXPORT int woffload_tag_push(const char *name)
{
    return wo_api_tag_push(name);
}

WO_EXPORT int woffload_tag_pop(void)
{
    return wo_api_tag_pop();
}

WO_EXPORT int woffload_tag(const void *ptr, size_t size, const char *name)
{
    return wo_api_tag(ptr, size, name);
}

WO_EXPORT int woffload_expect(const char *name, size_t bytes)
{
    return wo_api_expect(name, bytes);
}

WO_EXPORT int woffload_expect_end(void)
{
    return wo_api_expect_end();
}

WO_EXPORT int woffload_window_open(void)
{
    return wo_api_window_open();
}

WO_EXPORT int woffload_window_close(void)
{
    return wo_api_window_close();
}

WO_EXPORT int woffload_seal(void)
{
    return wo_api_seal();
}

WO_EXPORT int woffload_moe_picks(const void *experts, size_t bytes, unsigned n_experts,
                                 const void *ids, size_t n_ids, unsigned id_bytes)
{
    return wo_api_moe_picks(experts, bytes, n_experts, ids, n_ids, 1, n_ids, id_bytes, false);
}

WO_EXPORT int woffload_moe_picks_rows(const void *experts, size_t bytes, unsigned n_experts,
                                      const void *ids, size_t per_row, size_t n_rows,
                                      size_t row_stride, unsigned id_bytes)
{
    return wo_api_moe_picks(experts, bytes, n_experts, ids, per_row, n_rows, row_stride, id_bytes,
                            true);
}

WO_EXPORT int woffload_readonly(const void *ptr, size_t size)
{
    return wo_api_readonly(ptr, size);
}

WO_EXPORT int woffload_read_in_place(const void *ptr, size_t bytes, int on)
{
    return wo_api_read_in_place(ptr, bytes, on);
}

WO_EXPORT int woffload_departure_lag(unsigned ranges)
{
    return wo_api_departure_lag(ranges);
}

WO_EXPORT long woffload_stats(char *buf, size_t len)
{
    return wo_api_stats(buf, len);
}
