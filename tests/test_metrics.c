/* The metrics registry, its text exposition, the HTTP server (routes, 404/405, a port in use, the
 * address to bind) and the status JSON a peer sends (parsed back, hostile input refused). */
#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "metrics/http.h"
#include "metrics/metrics.h"
#include "metrics/status.h"
#include "test.h"

static void test_exposition(void) {
    dt_metrics *m;
    CHECK(dt_metrics_create(&m, "worker", 3, NULL) == 0);
    dt_metric *c = dt_metrics_counter(m, "dtrain_things_total", "Things.", NULL);
    dt_metric *g = dt_metrics_gauge(m, "dtrain_level", "A level.", "ps=\"1\"");
    double bounds[] = {0.1, 1};
    dt_metric *h = dt_metrics_histogram(m, "dtrain_wait_seconds", "Waits.", NULL, bounds, 2);
    dt_metric *a = dt_metrics_age(m, "dtrain_age_seconds", "Age.", NULL);
    CHECK(dt_metrics_counter(m, "dtrain_things_total", "Things.", NULL) == c); /* the same series again */
    CHECK(dt_metrics_gauge(m, "dtrain_things_total", "a counter's name as a gauge", NULL) == NULL);
    CHECK(dt_metrics_counter(NULL, "x", "", NULL) == NULL);
    dt_metric_add(NULL, 1); /* metrics off: nothing */
    dt_metric_add(c, 2);
    dt_metric_add(c, 3);
    dt_metric_set(g, -1.5);
    dt_metric_observe(h, 0.05);
    dt_metric_observe(h, 0.5);
    dt_metric_observe(h, 5);
    CHECK(isnan(dt_metric_value(a)));
    CHECK_NEAR(dt_metric_value(c), 5, 0);
    CHECK_NEAR(dt_metrics_lookup(m, "dtrain_level", "ps=\"1\""), -1.5, 0);
    CHECK(isnan(dt_metrics_lookup(m, "dtrain_level", NULL)));
    char *text;
    size_t len;
    CHECK(dt_metrics_render(m, &text, &len, NULL) == 0);
    CHECK(strlen(text) == len);
    CHECK(strstr(text, "# HELP dtrain_things_total Things.\n# TYPE dtrain_things_total counter\n"
                       "dtrain_things_total{job=\"worker\",task=\"3\"} 5\n") != NULL);
    CHECK(strstr(text, "dtrain_level{job=\"worker\",task=\"3\",ps=\"1\"} -1.5\n") != NULL);
    CHECK(strstr(text, "# TYPE dtrain_wait_seconds histogram\n") != NULL);
    CHECK(strstr(text, "dtrain_wait_seconds_bucket{job=\"worker\",task=\"3\",le=\"0.1\"} 1\n") != NULL);
    CHECK(strstr(text, "dtrain_wait_seconds_bucket{job=\"worker\",task=\"3\",le=\"1\"} 2\n") != NULL);
    CHECK(strstr(text, "dtrain_wait_seconds_bucket{job=\"worker\",task=\"3\",le=\"+Inf\"} 3\n") != NULL);
    CHECK(strstr(text, "dtrain_wait_seconds_sum{job=\"worker\",task=\"3\"} 5.5") != NULL);
    CHECK(strstr(text, "dtrain_wait_seconds_count{job=\"worker\",task=\"3\"} 3\n") != NULL);
    CHECK(strstr(text, "dtrain_age_seconds{job=\"worker\",task=\"3\"} NaN\n") != NULL);
    free(text);
    dt_metric_touch(a);
    CHECK(dt_metric_value(a) >= 0 && dt_metric_value(a) < 5);
    dt_metrics_free(m);
}

/* One HTTP/1.0 request to 127.0.0.1:port; the whole answer into buf. */
static int get(int port, const char *request, char *buf, size_t cap) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (s < 0 || connect(s, (struct sockaddr *)&a, sizeof a) != 0) return -1;
    if (write(s, request, strlen(request)) != (ssize_t)strlen(request)) return -1;
    size_t n = 0;
    ssize_t r;
    while (n + 1 < cap && (r = read(s, buf + n, cap - 1 - n)) > 0) n += (size_t)r;
    buf[n] = 0;
    close(s);
    return (int)n;
}

