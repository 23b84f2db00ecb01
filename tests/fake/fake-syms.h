/* tests/fake/fake-syms.h: the one list of driver entry points the fake
 * libcuda.so.1 exports, and the table cuGetProcAddress resolves from.
 *
 * FK_SYMS(X): X(abi_symbol, check). Every exported driver function has one
 * line here and starts with FK_ENTER(abi_symbol): the list gives it a call
 * counter, makes it a fault-injection point and names it in
 * fakecuda_functions(). check says what the real driver demands first:
 *   N  nothing (works before cuInit)
 *   I  a successful cuInit
 *   C  cuInit and a current context on the calling thread
 *
 * FK_PROCS(X): X(name, version, default_fn, per_thread_fn): what
 * cuGetProcAddress(name, version, flags) returns. Several lines per name give
 * the symbol's history; the highest version <= the requested one wins.
 * per_thread_fn (the _ptsz/_ptds symbol) is returned for
 * CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM; NULL means the default
 * function serves both. Versions come from cudaTypedefs.h (PFN_name_vNNNNN),
 * checked against driver 580 (CUDA 13.0) with probe-driver.c: e.g.
 * "cuGraphInstantiate" stays the 5-argument _v2 at 12000+ (the header's
 * cuGraphInstantiate -> cuGraphInstantiateWithFlags macro is compile-time). */
#pragma once

