/* Slurm's compressed lists (cluster/hostlist.h) and the cluster from a manager's environment
 * (cluster/manager.h) with the variables given by a table: ranges, padding, several bracket
 * groups, tasks per node with repeats, block and cyclic layouts, Open MPI on one host, and every
 * refusal naming its variable. The real managers are in tests/test_managers.sh and the *_slow.sh
 * tests. */
#include <stdlib.h>

#include "cluster/hostlist.h"
#include "cluster/manager.h"
#include "test.h"

static int hosts(dt_hostlist *l, const char *text, int max, dt_error *err) {
    memset(err, 0, sizeof *err);
    return dt_hostlist_parse(l, text, strlen(text), max, "SLURM_STEP_NODELIST", err);
}

/* The expansion joined by spaces, or the error message. */
static const char *expand(const char *text) {
    static char out[4096];
    dt_hostlist l;
    dt_error err;
    if (hosts(&l, text, 0, &err)) {
        snprintf(out, sizeof out, "error: %s", err.msg);
        return out;
    }
    size_t used = 0;
    out[0] = '\0';
    for (int i = 0; i < l.n; i++) used += (size_t)snprintf(out + used, sizeof out - used, "%s%s", i ? " " : "", l.host[i]);
    dt_hostlist_free(&l);
    return out;
}

static void test_hostlist_syntax(void) {
    CHECK(!strcmp(expand("node[01-04,07],gpu3"), "node01 node02 node03 node04 node07 gpu3"));
    CHECK(!strcmp(expand("vm"), "vm"));
    CHECK(!strcmp(expand(" a,b.example.org "), "a b.example.org"));
    CHECK(!strcmp(expand("n[8-10]"), "n8 n9 n10"));
    CHECK(!strcmp(expand("n[08-10]"), "n08 n09 n10")); /* the first bound's width */
    CHECK(!strcmp(expand("r[1-2]n[1-2]"), "r1n1 r1n2 r2n1 r2n2"));
    CHECK(!strcmp(expand("[1-2]x"), "1x 2x"));
    CHECK(!strcmp(expand("a[1],b[2-3]c"), "a1 b2c b3c"));
}

static void test_hostlist_refusals(void) {
    CHECK_CONTAINS(expand("node[01-04,07],gpu[3"), "SLURM_STEP_NODELIST: \"node[01-04,07],gpu[3\": missing ']'");
    CHECK_CONTAINS(expand("n[3-1]"), "range 3-1 goes down");
    CHECK_CONTAINS(expand("n[]"), "empty brackets");
    CHECK_CONTAINS(expand("n[1-]"), "expected a number");
    CHECK_CONTAINS(expand("n[a]"), "expected a number");
    CHECK_CONTAINS(expand("n[1;2]"), "bad character ';' in brackets");
    CHECK_CONTAINS(expand("a,,b"), "empty host");
    CHECK_CONTAINS(expand("a,"), "empty host");
    CHECK_CONTAINS(expand("n]"), "']' without '['");
    CHECK_CONTAINS(expand("n[1]]"), "']' without '['");
    CHECK_CONTAINS(expand("a b"), "bad character ' ' in a host name");
    CHECK_CONTAINS(expand(""), "SLURM_STEP_NODELIST: empty host list");
    CHECK_CONTAINS(expand("n[1234567890]"), "more than 9 digits");
    /* Counted before anything is expanded: a billion hosts are refused at once. */
    CHECK_CONTAINS(expand("n[0-999999999]"), "more than 8192 hosts");
    CHECK_CONTAINS(expand("a[1-100]b[1-100]"), "more than 8192 hosts");
    CHECK_CONTAINS(expand("[1][1][1][1][1][1][1][1][1]"), "more than 8 bracket groups");
    char long_name[300];
    memset(long_name, 'x', 299);
    long_name[299] = '\0';
    CHECK_CONTAINS(expand(long_name), "longer than 255 characters");
    dt_hostlist l;
    dt_error err;
    CHECK(hosts(&l, "n[1-5]", 4, &err) == DT_EINVAL);
    CHECK_CONTAINS(err.msg, "more than 4 hosts");
    CHECK(l.n == 0 && l.host == NULL);
}

