#include "cluster/cluster.h"

#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/error.h"

/* ---- small text helpers ---- */

static int is_blank(char ch) { return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r'; }

static void trim(const char **s, size_t *len) {
    while (*len && is_blank(**s)) (*s)++, (*len)--;
    while (*len && is_blank((*s)[*len - 1])) (*len)--;
}

/* Quotes untrusted text for a message: at most 64 characters, non-printables as '?'. */
static const char *quote(char out[80], const char *s, size_t len) {
    size_t n = 0;
    out[n++] = '"';
    for (size_t i = 0; i < len && n < 66; i++) {
        unsigned char ch = (unsigned char)s[i];
        out[n++] = (ch >= 32 && ch < 127) ? (char)ch : '?';
    }
    if (len > 64) out[n++] = '.', out[n++] = '.', out[n++] = '.';
    out[n++] = '"';
    out[n] = '\0';
    return out;
}

const char *dt_text_quote(char out[80], const char *s, size_t len) { return quote(out, s, len); }

static int is_name_char(char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           ch == '.' || ch == '-' || ch == '_';
}

static int is_v6_char(char ch) {
    return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f') || (ch >= 'A' && ch <= 'F') ||
           ch == ':' || ch == '.';
}

const char *dt_job_name(dt_job job) {
    switch (job) {
    case DT_JOB_PS: return "ps";
    case DT_JOB_WORKER: return "worker";
    case DT_JOB_EVALUATOR: return "evaluator";
    default: return "none";
    }
}

/* ---- addresses ---- */

int dt_addr_parse(dt_addr *a, const char *text, size_t len, const char *field, dt_error *err) {
    char q[80];
    memset(a, 0, sizeof *a);
    trim(&text, &len);
    if (len == 0) return dt_errorf(err, DT_EINVAL, "%s: empty address (expected host:port)", field);
    const char *colon; /* the host/port separator */
    if (text[0] == '[') {
        const char *close = memchr(text, ']', len);
        if (!close)
            return dt_errorf(err, DT_EINVAL, "%s: %s: missing ']' after the IPv6 address", field,
                             quote(q, text, len));
        if (close == text + 1)
            return dt_errorf(err, DT_EINVAL, "%s: %s: empty host", field, quote(q, text, len));
        for (const char *p = text + 1; p < close; p++)
            if (!is_v6_char(*p))
                return dt_errorf(err, DT_EINVAL, "%s: %s: bad character in IPv6 address", field,
                                 quote(q, text, len));
        colon = close + 1;
        if (colon >= text + len || *colon != ':')
            return dt_errorf(err, DT_EINVAL, "%s: %s: missing port (expected [v6]:port)", field,
                             quote(q, text, len));
    } else {
        colon = NULL;
        for (size_t i = 0; i < len; i++)
            if (text[i] == ':') {
                if (colon)
                    return dt_errorf(err, DT_EINVAL,
                                     "%s: %s: more than one ':' (write IPv6 as [addr]:port)",
                                     field, quote(q, text, len));
                colon = text + i;
            }
        if (!colon)
            return dt_errorf(err, DT_EINVAL, "%s: %s: missing port (expected host:port)", field,
                             quote(q, text, len));
        if (colon == text)
            return dt_errorf(err, DT_EINVAL, "%s: %s: empty host", field, quote(q, text, len));
        for (const char *p = text; p < colon; p++)
            if (!is_name_char(*p))
                return dt_errorf(err, DT_EINVAL, "%s: %s: bad character '%c' in host", field,
                                 quote(q, text, len), (*p >= 32 && *p < 127) ? *p : '?');
    }
    size_t host_len = (size_t)(colon - text);
    if (host_len >= DT_HOST_MAX)
        return dt_errorf(err, DT_EINVAL, "%s: %s: host longer than %d characters", field,
                         quote(q, text, len), DT_HOST_MAX - 1);
    const char *port = colon + 1;
    size_t port_len = len - host_len - 1;
    if (port_len == 0)
        return dt_errorf(err, DT_EINVAL, "%s: %s: missing port after ':'", field, quote(q, text, len));
    long value = 0;
    for (size_t i = 0; i < port_len; i++) {
        if (port[i] < '0' || port[i] > '9')
            return dt_errorf(err, DT_EINVAL, "%s: %s: port %s is not a number", field,
                             quote(q, text, len), quote((char[80]){0}, port, port_len));
        if (value <= 65535) value = value * 10 + (port[i] - '0');
    }
    if (value < 1 || value > 65535)
        return dt_errorf(err, DT_EINVAL, "%s: %s: port out of range (1..65535)", field,
                         quote(q, text, len));
    memcpy(a->host, text, host_len);
    a->host[host_len] = '\0';
    a->port = (int)value;
    return 0;
}

int dt_addr_is_loopback(const dt_addr *a) {
    return strcasecmp(a->host, "localhost") == 0 || strncmp(a->host, "127.", 4) == 0 ||
           strcmp(a->host, "[::1]") == 0;
}

static int endpoint(char *buf, size_t n, const char *host, int port) {
    int w = snprintf(buf, n, "tcp://%s:%d", host, port);
    return (w < 0 || (size_t)w >= n) ? DT_EINVAL : 0;
}

int dt_addr_connect_endpoint(const dt_addr *a, char *buf, size_t n) {
    return endpoint(buf, n, a->host, a->port);
}

int dt_addr_bind_endpoint(const dt_addr *a, char *buf, size_t n) {
    /* The transport binds to interfaces and IP addresses, not to names (transport/conn.h). */
    return endpoint(buf, n, strcasecmp(a->host, "localhost") == 0 ? "127.0.0.1" : a->host, a->port);
}

/* --bind's value: "*", HOST or HOST:PORT (IPv6 in brackets, with or without a port); *port 0:
 * none given. */
static int parse_bind(const char *text, char host[DT_HOST_MAX], int *port, dt_error *err) {
    size_t len = strlen(text);
    dt_addr a;
    *port = 0;
    if (!strcmp(text, "*")) {
        strcpy(host, "*");
        return DT_OK;
    }
    const char *close = strrchr(text, ']'), *colon = strchr(text, ':');
    int has_port = text[0] == '[' ? close && close[1] == ':' : colon != NULL;
    if (has_port) {
        if (dt_addr_parse(&a, text, len, "--bind", err)) return DT_EINVAL;
        *port = a.port;
    } else {
        char with_port[DT_HOST_MAX + 8];
        if (len >= DT_HOST_MAX)
            return dt_errorf(err, DT_EINVAL, "--bind: host longer than %d characters", DT_HOST_MAX - 1);
        snprintf(with_port, sizeof with_port, "%s:1", text);
        char q[80];
        if (dt_addr_parse(&a, with_port, strlen(with_port), "--bind", NULL))
            return dt_errorf(err, DT_EINVAL, "--bind: %s is not an address (expected *, HOST or HOST:PORT, IPv6 "
                             "in brackets: [::])", quote(q, text, len));
    }
    strcpy(host, a.host);
    return DT_OK;
}

int dt_bind_check(const char *bind, dt_error *err) {
    char host[DT_HOST_MAX];
    int port;
    return bind && *bind ? parse_bind(bind, host, &port, err) : DT_OK;
}

/* host as an address the transport binds, into out (IPv6 in brackets): literals as they are, a name
 * as its first IPv4 address, else its first IPv6 one (what the transport connects a name to:
 * transport/conn.h). */
static int resolve_host(const char *host, char *out, size_t n, const char *field, dt_error *err) {
    struct in_addr a4;
    struct in6_addr a6;
    char inner[DT_HOST_MAX];
    if (!strcmp(host, "*") || inet_pton(AF_INET, host, &a4) == 1) {
        snprintf(out, n, "%s", host);
        return DT_OK;
    }
    if (host[0] == '[') {
        snprintf(inner, sizeof inner, "%.*s", (int)strlen(host) - 2, host + 1);
        if (inet_pton(AF_INET6, inner, &a6) != 1)
            return dt_errorf(err, DT_EINVAL, "%s: %s is not an IPv6 address", field, host);
        snprintf(out, n, "%s", host);
        return DT_OK;
    }
    if (!strcasecmp(host, "localhost")) {
        snprintf(out, n, "127.0.0.1");
        return DT_OK;
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    int gai = getaddrinfo(host, NULL, &hints, &res);
    if (gai != 0)
        return dt_errorf(err, DT_ENET, "%s: cannot resolve %s: %s (--bind ADDRESS binds another address)", field,
                         host, gai == EAI_SYSTEM ? strerror(errno) : gai_strerror(gai));
    const struct addrinfo *pick = NULL;
    for (const struct addrinfo *ai = res; ai && !pick; ai = ai->ai_next)
        if (ai->ai_family == AF_INET) pick = ai;
    for (const struct addrinfo *ai = res; ai && !pick; ai = ai->ai_next)
        if (ai->ai_family == AF_INET6) pick = ai;
    char text[INET6_ADDRSTRLEN] = "";
    int v6 = pick && pick->ai_family == AF_INET6;
    if (pick && !v6)
        inet_ntop(AF_INET, &((const struct sockaddr_in *)pick->ai_addr)->sin_addr, text, sizeof text);
    else if (pick)
        inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)pick->ai_addr)->sin6_addr, text, sizeof text);
    freeaddrinfo(res);
    if (!text[0]) return dt_errorf(err, DT_ENET, "%s: %s has no IPv4 or IPv6 address", field, host);
    snprintf(out, n, v6 ? "[%s]" : "%s", text);
    return DT_OK;
}

