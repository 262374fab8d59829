/* examples/train_single.c made distributed with three changes (marked CHANGE 1-3):
 *   1. the cluster from the command line (--ps_hosts, --worker_hosts, --job_name, --task_index, or
 *      TF_CONFIG), which also gives this worker its shard of the data;
 *   2. a ps only serves, until the chief ends training;
 *   3. the optimizer wrapped for the cluster: the variables live on the ps tasks.
 * usage: train_distributed MODEL DATA [STEPS] --ps_hosts=... --worker_hosts=... --job_name=... --task_index=N */
#include <stdio.h>
#include <stdlib.h>

#include "dtrain.h"

int main(int argc, char **argv) {
    dt_error err = {0};
    dt_net *net = NULL;
    dt_batches *batches = NULL;
    dt_optimizer *opt = NULL;
    int status = 1;
    dt_cluster *cluster = NULL;                                             /* CHANGE 1 */
    if (dt_cluster_from_args(&cluster, &argc, argv, &err)) goto done;       /* CHANGE 1 */

    if (argc < 3) {
        snprintf(err.msg, sizeof err.msg, "usage: MODEL DATA [STEPS]");
        goto done;
    }
    int64_t steps = argc > 3 ? atoll(argv[3]) : 500, step = 0;
    if (dt_net_load(&net, argv[1], 64, &err)) goto done;
    if (dt_cluster_is_ps(cluster)) {                                        /* CHANGE 2 */
        status = dt_serve(cluster, net, NULL, 600000, NULL, &err) ? 1 : 0;  /* CHANGE 2 */
        goto done;                                                          /* CHANGE 2 */
    }                                                                       /* CHANGE 2 */
    if (dt_batches_open(&batches, argv[2], net, 64, 1, cluster, &err)) goto done; /* CHANGE 1: shard */
    if (dt_optimizer_new(&opt, "adam", 0.001f, net, &err)) goto done;
    if (dt_optimizer_distribute(opt, cluster, net, 0, NULL, &err)) goto done; /* CHANGE 3 */

    if (dt_optimizer_start(opt, net, 1, &step, &err)) goto done;
    while (step < steps) {
        const float *x;
        const int32_t *y;
        int n, correct;
        if (dt_batches_next(batches, &x, &y, &n, &err)) goto done;
        if (!dt_net_forward(net, x, n, 1, (uint64_t)step, &err)) goto done;
        float loss = dt_net_loss(net, y, &correct);
        if (dt_net_backward(net, &err)) goto done;
        if (dt_optimizer_apply(opt, net, &step, &err)) goto done;
        if (step % 100 == 0) printf("step %lld loss %.4f accuracy %.3f\n", (long long)step, loss, (double)correct / n);
    }
    if (dt_optimizer_finish(opt, &err)) goto done;
    double acc;
    if (dt_batches_test_accuracy(batches, net, &acc, &err)) goto done;
    printf("test accuracy %.4f\n", acc);
    status = 0;
done:
    if (status) fprintf(stderr, "%s: %s\n", argv[0], err.msg);
    dt_optimizer_free(opt);
    dt_batches_free(batches);
    dt_net_free(net);
    dt_cluster_free(cluster);                                               /* CHANGE 1 */
    return status;
}
