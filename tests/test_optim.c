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

/* dt_opt_apply_to with skipped ranges (batch norm's moving statistics): those floats keep their
 * values (out of place: copied) and every slot, even non-zero ones and under weight decay; the
 * others get exactly dt_opt_apply. Ranges count from base, and the parts outside the slice are
 * ignored (a ps part of a shard). */
static void test_skip(void) {
    enum { N = 24 };
    static const size_t ranges[] = {2, 3, 8, 4, 20, 2, 29, 6}; /* shard floats; the slice is [6, 30) */
    const char *names[] = {"sgd", "momentum", "adam"};
    for (int o = 0; o < 3; o++)
        for (int wd = 0; wd < 2; wd++)
            for (int inplace = 0; inplace < 2; inplace++) {
                dt_opt_config c;
                dt_opt_config_init(&c, names[o], 0.1f, NULL);
                c.weight_decay = wd ? 0.5f : 0.0f;
                float p[N], g[N], st[2 * N], want[N], want_st[2 * N], out[N];
                uint8_t mask[N];
                for (int i = 0; i < N; i++) p[i] = 0.1f * (float)(i - 7), g[i] = 0.3f * (float)((i * 5) % 7 - 3);
                for (int i = 0; i < 2 * N; i++) st[i] = 0.01f * (float)(i % 5); /* an older run's non-zero slots */
                memset(mask, 1, sizeof mask); /* decay everywhere: the skip wins */
                memcpy(want, p, sizeof p);
                memcpy(want_st, st, sizeof st);
                dt_opt_apply(&c, want, g, want_st, mask, N, 3);
                int skipped[N] = {0};
                for (int i = 0; i < N; i++) {
                    size_t f = (size_t)i + 6;
                    skipped[i] = (f >= 8 && f < 12) || (f >= 20 && f < 22) || (f >= 29);
                    if (!skipped[i]) continue;
                    want[i] = p[i];
                    want_st[i] = st[i], want_st[N + i] = st[N + i];
                }
                dt_opt_skip skip = {ranges, 4, 6};
                float *dst = inplace ? p : out;
                if (!inplace) memset(out, 0xff, sizeof out); /* NaN: a float left unwritten shows */
                dt_opt_apply_to(&c, dst, p, g, st, mask, N, 3, &skip);
                CHECK_MSG(memcmp(dst, want, sizeof want) == 0, "%s wd %d %s: values", names[o], wd,
                          inplace ? "in place" : "out of place");
                CHECK_MSG(memcmp(st, want_st, (size_t)dt_opt_slots(&c) * N * sizeof(float)) == 0, "%s wd %d: slots",
                          names[o], wd);
            }
}

int main(void) {
    RUN(test_config_refusals);
    RUN(test_sgd_and_momentum);
    RUN(test_adam);
    RUN(test_skip);
    return test_summary();
}