/* Whether an address (as resolve_host writes it) is one of this host's: a socket binds it. Only
 * "not available" counts as no; anything else is left for the transport's bind to report. */
static int is_local(const char *addr, int *loopback) {
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    socklen_t len;
    char inner[DT_HOST_MAX];
    struct sockaddr_in *a4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&ss;
    *loopback = 0;
    if (addr[0] == '[') {
        snprintf(inner, sizeof inner, "%.*s", (int)strlen(addr) - 2, addr + 1);
        a6->sin6_family = AF_INET6;
        if (inet_pton(AF_INET6, inner, &a6->sin6_addr) != 1) return 1;
        *loopback = IN6_IS_ADDR_LOOPBACK(&a6->sin6_addr);
        len = sizeof *a6;
    } else {
        a4->sin_family = AF_INET;
        if (inet_pton(AF_INET, addr, &a4->sin_addr) != 1) return 1;
        *loopback = (ntohl(a4->sin_addr.s_addr) >> 24) == 127;
        len = sizeof *a4;
    }
    int s = socket(ss.ss_family, SOCK_STREAM, 0);
    if (s < 0) return 1;
    int ok = bind(s, (struct sockaddr *)&ss, len) == 0 || errno != EADDRNOTAVAIL;
    close(s);
    return ok;
}

