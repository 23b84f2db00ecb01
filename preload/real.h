/* preload/real.h: the one list of every hooked entry point (with its
 * prototype), and the table of real functions behind them.
 *
 * WO_DRIVER_HOOKS / WO_RUNTIME_HOOKS: X(sym, pt, hook, RET, PARAMS, ARGS)
 *   sym     the ABI symbol (what libcuda/libcudart export, what dlsym finds)
 *   pt      1 for a per-thread-default-stream variant (_ptsz/_ptds): stream 0
 *           then means the calling thread's stream
 *   hook    the logic function: RET hook(real, pt, caller, ARGS...)
 * Everything generated from these lists (exported wrappers, prototypes, the
 * real table, the cuGetProcAddress wrapper slots, per-hook call counters)
 * stays in step because it comes from the one line.
 *
 * WO_DRIVER_PROCS: G(name, version, sym, sym_pt): what the driver's
 * cuGetProcAddress returns for (name, version >= `version`); sym_pt for
 * CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM. Versions from cudaTypedefs.h.
 *
 * Real driver functions come from the CUDA driver library dlopen()ed on first
 * use (WOFFLOAD_CUDA_LIB); real runtime functions from the next definition
 * after ours (RTLD_NEXT), else from an already loaded libcudart. Nothing links
 * libcuda or libcudart. */
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "core/macro.h"

/* The 11.3 resolver has no status argument; cuda.h maps the name to _v2. */
#undef cuGetProcAddress
/* The graph-exec mutators are hooked in both versions (an engine built
 * against CUDA 11 asks for the first); cuda.h maps the names to _v2. */
#undef cuGraphExecUpdate
#undef cuGraphExecKernelNodeSetParams

#define WO_UNPACK(...) __VA_ARGS__

