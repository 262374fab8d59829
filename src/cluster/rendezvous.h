/* The rendezvous: MPI launchers tell a rank its number but not where the other ranks run, so at
 * start every rank sends rank 0 its number and port over TCP, at --rendezvous HOST:PORT (rank 0's
 * host), and rank 0 answers every rank with the whole list, or with the one-line reason it
 * refuses. The data path stays the transport's (transport/conn.h); this is only the start.
 * Protocol in docs/protocol.md, "Rendezvous"; why not MPI itself in docs/cluster.md.
 *
 * A rank's host is the address rank 0 sees its connection come from (so it is an address the
 * network routes to that rank); rank 0's is the --rendezvous address. Rank 0 refuses (and tells
 * every rank): a rank claimed twice, world sizes that differ, two ranks at one host:port, and a
 * world incomplete at the deadline. Every wait ends at deadline_ms: no rank waits for a peer that
 * will never come. Bounds: lines of at most 128 bytes, a hello within 5 s of connecting, at most
 * size + 15 connections at once (when full, the one waiting longest without a hello is closed for
 * a newcomer), any other talker is dropped unanswered; a rank whose connection is closed before
 * its answer tries again until its deadline. Unauthenticated, like --auth=none (docs/security.md). */
#ifndef DT_CLUSTER_RENDEZVOUS_H
#define DT_CLUSTER_RENDEZVOUS_H

#include <stdio.h>

#include "cluster/cluster.h"

typedef struct {
    const char *at;        /* "host:port": rank 0 listens there, the others connect */
    int rank, size;        /* this rank, and the world (2..2 * DT_CLUSTER_MAX_TASKS) */
    int port, local;       /* this rank's own port, and its local id (for messages) */
    const char *rank_var, *size_var, *local_var; /* where rank, size and local came from */
    int deadline_ms;       /* from the start of the call */
    FILE *log;             /* rank 0: connections closed without a hello (rate-limited); NULL: quiet */
} dt_rendezvous;

/* Fills addrs[size] (ranks in order) or fails with a one-line message. */
int dt_rendezvous_gather(const dt_rendezvous *rv, dt_addr *addrs, dt_error *err);
/* Rank 0's answer as a rank reads it (buf: len bytes and a NUL; it is modified): "ok SIZE" and one
 * "host port" line per rank into addrs[rv->size], or rank 0's refusal, or a one-line error. Bytes
 * from the network: fuzz/fuzz_rendezvous.c. */
int dt_rendezvous_parse_answer(const dt_rendezvous *rv, char *buf, size_t len, dt_addr *addrs, dt_error *err);

#endif