int dt_addr_bind_resolve(const dt_addr *a, const char *field, const char *bind, char *buf, size_t n, char *warn,
                         size_t warn_n, dt_error *err) {
    char host[DT_HOST_MAX], addr[DT_HOST_MAX];
    int port = 0, loopback = 0;
    const char *from = field;
    if (warn_n) warn[0] = '\0';
    if (bind && *bind) {
        if (parse_bind(bind, host, &port, err)) return DT_EINVAL;
        from = "--bind";
    } else {
        snprintf(host, sizeof host, "%s", a->host);
    }
    if (!port) port = a->port;
    int rc = resolve_host(host, addr, sizeof addr, from, err);
    if (rc) return rc;
    if (strcmp(addr, "*") && !is_local(addr, &loopback))
        return dt_errorf(err, DT_ENET, "%s: %s%s%s%s is not an address of this host (behind NAT, or a service "
                         "address?): bind another with --bind (0.0.0.0: every IPv4 interface; or this host's "
                         "interface address)", from, host, strcmp(host, addr) ? " (" : "", strcmp(host, addr) ? addr : "",
                         strcmp(host, addr) ? ")" : "");
    /* Debian maps the host's own name to 127.0.1.1: such a ps is out of other hosts' reach. */
    if (loopback && !(bind && *bind) && !dt_addr_is_loopback(a) && warn_n)
        snprintf(warn, warn_n, "%s: %s resolves to %s here, a loopback address: workers on other hosts cannot "
                 "reach this ps (fix the name in /etc/hosts, or pass --bind with this host's interface address "
                 "or 0.0.0.0)", field, a->host, addr);
    if (endpoint(buf, n, addr, port)) return dt_errorf(err, DT_EINVAL, "%s: address too long", from);
    return DT_OK;
}

int dt_addr_ipc_endpoint(const dt_addr *a, char *buf, size_t n) {
    if (!dt_addr_is_loopback(a)) return DT_EINVAL;
    const char *off = getenv("DTRAIN_IPC");
    if (off && !strcmp(off, "0")) return DT_EINVAL;
    const char *dir = getenv("TMPDIR");
    if (!dir || !*dir) dir = "/tmp";
    const char *host = strcasecmp(a->host, "localhost") == 0 ? "127.0.0.1" : a->host;
    int w = snprintf(buf, n, "ipc://%s/dtrain-%s:%d.sock", dir, host, a->port);
    /* 108 bytes is the kernel's limit on a Unix socket path (sun_path). */
    return (w < 0 || (size_t)w >= n || w - 6 >= 108) ? DT_EINVAL : 0;
}

/* ---- building a definition ---- */

/* Addresses with the label of where they came from, so a duplicate names both fields. */
typedef struct {
    dt_addr addr;
    char label[48];
} entry;

typedef struct {
    entry *e;
    int n, cap;
} entries;

static int entries_push(entries *l, const char *label_fmt, const char *name, int index,
                        dt_error *err) {
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 8;
        entry *e = realloc(l->e, (size_t)cap * sizeof *e);
        if (!e) return dt_errorf(err, DT_ENOMEM, "out of memory for the cluster address list");
        l->e = e;
        l->cap = cap;
    }
    memset(&l->e[l->n], 0, sizeof l->e[l->n]);
    snprintf(l->e[l->n].label, sizeof l->e[l->n].label, label_fmt, name, index);
    l->n++;
    return 0;
}

