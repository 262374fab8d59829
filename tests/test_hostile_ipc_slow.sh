#!/usr/bin/env bash
# Hostile peers, second round, the same-host socket alone (docs/security.md): endless messages
# over the ps's Unix socket for 8 s while a sync cluster trains. The ps's resident size must stay
# within 256 MiB of where it was (B = 89 MiB: tests/test_hostile_round2_slow.sh). Measured +100 to
# +144 MiB; +652 to +773 MiB when a same-host sender was cut only a second into its message and
# the frames freed stayed resident in libzmq's threads' malloc arenas.
# Labelled slow (release build only): the sanitizer's allocator keeps its own resident memory.
export DTRAIN_ROUND2_ATTACKS=ipc DTRAIN_ROUND2_SECONDS=8 DTRAIN_ROUND2_BOUND_MB=256
exec bash "$(dirname "$0")/test_hostile_round2_slow.sh"
