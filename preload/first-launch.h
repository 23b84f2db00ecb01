/* preload/first-launch.h: under CUDA's lazy module loading with the copy
 * engine on (uvm.h: wo_uvm_lazy_gate, WOFFLOAD_PICKS_LAZY), a kernel's
 * first launch may load its module, and a load waits for the context's
 * work, an engine stream's wait for the copy thread among it. So the first
 * launch of each function (its parameter sizes read too, which may load it)
 * goes behind the copy engine's gate, as module loads do (launch.c):
 *
 *   bool g = wo_first_launch_begin(key);   (key: the launch key, core/kernel-name.h)
 *   ... the scan, the real launch ...
 *   wo_first_launch_end(g);
 *
 * The other first uses that load a function (its attributes, its cache
 * config, an occupancy query, cuFuncLoad, cuKernelGetFunction) take the
 * same gate with the same first-sight table (first-launch.c); a module's
 * function looked up by name (cuModuleGetFunction) takes it at each lookup,
 * as module loads do (launch.c). A load none of these sees is a stall the copy engine's
 * rescue ends. Two field reads a launch while the copy engine is off. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

/* Whether key's launch is its function's first (the first thread to see
 * it; a full table says yes: gated in vain, never one missed) under the
 * lazy gate: then it is behind the gate (counted: interpose
 * gated_first_launches), and wo_first_launch_end(true) lets it out. */
bool wo_first_launch_begin(uintptr_t key);
void wo_first_launch_end(bool gated);