/* clang-format off */
#define WO_DRIVER_HOOKS(X) \
    X(cuGetProcAddress, 0, wo_h_proc_v1, CUresult, (const char *symbol, void **pfn, int ver, cuuint64_t flags), (symbol, pfn, ver, flags)) \
    X(cuGetProcAddress_v2, 0, wo_h_proc_v2, CUresult, (const char *symbol, void **pfn, int ver, cuuint64_t flags, CUdriverProcAddressQueryResult *status), (symbol, pfn, ver, flags, status)) \
    X(cuMemAlloc_v2, 0, wo_h_mem_alloc, CUresult, (CUdeviceptr *dptr, size_t size), (dptr, size)) \
    X(cuMemFree_v2, 0, wo_h_mem_free, CUresult, (CUdeviceptr dptr), (dptr)) \
    X(cuMemAllocAsync, 0, wo_h_mem_alloc_async, CUresult, (CUdeviceptr *dptr, size_t size, CUstream s), (dptr, size, s)) \
    X(cuMemAllocAsync_ptsz, 1, wo_h_mem_alloc_async, CUresult, (CUdeviceptr *dptr, size_t size, CUstream s), (dptr, size, s)) \
    X(cuMemFreeAsync, 0, wo_h_mem_free_async, CUresult, (CUdeviceptr dptr, CUstream s), (dptr, s)) \
    X(cuMemFreeAsync_ptsz, 1, wo_h_mem_free_async, CUresult, (CUdeviceptr dptr, CUstream s), (dptr, s)) \
    X(cuMemAllocManaged, 0, wo_h_mem_alloc_managed, CUresult, (CUdeviceptr *dptr, size_t size, unsigned int flags), (dptr, size, flags)) \
    X(cuMemCreate, 0, wo_h_mem_create, CUresult, (CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop, unsigned long long flags), (h, size, prop, flags)) \
    X(cuMemRelease, 0, wo_h_mem_release, CUresult, (CUmemGenericAllocationHandle h), (h)) \
    X(cuMemMap, 0, wo_h_mem_map, CUresult, (CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h, unsigned long long flags), (ptr, size, offset, h, flags)) \
    X(cuMemUnmap, 0, wo_h_mem_unmap, CUresult, (CUdeviceptr ptr, size_t size), (ptr, size)) \
    X(cuMemFreeHost, 0, wo_h_mem_free_host, CUresult, (void *p), (p)) \
    X(cuMemHostUnregister, 0, wo_h_mem_host_unregister, CUresult, (void *p), (p)) \
    X(cuMemcpy, 0, wo_h_memcpy, CUresult, (CUdeviceptr dst, CUdeviceptr src, size_t n), (dst, src, n)) \
    X(cuMemcpy_ptds, 1, wo_h_memcpy, CUresult, (CUdeviceptr dst, CUdeviceptr src, size_t n), (dst, src, n)) \
    X(cuMemcpyAsync, 0, wo_h_memcpy_async, CUresult, (CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s), (dst, src, n, s)) \
    X(cuMemcpyAsync_ptsz, 1, wo_h_memcpy_async, CUresult, (CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s), (dst, src, n, s)) \
    X(cuMemcpyHtoD_v2, 0, wo_h_memcpy_htod, CUresult, (CUdeviceptr dst, const void *src, size_t n), (dst, src, n)) \
    X(cuMemcpyHtoD_v2_ptds, 1, wo_h_memcpy_htod, CUresult, (CUdeviceptr dst, const void *src, size_t n), (dst, src, n)) \
    X(cuMemcpyDtoH_v2, 0, wo_h_memcpy_dtoh, CUresult, (void *dst, CUdeviceptr src, size_t n), (dst, src, n)) \
    X(cuMemcpyDtoH_v2_ptds, 1, wo_h_memcpy_dtoh, CUresult, (void *dst, CUdeviceptr src, size_t n), (dst, src, n)) \
    X(cuMemcpyDtoD_v2, 0, wo_h_memcpy_dtod, CUresult, (CUdeviceptr dst, CUdeviceptr src, size_t n), (dst, src, n)) \
    X(cuMemcpyDtoD_v2_ptds, 1, wo_h_memcpy_dtod, CUresult, (CUdeviceptr dst, CUdeviceptr src, size_t n), (dst, src, n)) \
    X(cuMemcpyHtoDAsync_v2, 0, wo_h_memcpy_htod_async, CUresult, (CUdeviceptr dst, const void *src, size_t n, CUstream s), (dst, src, n, s)) \
    X(cuMemcpyHtoDAsync_v2_ptsz, 1, wo_h_memcpy_htod_async, CUresult, (CUdeviceptr dst, const void *src, size_t n, CUstream s), (dst, src, n, s)) \
    X(cuMemcpyDtoHAsync_v2, 0, wo_h_memcpy_dtoh_async, CUresult, (void *dst, CUdeviceptr src, size_t n, CUstream s), (dst, src, n, s)) \
    X(cuMemcpyDtoHAsync_v2_ptsz, 1, wo_h_memcpy_dtoh_async, CUresult, (void *dst, CUdeviceptr src, size_t n, CUstream s), (dst, src, n, s)) \
    X(cuMemcpyDtoDAsync_v2, 0, wo_h_memcpy_dtod_async, CUresult, (CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s), (dst, src, n, s)) \
    X(cuMemcpyDtoDAsync_v2_ptsz, 1, wo_h_memcpy_dtod_async, CUresult, (CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s), (dst, src, n, s)) \
    X(cuMemcpy2D_v2, 0, wo_h_memcpy2d, CUresult, (const CUDA_MEMCPY2D *p), (p)) \
    X(cuMemcpy2D_v2_ptds, 1, wo_h_memcpy2d, CUresult, (const CUDA_MEMCPY2D *p), (p)) \
    X(cuMemcpy2DUnaligned_v2, 0, wo_h_memcpy2d, CUresult, (const CUDA_MEMCPY2D *p), (p)) \
    X(cuMemcpy2DUnaligned_v2_ptds, 1, wo_h_memcpy2d, CUresult, (const CUDA_MEMCPY2D *p), (p)) \
    X(cuMemcpy2DAsync_v2, 0, wo_h_memcpy2d_async, CUresult, (const CUDA_MEMCPY2D *p, CUstream s), (p, s)) \
    X(cuMemcpy2DAsync_v2_ptsz, 1, wo_h_memcpy2d_async, CUresult, (const CUDA_MEMCPY2D *p, CUstream s), (p, s)) \
    X(cuMemcpy3D_v2, 0, wo_h_memcpy3d, CUresult, (const CUDA_MEMCPY3D *p), (p)) \
    X(cuMemcpy3D_v2_ptds, 1, wo_h_memcpy3d, CUresult, (const CUDA_MEMCPY3D *p), (p)) \
    X(cuMemcpy3DAsync_v2, 0, wo_h_memcpy3d_async, CUresult, (const CUDA_MEMCPY3D *p, CUstream s), (p, s)) \
    X(cuMemcpy3DAsync_v2_ptsz, 1, wo_h_memcpy3d_async, CUresult, (const CUDA_MEMCPY3D *p, CUstream s), (p, s)) \
    X(cuMemcpyPeer, 0, wo_h_memcpy_peer, CUresult, (CUdeviceptr dst, CUcontext dctx, CUdeviceptr src, CUcontext sctx, size_t n), (dst, dctx, src, sctx, n)) \
    X(cuMemcpyPeer_ptds, 1, wo_h_memcpy_peer, CUresult, (CUdeviceptr dst, CUcontext dctx, CUdeviceptr src, CUcontext sctx, size_t n), (dst, dctx, src, sctx, n)) \
    X(cuMemcpyPeerAsync, 0, wo_h_memcpy_peer_async, CUresult, (CUdeviceptr dst, CUcontext dctx, CUdeviceptr src, CUcontext sctx, size_t n, CUstream s), (dst, dctx, src, sctx, n, s)) \
    X(cuMemcpyPeerAsync_ptsz, 1, wo_h_memcpy_peer_async, CUresult, (CUdeviceptr dst, CUcontext dctx, CUdeviceptr src, CUcontext sctx, size_t n, CUstream s), (dst, dctx, src, sctx, n, s)) \
    X(cuMemsetD8_v2, 0, wo_h_memset_d8, CUresult, (CUdeviceptr dst, unsigned char v, size_t n), (dst, v, n)) \
    X(cuMemsetD8_v2_ptds, 1, wo_h_memset_d8, CUresult, (CUdeviceptr dst, unsigned char v, size_t n), (dst, v, n)) \
    X(cuMemsetD8Async, 0, wo_h_memset_d8_async, CUresult, (CUdeviceptr dst, unsigned char v, size_t n, CUstream s), (dst, v, n, s)) \
    X(cuMemsetD8Async_ptsz, 1, wo_h_memset_d8_async, CUresult, (CUdeviceptr dst, unsigned char v, size_t n, CUstream s), (dst, v, n, s)) \
    X(cuMemsetD2D8_v2, 0, wo_h_memset_2d8, CUresult, (CUdeviceptr dst, size_t pitch, unsigned char v, size_t w, size_t h), (dst, pitch, v, w, h)) \
    X(cuMemsetD2D8_v2_ptds, 1, wo_h_memset_2d8, CUresult, (CUdeviceptr dst, size_t pitch, unsigned char v, size_t w, size_t h), (dst, pitch, v, w, h)) \
    X(cuMemsetD2D8Async, 0, wo_h_memset_2d8_async, CUresult, (CUdeviceptr dst, size_t pitch, unsigned char v, size_t w, size_t h, CUstream s), (dst, pitch, v, w, h, s)) \
    X(cuMemsetD2D8Async_ptsz, 1, wo_h_memset_2d8_async, CUresult, (CUdeviceptr dst, size_t pitch, unsigned char v, size_t w, size_t h, CUstream s), (dst, pitch, v, w, h, s)) \
    X(cuMemsetD16_v2, 0, wo_h_memset_d16, CUresult, (CUdeviceptr dst, unsigned short v, size_t n), (dst, v, n)) \
    X(cuMemsetD16_v2_ptds, 1, wo_h_memset_d16, CUresult, (CUdeviceptr dst, unsigned short v, size_t n), (dst, v, n)) \
    X(cuMemsetD16Async, 0, wo_h_memset_d16_async, CUresult, (CUdeviceptr dst, unsigned short v, size_t n, CUstream s), (dst, v, n, s)) \
    X(cuMemsetD16Async_ptsz, 1, wo_h_memset_d16_async, CUresult, (CUdeviceptr dst, unsigned short v, size_t n, CUstream s), (dst, v, n, s)) \
    X(cuMemsetD2D16_v2, 0, wo_h_memset_2d16, CUresult, (CUdeviceptr dst, size_t pitch, unsigned short v, size_t w, size_t h), (dst, pitch, v, w, h)) \
    X(cuMemsetD2D16_v2_ptds, 1, wo_h_memset_2d16, CUresult, (CUdeviceptr dst, size_t pitch, unsigned short v, size_t w, size_t h), (dst, pitch, v, w, h)) \
    X(cuMemsetD2D16Async, 0, wo_h_memset_2d16_async, CUresult, (CUdeviceptr dst, size_t pitch, unsigned short v, size_t w, size_t h, CUstream s), (dst, pitch, v, w, h, s)) \
    X(cuMemsetD2D16Async_ptsz, 1, wo_h_memset_2d16_async, CUresult, (CUdeviceptr dst, size_t pitch, unsigned short v, size_t w, size_t h, CUstream s), (dst, pitch, v, w, h, s)) \
    X(cuMemsetD32_v2, 0, wo_h_memset_d32, CUresult, (CUdeviceptr dst, unsigned int v, size_t n), (dst, v, n)) \
    X(cuMemsetD32_v2_ptds, 1, wo_h_memset_d32, CUresult, (CUdeviceptr dst, unsigned int v, size_t n), (dst, v, n)) \
    X(cuMemsetD32Async, 0, wo_h_memset_d32_async, CUresult, (CUdeviceptr dst, unsigned int v, size_t n, CUstream s), (dst, v, n, s)) \
    X(cuMemsetD32Async_ptsz, 1, wo_h_memset_d32_async, CUresult, (CUdeviceptr dst, unsigned int v, size_t n, CUstream s), (dst, v, n, s)) \
    X(cuMemsetD2D32_v2, 0, wo_h_memset_2d32, CUresult, (CUdeviceptr dst, size_t pitch, unsigned int v, size_t w, size_t h), (dst, pitch, v, w, h)) \
    X(cuMemsetD2D32_v2_ptds, 1, wo_h_memset_2d32, CUresult, (CUdeviceptr dst, size_t pitch, unsigned int v, size_t w, size_t h), (dst, pitch, v, w, h)) \
    X(cuMemsetD2D32Async, 0, wo_h_memset_2d32_async, CUresult, (CUdeviceptr dst, size_t pitch, unsigned int v, size_t w, size_t h, CUstream s), (dst, pitch, v, w, h, s)) \
    X(cuMemsetD2D32Async_ptsz, 1, wo_h_memset_2d32_async, CUresult, (CUdeviceptr dst, size_t pitch, unsigned int v, size_t w, size_t h, CUstream s), (dst, pitch, v, w, h, s)) \
    X(cuLaunchKernel, 0, wo_h_launch_kernel, CUresult, (CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem, CUstream s, void **params, void **extra), (f, gx, gy, gz, bx, by, bz, shmem, s, params, extra)) \
    X(cuLaunchKernel_ptsz, 1, wo_h_launch_kernel, CUresult, (CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem, CUstream s, void **params, void **extra), (f, gx, gy, gz, bx, by, bz, shmem, s, params, extra)) \
    X(cuLaunchKernelEx, 0, wo_h_launch_kernel_ex, CUresult, (const CUlaunchConfig *cfg, CUfunction f, void **params, void **extra), (cfg, f, params, extra)) \
    X(cuLaunchKernelEx_ptsz, 1, wo_h_launch_kernel_ex, CUresult, (const CUlaunchConfig *cfg, CUfunction f, void **params, void **extra), (cfg, f, params, extra)) \
    X(cuStreamBeginCapture_v2, 0, wo_h_begin_capture, CUresult, (CUstream s, CUstreamCaptureMode mode), (s, mode)) \
    X(cuStreamBeginCapture_v2_ptsz, 1, wo_h_begin_capture, CUresult, (CUstream s, CUstreamCaptureMode mode), (s, mode)) \
    X(cuStreamBeginCaptureToGraph, 0, wo_h_begin_capture_to_graph, CUresult, (CUstream s, CUgraph g, const CUgraphNode *deps, const CUgraphEdgeData *data, size_t n, CUstreamCaptureMode mode), (s, g, deps, data, n, mode)) \
    X(cuStreamBeginCaptureToGraph_ptsz, 1, wo_h_begin_capture_to_graph, CUresult, (CUstream s, CUgraph g, const CUgraphNode *deps, const CUgraphEdgeData *data, size_t n, CUstreamCaptureMode mode), (s, g, deps, data, n, mode)) \
    X(cuStreamDestroy_v2, 0, wo_h_stream_destroy, CUresult, (CUstream s), (s)) \
    X(cuStreamEndCapture, 0, wo_h_end_capture, CUresult, (CUstream s, CUgraph *g), (s, g)) \
    X(cuStreamEndCapture_ptsz, 1, wo_h_end_capture, CUresult, (CUstream s, CUgraph *g), (s, g)) \
    X(cuGraphInstantiateWithFlags, 0, wo_h_graph_instantiate, CUresult, (CUgraphExec *e, CUgraph g, unsigned long long flags), (e, g, flags)) \
    X(cuGraphInstantiateWithParams, 0, wo_h_graph_instantiate_params, CUresult, (CUgraphExec *e, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p), (e, g, p)) \
    X(cuGraphInstantiateWithParams_ptsz, 1, wo_h_graph_instantiate_params, CUresult, (CUgraphExec *e, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p), (e, g, p)) \
    X(cuGraphLaunch, 0, wo_h_graph_launch, CUresult, (CUgraphExec e, CUstream s), (e, s)) \
    X(cuGraphLaunch_ptsz, 1, wo_h_graph_launch, CUresult, (CUgraphExec e, CUstream s), (e, s)) \
    X(cuGraphExecUpdate, 0, wo_h_graph_exec_update_v1, CUresult, (CUgraphExec e, CUgraph g, CUgraphNode *err, CUgraphExecUpdateResult *res), (e, g, err, res)) \
    X(cuGraphExecUpdate_v2, 0, wo_h_graph_exec_update, CUresult, (CUgraphExec e, CUgraph g, CUgraphExecUpdateResultInfo *info), (e, g, info)) \
    X(cuGraphExecDestroy, 0, wo_h_graph_exec_destroy, CUresult, (CUgraphExec e), (e)) \
    X(cuGraphExecKernelNodeSetParams, 0, wo_h_exec_kernel_set_v1, CUresult, (CUgraphExec e, CUgraphNode n, const CUDA_KERNEL_NODE_PARAMS_v1 *p), (e, n, p)) \
    X(cuGraphExecKernelNodeSetParams_v2, 0, wo_h_exec_kernel_set, CUresult, (CUgraphExec e, CUgraphNode n, const CUDA_KERNEL_NODE_PARAMS *p), (e, n, p)) \
    X(cuGraphExecMemcpyNodeSetParams, 0, wo_h_exec_memcpy_set, CUresult, (CUgraphExec e, CUgraphNode n, const CUDA_MEMCPY3D *p, CUcontext c), (e, n, p, c)) \
    X(cuGraphExecMemsetNodeSetParams, 0, wo_h_exec_memset_set, CUresult, (CUgraphExec e, CUgraphNode n, const CUDA_MEMSET_NODE_PARAMS *p, CUcontext c), (e, n, p, c)) \
    X(cuGraphExecNodeSetParams, 0, wo_h_exec_node_set, CUresult, (CUgraphExec e, CUgraphNode n, CUgraphNodeParams *p), (e, n, p)) \
    X(cuGraphNodeSetEnabled, 0, wo_h_exec_node_enable, CUresult, (CUgraphExec e, CUgraphNode n, unsigned int on), (e, n, on)) \
    X(cuStreamSynchronize, 0, wo_h_stream_sync, CUresult, (CUstream s), (s)) \
    X(cuStreamSynchronize_ptsz, 1, wo_h_stream_sync, CUresult, (CUstream s), (s)) \
    X(cuCtxSynchronize_v2, 0, wo_h_ctx_sync, CUresult, (CUcontext ctx), (ctx)) \
    X(cuEventSynchronize, 0, wo_h_event_sync, CUresult, (CUevent e), (e)) \
    X(cuModuleUnload, 0, wo_h_module_unload, CUresult, (CUmodule m), (m)) \
    X(cuLibraryUnload, 0, wo_h_library_unload, CUresult, (CUlibrary l), (l)) \
    X(cuModuleLoad, 0, wo_h_module_load, CUresult, (CUmodule *m, const char *fname), (m, fname)) \
    X(cuModuleLoadData, 0, wo_h_module_load_data, CUresult, (CUmodule *m, const void *image), (m, image)) \
    X(cuModuleLoadDataEx, 0, wo_h_module_load_data_ex, CUresult, (CUmodule *m, const void *image, unsigned int n, CUjit_option *opts, void **vals), (m, image, n, opts, vals)) \
    X(cuModuleLoadFatBinary, 0, wo_h_module_load_fatbin, CUresult, (CUmodule *m, const void *fatbin), (m, fatbin)) \
    X(cuLibraryLoadData, 0, wo_h_library_load_data, CUresult, (CUlibrary *l, const void *code, CUjit_option *jo, void **jv, unsigned int nj, CUlibraryOption *lo, void **lv, unsigned int nl), (l, code, jo, jv, nj, lo, lv, nl)) \
    X(cuLibraryLoadFromFile, 0, wo_h_library_load_file, CUresult, (CUlibrary *l, const char *fname, CUjit_option *jo, void **jv, unsigned int nj, CUlibraryOption *lo, void **lv, unsigned int nl), (l, fname, jo, jv, nj, lo, lv, nl)) \
    X(cuFuncGetAttribute, 0, wo_h_func_get_attribute, CUresult, (int *pi, CUfunction_attribute a, CUfunction f), (pi, a, f)) \
    X(cuFuncSetAttribute, 0, wo_h_func_set_attribute, CUresult, (CUfunction f, CUfunction_attribute a, int v), (f, a, v)) \
    X(cuFuncSetCacheConfig, 0, wo_h_func_set_cache_config, CUresult, (CUfunction f, CUfunc_cache c), (f, c)) \
    X(cuFuncLoad, 0, wo_h_func_load, CUresult, (CUfunction f), (f)) \
    X(cuKernelGetAttribute, 0, wo_h_kernel_get_attribute, CUresult, (int *pi, CUfunction_attribute a, CUkernel k, CUdevice d), (pi, a, k, d)) \
    X(cuKernelSetAttribute, 0, wo_h_kernel_set_attribute, CUresult, (CUfunction_attribute a, int v, CUkernel k, CUdevice d), (a, v, k, d)) \
    X(cuKernelSetCacheConfig, 0, wo_h_kernel_set_cache_config, CUresult, (CUkernel k, CUfunc_cache c, CUdevice d), (k, c, d)) \
    X(cuKernelGetFunction, 0, wo_h_kernel_get_function, CUresult, (CUfunction *pf, CUkernel k), (pf, k)) \
    X(cuModuleGetFunction, 0, wo_h_module_get_function, CUresult, (CUfunction *pf, CUmodule m, const char *name), (pf, m, name)) \
    X(cuOccupancyMaxActiveBlocksPerMultiprocessor, 0, wo_h_occupancy_blocks, CUresult, (int *n, CUfunction f, int bs, size_t smem), (n, f, bs, smem)) \
    X(cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags, 0, wo_h_occupancy_blocks_flags, CUresult, (int *n, CUfunction f, int bs, size_t smem, unsigned int fl), (n, f, bs, smem, fl)) \
    X(cuOccupancyMaxPotentialBlockSize, 0, wo_h_occupancy_size, CUresult, (int *mg, int *bs, CUfunction f, CUoccupancyB2DSize fn, size_t smem, int lim), (mg, bs, f, fn, smem, lim)) \
    X(cuOccupancyMaxPotentialBlockSizeWithFlags, 0, wo_h_occupancy_size_flags, CUresult, (int *mg, int *bs, CUfunction f, CUoccupancyB2DSize fn, size_t smem, int lim, unsigned int fl), (mg, bs, f, fn, smem, lim, fl))

