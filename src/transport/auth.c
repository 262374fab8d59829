#include "transport/auth.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "core/error.h"
#include "io/fsutil.h"

#define ZAP_ENDPOINT "inproc://zeromq.zap.01"
#define REFUSAL_QUIET_S 10 /* the same key from the same address is logged at most this often */

static int is_z85(const char *s, size_t n) {
    static const char alphabet[] =
        "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";
    for (size_t i = 0; i < n; i++)
        if (!s[i] || !strchr(alphabet, s[i])) return 0;
    return 1;
}

int dt_auth_read_key(char *out, const char *path, int secret, dt_error *err) {
    /* dt_read_file_stat: a FIFO or device is refused rather than waited on; the mode checked is
     * the one of the file read. A key is 40 characters and a newline: 127 bytes is plenty. */
    uint8_t *buf = NULL;
    size_t n = 0;
    struct stat st;
    int rc = dt_read_file_stat(&buf, &n, path, 127, &st, err);
    if (rc) {
        dt_error_wrap(err, rc, "key file: ");
        return rc;
    }
    if (secret && (st.st_mode & 077)) {
        free(buf);
        return dt_errorf(err, DT_EINVAL, "%s: secret key readable by group or others (mode %03o); chmod 600 it",
                         path, (unsigned)(st.st_mode & 0777));
    }
    rc = dt_auth_parse_key(out, (const char *)buf, n, path, err);
    explicit_bzero(buf, n);
    free(buf);
    return rc;
}

int dt_auth_parse_key(char *out, const char *text, size_t len, const char *label, dt_error *err) {
    size_t n = len;
    while (n > 0 && (text[n - 1] == '\n' || text[n - 1] == '\r' || text[n - 1] == ' ')) n--;
    if (n != DT_Z85_KEY_LEN || !is_z85(text, n))
        return dt_errorf(err, DT_EFORMAT, "%s: not a CURVE key (expected %d Z85 characters, as dtrain keygen writes)",
                         label, DT_Z85_KEY_LEN);
    memcpy(out, text, DT_Z85_KEY_LEN);
    out[DT_Z85_KEY_LEN] = '\0';
    /* Z85 characters can still spell a group beyond 32 bits, which libzmq refuses to decode. */
    uint8_t raw[32];
    if (!zmq_z85_decode(raw, out))
        return dt_errorf(err, DT_EFORMAT, "%s: not a CURVE key (its Z85 text does not decode to 32 bytes)", label);
    return DT_OK;
}

static int write_file(const char *path, const char *text, mode_t mode, dt_error *err) {
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, mode);
    if (fd < 0) return dt_errorf(err, DT_EIO, "%s: cannot create: %s", path, strerror(errno));
    size_t len = strlen(text);
    ssize_t w = write(fd, text, len);
    int rc = (w == (ssize_t)len && fchmod(fd, mode) == 0) ? DT_OK : dt_errorf(err, DT_EIO, "%s: write failed", path);
    if (close(fd) != 0 && rc == DT_OK) rc = dt_errorf(err, DT_EIO, "%s: write failed", path);
    return rc;
}

int dt_auth_keygen(const char *dir, const char *name, dt_error *err) {
    if (!dir || !*dir || !name || !*name || strchr(name, '/'))
        return dt_errorf(err, DT_EINVAL, "keygen needs a folder and a name without '/'");
    if (mkdir(dir, 0700) != 0 && errno != EEXIST)
        return dt_errorf(err, DT_EIO, "%s: cannot create folder: %s", dir, strerror(errno));
    char pub[DT_Z85_KEY_LEN + 1], sec[DT_Z85_KEY_LEN + 1];
    if (zmq_curve_keypair(pub, sec) != 0)
        return dt_errorf(err, DT_EINVAL, "zmq_curve_keypair: %s (libzmq built without CURVE?)", zmq_strerror(errno));
    char pub_path[4096], sec_path[4096], line[DT_Z85_KEY_LEN + 2];
    snprintf(pub_path, sizeof pub_path, "%s/%s.key", dir, name);
    snprintf(sec_path, sizeof sec_path, "%s/%s.secret", dir, name);
    snprintf(line, sizeof line, "%s\n", sec);
    int rc = write_file(sec_path, line, 0600, err);
    if (rc) return rc;
    snprintf(line, sizeof line, "%s\n", pub);
    if ((rc = write_file(pub_path, line, 0644, err))) unlink(sec_path);
    return rc;
}

