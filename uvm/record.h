/* uvm/record.h: WOFFLOAD_TRACE recording, driven by the consumer thread
 * (uvm/consumer.c calls these; nothing else does). The trace format and
 * writer are core/trace.h. */
#pragma once

#include "core/event.h"
#include "core/trace.h"

/* One event, in ring order, on the consumer thread. tag: the resolved tag
 * of a WO_EV_TAG event, else NULL. Opens the trace at the first event when
 * WOFFLOAD_TRACE is set; a no-op otherwise or after recording stopped. */
void wo_record_event(const struct wo_event *ev, const struct wo_trace_tag *tag);
/* After the last event (exit or reset): footer, flush, close. */
void wo_record_finish(void);
/* In a fork child: drop the parent's trace without writing to it; the child
 * records nothing (it would truncate the parent's file). */
void wo_record_forget(void);