/* Not listed, on purpose: "cuGraphInstantiate". cuda.h's cuGraphInstantiate
 * is a compile-time macro for cuGraphInstantiateWithFlags, but the name at
 * cuGetProcAddress is the 5-argument cuGraphInstantiate_v2 at every version
 * from 11000 on (driver 580: tests/fake/probe-real.txt); wrapped by the
 * 3-argument hook, its error node and log buffer would be registers' leftovers.
 * It is handed out unwrapped: an exec it makes is not attributed, and its
 * launches count as blind ones (speed, never data). */
#define WO_DRIVER_PROCS(G) \
    G("cuGetProcAddress", 11030, cuGetProcAddress, cuGetProcAddress) \
    G("cuGetProcAddress", 12000, cuGetProcAddress_v2, cuGetProcAddress_v2) \
    G("cuMemAlloc", 3020, cuMemAlloc_v2, cuMemAlloc_v2) \
    G("cuMemFree", 3020, cuMemFree_v2, cuMemFree_v2) \
    G("cuMemAllocAsync", 11020, cuMemAllocAsync, cuMemAllocAsync_ptsz) \
    G("cuMemFreeAsync", 11020, cuMemFreeAsync, cuMemFreeAsync_ptsz) \
    G("cuMemAllocManaged", 6000, cuMemAllocManaged, cuMemAllocManaged) \
    G("cuMemCreate", 10020, cuMemCreate, cuMemCreate) \
    G("cuMemRelease", 10020, cuMemRelease, cuMemRelease) \
    G("cuMemMap", 10020, cuMemMap, cuMemMap) \
    G("cuMemUnmap", 10020, cuMemUnmap, cuMemUnmap) \
    G("cuMemFreeHost", 2000, cuMemFreeHost, cuMemFreeHost) \
    G("cuMemHostUnregister", 4000, cuMemHostUnregister, cuMemHostUnregister) \
    G("cuMemcpy", 4000, cuMemcpy, cuMemcpy_ptds) \
    G("cuMemcpyAsync", 4000, cuMemcpyAsync, cuMemcpyAsync_ptsz) \
    G("cuMemcpyHtoD", 3020, cuMemcpyHtoD_v2, cuMemcpyHtoD_v2_ptds) \
    G("cuMemcpyDtoH", 3020, cuMemcpyDtoH_v2, cuMemcpyDtoH_v2_ptds) \
    G("cuMemcpyDtoD", 3020, cuMemcpyDtoD_v2, cuMemcpyDtoD_v2_ptds) \
    G("cuMemcpyHtoDAsync", 3020, cuMemcpyHtoDAsync_v2, cuMemcpyHtoDAsync_v2_ptsz) \
    G("cuMemcpyDtoHAsync", 3020, cuMemcpyDtoHAsync_v2, cuMemcpyDtoHAsync_v2_ptsz) \
    G("cuMemcpyDtoDAsync", 3020, cuMemcpyDtoDAsync_v2, cuMemcpyDtoDAsync_v2_ptsz) \
    G("cuMemcpy2D", 3020, cuMemcpy2D_v2, cuMemcpy2D_v2_ptds) \
    G("cuMemcpy2DUnaligned", 3020, cuMemcpy2DUnaligned_v2, cuMemcpy2DUnaligned_v2_ptds) \
    G("cuMemcpy2DAsync", 3020, cuMemcpy2DAsync_v2, cuMemcpy2DAsync_v2_ptsz) \
    G("cuMemcpy3D", 3020, cuMemcpy3D_v2, cuMemcpy3D_v2_ptds) \
    G("cuMemcpy3DAsync", 3020, cuMemcpy3DAsync_v2, cuMemcpy3DAsync_v2_ptsz) \
    G("cuMemcpyPeer", 4000, cuMemcpyPeer, cuMemcpyPeer_ptds) \
    G("cuMemcpyPeerAsync", 4000, cuMemcpyPeerAsync, cuMemcpyPeerAsync_ptsz) \
    G("cuMemsetD8", 3020, cuMemsetD8_v2, cuMemsetD8_v2_ptds) \
    G("cuMemsetD8Async", 3020, cuMemsetD8Async, cuMemsetD8Async_ptsz) \
    G("cuMemsetD2D8", 3020, cuMemsetD2D8_v2, cuMemsetD2D8_v2_ptds) \
    G("cuMemsetD2D8Async", 3020, cuMemsetD2D8Async, cuMemsetD2D8Async_ptsz) \
    G("cuMemsetD16", 3020, cuMemsetD16_v2, cuMemsetD16_v2_ptds) \
    G("cuMemsetD16Async", 3020, cuMemsetD16Async, cuMemsetD16Async_ptsz) \
    G("cuMemsetD2D16", 3020, cuMemsetD2D16_v2, cuMemsetD2D16_v2_ptds) \
    G("cuMemsetD2D16Async", 3020, cuMemsetD2D16Async, cuMemsetD2D16Async_ptsz) \
    G("cuMemsetD32", 3020, cuMemsetD32_v2, cuMemsetD32_v2_ptds) \
    G("cuMemsetD32Async", 3020, cuMemsetD32Async, cuMemsetD32Async_ptsz) \
    G("cuMemsetD2D32", 3020, cuMemsetD2D32_v2, cuMemsetD2D32_v2_ptds) \
    G("cuMemsetD2D32Async", 3020, cuMemsetD2D32Async, cuMemsetD2D32Async_ptsz) \
    G("cuLaunchKernel", 4000, cuLaunchKernel, cuLaunchKernel_ptsz) \
    G("cuLaunchKernelEx", 11060, cuLaunchKernelEx, cuLaunchKernelEx_ptsz) \
    G("cuStreamBeginCapture", 10010, cuStreamBeginCapture_v2, cuStreamBeginCapture_v2_ptsz) \
    G("cuStreamBeginCaptureToGraph", 12030, cuStreamBeginCaptureToGraph, cuStreamBeginCaptureToGraph_ptsz) \
    G("cuStreamDestroy", 4000, cuStreamDestroy_v2, cuStreamDestroy_v2) \
    G("cuStreamEndCapture", 10000, cuStreamEndCapture, cuStreamEndCapture_ptsz) \
    G("cuGraphInstantiateWithFlags", 11040, cuGraphInstantiateWithFlags, cuGraphInstantiateWithFlags) \
    G("cuGraphInstantiateWithParams", 12000, cuGraphInstantiateWithParams, cuGraphInstantiateWithParams_ptsz) \
    G("cuGraphLaunch", 10000, cuGraphLaunch, cuGraphLaunch_ptsz) \
    G("cuGraphExecUpdate", 10020, cuGraphExecUpdate, cuGraphExecUpdate) \
    G("cuGraphExecUpdate", 12000, cuGraphExecUpdate_v2, cuGraphExecUpdate_v2) \
    G("cuGraphExecDestroy", 10000, cuGraphExecDestroy, cuGraphExecDestroy) \
    G("cuGraphExecKernelNodeSetParams", 10010, cuGraphExecKernelNodeSetParams, cuGraphExecKernelNodeSetParams) \
    G("cuGraphExecKernelNodeSetParams", 12000, cuGraphExecKernelNodeSetParams_v2, cuGraphExecKernelNodeSetParams_v2) \
    G("cuGraphExecMemcpyNodeSetParams", 10020, cuGraphExecMemcpyNodeSetParams, cuGraphExecMemcpyNodeSetParams) \
    G("cuGraphExecMemsetNodeSetParams", 10020, cuGraphExecMemsetNodeSetParams, cuGraphExecMemsetNodeSetParams) \
    G("cuGraphExecNodeSetParams", 12020, cuGraphExecNodeSetParams, cuGraphExecNodeSetParams) \
    G("cuGraphNodeSetEnabled", 11060, cuGraphNodeSetEnabled, cuGraphNodeSetEnabled) \
    G("cuStreamSynchronize", 2000, cuStreamSynchronize, cuStreamSynchronize_ptsz) \
    G("cuCtxSynchronize", 13000, cuCtxSynchronize_v2, cuCtxSynchronize_v2) \
    G("cuEventSynchronize", 2000, cuEventSynchronize, cuEventSynchronize) \
    G("cuModuleUnload", 2000, cuModuleUnload, cuModuleUnload) \
    G("cuLibraryUnload", 12000, cuLibraryUnload, cuLibraryUnload) \
    G("cuModuleLoad", 2000, cuModuleLoad, cuModuleLoad) \
    G("cuModuleLoadData", 2000, cuModuleLoadData, cuModuleLoadData) \
    G("cuModuleLoadDataEx", 2010, cuModuleLoadDataEx, cuModuleLoadDataEx) \
    G("cuModuleLoadFatBinary", 2000, cuModuleLoadFatBinary, cuModuleLoadFatBinary) \
    G("cuLibraryLoadData", 12000, cuLibraryLoadData, cuLibraryLoadData) \
    G("cuLibraryLoadFromFile", 12000, cuLibraryLoadFromFile, cuLibraryLoadFromFile) \
    G("cuFuncGetAttribute", 2020, cuFuncGetAttribute, cuFuncGetAttribute) \
    G("cuFuncSetAttribute", 9000, cuFuncSetAttribute, cuFuncSetAttribute) \
    G("cuFuncSetCacheConfig", 3000, cuFuncSetCacheConfig, cuFuncSetCacheConfig) \
    G("cuFuncLoad", 12040, cuFuncLoad, cuFuncLoad) \
    G("cuKernelGetAttribute", 12000, cuKernelGetAttribute, cuKernelGetAttribute) \
    G("cuKernelSetAttribute", 12000, cuKernelSetAttribute, cuKernelSetAttribute) \
    G("cuKernelSetCacheConfig", 12000, cuKernelSetCacheConfig, cuKernelSetCacheConfig) \
    G("cuKernelGetFunction", 12000, cuKernelGetFunction, cuKernelGetFunction) \
    G("cuModuleGetFunction", 2000, cuModuleGetFunction, cuModuleGetFunction) \
    G("cuOccupancyMaxActiveBlocksPerMultiprocessor", 6050, cuOccupancyMaxActiveBlocksPerMultiprocessor, cuOccupancyMaxActiveBlocksPerMultiprocessor) \
    G("cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags", 7000, cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags, cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags) \
    G("cuOccupancyMaxPotentialBlockSize", 6050, cuOccupancyMaxPotentialBlockSize, cuOccupancyMaxPotentialBlockSize) \
    G("cuOccupancyMaxPotentialBlockSizeWithFlags", 7000, cuOccupancyMaxPotentialBlockSizeWithFlags, cuOccupancyMaxPotentialBlockSizeWithFlags)

