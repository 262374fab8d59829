/* Non-finite floats (NaN, infinities) where they enter a process: a checkpoint read back, the
 * parameters a ps serves. One pass over the bits: it vectorises, reads unaligned data (a file
 * image) and, unlike isfinite(), cannot be folded away by -ffinite-math-only. */
#ifndef DT_CORE_FINITE_H
#define DT_CORE_FINITE_H

#include <stddef.h>

/* The index of the first NaN or infinity among the n floats at x (need not be aligned), or n if
 * every one is finite. */
size_t dt_first_nonfinite(const void *x, size_t n);

#endif
