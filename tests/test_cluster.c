/* Cluster definitions: flags in both forms and their consumption from argv, TF_CONFIG (with and
 * without chief, legacy master, evaluator, Kubeflow addresses, unknown keys), the local definition,
 * precedence, every refusal (the message must name the field), endpoints and the log line. */
#include <stdlib.h>

#include "cluster/cluster.h"
#include "test.h"

static int flags(dt_cluster *c, const char *ps, const char *wk, const char *job, const char *idx,
                 dt_error *err) {
    memset(err, 0, sizeof *err);
    return dt_cluster_from_flags(c, ps, wk, job, idx, err);
}

static int tf(dt_cluster *c, const char *json, dt_error *err) {
    memset(err, 0, sizeof *err);
    return dt_cluster_from_tf_config(c, json, strlen(json), err);
}

static void test_flags_article_example(void) {
    dt_cluster c;
    dt_error err;
    CHECK(flags(&c, "10.0.0.1:2222", "10.0.0.1:2224,10.0.0.2:2225", "worker", "1", &err) == 0);
    CHECK(c.distributed && c.n_ps == 1 && c.n_workers == 2 && c.n_evaluators == 0);
    CHECK(strcmp(c.ps[0].host, "10.0.0.1") == 0 && c.ps[0].port == 2222);
    CHECK(strcmp(c.workers[1].host, "10.0.0.2") == 0 && c.workers[1].port == 2225);
    CHECK(c.job == DT_JOB_WORKER && c.task_index == 1 && !c.is_chief);
    CHECK(strcmp(c.source, "flags") == 0);
    const dt_addr *self = dt_cluster_self(&c);
    CHECK(self && self->port == 2225);
    dt_cluster_clear(&c);

    CHECK(flags(&c, "10.0.0.1:2222", "10.0.0.1:2224,10.0.0.2:2225", "worker", NULL, &err) == 0);
    CHECK(c.task_index == 0 && c.is_chief); /* task_index defaults to 0, worker 0 is the chief */
    dt_cluster_clear(&c);

    CHECK(flags(&c, "10.0.0.1:2222", "10.0.0.1:2224", "ps", "0", &err) == 0);
    CHECK(c.job == DT_JOB_PS && c.task_index == 0 && !c.is_chief);
    dt_cluster_clear(&c);

    /* blanks around entries are tolerated; no ps at all is a valid worker-only definition */
    CHECK(flags(&c, NULL, " a:1 , b:2 ", "worker", " 1 ", &err) == 0);
    CHECK(c.n_ps == 0 && c.n_workers == 2 && strcmp(c.workers[1].host, "b") == 0);
    dt_cluster_clear(&c);
}

