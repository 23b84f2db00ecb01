/* tools/doctor.h: `woffload doctor`. */
#pragma once
#include <stdio.h>
#include "core/macro.h"
int wo_doctor(FILE *out, const char *policy_path, bool env);
/* Whether this tool runs from the build tree it was built in: it then uses
 * that tree's library and data, an installed tool the installed ones. */
bool wo_tool_in_build_tree(void);