static int check_duplicates(const entries *all, dt_error *err) {
    for (int i = 0; i < all->n; i++)
        for (int j = 0; j < i; j++) {
            const dt_addr *a = &all->e[i].addr, *b = &all->e[j].addr;
            if (a->port == b->port && strcasecmp(a->host, b->host) == 0)
                return dt_errorf(err, DT_EINVAL, "%s: duplicate address %s:%d (also %s)",
                                 all->e[i].label, a->host, a->port, all->e[j].label);
        }
    return 0;
}

static int copy_list(dt_addr **out, const entries *all, int first, int n, dt_error *err) {
    *out = NULL;
    if (n == 0) return 0;
    *out = dt_calloc((size_t)n, sizeof **out, "the cluster address list", err);
    if (!*out) return DT_ENOMEM;
    for (int i = 0; i < n; i++) (*out)[i] = all->e[first + i].addr;
    return 0;
}

/* all holds ps entries [0, n_ps), then workers, then evaluators. */
static int finish(dt_cluster *c, const entries *all, int n_ps, int n_workers, int n_evaluators,
                  dt_error *err) {
    int rc = check_duplicates(all, err);
    if (rc) return rc;
    if ((rc = copy_list(&c->ps, all, 0, n_ps, err)) ||
        (rc = copy_list(&c->workers, all, n_ps, n_workers, err)) ||
        (rc = copy_list(&c->evaluators, all, n_ps + n_workers, n_evaluators, err)))
        return rc;
    c->n_ps = n_ps;
    c->n_workers = n_workers;
    c->n_evaluators = n_evaluators;
    c->distributed = 1;
    c->is_chief = c->job == DT_JOB_WORKER && c->task_index == 0;
    return 0;
}

void dt_cluster_single(dt_cluster *c) {
    memset(c, 0, sizeof *c);
    c->job = DT_JOB_NONE;
    c->is_chief = 1;
    c->source = "single process";
}

void dt_cluster_clear(dt_cluster *c) {
    if (!c) return;
    free(c->ps);
    free(c->workers);
    free(c->evaluators);
    dt_cluster_single(c);
}

/* Leaves c single and frees what was built if rc is an error. */
static int done(dt_cluster *c, entries *all, int rc) {
    free(all->e);
    if (rc) dt_cluster_clear(c);
    return rc;
}

/* ---- flags ---- */

static int parse_host_list(entries *all, const char *list, const char *flag, int *n_out,
                           dt_error *err) {
    const char *s = list;
    size_t len = strlen(list);
    trim(&s, &len);
    if (len == 0) return dt_errorf(err, DT_EINVAL, "%s: empty list (expected host:port,...)", flag);
    int n = 0;
    const char *p = s, *end = s + len;
    for (;;) {
        const char *comma = memchr(p, ',', (size_t)(end - p));
        const char *stop = comma ? comma : end;
        if (n == DT_CLUSTER_MAX_TASKS)
            return dt_errorf(err, DT_EINVAL, "%s: more than %d addresses", flag,
                             DT_CLUSTER_MAX_TASKS);
        int rc = entries_push(all, "%s[%d]", flag, n, err);
        if (rc) return rc;
        entry *e = &all->e[all->n - 1];
        if ((rc = dt_addr_parse(&e->addr, p, (size_t)(stop - p), e->label, err))) return rc;
        n++;
        if (!comma) break;
        p = comma + 1;
    }
    *n_out = n;
    return 0;
}

/* Strict decimal int; negative values parse (so they can be refused by name). A value beyond
 * long long saturates, which every range check refuses: it is never cut to the digits that fit. */
static int parse_index(const char *s, size_t len, long long *out) {
    trim(&s, &len);
    size_t i = 0;
    int neg = 0;
    if (i < len && (s[i] == '-' || s[i] == '+')) neg = s[i++] == '-';
    if (i == len) return -1;
    long long v = 0;
    for (; i < len; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        int d = s[i] - '0';
        v = v > (LLONG_MAX - d) / 10 ? LLONG_MAX : v * 10 + d;
    }
    *out = neg ? -v : v;
    return 0;
}

/* shown: the index as the user wrote it (NULL: print index), so that a refusal quotes the value as
 * given. */
static int check_index(long long index, const char *shown, int n, const char *field, const char *job,
                       dt_error *err) {
    char num[32];
    if (!shown) snprintf(num, sizeof num, "%lld", index), shown = num;
    if (index < 0) return dt_errorf(err, DT_EINVAL, "%s: %s is negative", field, shown);
    if (index >= n)
        return dt_errorf(err, DT_EINVAL, "%s: %s is out of range for job %s (%d task%s: 0..%d)",
                         field, shown, job, n, n == 1 ? "" : "s", n - 1);
    return 0;
}