#define FK_SYMS(X)                                                                                 \
    X(cuInit, N)                                                                                   \
    X(cuDriverGetVersion, N)                                                                       \
    X(cuGetErrorName, N)                                                                           \
    X(cuGetErrorString, N)                                                                         \
    X(cuGetProcAddress, N)                                                                         \
    X(cuGetProcAddress_v2, N)                                                                      \
    X(cuDeviceGet, I)                                                                              \
    X(cuDeviceGetCount, I)                                                                         \
    X(cuDeviceGetName, I)                                                                          \
    X(cuDeviceGetAttribute, I)                                                                     \
    X(cuDeviceTotalMem_v2, I)                                                                      \
    X(cuDevicePrimaryCtxRetain, I)                                                                 \
    X(cuDevicePrimaryCtxRelease_v2, I)                                                             \
    X(cuCtxCreate_v2, I)                                                                           \
    X(cuCtxCreate_v4, I)                                                                           \
    X(cuCtxDestroy_v2, I)                                                                          \
    X(cuCtxSetLimit, C)                                                                            \
    X(cuCtxGetCurrent, I)                                                                          \
    X(cuCtxSetCurrent, I)                                                                          \
    X(cuCtxPushCurrent_v2, I)                                                                      \
    X(cuCtxPopCurrent_v2, I)                                                                       \
    X(cuCtxGetDevice, C)                                                                           \
    X(cuCtxGetDevice_v2, I)                                                                        \
    X(cuCtxSynchronize, C)                                                                         \
    X(cuCtxSynchronize_v2, I)                                                                      \
    X(cuCtxGetStreamPriorityRange, C)                                                              \
    X(cuThreadExchangeStreamCaptureMode, I)                                                        \
    X(cuMemGetInfo_v2, C)                                                                          \
    X(cuMemAlloc_v2, C)                                                                            \
    X(cuMemFree_v2, C)                                                                             \
    X(cuMemAllocAsync, C)                                                                          \
    X(cuMemAllocAsync_ptsz, C)                                                                     \
    X(cuMemFreeAsync, C)                                                                           \
    X(cuMemFreeAsync_ptsz, C)                                                                      \
    X(cuMemAllocManaged, C)                                                                        \
    X(cuMemHostAlloc, C)                                                                           \
    X(cuMemAllocHost_v2, C)                                                                        \
    X(cuMemFreeHost, C)                                                                            \
    X(cuMemHostRegister_v2, C)                                                                     \
    X(cuMemHostUnregister, C)                                                                      \
    X(cuMemHostGetDevicePointer_v2, C)                                                             \
    X(cuMemGetAddressRange_v2, C)                                                                  \
    X(cuMemAdvise, C)                                                                              \
    X(cuMemAdvise_v2, C)                                                                           \
    X(cuMemPrefetchAsync, C)                                                                       \
    X(cuMemPrefetchAsync_ptsz, C)                                                                  \
    X(cuMemPrefetchAsync_v2, C)                                                                    \
    X(cuMemPrefetchAsync_v2_ptsz, C)                                                               \
    X(cuMemRangeGetAttribute, I)                                                                   \
    X(cuPointerGetAttribute, I)                                                                    \
    X(cuPointerGetAttributes, I)                                                                   \
    X(cuMemcpy, C)                                                                                 \
    X(cuMemcpy_ptds, C)                                                                            \
    X(cuMemcpyAsync, C)                                                                            \
    X(cuStreamWaitValue32_v2, C)                                                                   \
    X(cuStreamWriteValue32_v2, C)                                                                  \
    X(cuMemcpyAsync_ptsz, C)                                                                       \
    X(cuMemcpyHtoD_v2, C)                                                                          \
    X(cuMemcpyHtoD_v2_ptds, C)                                                                     \
    X(cuMemcpyDtoH_v2, C)                                                                          \
    X(cuMemcpyDtoH_v2_ptds, C)                                                                     \
    X(cuMemcpyDtoD_v2, C)                                                                          \
    X(cuMemcpyDtoD_v2_ptds, C)                                                                     \
    X(cuMemcpyHtoDAsync_v2, C)                                                                     \
    X(cuMemcpyHtoDAsync_v2_ptsz, C)                                                                \
    X(cuMemcpyDtoHAsync_v2, C)                                                                     \
    X(cuMemcpyDtoHAsync_v2_ptsz, C)                                                                \
    X(cuMemcpyDtoDAsync_v2, C)                                                                     \
    X(cuMemcpyDtoDAsync_v2_ptsz, C)                                                                \
    X(cuMemcpy2D_v2, C)                                                                            \
    X(cuMemcpy2D_v2_ptds, C)                                                                       \
    X(cuMemcpy2DUnaligned_v2, C)                                                                   \
    X(cuMemcpy2DUnaligned_v2_ptds, C)                                                              \
    X(cuMemcpy2DAsync_v2, C)                                                                       \
    X(cuMemcpy2DAsync_v2_ptsz, C)                                                                  \
    X(cuMemcpy3D_v2, C)                                                                            \
    X(cuMemcpy3D_v2_ptds, C)                                                                       \
    X(cuMemcpy3DAsync_v2, C)                                                                       \
    X(cuMemcpy3DAsync_v2_ptsz, C)                                                                  \
    X(cuMemsetD8_v2, C)                                                                            \
    X(cuMemsetD8_v2_ptds, C)                                                                       \
    X(cuMemsetD16_v2, C)                                                                           \
    X(cuMemsetD16_v2_ptds, C)                                                                      \
    X(cuMemsetD32_v2, C)                                                                           \
    X(cuMemsetD32_v2_ptds, C)                                                                      \
    X(cuMemsetD8Async, C)                                                                          \
    X(cuMemsetD8Async_ptsz, C)                                                                     \
    X(cuMemsetD16Async, C)                                                                         \
    X(cuMemsetD16Async_ptsz, C)                                                                    \
    X(cuMemsetD32Async, C)                                                                         \
    X(cuMemsetD32Async_ptsz, C)                                                                    \
    X(cuStreamCreate, C)                                                                           \
    X(cuStreamCreateWithPriority, C)                                                               \
    X(cuStreamDestroy_v2, C)                                                                       \
    X(cuStreamSynchronize, C)                                                                      \
    X(cuStreamSynchronize_ptsz, C)                                                                 \
    X(cuStreamQuery, C)                                                                            \
    X(cuStreamQuery_ptsz, C)                                                                       \
    X(cuStreamWaitEvent, C)                                                                        \
    X(cuStreamWaitEvent_ptsz, C)                                                                   \
    X(cuStreamGetFlags, C)                                                                         \
    X(cuStreamGetFlags_ptsz, C)                                                                    \
    X(cuStreamGetPriority, C)                                                                      \
    X(cuStreamGetPriority_ptsz, C)                                                                 \
    X(cuStreamGetCtx, C)                                                                           \
    X(cuStreamGetCtx_ptsz, C)                                                                      \
    X(cuStreamIsCapturing, C)                                                                      \
    X(cuStreamIsCapturing_ptsz, C)                                                                 \
    X(cuStreamGetCaptureInfo_v2, C)                                                                \
    X(cuStreamGetCaptureInfo_v2_ptsz, C)                                                           \
    X(cuStreamGetCaptureInfo_v3, C)                                                                \
    X(cuStreamGetCaptureInfo_v3_ptsz, C)                                                           \
    X(cuStreamBeginCapture_v2, C)                                                                  \
    X(cuStreamBeginCapture_v2_ptsz, C)                                                             \
    X(cuStreamBeginCaptureToGraph, C)                                                              \
    X(cuStreamBeginCaptureToGraph_ptsz, C)                                                         \
    X(cuStreamEndCapture, C)                                                                       \
    X(cuStreamEndCapture_ptsz, C)                                                                  \
    X(cuLaunchHostFunc, C)                                                                         \
    X(cuLaunchHostFunc_ptsz, C)                                                                    \
    X(cuEventCreate, C)                                                                            \
    X(cuEventRecord, C)                                                                            \
    X(cuEventRecord_ptsz, C)                                                                       \
    X(cuEventRecordWithFlags, C)                                                                   \
    X(cuEventRecordWithFlags_ptsz, C)                                                              \
    X(cuEventQuery, I)                                                                             \
    X(cuEventSynchronize, I)                                                                       \
    X(cuEventDestroy_v2, I)                                                                        \
    X(cuEventElapsedTime, I)                                                                       \
    X(cuEventElapsedTime_v2, I)                                                                    \
    X(cuModuleLoad, C)                                                                             \
    X(cuModuleLoadData, C)                                                                         \
    X(cuModuleUnload, C)                                                                           \
    X(cuModuleGetFunction, C)                                                                      \
    X(cuFuncGetModule, I)                                                                          \
    X(cuLibraryLoadData, I)                                                                        \
    X(cuLibraryUnload, I)                                                                          \
    X(cuLibraryGetKernel, I)                                                                       \
    X(cuKernelGetFunction, C)                                                                      \
    X(cuKernelGetName, I)                                                                          \
    X(cuKernelGetParamInfo, I)                                                                     \
    X(cuFuncGetName, I)                                                                            \
    X(cuFuncGetParamInfo, I)                                                                       \
    X(cuFuncGetAttribute, I)                                                                       \
    X(cuLaunchKernel, C)                                                                           \
    X(cuLaunchKernel_ptsz, C)                                                                      \
    X(cuLaunchKernelEx, C)                                                                         \
    X(cuLaunchKernelEx_ptsz, C)                                                                    \
    X(cuGraphInstantiate_v2, C)                                                                    \
    X(cuGraphInstantiateWithFlags, C)                                                              \
    X(cuGraphLaunch, C)                                                                            \
    X(cuGraphLaunch_ptsz, C)                                                                       \
    X(cuGraphExecDestroy, I)                                                                       \
    X(cuGraphDestroy, I)                                                                           \
    X(cuGraphCreate, C)                                                                            \
    X(cuGraphAddKernelNode_v2, C)                                                                  \
    X(cuGraphGetNodes, C)                                                                          \
    X(cuGraphGetEdges_v2, C)                                                                       \
    X(cuGraphNodeGetType, C)                                                                       \
    X(cuGraphKernelNodeGetParams_v2, C)                                                            \
    X(cuGraphKernelNodeGetAttribute, C)                                                            \
    X(cuGraphMemcpyNodeGetParams, C)                                                               \
    X(cuGraphMemsetNodeGetParams, C)                                                               \
    X(cuGraphMemAllocNodeGetParams, C)                                                             \
    X(cuGraphMemFreeNodeGetParams, C)                                                              \
    X(cuGraphExecUpdate_v2, C)                                                                     \
    X(cuGraphExecKernelNodeSetParams_v2, C)                                                        \
    X(cuMemGetAllocationGranularity, I)                                                            \
    X(cuMemCreate, C)                                                                              \
    X(cuMemRelease, I)                                                                             \
    X(cuMemAddressReserve, C)                                                                      \
    X(cuMemAddressFree, I)                                                                         \
    X(cuMemMap, C)                                                                                 \
    X(cuMemUnmap, I)                                                                               \
    X(cuMemSetAccess, C)

