/* uvm/copy-ptx.c: the shim's kernels (uvm/stream-copy.cu) as PTX, in one
 * place for the executors that load them (stream-slots.c, picks.c). */
#include "uvm/internal.h"
#include "uvm/stream-copy-ptx.h"

const char *wo_copy_ptx(void)
{
    return wo_stream_copy_ptx;
}