static const char *tpn(const char *text) {
    static char out[1100];
    int *c, n;
    dt_error err = {0};
    if (dt_tasks_per_node_parse(&c, &n, text, strlen(text), 16, "SLURM_STEP_TASKS_PER_NODE", &err)) {
        snprintf(out, sizeof out, "error: %s", err.msg);
        return out;
    }
    size_t used = 0;
    out[0] = '\0';
    for (int i = 0; i < n; i++) used += (size_t)snprintf(out + used, sizeof out - used, "%s%d", i ? " " : "", c[i]);
    free(c);
    return out;
}

static void test_tasks_per_node(void) {
    CHECK(!strcmp(tpn("2(x3),1"), "2 2 2 1"));
    CHECK(!strcmp(tpn("3"), "3"));
    CHECK(!strcmp(tpn("1,4(x2)"), "1 4 4"));
    const char *bad[] = {"", "0", "2(x0)", "2(x3", "2(3)", "2,", ",2", "a", "2(x3)1", "-1", "2 (x3)"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK_MSG(!strncmp(tpn(bad[i]), "error: SLURM_STEP_TASKS_PER_NODE: ", 34), "%s -> %s", bad[i], tpn(bad[i]));
    CHECK_CONTAINS(tpn("1(x17)"), "more than 16 nodes");
    CHECK_CONTAINS(tpn("1(x9),1(x8)"), "more than 16 nodes");
}

/* ---- the environment from a table ---- */

typedef struct {
    const char *vars[24]; /* "NAME=VALUE" */
} fake_env;

static const char *lookup(void *ctx, const char *name) {
    fake_env *e = ctx;
    size_t n = strlen(name);
    for (int i = 0; i < 24 && e->vars[i]; i++)
        if (!strncmp(e->vars[i], name, n) && e->vars[i][n] == '=') return e->vars[i] + n + 1;
    return NULL;
}

static int derive(dt_cluster *c, fake_env *e, int num_ps, dt_error *err) {
    dt_manager_options m = {.num_ps = num_ps, .deadline_ms = 1000, .env = lookup, .env_ctx = e};
    memset(err, 0, sizeof *err);
    return dt_cluster_from_manager(c, &m, err);
}

static void test_slurm_block_and_cyclic(void) {
    dt_cluster c;
    dt_error err;
    /* 2 ps + 4 workers over 3 nodes of 2 tasks: rank 3 is worker 1 on node n2, local id 1. */
    fake_env e = {{"SLURM_STEP_ID=4", "SLURM_PROCID=3", "SLURM_NTASKS=6", "SLURM_LOCALID=1", "SLURM_NODEID=1",
                   "SLURM_STEP_NODELIST=n[1-3]", "SLURM_STEP_TASKS_PER_NODE=2(x3)"}};
    CHECK(derive(&c, &e, 2, &err) == 0);
    CHECK(c.n_ps == 2 && c.n_workers == 4 && c.job == DT_JOB_WORKER && c.task_index == 1 && !c.is_chief);
    CHECK(!strcmp(c.source, "slurm"));
    CHECK(!strcmp(c.ps[0].host, "n1") && c.ps[0].port == 2222 && !strcmp(c.ps[1].host, "n1") && c.ps[1].port == 2223);
    CHECK(!strcmp(c.workers[0].host, "n2") && c.workers[0].port == 2222); /* rank 2, the chief */
    CHECK(!strcmp(c.workers[3].host, "n3") && c.workers[3].port == 2223);
    CHECK_CONTAINS(c.origin, "SLURM_STEP_NODELIST=\"n[1-3]\"");
    dt_cluster_clear(&c);
    /* cyclic: ranks go n1 n2 n3 n1 n2 n3; rank 3 is n1's second task */
    fake_env cy = {{"SLURM_STEP_ID=4", "SLURM_PROCID=3", "SLURM_NTASKS=6", "SLURM_LOCALID=1", "SLURM_NODEID=0",
                    "SLURM_STEP_NODELIST=n[1-3]", "SLURM_STEP_TASKS_PER_NODE=2(x3)", "SLURM_DISTRIBUTION=cyclic"}};
    CHECK(derive(&c, &cy, 2, &err) == 0);
    CHECK(!strcmp(c.ps[1].host, "n2") && c.ps[1].port == 2222);
    CHECK(!strcmp(c.workers[1].host, "n1") && c.workers[1].port == 2223);
    dt_cluster_clear(&c);
    /* The layout must agree with this task's own SLURM_LOCALID: with cyclic unsaid, it does not. */
    cy.vars[7] = NULL;
    CHECK(derive(&c, &cy, 2, &err) == DT_EINVAL);
    CHECK_CONTAINS(err.msg, "SLURM_NODEID: 0, but SLURM_STEP_TASKS_PER_NODE=\"2(x3)\" over SLURM_STEP_NODELIST=\"n[1-3]\" "
                            "(block) puts rank 3 on node 1 (n2)");
    cy.vars[4] = "SLURM_NODEID=1";
    cy.vars[3] = "SLURM_LOCALID=0";
    CHECK(derive(&c, &cy, 2, &err) == DT_EINVAL);
    CHECK_CONTAINS(err.msg, "SLURM_LOCALID: 0, but SLURM_STEP_TASKS_PER_NODE=\"2(x3)\"");
    /* Without the step's variables, the job's are used. */
    fake_env job = {{"SLURM_STEP_ID=0", "SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_JOB_NODELIST=a,b",
                     "SLURM_TASKS_PER_NODE=1(x2)"}};
    CHECK(derive(&c, &job, 1, &err) == 0);
    CHECK(c.job == DT_JOB_PS && !strcmp(c.workers[0].host, "b") && c.workers[0].port == 2222);
    CHECK_CONTAINS(c.origin, "SLURM_JOB_NODELIST");
    dt_cluster_clear(&c);
}

static void test_slurm_refusals(void) {
    dt_cluster c;
    dt_error err;
    struct { const char *var, *want; } cases[] = {
        {"SLURM_NTASKS=2", "SLURM_NTASKS: 2 tasks, but --num_ps 2 needs at least 3"},
        {"SLURM_NTASKS=x", "SLURM_NTASKS: \"x\" is not a number"},
        {"SLURM_PROCID=9", "SLURM_PROCID: 9 is out of range 0..3"},
        {"SLURM_STEP_NODELIST=n[1-", "SLURM_STEP_NODELIST: \"n[1-\": "},
        {"SLURM_STEP_TASKS_PER_NODE=3,2", "SLURM_STEP_TASKS_PER_NODE: \"3,2\" sums to 5 tasks, but SLURM_NTASKS=4"},
        {"SLURM_STEP_TASKS_PER_NODE=2", "SLURM_STEP_TASKS_PER_NODE: \"2\" counts 1 node, but SLURM_STEP_NODELIST=\"n[1-2]\" names 2"},
        {"SLURM_STEP_NODELIST=n1,n1", "rank 2: duplicate address n1:2222 (also rank 0)"},
        {"SLURM_DISTRIBUTION=arbitrary", "SLURM_DISTRIBUTION: \"arbitrary\""},
        {"SLURMD_NODENAME=n2", "SLURMD_NODENAME: \"n2\", but SLURM_STEP_TASKS_PER_NODE=\"2(x2)\" over SLURM_STEP_NODELIST=\"n[1-2]\" (block) puts rank 1 on n1"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fake_env e = {{cases[i].var, "SLURM_STEP_ID=1", "SLURM_PROCID=1", "SLURM_NTASKS=4", "SLURM_STEP_NODELIST=n[1-2]",
                       "SLURM_STEP_TASKS_PER_NODE=2(x2)"}};
        CHECK_MSG(derive(&c, &e, 2, &err) == DT_EINVAL, "%s", cases[i].var);
        CHECK_CONTAINS(err.msg, cases[i].want);
        CHECK(!c.distributed);
    }
    fake_env none = {{"TF_CONFIG={}"}};
    CHECK(derive(&c, &none, 1, &err) == DT_EINVAL);
    CHECK_CONTAINS(err.msg, "--num_ps: no cluster manager in the environment");
    fake_env batch = {{"SLURM_PROCID=0", "SLURM_NTASKS=3"}};
    CHECK(derive(&c, &batch, 1, &err) == DT_EINVAL);
    CHECK_CONTAINS(err.msg, "SLURM_STEP_ID: not set");
    fake_env e = {{"SLURM_STEP_ID=1", "SLURM_PROCID=1", "SLURM_NTASKS=2", "SLURM_STEP_NODELIST=n1",
                   "SLURM_STEP_TASKS_PER_NODE=2"}};
    dt_manager_options m = {.num_ps = 1, .base_port = 65535, .env = lookup, .env_ctx = &e};
    CHECK(dt_cluster_from_manager(&c, &m, &err) == DT_EINVAL);
    CHECK_CONTAINS(err.msg, "--base_port 65535 + local id 1 is past port 65535");
}

static void test_mpi_and_pmi(void) {
    dt_cluster c;
    dt_error err;
    fake_env one_host = {{"OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_SIZE=3", "OMPI_COMM_WORLD_LOCAL_RANK=1",
                          "OMPI_COMM_WORLD_LOCAL_SIZE=3", "SLURM_PROCID=0", "SLURM_STEP_ID=0"}};
    CHECK(derive(&c, &one_host, 1, &err) == 0);
    CHECK(!strcmp(c.source, "mpi") && c.is_chief && !strcmp(c.ps[0].host, "127.0.0.1") && c.workers[1].port == 2224);
    dt_cluster_clear(&c);
    fake_env spread = {{"OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_SIZE=4", "OMPI_COMM_WORLD_LOCAL_RANK=1",
                        "OMPI_COMM_WORLD_LOCAL_SIZE=2"}};
    CHECK(derive(&c, &spread, 1, &err) == DT_EINVAL);
    CHECK_CONTAINS(err.msg, "give --rendezvous HOST:PORT");
    fake_env big_local = {{"OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_SIZE=3", "OMPI_COMM_WORLD_LOCAL_SIZE=4"}};
    CHECK(derive(&c, &big_local, 1, &err) == DT_EINVAL);
    CHECK_CONTAINS(err.msg, "OMPI_COMM_WORLD_LOCAL_SIZE: 4 is out of range 1..3");
    /* srun --mpi=pmi2: PMI and Slurm agree, and Slurm's variables name the hosts. */
    fake_env pmi2 = {{"PMI_RANK=1", "PMI_SIZE=2", "SLURM_STEP_ID=0", "SLURM_PROCID=1", "SLURM_NTASKS=2",
                      "SLURM_STEP_NODELIST=a,b", "SLURM_STEP_TASKS_PER_NODE=1(x2)"}};
    CHECK(derive(&c, &pmi2, 1, &err) == 0);
    CHECK(!strcmp(c.source, "slurm") && !strcmp(c.workers[0].host, "b"));
    dt_cluster_clear(&c);
    /* A PMI launcher inside an allocation: its ranks, not the inherited Slurm ones. */
    fake_env hydra = {{"PMI_RANK=2", "PMI_SIZE=3", "MPI_LOCALRANKID=2", "MPI_LOCALNRANKS=3", "SLURM_PROCID=0",
                       "SLURM_NTASKS=1"}};
    CHECK(derive(&c, &hydra, 1, &err) == 0);
    CHECK(!strcmp(c.source, "mpi") && c.task_index == 1 && c.workers[1].port == 2224);
    CHECK_CONTAINS(c.origin, "PMI_RANK=2");
    dt_cluster_clear(&c);
}

int main(void) {
    RUN(test_hostlist_syntax);
    RUN(test_hostlist_refusals);
    RUN(test_tasks_per_node);
    RUN(test_slurm_block_and_cyclic);
    RUN(test_slurm_refusals);
    RUN(test_mpi_and_pmi);
    return test_summary();
}