int dt_cluster_from_flags(dt_cluster *c, const char *ps_hosts, const char *worker_hosts,
                          const char *job_name, const char *task_index, dt_error *err) {
    dt_cluster_single(c);
    entries all = {0};
    int rc, n_ps = 0, n_workers = 0;
    if (!worker_hosts)
        return dt_errorf(err, DT_EINVAL,
                         "--worker_hosts: missing (needed with --ps_hosts, --job_name, --task_index)");
    if (ps_hosts && (rc = parse_host_list(&all, ps_hosts, "--ps_hosts", &n_ps, err)))
        return done(c, &all, rc);
    if ((rc = parse_host_list(&all, worker_hosts, "--worker_hosts", &n_workers, err)))
        return done(c, &all, rc);
    char q[80];
    if (!job_name)
        return done(c, &all, dt_errorf(err, DT_EINVAL, "--job_name: missing (ps or worker)"));
    if (strcmp(job_name, "ps") == 0) {
        c->job = DT_JOB_PS;
        if (n_ps == 0)
            return done(c, &all, dt_errorf(err, DT_EINVAL,
                                           "--job_name: ps, but --ps_hosts is missing"));
    } else if (strcmp(job_name, "worker") == 0) {
        c->job = DT_JOB_WORKER;
    } else {
        return done(c, &all, dt_errorf(err, DT_EINVAL, "--job_name: unknown job %s (ps or worker)",
                                       quote(q, job_name, strlen(job_name))));
    }
    long long index = 0;
    if (task_index && parse_index(task_index, strlen(task_index), &index))
        return done(c, &all, dt_errorf(err, DT_EINVAL, "--task_index: %s is not an integer",
                                       quote(q, task_index, strlen(task_index))));
    char shown[48] = "0";
    if (task_index) { /* the digits as given, blanks trimmed (parse_index accepted them) */
        const char *t = task_index;
        size_t tl = strlen(task_index);
        trim(&t, &tl);
        snprintf(shown, sizeof shown, "%.*s%s", (int)(tl < 40 ? tl : 40), t, tl > 40 ? "..." : "");
    }
    if ((rc = check_index(index, shown, c->job == DT_JOB_PS ? n_ps : n_workers, "--task_index",
                          job_name, err)))
        return done(c, &all, rc);
    c->task_index = (int)index;
    c->source = "flags";
    return done(c, &all, finish(c, &all, n_ps, n_workers, 0, err));
}

/* ---- TF_CONFIG ---- */

/* cluster.<key>: absent -> *n = 0; otherwise a non-empty array of "host:port" strings. */
static int tf_list(entries *all, json_t *cluster, const char *key, int *n_out, dt_error *err) {
    *n_out = 0;
    json_t *arr = json_object_get(cluster, key);
    if (!arr) return 0;
    if (!json_is_array(arr))
        return dt_errorf(err, DT_EFORMAT,
                         "TF_CONFIG cluster.%s: wrong type (expected an array of \"host:port\")",
                         key);
    size_t n = json_array_size(arr);
    if (n == 0) return dt_errorf(err, DT_EINVAL, "TF_CONFIG cluster.%s: empty list", key);
    if (n > DT_CLUSTER_MAX_TASKS)
        return dt_errorf(err, DT_EINVAL, "TF_CONFIG cluster.%s: more than %d addresses", key,
                         DT_CLUSTER_MAX_TASKS);
    for (size_t i = 0; i < n; i++) {
        json_t *s = json_array_get(arr, i);
        int rc = entries_push(all, "TF_CONFIG cluster.%s[%d]", key, (int)i, err);
        if (rc) return rc;
        entry *e = &all->e[all->n - 1];
        if (!json_is_string(s))
            return dt_errorf(err, DT_EFORMAT, "%s: wrong type (expected a \"host:port\" string)",
                             e->label);
        if ((rc = dt_addr_parse(&e->addr, json_string_value(s), json_string_length(s), e->label,
                                err)))
            return rc;
    }
    *n_out = (int)n;
    return 0;
}

