/* Monotonic time for durations and rates (never wall-clock: it must not jump). */
#ifndef DT_CORE_CLOCK_H
#define DT_CORE_CLOCK_H

#include <stdint.h>

/* Seconds from an arbitrary fixed point (CLOCK_MONOTONIC). */
double dt_seconds(void);

/* Microseconds from the same point, as an integer (deadlines and ages). */
int64_t dt_clock_us(void);

/* Microseconds of CPU the calling thread has used (CLOCK_THREAD_CPUTIME_ID): set against the wall
 * clock, how much of a span the thread ran and how much it waited (for a core, or for I/O). */
int64_t dt_thread_cpu_us(void);

#endif