static void test_flag_refusals(void) {
    static const struct {
        const char *ps, *wk, *job, *idx, *field, *what;
    } cases[] = {
        {"", "a:1", "worker", "0", "--ps_hosts", "empty list"},
        {"a:1", " ", "worker", "0", "--worker_hosts", "empty list"},
        {"a:1", NULL, "worker", "0", "--worker_hosts", "missing"},
        {"a:1", "b:1,,c:1", "worker", "0", "--worker_hosts[1]", "empty address"},
        {"a:1", "b:1,", "worker", "0", "--worker_hosts[1]", "empty address"},
        {":2222", "b:1", "worker", "0", "--ps_hosts[0]", "empty host"},
        {"a:1", "b:x1", "worker", "0", "--worker_hosts[0]", "not a number"},
        {"a:1", "b:-5", "worker", "0", "--worker_hosts[0]", "not a number"},
        {"a:1", "b:0", "worker", "0", "--worker_hosts[0]", "out of range"},
        {"a:1", "b:65536", "worker", "0", "--worker_hosts[0]", "out of range"},
        {"a:1", "b:99999999999999999999", "worker", "0", "--worker_hosts[0]", "out of range"},
        {"a:1", "b:", "worker", "0", "--worker_hosts[0]", "missing port"},
        {"a:1", "b", "worker", "0", "--worker_hosts[0]", "missing port"},
        {"a:1", "b c:1", "worker", "0", "--worker_hosts[0]", "bad character"},
        {"a:1", "::1:80", "worker", "0", "--worker_hosts[0]", "IPv6"},
        {"a:1", "[::1:80", "worker", "0", "--worker_hosts[0]", "']'"},
        {"a:1,b:2", "c:3,a:1", "worker", "0", "--worker_hosts[1]", "--ps_hosts[0]"},
        {"a:1", "b:2,B:2", "worker", "0", "--worker_hosts[1]", "duplicate"},
        {"a:1", "b:2", NULL, "0", "--job_name", "missing"},
        {"a:1", "b:2", "chief", "0", "--job_name", "unknown job"},
        {"a:1", "b:2", "", "0", "--job_name", "unknown job"},
        {NULL, "b:2", "ps", "0", "--job_name", "--ps_hosts"},
        {"a:1", "b:2,c:3", "worker", "2", "--task_index", "out of range"},
        {"a:1", "b:2", "ps", "1", "--task_index", "out of range"},
        {"a:1", "b:2", "worker", "-1", "--task_index", "negative"},
        {"a:1", "b:2", "worker", "one", "--task_index", "not an integer"},
        {"a:1", "b:2", "worker", "", "--task_index", "not an integer"},
        {"a:1", "b:2", "worker", "1.5", "--task_index", "not an integer"},
        /* beyond int and long long: refused quoting the value as given, not the digits that fit */
        {"a:1", "b:2", "worker", "1099511627776", "--task_index", ": 1099511627776 is out of range"},
        {"a:1", "b:2", "worker", " 99999999999999999999999 ", "--task_index", ": 99999999999999999999999 is out"},
        {"a:1", "b:2", "worker", "-99999999999999999999999", "--task_index", ": -99999999999999999999999 is negative"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dt_cluster c;
        dt_error err;
        int rc = flags(&c, cases[i].ps, cases[i].wk, cases[i].job, cases[i].idx, &err);
        CHECK_MSG(rc == DT_EINVAL, "case %zu: rc %d", i, rc);
        CHECK_CONTAINS(err.msg, cases[i].field);
        CHECK_CONTAINS(err.msg, cases[i].what);
        CHECK(!c.distributed && c.ps == NULL && c.workers == NULL); /* nothing left allocated */
        dt_cluster_clear(&c);
    }
}

static void test_addresses(void) {
    dt_addr a;
    dt_error err = {0};
    CHECK(dt_addr_parse(&a, "[::1]:2222", 10, "f", &err) == 0);
    CHECK(strcmp(a.host, "[::1]") == 0 && a.port == 2222);
    CHECK(dt_addr_parse(&a, "job-worker-0.ns.svc.cluster.local:65535", 39, "f", &err) == 0);
    CHECK(a.port == 65535 && strcmp(a.host, "job-worker-0.ns.svc.cluster.local") == 0);
    char long_host[400];
    memset(long_host, 'h', 300);
    strcpy(long_host + 300, ":1");
    CHECK(dt_addr_parse(&a, long_host, strlen(long_host), "field_x", &err) == DT_EINVAL);
    CHECK_CONTAINS(err.msg, "field_x");
    CHECK_CONTAINS(err.msg, "longer than");

    char ep[DT_ENDPOINT_MAX];
    dt_addr_parse(&a, "10.0.0.1:2222", 13, "f", NULL);
    CHECK(dt_addr_connect_endpoint(&a, ep, sizeof ep) == 0 && strcmp(ep, "tcp://10.0.0.1:2222") == 0);
    CHECK(dt_addr_bind_endpoint(&a, ep, sizeof ep) == 0 && strcmp(ep, "tcp://10.0.0.1:2222") == 0);
    CHECK(!dt_addr_is_loopback(&a));
    dt_addr_parse(&a, "127.0.0.1:5000", 14, "f", NULL);
    CHECK(dt_addr_bind_endpoint(&a, ep, sizeof ep) == 0 && strcmp(ep, "tcp://127.0.0.1:5000") == 0);
    dt_addr_parse(&a, "localhost:5000", 14, "f", NULL);
    CHECK(dt_addr_bind_endpoint(&a, ep, sizeof ep) == 0 && strcmp(ep, "tcp://127.0.0.1:5000") == 0);
    CHECK(dt_addr_connect_endpoint(&a, ep, sizeof ep) == 0 && strcmp(ep, "tcp://localhost:5000") == 0);
    dt_addr_parse(&a, "[::1]:5000", 10, "f", NULL);
    CHECK(dt_addr_bind_endpoint(&a, ep, sizeof ep) == 0 && strcmp(ep, "tcp://[::1]:5000") == 0);
    CHECK(dt_addr_connect_endpoint(&a, ep, 8) == DT_EINVAL); /* too small */
}

/* What a ps binds: its own address, or --bind's; an address that is not this host's is refused
 * naming the field and --bind. */
static void test_bind_resolve(void) {
    dt_addr a;
    dt_error err = {0};
    char ep[DT_ENDPOINT_MAX], warn[256];
    dt_addr_parse(&a, "127.0.0.1:5000", 14, "f", NULL);
    CHECK(dt_addr_bind_resolve(&a, "--ps_hosts[0]", NULL, ep, sizeof ep, warn, sizeof warn, &err) == 0);
    CHECK(strcmp(ep, "tcp://127.0.0.1:5000") == 0 && warn[0] == '\0');
    dt_addr_parse(&a, "localhost:5000", 14, "f", NULL);
    CHECK(dt_addr_bind_resolve(&a, "--ps_hosts[0]", "", ep, sizeof ep, warn, sizeof warn, &err) == 0);
    CHECK(strcmp(ep, "tcp://127.0.0.1:5000") == 0 && warn[0] == '\0');
    dt_addr_parse(&a, "[::1]:5000", 10, "f", NULL);
    CHECK(dt_addr_bind_resolve(&a, "--ps_hosts[0]", NULL, ep, sizeof ep, warn, sizeof warn, &err) == 0);
    CHECK(strcmp(ep, "tcp://[::1]:5000") == 0);

    /* TEST-NET-2: an address of no host here, as a NAT'd or service address is not. */
    dt_addr_parse(&a, "198.51.100.7:2222", 17, "f", NULL);
    CHECK(dt_addr_bind_resolve(&a, "--ps_hosts[1]", NULL, ep, sizeof ep, warn, sizeof warn, &err) == DT_ENET);
    CHECK_CONTAINS(err.msg, "--ps_hosts[1]: 198.51.100.7 is not an address of this host");
    CHECK_CONTAINS(err.msg, "--bind");
    CHECK(dt_addr_bind_resolve(&a, "--ps_hosts[1]", "0.0.0.0", ep, sizeof ep, warn, sizeof warn, &err) == 0);
    CHECK(strcmp(ep, "tcp://0.0.0.0:2222") == 0);
    CHECK(dt_addr_bind_resolve(&a, "--ps_hosts[1]", "127.0.0.1:3333", ep, sizeof ep, warn, sizeof warn, &err) == 0);
    CHECK(strcmp(ep, "tcp://127.0.0.1:3333") == 0);
    CHECK(dt_addr_bind_resolve(&a, "--ps_hosts[1]", "*", ep, sizeof ep, warn, sizeof warn, &err) == 0);
    CHECK(strcmp(ep, "tcp://*:2222") == 0);
    CHECK(dt_addr_bind_resolve(&a, "--ps_hosts[1]", "[::]", ep, sizeof ep, warn, sizeof warn, &err) == 0);
    CHECK(strcmp(ep, "tcp://[::]:2222") == 0);
    CHECK(dt_addr_bind_resolve(&a, "--ps_hosts[1]", "[::]:4444", ep, sizeof ep, warn, sizeof warn, &err) == 0);
    CHECK(strcmp(ep, "tcp://[::]:4444") == 0);
    CHECK(dt_addr_bind_resolve(&a, "--ps_hosts[1]", "198.51.100.8", ep, sizeof ep, warn, sizeof warn, &err) == DT_ENET);
    CHECK_CONTAINS(err.msg, "--bind: 198.51.100.8 is not an address of this host");

    CHECK(dt_bind_check(NULL, &err) == 0 && dt_bind_check("", &err) == 0 && dt_bind_check("0.0.0.0", &err) == 0);
    CHECK(dt_bind_check("[::1]:7", &err) == 0 && dt_bind_check("eth0-host.example", &err) == 0);
    CHECK(dt_bind_check("a b", &err) == DT_EINVAL);
    CHECK_CONTAINS(err.msg, "--bind: \"a b\" is not an address");
    CHECK(dt_bind_check("::", &err) == DT_EINVAL);
    CHECK_CONTAINS(err.msg, "--bind");
    CHECK(dt_bind_check("0.0.0.0:70000", &err) == DT_EINVAL);
    CHECK_CONTAINS(err.msg, "port out of range");
    CHECK(dt_bind_check("[zz]", &err) == DT_EINVAL);
}

static char **make_argv(const char *const *args, int n) {
    char **argv = calloc((size_t)n + 1, sizeof *argv);
    for (int i = 0; i < n; i++) argv[i] = (char *)args[i];
    return argv;
}

static void test_from_args(void) {
    unsetenv("TF_CONFIG");
    const char *args[] = {"prog", "--ps_hosts", "10.0.0.1:2222", "--epochs=3",
                          "--worker_hosts=10.0.0.1:2224,10.0.0.2:2225", "data_dir",
                          "--job_name", "worker", "--task_index=1", "--", "--job_name=ps"};
    int argc = 11;
    char **argv = make_argv(args, argc);
    dt_cluster c;
    dt_error err = {0};
    CHECK(dt_cluster_parse_args(&c, &argc, argv, &err) == 0);
    CHECK(c.n_ps == 1 && c.n_workers == 2 && c.job == DT_JOB_WORKER && c.task_index == 1);
    /* the rest stays, in order; nothing after "--" is looked at */
    CHECK(argc == 5);
    CHECK(strcmp(argv[0], "prog") == 0 && strcmp(argv[1], "--epochs=3") == 0);
    CHECK(strcmp(argv[2], "data_dir") == 0 && strcmp(argv[3], "--") == 0);
    CHECK(strcmp(argv[4], "--job_name=ps") == 0 && argv[5] == NULL);
    dt_cluster_clear(&c);
    free(argv);

    /* "--task_index -1": a value may start with one dash */
    const char *neg[] = {"prog", "--worker_hosts=a:1", "--job_name=worker", "--task_index", "-1"};
    argc = 5;
    argv = make_argv(neg, argc);
    CHECK(dt_cluster_parse_args(&c, &argc, argv, &err) == DT_EINVAL);
    CHECK_CONTAINS(err.msg, "--task_index");
    CHECK_CONTAINS(err.msg, "negative");
    CHECK(argc == 5 && strcmp(argv[1], "--worker_hosts=a:1") == 0); /* untouched on failure */
    free(argv);

    const char *missing[] = {"prog", "--worker_hosts=a:1", "--job_name"};
    argc = 3;
    argv = make_argv(missing, argc);
    CHECK(dt_cluster_parse_args(&c, &argc, argv, &err) == DT_EINVAL);
    CHECK_CONTAINS(err.msg, "--job_name: missing value");
    free(argv);

    const char *twice[] = {"prog", "--worker_hosts=a:1", "--job_name=worker", "--job_name", "ps"};
    argc = 5;
    argv = make_argv(twice, argc);
    CHECK(dt_cluster_parse_args(&c, &argc, argv, &err) == DT_EINVAL);
    CHECK_CONTAINS(err.msg, "--job_name: given twice");
    free(argv);

    /* a longer flag with the same prefix is not ours */
    const char *other[] = {"prog", "--ps_hosts_file=x", "--task_indexes=3"};
    argc = 3;
    argv = make_argv(other, argc);
    CHECK(dt_cluster_parse_args(&c, &argc, argv, &err) == 0);
    CHECK(!c.distributed && c.is_chief && argc == 3);
    free(argv);

    /* only --task_index: the flags define the cluster, and --worker_hosts is missing */
    const char *lone[] = {"prog", "--task_index=1"};
    argc = 2;
    argv = make_argv(lone, argc);
    CHECK(dt_cluster_parse_args(&c, &argc, argv, &err) == DT_EINVAL);
    CHECK_CONTAINS(err.msg, "--worker_hosts");
    free(argv);
}

static void test_precedence(void) {
    const char *json = "{\"cluster\": {\"worker\": [\"w0:1\", \"w1:1\"], \"ps\": [\"p0:1\"]},"
                       " \"task\": {\"type\": \"ps\", \"index\": 0}}";
    setenv("TF_CONFIG", json, 1);
    const char *plain[] = {"prog", "--epochs=1"};
    int argc = 2;
    char **argv = make_argv(plain, argc);
    dt_cluster c;
    dt_error err = {0};
    CHECK(dt_cluster_parse_args(&c, &argc, argv, &err) == 0);
    CHECK(strcmp(c.source, "TF_CONFIG") == 0 && c.job == DT_JOB_PS && c.n_workers == 2);
    dt_cluster_clear(&c);
    free(argv);

    const char *with_flags[] = {"prog", "--worker_hosts=a:1,b:2,c:3", "--job_name=worker",
                                "--task_index=2"};
    argc = 4;
    argv = make_argv(with_flags, argc);
    CHECK(dt_cluster_parse_args(&c, &argc, argv, &err) == 0);
    CHECK(strcmp(c.source, "flags") == 0 && c.n_workers == 3 && c.n_ps == 0 && c.task_index == 2);
    CHECK(argc == 1);
    dt_cluster_clear(&c);
    free(argv);

    setenv("TF_CONFIG", "  ", 1); /* blank: as if unset */
    argc = 2;
    argv = make_argv(plain, argc);
    CHECK(dt_cluster_parse_args(&c, &argc, argv, &err) == 0);
    CHECK(!c.distributed && c.is_chief && strcmp(c.source, "single process") == 0);
    free(argv);
    unsetenv("TF_CONFIG");

    CHECK(dt_cluster_resolve(&c, NULL, NULL, NULL, NULL, NULL, &err) == 0 && !c.distributed);
    CHECK(dt_cluster_resolve(&c, NULL, NULL, NULL, NULL, "{not json", &err) == DT_EFORMAT);
    CHECK_CONTAINS(err.msg, "TF_CONFIG");
}

static void test_tf_config_without_chief(void) {
    dt_cluster c;
    dt_error err;
    const char *json = "{\"cluster\": {\"worker\": [\"w0:2222\", \"w1:2222\"], \"ps\": [\"p0:2222\"]},"
                       " \"task\": {\"type\": \"worker\", \"index\": 0}}";
    CHECK(tf(&c, json, &err) == 0);
    CHECK(c.n_workers == 2 && c.n_ps == 1 && c.job == DT_JOB_WORKER && c.task_index == 0 && c.is_chief);
    CHECK(strcmp(c.workers[0].host, "w0") == 0);
    dt_cluster_clear(&c);
    json = "{\"cluster\": {\"worker\": [\"w0:2222\", \"w1:2222\"], \"ps\": [\"p0:2222\"]},"
           " \"task\": {\"type\": \"worker\", \"index\": 1}}";
    CHECK(tf(&c, json, &err) == 0);
    CHECK(c.task_index == 1 && !c.is_chief);
    dt_cluster_clear(&c);
}

/* The chief is worker 0; TF_CONFIG's worker i is our worker i + 1. */
static void test_tf_config_chief(void) {
    dt_cluster c;
    dt_error err;
    const char *base = "{\"cluster\": {\"chief\": [\"c0:2222\"], \"worker\": [\"w0:2222\", \"w1:2222\"],"
                       " \"ps\": [\"p0:2222\", \"p1:2222\"]}, \"task\": {\"type\": \"%s\", \"index\": %d}}";
    char json[512];
    snprintf(json, sizeof json, base, "chief", 0);
    CHECK(tf(&c, json, &err) == 0);
    CHECK(c.n_workers == 3 && c.n_ps == 2 && c.job == DT_JOB_WORKER && c.task_index == 0 && c.is_chief);
    CHECK(strcmp(c.workers[0].host, "c0") == 0 && strcmp(c.workers[1].host, "w0") == 0 &&
          strcmp(c.workers[2].host, "w1") == 0);
    dt_cluster_clear(&c);
    snprintf(json, sizeof json, base, "worker", 0);
    CHECK(tf(&c, json, &err) == 0);
    CHECK(c.task_index == 1 && !c.is_chief && strcmp(dt_cluster_self(&c)->host, "w0") == 0);
    dt_cluster_clear(&c);
    snprintf(json, sizeof json, base, "worker", 1);
    CHECK(tf(&c, json, &err) == 0);
    CHECK(c.task_index == 2 && strcmp(dt_cluster_self(&c)->host, "w1") == 0);
    dt_cluster_clear(&c);
    snprintf(json, sizeof json, base, "ps", 1);
    CHECK(tf(&c, json, &err) == 0);
    CHECK(c.job == DT_JOB_PS && c.task_index == 1 && strcmp(dt_cluster_self(&c)->host, "p1") == 0);
    dt_cluster_clear(&c);
    snprintf(json, sizeof json, base, "worker", 2);
    CHECK(tf(&c, json, &err) == DT_EINVAL);
    CHECK_CONTAINS(err.msg, "task.index");
    snprintf(json, sizeof json, base, "chief", 1);
    CHECK(tf(&c, json, &err) == DT_EINVAL);
    CHECK_CONTAINS(err.msg, "task.index");

    /* chief only, no worker list: one worker */
    CHECK(tf(&c, "{\"cluster\": {\"chief\": [\"c:1\"], \"ps\": [\"p:1\"]}, \"task\": {\"type\": \"chief\"}}",
             &err) == 0);
    CHECK(c.n_workers == 1 && c.is_chief);
    dt_cluster_clear(&c);
}

static void test_tf_config_master(void) {
    dt_cluster c;
    dt_error err;
    CHECK(tf(&c, "{\"cluster\": {\"master\": [\"m:1\"], \"worker\": [\"w:1\"]},"
                 " \"task\": {\"type\": \"master\", \"index\": 0}}", &err) == 0);
    CHECK(c.n_workers == 2 && c.task_index == 0 && c.is_chief && strcmp(c.workers[0].host, "m") == 0);
    dt_cluster_clear(&c);
    CHECK(tf(&c, "{\"cluster\": {\"master\": [\"m:1\"], \"worker\": [\"w:1\"]},"
                 " \"task\": {\"type\": \"worker\", \"index\": 0}}", &err) == 0);
    CHECK(c.task_index == 1 && !c.is_chief);
    dt_cluster_clear(&c);
}

static void test_tf_config_evaluator(void) {
    dt_cluster c;
    dt_error err;
    CHECK(tf(&c, "{\"cluster\": {\"chief\": [\"c:1\"], \"worker\": [\"w:1\"], \"ps\": [\"p:1\"],"
                 " \"evaluator\": [\"e:1\"]}, \"task\": {\"type\": \"evaluator\", \"index\": 0}}", &err) == 0);
    CHECK(c.job == DT_JOB_EVALUATOR && !c.is_chief && c.n_workers == 2 && c.n_evaluators == 1);
    CHECK(strcmp(dt_cluster_self(&c)->host, "e") == 0);
    dt_cluster_clear(&c);
    /* not listed: index 0 only, no address of its own */
    CHECK(tf(&c, "{\"cluster\": {\"worker\": [\"w:1\"]}, \"task\": {\"type\": \"evaluator\"}}", &err) == 0);
    CHECK(c.job == DT_JOB_EVALUATOR && dt_cluster_self(&c) == NULL && c.n_evaluators == 0);
    dt_cluster_clear(&c);
    CHECK(tf(&c, "{\"cluster\": {\"worker\": [\"w:1\"]}, \"task\": {\"type\": \"evaluator\", \"index\": 1}}",
             &err) == DT_EINVAL);
    CHECK_CONTAINS(err.msg, "task.index");
}

/* As Kubeflow's operator writes it, with keys we do not know. */
static void test_tf_config_kubeflow(void) {
    const char *json =
        "{\"cluster\":{\"chief\":[\"mnist-chief-0.kubeflow.svc:2222\"],"
        "\"ps\":[\"mnist-ps-0.kubeflow.svc:2222\",\"mnist-ps-1.kubeflow.svc:2222\"],"
        "\"worker\":[\"mnist-worker-0.kubeflow.svc:2222\",\"mnist-worker-1.kubeflow.svc:2222\"],"
        "\"future_job\":[\"x:1\"]},"
        "\"task\":{\"type\":\"worker\",\"index\":1,\"trial\":\"7\"},\"environment\":\"cloud\","
        "\"rpc_layer\":\"grpc\"}";
    dt_cluster c;
    dt_error err;
    CHECK(tf(&c, json, &err) == 0);
    CHECK(c.n_ps == 2 && c.n_workers == 3 && c.task_index == 2 && !c.is_chief);
    CHECK(strcmp(c.workers[2].host, "mnist-worker-1.kubeflow.svc") == 0 && c.workers[2].port == 2222);
    char ep[DT_ENDPOINT_MAX];
    CHECK(dt_addr_connect_endpoint(&c.ps[1], ep, sizeof ep) == 0);
    CHECK(strcmp(ep, "tcp://mnist-ps-1.kubeflow.svc:2222") == 0);
    CHECK(dt_addr_bind_endpoint(&c.ps[1], ep, sizeof ep) == 0 && strcmp(ep, "tcp://mnist-ps-1.kubeflow.svc:2222") == 0);
    dt_cluster_clear(&c);
}

static void test_tf_config_single(void) {
    dt_cluster c;
    dt_error err;
    CHECK(tf(&c, "", &err) == 0 && !c.distributed);
    CHECK(tf(&c, "{}", &err) == 0 && !c.distributed && c.is_chief);
    CHECK(tf(&c, "{\"cluster\": {}, \"environment\": \"cloud\"}", &err) == 0 && !c.distributed);
}

static void test_tf_config_refusals(void) {
    static const struct {
        const char *json, *field, *what;
    } cases[] = {
        {"{\"cluster\": ", "TF_CONFIG", "not valid JSON"},
        {"[1, 2]", "TF_CONFIG", "wrong type"},
        {"{\"cluster\": [\"a:1\"], \"task\": {\"type\": \"worker\"}}", "TF_CONFIG cluster", "wrong type"},
        {"{\"cluster\": {\"worker\": \"a:1\"}, \"task\": {\"type\": \"worker\"}}", "cluster.worker", "wrong type"},
        {"{\"cluster\": {\"worker\": [\"a:1\", 5]}, \"task\": {\"type\": \"worker\"}}", "cluster.worker[1]", "wrong type"},
        {"{\"cluster\": {\"worker\": []}, \"task\": {\"type\": \"worker\"}}", "cluster.worker", "empty list"},
        {"{\"cluster\": {\"worker\": [\"a:1\"], \"ps\": [\":1\"]}, \"task\": {\"type\": \"worker\"}}", "cluster.ps[0]", "empty host"},
        {"{\"cluster\": {\"worker\": [\"a:70000\"]}, \"task\": {\"type\": \"worker\"}}", "cluster.worker[0]", "out of range"},
        {"{\"cluster\": {\"worker\": [\"a:x\"]}, \"task\": {\"type\": \"worker\"}}", "cluster.worker[0]", "not a number"},
        {"{\"cluster\": {\"worker\": [\"a:1\"], \"ps\": [\"a:1\"]}, \"task\": {\"type\": \"worker\"}}", "cluster.worker[0]", "cluster.ps[0]"},
        {"{\"cluster\": {\"chief\": [\"c:1\", \"d:1\"]}, \"task\": {\"type\": \"chief\"}}", "cluster.chief", "chiefs"},
        {"{\"cluster\": {\"chief\": [\"c:1\"], \"master\": [\"m:1\"]}, \"task\": {\"type\": \"chief\"}}", "cluster.master", "cluster.chief"},
        {"{\"cluster\": {\"ps\": [\"p:1\"]}, \"task\": {\"type\": \"ps\"}}", "TF_CONFIG cluster", "no chief and no worker"},
        {"{\"cluster\": {\"worker\": [\"a:1\"]}}", "TF_CONFIG task", "missing"},
        {"{\"task\": {\"type\": \"worker\", \"index\": 0}}", "TF_CONFIG cluster", "missing"},
        {"{\"cluster\": {\"worker\": [\"a:1\"]}, \"task\": [0]}", "TF_CONFIG task", "wrong type"},
        {"{\"cluster\": {\"worker\": [\"a:1\"]}, \"task\": {\"index\": 0}}", "task.type", "missing"},
        {"{\"cluster\": {\"worker\": [\"a:1\"]}, \"task\": {\"type\": 1}}", "task.type", "wrong type"},
        {"{\"cluster\": {\"worker\": [\"a:1\"]}, \"task\": {\"type\": \"boss\"}}", "task.type", "unknown job"},
        {"{\"cluster\": {\"worker\": [\"a:1\"]}, \"task\": {\"type\": \"worker\", \"index\": \"0\"}}", "task.index", "wrong type"},
        {"{\"cluster\": {\"worker\": [\"a:1\"]}, \"task\": {\"type\": \"worker\", \"index\": 1.0}}", "task.index", "wrong type"},
        {"{\"cluster\": {\"worker\": [\"a:1\"]}, \"task\": {\"type\": \"worker\", \"index\": -1}}", "task.index", "negative"},
        {"{\"cluster\": {\"worker\": [\"a:1\"]}, \"task\": {\"type\": \"worker\", \"index\": 1}}", "task.index", "out of range"},
        {"{\"cluster\": {\"worker\": [\"a:1\"]}, \"task\": {\"type\": \"worker\", \"index\": 99999999999}}", "task.index", "out of range"},
        {"{\"cluster\": {\"worker\": [\"a:1\"]}, \"task\": {\"type\": \"ps\"}}", "task.type", "cluster.ps"},
        {"{\"cluster\": {\"worker\": [\"a:1\"]}, \"task\": {\"type\": \"chief\"}}", "task.type", "no chief"},
        {"{\"cluster\": {\"worker\": [\"a:1\"], \"worker\": [\"b:1\"]}, \"task\": {\"type\": \"worker\"}}", "TF_CONFIG", "duplicate"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dt_cluster c;
        dt_error err;
        int rc = tf(&c, cases[i].json, &err);
        CHECK_MSG(rc < 0, "case %zu accepted", i);
        CHECK_CONTAINS(err.msg, cases[i].field);
        CHECK_CONTAINS(err.msg, cases[i].what);
        CHECK(!c.distributed && c.ps == NULL && c.workers == NULL && c.evaluators == NULL);
    }
}

static void test_local(void) {
    int ports[] = {5000, 5001, 5002};
    dt_cluster c;
    dt_error err = {0};
    CHECK(dt_cluster_local(&c, 1, 2, ports, DT_JOB_WORKER, 1, &err) == 0);
    CHECK(c.n_ps == 1 && c.n_workers == 2 && c.ps[0].port == 5000 && c.workers[1].port == 5002);
    CHECK(strcmp(c.workers[0].host, "127.0.0.1") == 0 && c.task_index == 1 && !c.is_chief);
    char list[128];
    CHECK(dt_cluster_format_hosts(&c, DT_JOB_WORKER, list, sizeof list, &err) == 0);
    CHECK(strcmp(list, "127.0.0.1:5001,127.0.0.1:5002") == 0);
    CHECK(dt_cluster_format_hosts(&c, DT_JOB_WORKER, list, 10, &err) == DT_EINVAL);
    /* what the launcher passes on rebuilds the same cluster through the flags */
    char ps_list[64], wk_list[128];
    CHECK(dt_cluster_format_hosts(&c, DT_JOB_PS, ps_list, sizeof ps_list, &err) == 0);
    CHECK(dt_cluster_format_hosts(&c, DT_JOB_WORKER, wk_list, sizeof wk_list, &err) == 0);
    dt_cluster f;
    CHECK(dt_cluster_from_flags(&f, ps_list, wk_list, "worker", "1", &err) == 0);
    CHECK(f.n_ps == c.n_ps && f.n_workers == c.n_workers &&
          memcmp(f.workers, c.workers, sizeof *c.workers * 2) == 0 && f.task_index == c.task_index);
    dt_cluster_clear(&f);
    dt_cluster_clear(&c);

    CHECK(dt_cluster_local(&c, 1, 2, ports, DT_JOB_NONE, 0, &err) == 0 && !c.is_chief && c.distributed);
    dt_cluster_clear(&c);
    int dup[] = {5000, 5001, 5000};
    CHECK(dt_cluster_local(&c, 1, 2, dup, DT_JOB_PS, 0, &err) == DT_EINVAL);
    CHECK_CONTAINS(err.msg, "duplicate");
    int bad[] = {5000, 0, 5001};
    CHECK(dt_cluster_local(&c, 1, 2, bad, DT_JOB_PS, 0, &err) == DT_EINVAL);
    CHECK_CONTAINS(err.msg, "local worker 0");
    CHECK(dt_cluster_local(&c, 1, 0, ports, DT_JOB_PS, 0, &err) == DT_EINVAL);
    CHECK_CONTAINS(err.msg, "--workers");
    CHECK(dt_cluster_local(&c, 1, 2, ports, DT_JOB_PS, 1, &err) == DT_EINVAL);
    CHECK_CONTAINS(err.msg, "out of range");
}

static void test_describe(void) {
    dt_cluster c;
    dt_error err;
    char line[512];
    dt_cluster_single(&c);
    dt_cluster_describe(&c, line, sizeof line);
    CHECK_CONTAINS(line, "single process");
    CHECK(flags(&c, "10.0.0.1:2222", "10.0.0.1:2224,10.0.0.2:2225", "worker", "1", &err) == 0);
    dt_cluster_describe(&c, line, sizeof line);
    CHECK_CONTAINS(line, "worker 1 of 2 (not chief)");
    CHECK_CONTAINS(line, "ps=[10.0.0.1:2222]");
    CHECK_CONTAINS(line, "workers=[10.0.0.1:2224,10.0.0.2:2225]");
    CHECK_CONTAINS(line, "from flags");
    char tiny[12];
    dt_cluster_describe(&c, tiny, sizeof tiny); /* truncated, still a string */
    CHECK(strlen(tiny) == sizeof tiny - 1);
    dt_cluster_clear(&c);

    char many[2048] = "";
    for (int i = 0; i < 20; i++) snprintf(many + strlen(many), sizeof many - strlen(many), "%sh%d:1", i ? "," : "", i);
    CHECK(flags(&c, NULL, many, "worker", "19", &err) == 0);
    dt_cluster_describe(&c, line, sizeof line);
    CHECK_CONTAINS(line, "worker 19 of 20");
    CHECK_CONTAINS(line, "12 more");
    dt_cluster_clear(&c);
}

int main(void) {
    RUN(test_flags_article_example);
    RUN(test_flag_refusals);
    RUN(test_addresses);
    RUN(test_bind_resolve);
    RUN(test_from_args);
    RUN(test_precedence);
    RUN(test_tf_config_without_chief);
    RUN(test_tf_config_chief);
    RUN(test_tf_config_master);
    RUN(test_tf_config_evaluator);
    RUN(test_tf_config_kubeflow);
    RUN(test_tf_config_single);
    RUN(test_tf_config_refusals);
    RUN(test_local);
    RUN(test_describe);
    return test_summary();
}