#define FK_PROCS(X)                                                                                \
    X(cuInit, 2000, cuInit, NULL)                                                                  \
    X(cuDriverGetVersion, 2020, cuDriverGetVersion, NULL)                                          \
    X(cuGetErrorName, 6000, cuGetErrorName, NULL)                                                  \
    X(cuGetErrorString, 6000, cuGetErrorString, NULL)                                              \
    X(cuGetProcAddress, 11030, cuGetProcAddress, NULL)                                             \
    X(cuGetProcAddress, 12000, cuGetProcAddress_v2, NULL)                                          \
    X(cuDeviceGet, 2000, cuDeviceGet, NULL)                                                        \
    X(cuDeviceGetCount, 2000, cuDeviceGetCount, NULL)                                              \
    X(cuDeviceGetName, 2000, cuDeviceGetName, NULL)                                                \
    X(cuDeviceGetAttribute, 2000, cuDeviceGetAttribute, NULL)                                      \
    X(cuDeviceTotalMem, 3020, cuDeviceTotalMem_v2, NULL)                                           \
    X(cuDevicePrimaryCtxRetain, 7000, cuDevicePrimaryCtxRetain, NULL)                              \
    X(cuDevicePrimaryCtxRelease, 11000, cuDevicePrimaryCtxRelease_v2, NULL)                        \
    X(cuCtxGetCurrent, 4000, cuCtxGetCurrent, NULL)                                                \
    X(cuCtxSetCurrent, 4000, cuCtxSetCurrent, NULL)                                                \
    X(cuCtxCreate, 3020, cuCtxCreate_v2, NULL)                                                     \
    X(cuCtxCreate, 12050, cuCtxCreate_v4, NULL)                                                    \
    X(cuCtxDestroy, 4000, cuCtxDestroy_v2, NULL)                                                   \
    X(cuCtxSetLimit, 3010, cuCtxSetLimit, NULL)                                                    \
    X(cuCtxPushCurrent, 4000, cuCtxPushCurrent_v2, NULL)                                           \
    X(cuCtxPopCurrent, 4000, cuCtxPopCurrent_v2, NULL)                                             \
    X(cuCtxGetDevice, 2000, cuCtxGetDevice, NULL)                                                  \
    X(cuCtxGetDevice, 13000, cuCtxGetDevice_v2, NULL)                                              \
    X(cuCtxSynchronize, 2000, cuCtxSynchronize, NULL)                                              \
    X(cuCtxSynchronize, 13000, cuCtxSynchronize_v2, NULL)                                          \
    X(cuCtxGetStreamPriorityRange, 5050, cuCtxGetStreamPriorityRange, NULL)                        \
    X(cuThreadExchangeStreamCaptureMode, 10010, cuThreadExchangeStreamCaptureMode, NULL)           \
    X(cuMemGetInfo, 3020, cuMemGetInfo_v2, NULL)                                                   \
    X(cuMemAlloc, 3020, cuMemAlloc_v2, NULL)                                                       \
    X(cuMemFree, 3020, cuMemFree_v2, NULL)                                                         \
    X(cuMemAllocAsync, 11020, cuMemAllocAsync, cuMemAllocAsync_ptsz)                               \
    X(cuMemFreeAsync, 11020, cuMemFreeAsync, cuMemFreeAsync_ptsz)                                  \
    X(cuMemAllocManaged, 6000, cuMemAllocManaged, NULL)                                            \
    X(cuMemHostAlloc, 2020, cuMemHostAlloc, NULL)                                                  \
    X(cuMemAllocHost, 3020, cuMemAllocHost_v2, NULL)                                               \
    X(cuMemFreeHost, 2000, cuMemFreeHost, NULL)                                                    \
    X(cuMemHostRegister, 6050, cuMemHostRegister_v2, NULL)                                         \
    X(cuMemHostUnregister, 4000, cuMemHostUnregister, NULL)                                        \
    X(cuMemHostGetDevicePointer, 3020, cuMemHostGetDevicePointer_v2, NULL)                         \
    X(cuMemGetAddressRange, 3020, cuMemGetAddressRange_v2, NULL)                                   \
    X(cuMemAdvise, 8000, cuMemAdvise, NULL)                                                        \
    X(cuMemAdvise, 12020, cuMemAdvise_v2, NULL)                                                    \
    X(cuMemPrefetchAsync, 8000, cuMemPrefetchAsync, cuMemPrefetchAsync_ptsz)                       \
    X(cuMemPrefetchAsync, 12020, cuMemPrefetchAsync_v2, cuMemPrefetchAsync_v2_ptsz)                \
    X(cuMemRangeGetAttribute, 8000, cuMemRangeGetAttribute, NULL)                                  \
    X(cuPointerGetAttribute, 4000, cuPointerGetAttribute, NULL)                                    \
    X(cuPointerGetAttributes, 7000, cuPointerGetAttributes, NULL)                                  \
    X(cuMemcpy, 4000, cuMemcpy, cuMemcpy_ptds)                                                     \
    X(cuMemcpyAsync, 4000, cuMemcpyAsync, cuMemcpyAsync_ptsz)                                      \
    X(cuMemcpyHtoD, 3020, cuMemcpyHtoD_v2, cuMemcpyHtoD_v2_ptds)                                   \
    X(cuMemcpyDtoH, 3020, cuMemcpyDtoH_v2, cuMemcpyDtoH_v2_ptds)                                   \
    X(cuMemcpyDtoD, 3020, cuMemcpyDtoD_v2, cuMemcpyDtoD_v2_ptds)                                   \
    X(cuMemcpyHtoDAsync, 3020, cuMemcpyHtoDAsync_v2, cuMemcpyHtoDAsync_v2_ptsz)                    \
    X(cuMemcpyDtoHAsync, 3020, cuMemcpyDtoHAsync_v2, cuMemcpyDtoHAsync_v2_ptsz)                    \
    X(cuMemcpyDtoDAsync, 3020, cuMemcpyDtoDAsync_v2, cuMemcpyDtoDAsync_v2_ptsz)                    \
    X(cuMemcpy2D, 3020, cuMemcpy2D_v2, cuMemcpy2D_v2_ptds)                                         \
    X(cuMemcpy2DUnaligned, 3020, cuMemcpy2DUnaligned_v2, cuMemcpy2DUnaligned_v2_ptds)              \
    X(cuMemcpy2DAsync, 3020, cuMemcpy2DAsync_v2, cuMemcpy2DAsync_v2_ptsz)                          \
    X(cuMemcpy3D, 3020, cuMemcpy3D_v2, cuMemcpy3D_v2_ptds)                                         \
    X(cuMemcpy3DAsync, 3020, cuMemcpy3DAsync_v2, cuMemcpy3DAsync_v2_ptsz)                          \
    X(cuMemsetD8, 3020, cuMemsetD8_v2, cuMemsetD8_v2_ptds)                                         \
    X(cuMemsetD16, 3020, cuMemsetD16_v2, cuMemsetD16_v2_ptds)                                      \
    X(cuMemsetD32, 3020, cuMemsetD32_v2, cuMemsetD32_v2_ptds)                                      \
    X(cuMemsetD8Async, 3020, cuMemsetD8Async, cuMemsetD8Async_ptsz)                                \
    X(cuMemsetD16Async, 3020, cuMemsetD16Async, cuMemsetD16Async_ptsz)                             \
    X(cuMemsetD32Async, 3020, cuMemsetD32Async, cuMemsetD32Async_ptsz)                             \
    X(cuStreamCreate, 2000, cuStreamCreate, NULL)                                                  \
    X(cuStreamCreateWithPriority, 5050, cuStreamCreateWithPriority, NULL)                          \
    X(cuStreamDestroy, 4000, cuStreamDestroy_v2, NULL)                                             \
    X(cuStreamSynchronize, 2000, cuStreamSynchronize, cuStreamSynchronize_ptsz)                    \
    X(cuStreamQuery, 2000, cuStreamQuery, cuStreamQuery_ptsz)                                      \
    X(cuStreamWaitEvent, 3020, cuStreamWaitEvent, cuStreamWaitEvent_ptsz)                          \
    X(cuStreamGetFlags, 5050, cuStreamGetFlags, cuStreamGetFlags_ptsz)                             \
    X(cuStreamGetPriority, 5050, cuStreamGetPriority, cuStreamGetPriority_ptsz)                    \
    X(cuStreamGetCtx, 9020, cuStreamGetCtx, cuStreamGetCtx_ptsz)                                   \
    X(cuStreamIsCapturing, 10000, cuStreamIsCapturing, cuStreamIsCapturing_ptsz)                   \
    X(cuStreamGetCaptureInfo, 11030, cuStreamGetCaptureInfo_v2, cuStreamGetCaptureInfo_v2_ptsz)    \
    X(cuStreamGetCaptureInfo, 12030, cuStreamGetCaptureInfo_v3, cuStreamGetCaptureInfo_v3_ptsz)    \
    X(cuStreamBeginCapture, 10010, cuStreamBeginCapture_v2, cuStreamBeginCapture_v2_ptsz)          \
    X(cuStreamBeginCaptureToGraph, 12030, cuStreamBeginCaptureToGraph,                             \
      cuStreamBeginCaptureToGraph_ptsz)                                                            \
    X(cuStreamEndCapture, 10000, cuStreamEndCapture, cuStreamEndCapture_ptsz)                      \
    X(cuLaunchHostFunc, 10000, cuLaunchHostFunc, cuLaunchHostFunc_ptsz)                            \
    X(cuEventCreate, 2000, cuEventCreate, NULL)                                                    \
    X(cuEventRecord, 2000, cuEventRecord, cuEventRecord_ptsz)                                      \
    X(cuEventRecordWithFlags, 11010, cuEventRecordWithFlags, cuEventRecordWithFlags_ptsz)          \
    X(cuEventQuery, 2000, cuEventQuery, NULL)                                                      \
    X(cuEventSynchronize, 2000, cuEventSynchronize, NULL)                                          \
    X(cuEventDestroy, 4000, cuEventDestroy_v2, NULL)                                               \
    X(cuEventElapsedTime, 2000, cuEventElapsedTime, NULL)                                          \
    X(cuEventElapsedTime, 12080, cuEventElapsedTime_v2, NULL)                                      \
    X(cuModuleLoad, 2000, cuModuleLoad, NULL)                                                      \
    X(cuModuleLoadData, 2000, cuModuleLoadData, NULL)                                              \
    X(cuModuleUnload, 2000, cuModuleUnload, NULL)                                                  \
    X(cuModuleGetFunction, 2000, cuModuleGetFunction, NULL)                                        \
    X(cuFuncGetModule, 11000, cuFuncGetModule, NULL)                                               \
    X(cuLibraryLoadData, 12000, cuLibraryLoadData, NULL)                                           \
    X(cuLibraryUnload, 12000, cuLibraryUnload, NULL)                                               \
    X(cuLibraryGetKernel, 12000, cuLibraryGetKernel, NULL)                                         \
    X(cuKernelGetFunction, 12000, cuKernelGetFunction, NULL)                                       \
    X(cuKernelGetName, 12030, cuKernelGetName, NULL)                                               \
    X(cuKernelGetParamInfo, 12040, cuKernelGetParamInfo, NULL)                                     \
    X(cuFuncGetName, 12030, cuFuncGetName, NULL)                                                   \
    X(cuFuncGetParamInfo, 12040, cuFuncGetParamInfo, NULL)                                         \
    X(cuFuncGetAttribute, 2020, cuFuncGetAttribute, NULL)                                          \
    X(cuLaunchKernel, 4000, cuLaunchKernel, cuLaunchKernel_ptsz)                                   \
    X(cuLaunchKernelEx, 11060, cuLaunchKernelEx, cuLaunchKernelEx_ptsz)                            \
    X(cuGraphInstantiate, 11000, cuGraphInstantiate_v2, NULL)                                      \
    X(cuGraphInstantiateWithFlags, 11040, cuGraphInstantiateWithFlags, NULL)                       \
    X(cuGraphLaunch, 10000, cuGraphLaunch, cuGraphLaunch_ptsz)                                     \
    X(cuGraphExecDestroy, 10000, cuGraphExecDestroy, NULL)                                         \
    X(cuGraphDestroy, 10000, cuGraphDestroy, NULL)                                                 \
    X(cuGraphCreate, 10000, cuGraphCreate, NULL)                                                   \
    X(cuGraphAddKernelNode, 12000, cuGraphAddKernelNode_v2, NULL)                                  \
    X(cuGraphGetNodes, 10000, cuGraphGetNodes, NULL)                                               \
    X(cuGraphGetEdges, 12030, cuGraphGetEdges_v2, NULL)                                            \
    X(cuGraphNodeGetType, 10000, cuGraphNodeGetType, NULL)                                         \
    X(cuGraphKernelNodeGetParams, 12000, cuGraphKernelNodeGetParams_v2, NULL)                      \
    X(cuGraphKernelNodeGetAttribute, 11000, cuGraphKernelNodeGetAttribute, NULL)                   \
    X(cuGraphMemcpyNodeGetParams, 10000, cuGraphMemcpyNodeGetParams, NULL)                         \
    X(cuGraphMemsetNodeGetParams, 10000, cuGraphMemsetNodeGetParams, NULL)                         \
    X(cuGraphMemAllocNodeGetParams, 11040, cuGraphMemAllocNodeGetParams, NULL)                     \
    X(cuGraphMemFreeNodeGetParams, 11040, cuGraphMemFreeNodeGetParams, NULL)                       \
    X(cuGraphExecUpdate, 12000, cuGraphExecUpdate_v2, NULL)                                        \
    X(cuGraphExecKernelNodeSetParams, 12000, cuGraphExecKernelNodeSetParams_v2, NULL)              \
    X(cuMemGetAllocationGranularity, 10020, cuMemGetAllocationGranularity, NULL)                   \
    X(cuMemCreate, 10020, cuMemCreate, NULL)                                                       \
    X(cuMemRelease, 10020, cuMemRelease, NULL)                                                     \
    X(cuMemAddressReserve, 10020, cuMemAddressReserve, NULL)                                       \
    X(cuMemAddressFree, 10020, cuMemAddressFree, NULL)                                             \
    X(cuMemMap, 10020, cuMemMap, NULL)                                                             \
    X(cuMemUnmap, 10020, cuMemUnmap, NULL)                                                         \
    X(cuMemSetAccess, 10020, cuMemSetAccess, NULL)