static void test_server(void) {
    dt_metrics *m;
    dt_status *st;
    CHECK(dt_metrics_create(&m, "ps", 0, NULL) == 0);
    CHECK(dt_status_create(&st, m, NULL, NULL) == 0);
    dt_metric_set(dt_metrics_gauge(m, "dtrain_global_step", "Step.", NULL), 42);
    /* ps 0's work coordinator (dynamic sharding): its figures reach the status page. */
    dt_metric_set(dt_metrics_gauge(m, "dtrain_work_epoch", "Epoch.", NULL), 3);
    dt_metric_set(dt_metrics_gauge(m, "dtrain_work_units", "Units.", "state=\"held\""), 2);
    dt_metric_add(dt_metrics_counter(m, "dtrain_work_losses_total", "Lost.", NULL), 1);
    dt_http *h;
    dt_error err = {0};
    CHECK(dt_http_start(&h, "127.0.0.1", 0, m, st, &err) == 0);
    int port = dt_http_port(h);
    CHECK(port > 0);
    static char buf[1 << 16];
    CHECK(get(port, "GET /metrics HTTP/1.0\r\n\r\n", buf, sizeof buf) > 0);
    CHECK(strstr(buf, "HTTP/1.0 200") == buf || strstr(buf, "HTTP/1.1 200") == buf);
    CHECK(strstr(buf, "text/plain; version=0.0.4") != NULL);
    CHECK(strstr(buf, "dtrain_global_step{job=\"ps\",task=\"0\"} 42\n") != NULL);
    CHECK(get(port, "GET /status.json HTTP/1.0\r\n\r\n", buf, sizeof buf) > 0);
    const char *body = strstr(buf, "\r\n\r\n");
    dt_status_self self;
    CHECK(body && dt_status_parse_self(body + 4, strlen(body + 4), &self, NULL) == 0);
    CHECK(!strcmp(self.job, "ps") && self.task == 0 && self.global_step == 42);
    CHECK(self.work_epoch == 3 && self.units_held == 2 && self.work_losses == 1 && isnan(self.units_done));
    CHECK(get(port, "GET / HTTP/1.0\r\n\r\n", buf, sizeof buf) > 0);
    CHECK(strstr(buf, "text/html") != NULL && strstr(buf, "status.json") != NULL);
    CHECK(get(port, "GET /checkpoint/model.ckpt HTTP/1.0\r\n\r\n", buf, sizeof buf) > 0);
    CHECK(strstr(buf, " 404 ") != NULL);
    CHECK(get(port, "PUT /metrics HTTP/1.0\r\nContent-Length: 0\r\n\r\n", buf, sizeof buf) > 0);
    CHECK(strstr(buf, " 405 ") != NULL);

    /* The same port again: refused, named. */
    dt_http *h2 = NULL;
    CHECK(dt_http_start(&h2, "127.0.0.1", port, m, st, &err) == DT_ENET);
    CHECK(h2 == NULL);
    CHECK_MSG(strstr(err.msg, "Address already in use") && strstr(err.msg, "--metrics_port"), "%s", err.msg);
    CHECK(dt_http_start(&h2, "localhost", 0, m, st, &err) == DT_EINVAL); /* addresses only */
    CHECK(dt_http_start(&h2, "192.0.2.1", 0, m, st, &err) == DT_ENET);   /* not this machine's */
    CHECK_MSG(strstr(err.msg, "not an address of this machine") != NULL, "%s", err.msg);
    dt_http_stop(h);
    dt_status_free(st);
    dt_metrics_free(m);
}

