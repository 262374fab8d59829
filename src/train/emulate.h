/* Benchmarks of scale only (--debug_emulate_compute_ms, docs/testbed.md): a step's forward and
 * backward replaced by sleeps, so many workers share few cores without slowing each other. */
#ifndef DT_TRAIN_EMULATE_H
#define DT_TRAIN_EMULATE_H

#include "model/net.h"

/* Sleeps ms in all: a third for the forward, two thirds for the backward (the backward computes
 * two products per layer to the forward's one), spread over the layers in proportion to their
 * multiply-adds, calling the net's hooks (model/net.h) where forward and backward would, so an
 * overlapped exchange meets the same order of events as in real training. A hook that blocks
 * delays the layers after it, as it would delay real compute. */
void dt_emulate_step(dt_net *net, int ms);

/* Sleeps until ms after `since` (dt_seconds): a click-log model's real step padded to ms, so its
 * rows still travel as its batches say (nothing if the step took longer). */
void dt_emulate_until(double since, int ms);

#endif