/* A secret key file and the public key it implies. */
static int read_pair(dt_auth *a, const char *dir, const char *name, dt_error *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.secret", dir, name);
    int rc = dt_auth_read_key(a->secret_key, path, 1, err);
    if (rc) return rc;
    if (zmq_curve_public(a->public_key, a->secret_key) != 0)
        return dt_errorf(err, DT_EFORMAT, "%s: not a CURVE secret key", path);
    return DT_OK;
}



static int load_allowed(dt_auth *a, const char *dir, dt_error *err) {
    char folder[4096];
    snprintf(folder, sizeof folder, "%s/authorized", dir);
    DIR *d = opendir(folder);
    if (!d) return dt_errorf(err, DT_EIO, "%s: cannot open the authorized keys folder: %s", folder, strerror(errno));
    int rc = DT_OK, cap = 0;
    struct dirent *e;
    while (rc == DT_OK && (e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len < 5 || strcmp(e->d_name + len - 4, ".key")) continue;
        if (a->n_allowed == cap) {
            cap = cap ? 2 * cap : 8;
            void *p = realloc(a->allowed, (size_t)cap * sizeof *a->allowed);
            if (!p) {
                rc = dt_errorf(err, DT_ENOMEM, "authorized keys");
                break;
            }
            a->allowed = p;
        }
        char path[8192];
        snprintf(path, sizeof path, "%s/%s", folder, e->d_name);
        if ((rc = dt_auth_read_key(a->allowed[a->n_allowed], path, 0, err)) == DT_OK) a->n_allowed++;
    }
    closedir(d);
    if (rc == DT_OK && a->n_allowed == 0)
        rc = dt_errorf(err, DT_EINVAL, "%s: no *.key files: no client could connect", folder);

    return rc;
}

int dt_auth_load(dt_auth *a, const char *keys_dir, int server, dt_error *err) {
    memset(a, 0, sizeof *a);
    a->curve = 1;
    if (!keys_dir || !*keys_dir) return dt_errorf(err, DT_EINVAL, "--auth=curve needs --keys=DIR");
    int rc;
    if (server) {
        rc = read_pair(a, keys_dir, "server", err);
        if (!rc) rc = load_allowed(a, keys_dir, err);
    } else {
        char path[4096];
        snprintf(path, sizeof path, "%s/server.key", keys_dir);
        rc = read_pair(a, keys_dir, "client", err);
        if (!rc) rc = dt_auth_read_key(a->server_key, path, 0, err);
    }
    if (rc) dt_auth_free(a);
    return rc;
}

void dt_auth_free(dt_auth *a) {
    free(a->allowed);
    a->allowed = NULL;
    a->n_allowed = 0;
    memset(a->secret_key, 0, sizeof a->secret_key);
}

static int setopt_str(void *s, int opt, const char *v, const char *name, dt_error *err) {
    if (zmq_setsockopt(s, opt, v, strlen(v)) != 0)
        return dt_errorf(err, DT_ENET, "zmq_setsockopt(%s): %s", name, zmq_strerror(errno));
    return DT_OK;
}

/* CURVE wraps each frame in a MESSAGE command (command name, nonce, MAC, flags: 33 bytes) and
 * libzmq checks ZMQ_MAXMSGSIZE against the wrapped size: widen the socket's bound by that much. */
#define CURVE_FRAME_OVERHEAD 64
static int widen_maxmsg(void *sock, dt_error *err) {
    int64_t m = -1;
    size_t len = sizeof m;
    if (zmq_getsockopt(sock, ZMQ_MAXMSGSIZE, &m, &len) != 0)
        return dt_errorf(err, DT_ENET, "zmq_getsockopt(ZMQ_MAXMSGSIZE): %s", zmq_strerror(errno));
    if (m < 0 || m > INT64_MAX - CURVE_FRAME_OVERHEAD) return DT_OK;
    m += CURVE_FRAME_OVERHEAD;
    if (zmq_setsockopt(sock, ZMQ_MAXMSGSIZE, &m, sizeof m) != 0)
        return dt_errorf(err, DT_ENET, "zmq_setsockopt(ZMQ_MAXMSGSIZE): %s", zmq_strerror(errno));
    return DT_OK;
}