static void test_listen_spec(void) {
    char host[64];
    int port;
    CHECK(dt_http_listen_spec(NULL, 0, host, sizeof host, &port, NULL) == 0 && port == 0);
    CHECK(dt_http_listen_spec(NULL, 9100, host, sizeof host, &port, NULL) == 0 && port == 9100 &&
          !strcmp(host, "127.0.0.1"));
    CHECK(dt_http_listen_spec("0.0.0.0:9200", 0, host, sizeof host, &port, NULL) == 0 && port == 9200 &&
          !strcmp(host, "0.0.0.0"));
    CHECK(dt_http_listen_spec("[::1]:9300", 0, host, sizeof host, &port, NULL) == 0 && port == 9300 &&
          !strcmp(host, "[::1]"));
    CHECK(dt_http_listen_spec("::1", 9400, host, sizeof host, &port, NULL) == 0 && port == 9400 && !strcmp(host, "::1"));
    dt_error err = {0};
    CHECK(dt_http_listen_spec("127.0.0.1:9100", 9101, host, sizeof host, &port, &err) == DT_EINVAL);
    CHECK(strstr(err.msg, "different ports") != NULL);
    CHECK(dt_http_listen_spec("127.0.0.1:70000", 0, host, sizeof host, &port, &err) == DT_EINVAL);
    CHECK(dt_http_listen_spec("127.0.0.1:", 0, host, sizeof host, &port, &err) == DT_EINVAL);
}

static void test_parse_self(void) {
    dt_status_self s;
    dt_error err = {0};
    const char *ok = "{\"self\":{\"job\":\"worker\",\"task\":1,\"state\":\"training\",\"global_step\":7,\"loss\":null}}";
    CHECK(dt_status_parse_self(ok, strlen(ok), &s, &err) == 0);
    CHECK(!strcmp(s.job, "worker") && s.task == 1 && s.global_step == 7 && isnan(s.loss) && isnan(s.stale));
    const char *bad[] = {"", "[]", "{\"self\":1}", "{\"self\":{\"job\":\"worker\",\"task\":-1,\"state\":\"x\"}}",
                         "{\"self\":{\"job\":\"worker\",\"task\":1.5,\"state\":\"x\"}}",
                         "{\"self\":{\"job\":\"a very long job name indeed\",\"task\":1,\"state\":\"x\"}}",
                         "{\"self\":{\"job\":\"worker\",\"task\":1,\"state\":\"x\",\"loss\":\"low\"}}",
                         "{\"self\":{\"job\":\"worker\",\"task\":1,\"task\":2,\"state\":\"x\"}}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err.msg[0] = 0;
        CHECK_MSG(dt_status_parse_self(bad[i], strlen(bad[i]), &s, &err) == DT_EFORMAT, "%s", bad[i]);
        CHECK(err.msg[0] != 0);
    }
    size_t big = DT_STATUS_MAX_SELF_BYTES + 1;
    char *huge = calloc(big, 1);
    CHECK(huge && dt_status_parse_self(huge, big, &s, &err) == DT_EFORMAT);
    free(huge);
}

/* A binary model's validations carry an AUC: a fourth figure in status.json's validation points and
 * the gauge dtrain_validation_auc, which an image model (NAN) never gets. */
static void test_validation_auc(void) {
    dt_metrics *m;
    dt_status *s;
    dt_error err = {0};
    CHECK(dt_metrics_create(&m, "worker", 0, NULL) == 0);
    CHECK(dt_status_create(&s, m, NULL, &err) == 0);
    dt_status_start(s, 100, 0, 32);
    char *json, *text;
    size_t len;
    dt_status_validation(s, 10, 0.5, 0.75, NAN);
    CHECK(dt_status_json(s, &json, &len, &err) == 0);
    CHECK_MSG(strstr(json, "\"validation\":[[10.0,0.5,0.75]]") != NULL, "%s", json);
    free(json);
    CHECK(dt_metrics_render(m, &text, &len, NULL) == 0);
    CHECK(strstr(text, "dtrain_validation_auc") == NULL);
    free(text);
    dt_status_validation(s, 20, 0.25, 0.875, 0.8125);
    CHECK(dt_status_json(s, &json, &len, &err) == 0);
    CHECK_MSG(strstr(json, "[20.0,0.25,0.875,0.8125]]") != NULL, "%s", json);
    free(json);
    CHECK(dt_metrics_render(m, &text, &len, NULL) == 0);
    CHECK_MSG(strstr(text, "dtrain_validation_auc{job=\"worker\",task=\"0\"} 0.8125\n") != NULL, "%s", text);
    free(text);
    dt_status_free(s);
    dt_metrics_free(m);
}

int main(void) {
    RUN(test_exposition);
    RUN(test_validation_auc);
    RUN(test_server);
    RUN(test_listen_spec);
    RUN(test_parse_self);
    return test_summary();
}
