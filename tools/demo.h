/* tools/demo.h: `woffload demo`. */
#pragma once
#include <stdio.h>
#include "core/macro.h"
int wo_demo(FILE *out, const char *trace, const char *policy, bool replay_only);