#define WO_RUNTIME_HOOKS(X) \
    X(cudaMalloc, 0, wo_h_cuda_malloc, cudaError_t, (void **p, size_t size), (p, size)) \
    X(cudaFree, 0, wo_h_cuda_free, cudaError_t, (void *p), (p)) \
    X(cudaMallocAsync, 0, wo_h_cuda_malloc_async, cudaError_t, (void **p, size_t size, cudaStream_t s), (p, size, s)) \
    X(cudaMallocAsync_ptsz, 1, wo_h_cuda_malloc_async, cudaError_t, (void **p, size_t size, cudaStream_t s), (p, size, s)) \
    X(cudaFreeAsync, 0, wo_h_cuda_free_async, cudaError_t, (void *p, cudaStream_t s), (p, s)) \
    X(cudaFreeAsync_ptsz, 1, wo_h_cuda_free_async, cudaError_t, (void *p, cudaStream_t s), (p, s)) \
    X(cudaMallocManaged, 0, wo_h_cuda_malloc_managed, cudaError_t, (void **p, size_t size, unsigned int flags), (p, size, flags)) \
    X(cudaMemcpy, 0, wo_h_cuda_memcpy, cudaError_t, (void *dst, const void *src, size_t n, enum cudaMemcpyKind kind), (dst, src, n, kind)) \
    X(cudaMemcpy_ptds, 1, wo_h_cuda_memcpy, cudaError_t, (void *dst, const void *src, size_t n, enum cudaMemcpyKind kind), (dst, src, n, kind)) \
    X(cudaMemcpyAsync, 0, wo_h_cuda_memcpy_async, cudaError_t, (void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, cudaStream_t s), (dst, src, n, kind, s)) \
    X(cudaMemcpyAsync_ptsz, 1, wo_h_cuda_memcpy_async, cudaError_t, (void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, cudaStream_t s), (dst, src, n, kind, s)) \
    X(cudaMemcpy2D, 0, wo_h_cuda_memcpy2d, cudaError_t, (void *dst, size_t dpitch, const void *src, size_t spitch, size_t w, size_t h, enum cudaMemcpyKind kind), (dst, dpitch, src, spitch, w, h, kind)) \
    X(cudaMemcpy2D_ptds, 1, wo_h_cuda_memcpy2d, cudaError_t, (void *dst, size_t dpitch, const void *src, size_t spitch, size_t w, size_t h, enum cudaMemcpyKind kind), (dst, dpitch, src, spitch, w, h, kind)) \
    X(cudaMemcpy2DAsync, 0, wo_h_cuda_memcpy2d_async, cudaError_t, (void *dst, size_t dpitch, const void *src, size_t spitch, size_t w, size_t h, enum cudaMemcpyKind kind, cudaStream_t s), (dst, dpitch, src, spitch, w, h, kind, s)) \
    X(cudaMemcpy2DAsync_ptsz, 1, wo_h_cuda_memcpy2d_async, cudaError_t, (void *dst, size_t dpitch, const void *src, size_t spitch, size_t w, size_t h, enum cudaMemcpyKind kind, cudaStream_t s), (dst, dpitch, src, spitch, w, h, kind, s)) \
    X(cudaMemcpy3D, 0, wo_h_cuda_memcpy3d, cudaError_t, (const struct cudaMemcpy3DParms *p), (p)) \
    X(cudaMemcpy3D_ptds, 1, wo_h_cuda_memcpy3d, cudaError_t, (const struct cudaMemcpy3DParms *p), (p)) \
    X(cudaMemcpy3DAsync, 0, wo_h_cuda_memcpy3d_async, cudaError_t, (const struct cudaMemcpy3DParms *p, cudaStream_t s), (p, s)) \
    X(cudaMemcpy3DAsync_ptsz, 1, wo_h_cuda_memcpy3d_async, cudaError_t, (const struct cudaMemcpy3DParms *p, cudaStream_t s), (p, s)) \
    X(cudaLaunchKernel, 0, wo_h_cuda_launch_kernel, cudaError_t, (const void *func, dim3 grid, dim3 block, void **args, size_t shmem, cudaStream_t s), (func, grid, block, args, shmem, s)) \
    X(cudaLaunchKernel_ptsz, 1, wo_h_cuda_launch_kernel, cudaError_t, (const void *func, dim3 grid, dim3 block, void **args, size_t shmem, cudaStream_t s), (func, grid, block, args, shmem, s)) \
    X(__cudaLaunchKernel, 0, wo_h_cuda_launch_kernel_handle, cudaError_t, (cudaKernel_t k, dim3 grid, dim3 block, void **args, size_t shmem, cudaStream_t s), (k, grid, block, args, shmem, s)) \
    X(__cudaLaunchKernel_ptsz, 1, wo_h_cuda_launch_kernel_handle, cudaError_t, (cudaKernel_t k, dim3 grid, dim3 block, void **args, size_t shmem, cudaStream_t s), (k, grid, block, args, shmem, s)) \
    X(cudaLaunchKernelExC, 0, wo_h_cuda_launch_kernel_ex, cudaError_t, (const cudaLaunchConfig_t *cfg, const void *func, void **args), (cfg, func, args)) \
    X(cudaLaunchKernelExC_ptsz, 1, wo_h_cuda_launch_kernel_ex, cudaError_t, (const cudaLaunchConfig_t *cfg, const void *func, void **args), (cfg, func, args)) \
    X(cudaStreamBeginCapture, 0, wo_h_cuda_begin_capture, cudaError_t, (cudaStream_t s, enum cudaStreamCaptureMode mode), (s, mode)) \
    X(cudaStreamBeginCapture_ptsz, 1, wo_h_cuda_begin_capture, cudaError_t, (cudaStream_t s, enum cudaStreamCaptureMode mode), (s, mode)) \
    X(cudaStreamBeginCaptureToGraph, 0, wo_h_cuda_begin_capture_to_graph, cudaError_t, (cudaStream_t s, cudaGraph_t g, const cudaGraphNode_t *deps, const cudaGraphEdgeData *data, size_t n, enum cudaStreamCaptureMode mode), (s, g, deps, data, n, mode)) \
    X(cudaStreamBeginCaptureToGraph_ptsz, 1, wo_h_cuda_begin_capture_to_graph, cudaError_t, (cudaStream_t s, cudaGraph_t g, const cudaGraphNode_t *deps, const cudaGraphEdgeData *data, size_t n, enum cudaStreamCaptureMode mode), (s, g, deps, data, n, mode)) \
    X(cudaStreamEndCapture, 0, wo_h_cuda_end_capture, cudaError_t, (cudaStream_t s, cudaGraph_t *g), (s, g)) \
    X(cudaStreamEndCapture_ptsz, 1, wo_h_cuda_end_capture, cudaError_t, (cudaStream_t s, cudaGraph_t *g), (s, g)) \
    X(cudaGraphInstantiate, 0, wo_h_cuda_graph_instantiate, cudaError_t, (cudaGraphExec_t *e, cudaGraph_t g, unsigned long long flags), (e, g, flags)) \
    X(cudaGraphInstantiateWithFlags, 0, wo_h_cuda_graph_instantiate, cudaError_t, (cudaGraphExec_t *e, cudaGraph_t g, unsigned long long flags), (e, g, flags)) \
    X(cudaGraphInstantiateWithParams, 0, wo_h_cuda_graph_instantiate_params, cudaError_t, (cudaGraphExec_t *e, cudaGraph_t g, cudaGraphInstantiateParams *p), (e, g, p)) \
    X(cudaGraphInstantiateWithParams_ptsz, 1, wo_h_cuda_graph_instantiate_params, cudaError_t, (cudaGraphExec_t *e, cudaGraph_t g, cudaGraphInstantiateParams *p), (e, g, p)) \
    X(cudaGraphLaunch, 0, wo_h_cuda_graph_launch, cudaError_t, (cudaGraphExec_t e, cudaStream_t s), (e, s)) \
    X(cudaGraphLaunch_ptsz, 1, wo_h_cuda_graph_launch, cudaError_t, (cudaGraphExec_t e, cudaStream_t s), (e, s)) \
    X(cudaGetDriverEntryPoint, 0, wo_h_cuda_entry_point, cudaError_t, (const char *symbol, void **fn, unsigned long long flags, enum cudaDriverEntryPointQueryResult *status), (symbol, fn, flags, status)) \
    X(cudaGetDriverEntryPoint_ptsz, 1, wo_h_cuda_entry_point, cudaError_t, (const char *symbol, void **fn, unsigned long long flags, enum cudaDriverEntryPointQueryResult *status), (symbol, fn, flags, status)) \
    X(cudaGetDriverEntryPointByVersion, 0, wo_h_cuda_entry_point_by_version, cudaError_t, (const char *symbol, void **fn, unsigned int ver, unsigned long long flags, enum cudaDriverEntryPointQueryResult *status), (symbol, fn, ver, flags, status)) \
    X(cudaGetDriverEntryPointByVersion_ptsz, 1, wo_h_cuda_entry_point_by_version, cudaError_t, (const char *symbol, void **fn, unsigned int ver, unsigned long long flags, enum cudaDriverEntryPointQueryResult *status), (symbol, fn, ver, flags, status))
