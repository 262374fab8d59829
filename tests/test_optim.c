/* Optimizers against TensorFlow's formulas, evaluated independently in double precision. */
#include "compute/optim.h"
#include "test.h"

static void test_config_refusals(void) {
    dt_opt_config c;
    dt_error err = {0};
    CHECK(dt_opt_config_init(&c, "adagrad", 0.1f, &err) == DT_EINVAL);
    CHECK_CONTAINS(err.msg, "adagrad");
    CHECK(dt_opt_config_init(&c, "adam", -1.0f, &err) == DT_EINVAL);
    CHECK_CONTAINS(err.msg, "learning_rate");
    CHECK(dt_opt_config_init(&c, "adam", NAN, &err) == DT_EINVAL);
    CHECK(dt_opt_config_init(&c, "momentum", 0.1f, &err) == 0);
    CHECK(dt_opt_slots(&c) == 1);
}

static void test_sgd_and_momentum(void) {
    dt_opt_config c;
    CHECK(dt_opt_config_init(&c, "sgd", 0.5f, NULL) == 0);
    float p[3] = {1, 2, 3}, g[3] = {0.5f, -1, 2};
    dt_opt_apply(&c, p, g, NULL, NULL, 3, 0);
    CHECK_NEAR(p[0], 0.75, 1e-7);
    CHECK_NEAR(p[1], 2.5, 1e-7);
    CHECK_NEAR(p[2], 2.0, 1e-7);

    CHECK(dt_opt_config_init(&c, "momentum", 0.1f, NULL) == 0);
    float q[1] = {1}, acc[1] = {0};
    double qd = 1, ad = 0;
    float gs[3] = {1.0f, -0.5f, 0.25f};
    for (int s = 0; s < 3; s++) {
        dt_opt_apply(&c, q, &gs[s], acc, NULL, 1, s);
        ad = 0.9 * ad + gs[s];
        qd -= 0.1 * ad;
    }
    CHECK_NEAR(q[0], qd, 1e-6);
    CHECK_NEAR(acc[0], ad, 1e-6);
}

/* One and several Adam steps vs TF's AdamOptimizer formula, and the slice property: updating two
 * halves separately (as two ps tasks would) equals updating the whole. */
static void test_adam(void) {
    dt_opt_config c;
    CHECK(dt_opt_config_init(&c, "adam", 1e-3f, NULL) == 0);
    CHECK(dt_opt_slots(&c) == 2);
    enum { N = 6, STEPS = 4 };
    float p[N], st[2 * N] = {0};
    double pd[N], m[N] = {0}, v[N] = {0};
    for (int i = 0; i < N; i++) p[i] = (float)(pd[i] = 0.1 * (i - 2));
    for (int s = 0; s < STEPS; s++) {
        float g[N];
        for (int i = 0; i < N; i++) g[i] = (float)(0.3 * (i + 1) * (s % 2 ? -1 : 1) + 0.01 * s);
        dt_opt_apply(&c, p, g, st, NULL, N, s);
        /* The hyperparameters are float32 in TF as here: use their float values exactly. */
        const double b1 = 0.9f, b2 = 0.999f, lr = 1e-3f, eps = 1e-8f;
        double t = s + 1, lr_t = lr * sqrt(1 - pow(b2, t)) / (1 - pow(b1, t));
        for (int i = 0; i < N; i++) {
            m[i] = b1 * m[i] + (double)(1.0f - 0.9f) * g[i];
            v[i] = b2 * v[i] + (double)(1.0f - 0.999f) * (double)g[i] * g[i];
            pd[i] -= lr_t * m[i] / (sqrt(v[i]) + eps);
        }
        if (s == 0) {
            /* First step: m/(sqrt v) = sign(g), so every parameter moves by exactly lr. */
            for (int i = 0; i < N; i++) CHECK_NEAR(p[i], 0.1 * (i - 2) - 1e-3, 1e-6);
        }
    }
    for (int i = 0; i < N; i++) {
        CHECK_NEAR(p[i], pd[i], 1e-6);
        CHECK_NEAR(st[i], m[i], 1e-7); /* m cancels (signs alternate): absolute, gradients are O(1) */
        CHECK_NEAR(st[N + i], v[i], 1e-5 * v[i] + 1e-12); /* float32 vs double running sums */
    }

    float a[N], b[N], sa[2 * N] = {0}, s1[N] = {0}, s2[N] = {0}, g[N];
    for (int i = 0; i < N; i++) a[i] = b[i] = 0.05f * i, g[i] = 0.2f * (i - 3);
    dt_opt_apply(&c, a, g, sa, NULL, N, 0);
    dt_opt_apply(&c, b, g, s1, NULL, N / 2, 0);
    dt_opt_apply(&c, b + N / 2, g + N / 2, s2, NULL, N / 2, 0);
    for (int i = 0; i < N; i++) CHECK(a[i] == b[i]);
}

int main(void) {
    RUN(test_config_refusals);
    RUN(test_sgd_and_momentum);
    RUN(test_adam);
    return test_summary();
}
