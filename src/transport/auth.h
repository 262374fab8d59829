/* ZeroMQ CURVE security for the cluster (docs/security.md): authenticated and encrypted
 * connections between workers and ps tasks.
 *
 * Keys are Z85 text files (40 characters), one key per file:
 *   NAME.key     a public key;  NAME.secret  its secret key (mode 0600; `dtrain keygen` writes both).
 * A keys folder (--keys=DIR) holds what one process needs:
 *   ps:     DIR/server.secret (its own pair) and DIR/authorized/ *.key (the clients it accepts);
 *   worker: DIR/client.secret (its own pair) and DIR/server.key (the ps tasks' public key).
 * Public keys are derived from the secret files (zmq_curve_public), so a pair cannot disagree.
 *
 * The ps side answers ZAP (the ZeroMQ authentication protocol, inproc://zeromq.zap.01) from a
 * thread: a client whose public key is not authorized is refused and the refusal logged with the
 * key and the peer's address; a client that does not speak CURVE at all fails the handshake, which
 * the server socket's monitor (the connection watch's, peers.c: libzmq keeps one monitor per
 * socket) reports to dt_auth_server_handshake_failed, logged alike. */
#ifndef DT_TRANSPORT_AUTH_H
#define DT_TRANSPORT_AUTH_H

#include <stdio.h>

#include "dtrain.h"

#define DT_Z85_KEY_LEN 40

typedef struct dt_auth_s {
    int curve;                              /* 0: no security (NULL mechanism) */
    char public_key[DT_Z85_KEY_LEN + 1];    /* this process's pair */
    char secret_key[DT_Z85_KEY_LEN + 1];
    char server_key[DT_Z85_KEY_LEN + 1];    /* client: the ps tasks' public key */
    int n_allowed;                          /* server: authorized client keys */
    char (*allowed)[DT_Z85_KEY_LEN + 1];
} dt_auth;

/* Writes DIR/NAME.key and DIR/NAME.secret (0600) with a fresh key pair; creates DIR if needed.
 * Refuses to overwrite existing files. */
int dt_auth_keygen(const char *dir, const char *name, dt_error *err);

/* Reads one Z85 key file into out (DT_Z85_KEY_LEN + 1 chars); secret files must not be readable
 * by group or others. Errors name the file. */
int dt_auth_read_key(char *out, const char *path, int secret, dt_error *err);
/* The same for a key file's bytes (text, len; trailing newlines and spaces allowed): exactly
 * DT_Z85_KEY_LEN Z85 characters, else DT_EFORMAT naming label. */
int dt_auth_parse_key(char *out, const char *text, size_t len, const char *label, dt_error *err);

/* Loads what a ps (server 1) or a worker (server 0) needs from keys_dir (layout above).
 * dt_auth_free releases the allowed list. */
int dt_auth_load(dt_auth *a, const char *keys_dir, int server, dt_error *err);
void dt_auth_free(dt_auth *a);

/* Client sockets: sets the CURVE options before zmq_connect (a no-op when !a or !a->curve). */
int dt_auth_client_socket(void *sock, const dt_auth *a, dt_error *err);

/* Server: starts the ZAP handler in ctx and makes sock a CURVE server (before zmq_bind). log gets
 * one line per refusal, prefixed with log_prefix. *out is NULL when !a or !a->curve. */
typedef struct dt_zap dt_zap;
int dt_auth_server_start(dt_zap **out, void *ctx, void *sock, const dt_auth *a, FILE *log,
                         const char *log_prefix, dt_error *err);
/* A failed handshake on the server socket (a monitor event; endpoint: where), logged as a refusal.
 * Any thread; NULL: nothing. */
void dt_auth_server_handshake_failed(dt_zap *z, const char *endpoint);
/* Stops the handler thread and closes its sockets (before zmq_ctx_term). Refusals counted. */
unsigned long dt_auth_server_stop(dt_zap *z);

#endif
