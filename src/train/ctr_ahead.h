/* A click-log reader read one batch ahead (docs/sparse.md, "Prefetch"): the training loop takes
 * batch t while batch t + 1 is already read, so that a cluster worker can pull t + 1's sparse rows
 * under t's compute (dt_net_set_lookahead). The reader's batches are valid only until its next call,
 * so both are copies held here, alternating: batch t stays valid while t + 1 is read. */
#ifndef DT_TRAIN_CTR_AHEAD_H
#define DT_TRAIN_CTR_AHEAD_H

#include "data/ctr.h"

typedef struct dt_ctr_ahead dt_ctr_ahead;

int dt_ctr_ahead_create(dt_ctr_ahead **out, dt_error *err);
void dt_ctr_ahead_free(dt_ctr_ahead *a);
/* The next batch of r into *cur (as dt_ctr_next: n 0 once a one-pass reader is done), and the one
 * after it into *next (NULL when there is none). Both stay valid until the call after next. */
int dt_ctr_ahead_next(dt_ctr_ahead *a, dt_ctr_reader *r, dt_ctr_batch *cur, const dt_ctr_batch **next,
                      dt_error *err);

#endif
