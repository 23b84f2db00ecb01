/* tools/policy-gguf.h: `woffload-policy gguf` (tools/policy-gguf.c). */
#pragma once

/* argv[0] is "gguf", the arguments after it follow. Returns the exit
 * status: 0, 1 on a failure, or 2 for bad input (a message naming the
 * option or file printed). */
int wo_policy_gguf_main(int argc, char **argv);