/* clang-format on */

/* Indices: WO_HOOK_<sym> (driver), WO_RT_<sym> (runtime). */
enum wo_hook_id {
#define WO_HOOK_ENUM(sym, pt, hook, RET, PARAMS, ARGS) WO_HOOK_##sym,
    WO_DRIVER_HOOKS(WO_HOOK_ENUM) WO_NHOOKS
};
#define WO_RT_ENUM(sym, pt, hook, RET, PARAMS, ARGS) WO_RT_##sym,
enum wo_rt_id { WO_RUNTIME_HOOKS(WO_RT_ENUM) WO_NRT };
#undef WO_HOOK_ENUM
#undef WO_RT_ENUM

/* Function pointer types, and the exported wrappers' prototypes (cuda.h
 * declares only some of the ABI names, e.g. not the _ptds variants). */
#define WO_HOOK_DECL(sym, pt, hook, RET, PARAMS, ARGS)                                             \
    typedef RET(*wo_pfn_##sym) PARAMS;                                                             \
    RET sym PARAMS;
WO_DRIVER_HOOKS(WO_HOOK_DECL)
WO_RUNTIME_HOOKS(WO_HOOK_DECL)
#undef WO_HOOK_DECL

/* Driver functions the shim itself calls (beyond the hooked ones). */
#define WO_DRIVER_INTERNAL(Y)                                                                      \
    Y(cuInit)                                                                                      \
    Y(cuGetErrorName)                                                                              \
    Y(cuDriverGetVersion)                                                                          \
    Y(cuDeviceGet)                                                                                 \
    Y(cuDeviceGetCount)                                                                            \
    Y(cuDeviceGetAttribute)                                                                        \
    Y(cuDevicePrimaryCtxRetain)                                                                    \
    Y(cuCtxGetCurrent)                                                                             \
    Y(cuCtxSetCurrent)                                                                             \
    Y(cuCtxGetDevice)                                                                              \
    Y(cuCtxCreate_v4)                                                                              \
    Y(cuCtxCreate_v2)                                                                              \
    Y(cuCtxDestroy_v2)                                                                             \
    Y(cuCtxSetLimit)                                                                               \
    Y(cuMemGetInfo_v2)                                                                             \
    Y(cuMemHostAlloc)                                                                              \
    Y(cuMemHostGetDevicePointer_v2)                                                                \
    Y(cuMemHostRegister_v2)                                                                        \
    Y(cuMemAdvise_v2)                                                                              \
    Y(cuMemPrefetchAsync_v2)                                                                       \
    Y(cuMemsetD8_v2)                                                                               \
    Y(cuStreamCreate)                                                                              \
    Y(cuStreamDestroy_v2)                                                                          \
    Y(cuStreamSynchronize)                                                                         \
    Y(cuStreamQuery)                                                                               \
    Y(cuStreamWaitEvent)                                                                           \
    Y(cuStreamIsCapturing)                                                                         \
    Y(cuEventCreate)                                                                               \
    Y(cuEventDestroy_v2)                                                                           \
    Y(cuEventRecord)                                                                               \
    Y(cuEventQuery)                                                                                \
    Y(cuEventSynchronize)                                                                          \
    Y(cuEventElapsedTime)                                                                          \
    Y(cuFuncGetName)                                                                               \
    Y(cuPointerGetAttribute)                                                                       \
    Y(cuModuleLoadData)                                                                            \
    Y(cuModuleGetFunction)                                                                         \
    Y(cuModuleUnload)                                                                              \
    Y(cuFuncGetParamInfo)                                                                          \
    Y(cuKernelGetParamInfo)                                                                        \
    Y(cuFuncGetModule)                                                                             \
    Y(cuMemAddressReserve)                                                                         \
    Y(cuMemAddressFree)                                                                            \
    Y(cuMemSetAccess)                                                                              \
    Y(cuMemGetAllocationGranularity)                                                               \
    Y(cuCtxSynchronize)                                                                            \
    Y(cuGraphGetNodes)                                                                             \
    Y(cuGraphGetEdges_v2)                                                                          \
    Y(cuGraphNodeGetType)                                                                          \
    Y(cuGraphKernelNodeGetParams_v2)                                                               \
    Y(cuGraphKernelNodeGetAttribute)                                                               \
    Y(cuGraphMemcpyNodeGetParams)                                                                  \
    Y(cuGraphMemsetNodeGetParams)                                                                  \
    Y(cuGraphMemAllocNodeGetParams)                                                                \
    Y(cuGraphMemFreeNodeGetParams)                                                                 \
    Y(cuMemsetD8Async)                                                                             \
    Y(cuMemsetD16Async)                                                                            \
    Y(cuMemsetD32Async)                                                                            \
    Y(cuStreamWaitValue32_v2)                                                                      \
    Y(cuStreamWriteValue32_v2)

/* The real driver table: filled once from the driver library. */
struct wo_real {
    void *lib; /* dlopen handle of the driver library, NULL when it could not be loaded */
    void *hook[WO_NHOOKS];
#define WO_REAL_MEMBER(name) void *name;
    WO_DRIVER_INTERNAL(WO_REAL_MEMBER)
#undef WO_REAL_MEMBER
};

/* Loads the driver library and resolves the table on first call (thread-safe).
 * Returns the table, or NULL while this very thread is loading it (the
 * driver's own constructors calling dlsym) so callers pass through. */
const struct wo_real *wo_real_driver(void);
/* The table if loaded already, else NULL; never loads. */
const struct wo_real *wo_real_driver_peek(void);

/* The real function behind an exported driver wrapper. */
static inline void *wo_real_hook(enum wo_hook_id id)
{
    const struct wo_real *r = wo_real_driver();
    return r ? r->hook[id] : NULL;
}

/* The real runtime function behind an exported runtime wrapper (resolved on
 * first call, cached); NULL when no CUDA runtime is loaded. */
void *wo_real_runtime(enum wo_rt_id id);
/* A runtime function we do not hook, by name (cudaGetFuncBySymbol). */
void *wo_real_runtime_sym(const char *name);

/* libc's own dlsym/dlvsym (never our exported hooks). */
void *wo_real_dlsym(void *handle, const char *name);
void *wo_real_dlvsym(void *handle, const char *name, const char *version);

/* Names of the hooks, in enum order (for the dlsym substitution and stats). */
extern const char *const wo_hook_names[WO_NHOOKS];
extern const char *const wo_rt_names[WO_NRT];
/* Our exported wrappers, in enum order (what dlsym hands out instead). */
extern void *const wo_hook_exports[WO_NHOOKS];