static int tf_parse(dt_cluster *c, entries *all, json_t *root, dt_error *err) {
    if (!json_is_object(root))
        return dt_errorf(err, DT_EFORMAT, "TF_CONFIG: wrong type (expected a JSON object)");
    json_t *cluster = json_object_get(root, "cluster"), *task = json_object_get(root, "task");
    if (cluster && !json_is_object(cluster))
        return dt_errorf(err, DT_EFORMAT, "TF_CONFIG cluster: wrong type (expected an object)");
    if (task && !json_is_object(task))
        return dt_errorf(err, DT_EFORMAT, "TF_CONFIG task: wrong type (expected an object)");
    int empty_cluster = !cluster || json_object_size(cluster) == 0;
    if (empty_cluster && !task) return 0; /* as TensorFlow: no cluster, a local process */
    if (empty_cluster)
        return dt_errorf(err, DT_EINVAL, "TF_CONFIG cluster: missing or empty, but task is given");
    if (!task) return dt_errorf(err, DT_EINVAL, "TF_CONFIG task: missing (which task is this?)");

    /* Entries in the order ps, chief, worker, evaluator, so the lists come out contiguous. */
    int rc, n_ps, n_chief, n_master, n_worker, n_eval;
    if ((rc = tf_list(all, cluster, "ps", &n_ps, err))) return rc;
    if (json_object_get(cluster, "chief") && json_object_get(cluster, "master"))
        return dt_errorf(err, DT_EINVAL,
                         "TF_CONFIG cluster.master: given together with cluster.chief (use one)");
    if ((rc = tf_list(all, cluster, "chief", &n_chief, err))) return rc;
    if ((rc = tf_list(all, cluster, "master", &n_master, err))) return rc;
    const char *chief_key = n_master ? "master" : "chief";
    n_chief += n_master;
    if (n_chief > 1)
        return dt_errorf(err, DT_EINVAL, "TF_CONFIG cluster.%s: %d chiefs (at most one)",
                         chief_key, n_chief);
    if ((rc = tf_list(all, cluster, "worker", &n_worker, err))) return rc;
    if ((rc = tf_list(all, cluster, "evaluator", &n_eval, err))) return rc;
    if (n_chief + n_worker == 0)
        return dt_errorf(err, DT_EINVAL, "TF_CONFIG cluster: no chief and no worker");

    json_t *type = json_object_get(task, "type"), *jindex = json_object_get(task, "index");
    if (!type) return dt_errorf(err, DT_EINVAL, "TF_CONFIG task.type: missing");
    if (!json_is_string(type))
        return dt_errorf(err, DT_EFORMAT, "TF_CONFIG task.type: wrong type (expected a string)");
    if (jindex && !json_is_integer(jindex))
        return dt_errorf(err, DT_EFORMAT, "TF_CONFIG task.index: wrong type (expected an integer)");
    long long index = jindex ? (long long)json_integer_value(jindex) : 0;
    const char *t = json_string_value(type);
    char q[80];
    if (strcmp(t, "chief") == 0 || strcmp(t, "master") == 0) {
        if (n_chief == 0)
            return dt_errorf(err, DT_EINVAL, "TF_CONFIG task.type: %s, but the cluster has no %s",
                             t, t);
        if ((rc = check_index(index, NULL, 1, "TF_CONFIG task.index", t, err))) return rc;
        c->job = DT_JOB_WORKER;
        c->task_index = 0;
    } else if (strcmp(t, "worker") == 0) {
        if ((rc = check_index(index, NULL, n_worker, "TF_CONFIG task.index", t, err))) return rc;
        c->job = DT_JOB_WORKER;
        c->task_index = (int)index + n_chief; /* the chief is worker 0 */
    } else if (strcmp(t, "ps") == 0) {
        if (n_ps == 0)
            return dt_errorf(err, DT_EINVAL, "TF_CONFIG task.type: ps, but cluster.ps is missing");
        if ((rc = check_index(index, NULL, n_ps, "TF_CONFIG task.index", t, err))) return rc;
        c->job = DT_JOB_PS;
        c->task_index = (int)index;
    } else if (strcmp(t, "evaluator") == 0) {
        /* Often not listed in the cluster; then there is one, index 0. */
        if ((rc = check_index(index, NULL, n_eval ? n_eval : 1, "TF_CONFIG task.index", t, err)))
            return rc;
        c->job = DT_JOB_EVALUATOR;
        c->task_index = (int)index;
    } else {
        return dt_errorf(err, DT_EINVAL,
                         "TF_CONFIG task.type: unknown job %s (chief, master, worker, ps or evaluator)",
                         quote(q, t, json_string_length(type)));
    }
    c->source = "TF_CONFIG";
    return finish(c, all, n_ps, n_chief + n_worker, n_eval, err);
}

