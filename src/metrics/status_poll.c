#include "metrics/status_poll.h"

#include <curl/curl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error.h"

#define POLL_MS 1000
#define FETCH_TIMEOUT_MS 800

typedef struct {
    char url[DT_HOST_MAX + 32];
    char *buf;                    /* [DT_STATUS_MAX_SELF_BYTES] this peer's latest answer */
    size_t len;
    int too_long;
} peer;

struct dt_peer_poll {
    pthread_t thread;
    atomic_int stop;
    dt_status *s;
    peer *peers;
    int n;
};

/* Keeps what fits; a longer answer is refused rather than cut into JSON that parses. */
static size_t on_data(char *data, size_t size, size_t nmemb, void *user) {
    peer *p = user;
    size_t n = size * nmemb;
    if (n > DT_STATUS_MAX_SELF_BYTES - p->len) {
        p->too_long = 1;
        return 0; /* libcurl stops the transfer */
    }
    memcpy(p->buf + p->len, data, n);
    p->len += n;
    return n;
}

static void *poll_thread(void *arg) {
    dt_peer_poll *pp = arg;
    CURL *c = curl_easy_init();
    if (!c) return NULL;
    while (!atomic_load(&pp->stop)) {
        for (int i = 0; i < pp->n && !atomic_load(&pp->stop); i++) {
            peer *p = &pp->peers[i];
            p->len = 0, p->too_long = 0;
            curl_easy_setopt(c, CURLOPT_URL, p->url);
            curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
            curl_easy_setopt(c, CURLOPT_WRITEDATA, p);
            curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)FETCH_TIMEOUT_MS);
            curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
            curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http");
            curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
            curl_easy_setopt(c, CURLOPT_PROXY, ""); /* a peer of the cluster, never through a proxy */
            long code = 0;
            dt_status_self self;
            if (curl_easy_perform(c) == CURLE_OK && curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code) == CURLE_OK &&
                code == 200 && dt_status_parse_self(p->buf, p->len, &self, NULL) == DT_OK)
                dt_status_peer(pp->s, &self);
        }
        for (int t = 0; t < POLL_MS / 50 && !atomic_load(&pp->stop); t++) nanosleep(&(struct timespec){0, 50000000L}, NULL);
    }
    curl_easy_cleanup(c);
    return NULL;
}

static void peers_free(dt_peer_poll *p) {
    for (int i = 0; i < p->n; i++) free(p->peers[i].buf);
    free(p->peers);
    free(p);
}

int dt_peer_poll_start(dt_peer_poll **out, const char *list, dt_status *s, dt_error *err) {
    *out = NULL;
    if (!list || !*list) return DT_OK;
    int n = 1;
    for (const char *q = list; *q; q++) n += *q == ',';
    if (n > DT_PEERS_MAX) return dt_errorf(err, DT_EINVAL, "--metrics_peers: %d addresses, at most %d", n, DT_PEERS_MAX);
    dt_peer_poll *p = dt_calloc(1, sizeof *p, "metrics peers", err);
    if (!p) return DT_ENOMEM;
    if (!(p->peers = dt_calloc((size_t)n, sizeof *p->peers, "metrics peers", err))) {
        free(p);
        return DT_ENOMEM;
    }
    p->s = s;
    int rc = DT_OK;
    for (const char *q = list; *q && !rc;) {
        size_t len = strcspn(q, ",");
        /* host:port (the last colon; IPv6 in brackets), only these characters, so nothing else
         * can reach the URL. */
        const char *colon = NULL;
        for (size_t k = 0; k < len; k++)
            if (q[k] == ':') colon = q + k;
        size_t digits = colon ? (size_t)(q + len - colon - 1) : 0;
        int port = colon ? atoi(colon + 1) : 0;
        int clean = len < DT_HOST_MAX && colon && colon > q && digits > 0 && digits <= 5 &&
                    strspn(colon + 1, "0123456789") >= digits && port >= 1 && port <= 65535;
        for (size_t k = 0; clean && k < len; k++)
            clean = q[k] && strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-:[]", q[k]) != NULL;
        if (!clean) {
            rc = dt_errorf(err, DT_EINVAL, "--metrics_peers: '%.*s' is not host:port", (int)(len < 200 ? len : 200), q);
            break;
        }
        peer *e = &p->peers[p->n];
        snprintf(e->url, sizeof e->url, "http://%.*s/status.json", (int)len, q);
        if (!(e->buf = dt_malloc(DT_STATUS_MAX_SELF_BYTES, "metrics peer answer", err))) rc = DT_ENOMEM;
        p->n++;
        q += len;
        if (*q == ',') q++;
    }
    if (!rc && curl_global_init(CURL_GLOBAL_NOTHING) != CURLE_OK) rc = dt_errorf(err, DT_ENOMEM, "libcurl: cannot initialise");
    if (!rc && pthread_create(&p->thread, NULL, poll_thread, p) != 0)
        rc = dt_errorf(err, DT_ENOMEM, "metrics peers: cannot start a thread");
    if (rc) {
        peers_free(p);
        return rc;
    }
    *out = p;
    return DT_OK;
}

void dt_peer_poll_stop(dt_peer_poll *p) {
    if (!p) return;
    atomic_store(&p->stop, 1);
    pthread_join(p->thread, NULL);
    peers_free(p);
}