int dt_auth_client_socket(void *sock, const dt_auth *a, dt_error *err) {
    if (!a || !a->curve) return DT_OK;
    int rc = widen_maxmsg(sock, err);
    if (!rc) rc = setopt_str(sock, ZMQ_CURVE_SERVERKEY, a->server_key, "ZMQ_CURVE_SERVERKEY", err);
    if (!rc) rc = setopt_str(sock, ZMQ_CURVE_PUBLICKEY, a->public_key, "ZMQ_CURVE_PUBLICKEY", err);
    if (!rc) rc = setopt_str(sock, ZMQ_CURVE_SECRETKEY, a->secret_key, "ZMQ_CURVE_SECRETKEY", err);
    return rc;
}

/* ---- the server's ZAP handler ---------------------------------------------------------------- */

struct dt_zap {
    const dt_auth *auth;
    void *sock, *rep;        /* the CURVE server, the ZAP REP */
    FILE *log;
    pthread_mutex_t lock;    /* the refusals' log and counts: the handler's thread and the server's */
    char prefix[64];
    pthread_t thread;
    atomic_int stop;
    unsigned long refused;
    char last_key[DT_Z85_KEY_LEN + 1], last_addr[80];
    time_t last_logged;
    unsigned long quiet; /* refusals of last_key/last_addr not logged since */
};

/* who: "from ADDRESS" (ZAP) or "on ENDPOINT" (a failed handshake: libzmq does not say from where). */
static void log_refusal(dt_zap *z, const char *key, const char *who, const char *why) {
    const char *addr = who;
    pthread_mutex_lock(&z->lock);
    z->refused++;
    time_t now = time(NULL);
    if (!z->log ||
        (!strcmp(key, z->last_key) && !strcmp(addr, z->last_addr) && now - z->last_logged < REFUSAL_QUIET_S)) {
        if (z->log) z->quiet++;
        pthread_mutex_unlock(&z->lock);
        return;
    }
    fprintf(z->log, "%srefused a client %s: %s", z->prefix, who, why);
    if (*key) fprintf(z->log, " (key %s)", key);
    if (z->quiet) fprintf(z->log, "; %lu more refusals of the previous one not logged", z->quiet);
    fputc('\n', z->log);
    fflush(z->log);
    snprintf(z->last_key, sizeof z->last_key, "%s", key);
    snprintf(z->last_addr, sizeof z->last_addr, "%s", addr);
    z->last_logged = now;
    z->quiet = 0;
    pthread_mutex_unlock(&z->lock);
}

/* Reads all frames of one message (at most max) into f[]; returns the count, -1 on error. */
static int recv_frames(void *s, zmq_msg_t *f, int max) {
    int n = 0, more = 1;
    while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, s, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            for (int i = 0; i < n; i++) zmq_msg_close(&f[i]);
            return -1;
        }
        more = zmq_msg_more(&m);
        if (n < max) f[n++] = m;
        else zmq_msg_close(&m);
    }
    return n;
}

static void copy_text(char *out, size_t cap, zmq_msg_t *m) {
    size_t n = zmq_msg_size(m) < cap - 1 ? zmq_msg_size(m) : cap - 1;
    memcpy(out, zmq_msg_data(m), n);
    out[n] = 0;
}

/* One ZAP request (RFC 27): version, request id, domain, address, routing id, mechanism, key. */
static void answer_zap(dt_zap *z) {
    zmq_msg_t f[8];
    int n = recv_frames(z->rep, f, 8);
    if (n < 0) return;
    char addr[64] = "?", mech[16] = "", key[DT_Z85_KEY_LEN + 1] = "";
    int ok = 0;
    if (n >= 6) {
        copy_text(addr, sizeof addr, &f[3]);
        copy_text(mech, sizeof mech, &f[5]);
    }
    if (n == 7 && !strcmp(mech, "CURVE") && zmq_msg_size(&f[6]) == 32) {
        zmq_z85_encode(key, zmq_msg_data(&f[6]), 32);
        for (int i = 0; i < z->auth->n_allowed && !ok; i++) ok = !strcmp(key, z->auth->allowed[i]);
    }
    char who[80];
    snprintf(who, sizeof who, "from %s", addr);
    if (!ok) log_refusal(z, key, who, n == 7 && !strcmp(mech, "CURVE") ? "public key not authorized" : "not CURVE");
    const char *status = ok ? "200" : "400", *text = ok ? "OK" : "key not authorized";
    zmq_send(z->rep, "1.0", 3, ZMQ_SNDMORE);
    if (n >= 2) zmq_send(z->rep, zmq_msg_data(&f[1]), zmq_msg_size(&f[1]), ZMQ_SNDMORE);
    else zmq_send(z->rep, "", 0, ZMQ_SNDMORE);
    zmq_send(z->rep, status, 3, ZMQ_SNDMORE);
    zmq_send(z->rep, text, strlen(text), ZMQ_SNDMORE);
    zmq_send(z->rep, "", 0, ZMQ_SNDMORE); /* user id */
    zmq_send(z->rep, "", 0, 0);           /* metadata */
    for (int i = 0; i < n; i++) zmq_msg_close(&f[i]);
}

