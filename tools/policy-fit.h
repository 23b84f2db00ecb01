/* tools/policy-fit.h: `woffload-policy fit` (tools/policy-fit.c). */
#pragma once

/* argv: the arguments after `fit`. Returns the exit status: 0, or 2 for bad
 * input (a message naming the option or file printed). */
int wo_policy_fit_main(int argc, char **argv);