int dt_cluster_from_tf_config(dt_cluster *c, const char *text, size_t len, dt_error *err) {
    dt_cluster_single(c);
    const char *s = text;
    size_t n = len;
    trim(&s, &n);
    if (n == 0) return 0;
    json_error_t jerr;
    json_t *root = json_loadb(s, n, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return dt_errorf(err, DT_EFORMAT, "TF_CONFIG: not valid JSON: line %d column %d: %s",
                         jerr.line, jerr.column, jerr.text);
    entries all = {0};
    int rc = tf_parse(c, &all, root, err);
    json_decref(root);
    return done(c, &all, rc);
}

/* ---- local ---- */

int dt_cluster_local(dt_cluster *c, int n_ps, int n_workers, const int *ports, dt_job job,
                     int task_index, dt_error *err) {
    dt_cluster_single(c);
    if (n_ps < 0 || n_ps > DT_CLUSTER_MAX_TASKS)
        return dt_errorf(err, DT_EINVAL, "--ps: %d ps tasks (0..%d)", n_ps, DT_CLUSTER_MAX_TASKS);
    if (n_workers < 1 || n_workers > DT_CLUSTER_MAX_TASKS)
        return dt_errorf(err, DT_EINVAL, "--workers: %d workers (1..%d)", n_workers,
                         DT_CLUSTER_MAX_TASKS);
    entries all = {0};
    int rc = 0;
    for (int i = 0; i < n_ps + n_workers && !rc; i++) {
        int is_ps = i < n_ps;
        if ((rc = entries_push(&all, "local %s %d", is_ps ? "ps" : "worker", is_ps ? i : i - n_ps,
                               err)))
            break;
        entry *e = &all.e[all.n - 1];
        if (ports[i] < 1 || ports[i] > 65535)
            rc = dt_errorf(err, DT_EINVAL, "%s: port %d out of range (1..65535)", e->label, ports[i]);
        snprintf(e->addr.host, sizeof e->addr.host, "127.0.0.1");
        e->addr.port = ports[i];
    }
    if (rc) return done(c, &all, rc);
    c->job = job;
    if (job == DT_JOB_PS || job == DT_JOB_WORKER) {
        if ((rc = check_index(task_index, NULL, job == DT_JOB_PS ? n_ps : n_workers, "task index",
                              dt_job_name(job), err)))
            return done(c, &all, rc);
        c->task_index = task_index;
    } else if (job != DT_JOB_NONE) {
        return done(c, &all, dt_errorf(err, DT_EINVAL, "job: %s is not part of a local cluster",
                                       dt_job_name(job)));
    }
    c->source = "local";
    return done(c, &all, finish(c, &all, n_ps, n_workers, 0, err));
}

/* ---- the ranks of a cluster manager's job ---- */

int dt_cluster_from_ranks(dt_cluster *c, const dt_addr *addrs, int n, int n_ps, int rank, const char *source,
                          dt_error *err) {
    dt_cluster_single(c);
    if (n_ps < 1 || n <= n_ps || n - n_ps > DT_CLUSTER_MAX_TASKS || n_ps > DT_CLUSTER_MAX_TASKS)
        return dt_errorf(err, DT_EINVAL, "%d tasks: not %d ps and 1..%d workers", n, n_ps, DT_CLUSTER_MAX_TASKS);
    if (rank < 0 || rank >= n) return dt_errorf(err, DT_EINVAL, "rank %d is out of range 0..%d", rank, n - 1);
    entries all = {0};
    int rc = 0;
    for (int i = 0; i < n && !rc; i++)
        if (!(rc = entries_push(&all, "%s %d", "rank", i, err))) all.e[all.n - 1].addr = addrs[i];
    if (rc) return done(c, &all, rc);
    c->job = rank < n_ps ? DT_JOB_PS : DT_JOB_WORKER;
    c->task_index = rank < n_ps ? rank : rank - n_ps;
    c->source = source;
    return done(c, &all, finish(c, &all, n_ps, n - n_ps, 0, err));
}

/* ---- precedence and argv ---- */

int dt_cluster_resolve(dt_cluster *c, const char *ps_hosts, const char *worker_hosts,
                       const char *job_name, const char *task_index, const char *tf_config,
                       dt_error *err) {
    if (ps_hosts || worker_hosts || job_name || task_index)
        return dt_cluster_from_flags(c, ps_hosts, worker_hosts, job_name, task_index, err);
    if (tf_config) return dt_cluster_from_tf_config(c, tf_config, strlen(tf_config), err);
    dt_cluster_single(c);
    return 0;
}

int dt_cluster_parse_args(dt_cluster *c, int *argc, char **argv, dt_error *err) {
    static const char *const names[4] = {"--ps_hosts", "--worker_hosts", "--job_name",
                                         "--task_index"};
    const char *value[4] = {0};
    dt_cluster_single(c);
    int n = *argc;
    unsigned char *used = dt_calloc(n > 0 ? (size_t)n : 1, 1, "argument flags", err);
    if (!used) return DT_ENOMEM;
    int rc = 0;
    for (int i = 1; i < n && !rc; i++) {
        const char *arg = argv[i];
        if (!arg || strcmp(arg, "--") == 0) break;
        for (int f = 0; f < 4; f++) {
            size_t len = strlen(names[f]);
            if (strncmp(arg, names[f], len) != 0 || (arg[len] != '\0' && arg[len] != '=')) continue;
            if (value[f]) {
                rc = dt_errorf(err, DT_EINVAL, "%s: given twice", names[f]);
                break;
            }
            used[i] = 1;
            if (arg[len] == '=') {
                value[f] = arg + len + 1;
            } else if (i + 1 < n && argv[i + 1] && strncmp(argv[i + 1], "--", 2) != 0) {
                value[f] = argv[++i];
                used[i] = 1;
            } else {
                rc = dt_errorf(err, DT_EINVAL, "%s: missing value", names[f]);
            }
            break;
        }
    }
    if (!rc) rc = dt_cluster_resolve(c, value[0], value[1], value[2], value[3], getenv("TF_CONFIG"), err);
    if (!rc) { /* consume only on success, keeping the order of the rest */
        int out = 0;
        for (int i = 0; i < n; i++)
            if (!used[i]) argv[out++] = argv[i];
        if (out < n) argv[out] = NULL; /* argv[n] is already NULL in main's argv */
        *argc = out;
    }
    free(used);
    return rc;
}

/* ---- describing ---- */

const dt_addr *dt_cluster_self(const dt_cluster *c) {
    if (!c->distributed) return NULL;
    switch (c->job) {
    case DT_JOB_PS: return c->task_index < c->n_ps ? &c->ps[c->task_index] : NULL;
    case DT_JOB_WORKER: return c->task_index < c->n_workers ? &c->workers[c->task_index] : NULL;
    case DT_JOB_EVALUATOR:
        return c->task_index < c->n_evaluators ? &c->evaluators[c->task_index] : NULL;
    default: return NULL;
    }
}

/* Appends to buf at *used, never past n; a truncated line stays NUL-terminated. */
static void append(char *buf, size_t n, size_t *used, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void append(char *buf, size_t n, size_t *used, const char *fmt, ...) {
    if (*used >= n) return;
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(buf + *used, n - *used, fmt, ap);
    va_end(ap);
    if (w > 0) *used = (size_t)w >= n - *used ? n : *used + (size_t)w;
}

static void append_list(char *buf, size_t n, size_t *used, const char *name, const dt_addr *a,
                        int count) {
    enum { SHOWN = 8 };
    append(buf, n, used, " %s=[", name);
    for (int i = 0; i < count && i < SHOWN; i++)
        append(buf, n, used, "%s%s:%d", i ? "," : "", a[i].host, a[i].port);
    if (count > SHOWN) append(buf, n, used, ",... %d more", count - SHOWN);
    append(buf, n, used, "]");
}

void dt_cluster_describe(const dt_cluster *c, char *buf, size_t n) {
    if (!buf || n == 0) return;
    buf[0] = '\0';
    size_t used = 0;
    if (!c->distributed) {
        append(buf, n, &used, "single process (no cluster)");
        return;
    }
    switch (c->job) {
    case DT_JOB_PS: append(buf, n, &used, "ps %d of %d;", c->task_index, c->n_ps); break;
    case DT_JOB_WORKER:
        append(buf, n, &used, "worker %d of %d (%s);", c->task_index, c->n_workers,
               c->is_chief ? "chief" : "not chief");
        break;
    case DT_JOB_EVALUATOR:
        append(buf, n, &used, "evaluator %d (not in the training cluster);", c->task_index);
        break;
    default: append(buf, n, &used, "cluster of %d ps, %d workers;", c->n_ps, c->n_workers); break;
    }
    append_list(buf, n, &used, "ps", c->ps, c->n_ps);
    append_list(buf, n, &used, "workers", c->workers, c->n_workers);
    if (c->n_evaluators) append_list(buf, n, &used, "evaluators", c->evaluators, c->n_evaluators);
    append(buf, n, &used, "; from %s", c->source);
}

int dt_cluster_format_hosts(const dt_cluster *c, dt_job job, char *buf, size_t n, dt_error *err) {
    const dt_addr *a = job == DT_JOB_PS ? c->ps : job == DT_JOB_WORKER ? c->workers : c->evaluators;
    int count = job == DT_JOB_PS ? c->n_ps : job == DT_JOB_WORKER ? c->n_workers : c->n_evaluators;
    if (job == DT_JOB_NONE) count = 0;
    if (!buf || n == 0) return dt_errorf(err, DT_EINVAL, "%s hosts: no buffer", dt_job_name(job));
    buf[0] = '\0';
    size_t used = 0;
    for (int i = 0; i < count; i++) {
        int w = snprintf(buf + used, n - used, "%s%s:%d", i ? "," : "", a[i].host, a[i].port);
        if (w < 0 || (size_t)w >= n - used)
            return dt_errorf(err, DT_EINVAL, "%s hosts: list longer than %zu bytes",
                             dt_job_name(job), n - 1);
        used += (size_t)w;
    }
    return 0;
}