/* A client that failed the handshake before any key was checked (no CURVE, or the wrong server
 * key), heard on the server socket's monitor (the connection watch's: peers.c, which calls this).
 * Refusals by key are logged by answer_zap already. */
void dt_auth_server_handshake_failed(dt_zap *z, const char *endpoint) {
    if (!z) return;
    char who[80];
    snprintf(who, sizeof who, "on %s", endpoint);
    log_refusal(z, "", who, "handshake failed (client without CURVE, or with another server key)");
}

static void *zap_main(void *arg) {
    dt_zap *z = arg;
    while (!atomic_load(&z->stop)) {
        zmq_pollitem_t items[1] = {{z->rep, 0, ZMQ_POLLIN, 0}};
        if (zmq_poll(items, 1, 100) < 0 && errno != EINTR) break;
        if (items[0].revents & ZMQ_POLLIN) answer_zap(z);
    }
    return NULL;
}

int dt_auth_server_start(dt_zap **out, void *ctx, void *sock, const dt_auth *a, FILE *log,
                         const char *log_prefix, dt_error *err) {
    *out = NULL;
    if (!a || !a->curve) return DT_OK;
    dt_zap *z = dt_calloc(1, sizeof *z, "ZAP handler", err);
    if (!z) return DT_ENOMEM;
    z->auth = a;
    z->sock = sock;
    z->log = log;
    snprintf(z->prefix, sizeof z->prefix, "%s", log_prefix ? log_prefix : "");
    pthread_mutex_init(&z->lock, NULL);
    int rc = DT_OK, one = 1, zero = 0;
    if (!(z->rep = zmq_socket(ctx, ZMQ_REP)) || zmq_setsockopt(z->rep, ZMQ_LINGER, &zero, sizeof zero) ||
        zmq_bind(z->rep, ZAP_ENDPOINT) != 0) {
        rc = dt_errorf(err, DT_ENET, "ZAP handler on %s: %s", ZAP_ENDPOINT, zmq_strerror(errno));
        goto fail;
    }
    /* The handler is bound before the server socket binds: libzmq's CURVE server would accept
     * any client if no ZAP handler were listening. */
    if (zmq_setsockopt(sock, ZMQ_CURVE_SERVER, &one, sizeof one) != 0 ||
        (rc = setopt_str(sock, ZMQ_CURVE_SECRETKEY, a->secret_key, "ZMQ_CURVE_SECRETKEY", err)) ||
        (rc = widen_maxmsg(sock, err))) {
        if (!rc) rc = dt_errorf(err, DT_ENET, "CURVE server options: %s", zmq_strerror(errno));
        goto fail;
    }
    if (pthread_create(&z->thread, NULL, zap_main, z) != 0) {
        rc = dt_errorf(err, DT_ENOMEM, "cannot start the ZAP handler thread");
        goto fail;
    }
    *out = z;
    return DT_OK;
fail:
    if (z->rep) zmq_close(z->rep);
    pthread_mutex_destroy(&z->lock);
    free(z);
    return rc;
}

unsigned long dt_auth_server_stop(dt_zap *z) {
    if (!z) return 0;
    atomic_store(&z->stop, 1);
    pthread_join(z->thread, NULL);
    zmq_close(z->rep);
    if (z->log && z->quiet)
        fprintf(z->log, "%s%lu more refusals of the last refused client not logged\n", z->prefix, z->quiet);
    unsigned long n = z->refused;
    pthread_mutex_destroy(&z->lock);
    free(z);
    return n;
}
