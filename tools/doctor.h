/* tools/doctor.h: `woffload doctor`. */
#pragma once
#include <stdio.h>
#include "core/macro.h"
int wo_doctor(FILE *out, const char *policy_path, bool env);
