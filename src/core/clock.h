/* Monotonic time for durations and rates (never wall-clock: it must not jump). */
#ifndef DT_CORE_CLOCK_H
#define DT_CORE_CLOCK_H

/* Seconds from an arbitrary fixed point (CLOCK_MONOTONIC). */
double dt_seconds(void);

#endif
