/* Training options (issue 15, items 3 and 4's library side): learning-rate schedules against
 * TensorFlow's formulas at chosen steps (closed forms, worked out by hand below), weight decay,
 * gradient clipping and a scheduled rate against PyTorch's SGD, AdamW and clip_grad_norm_
 * (tests/fixtures/optim.safetensors from gen_optim_fixtures.py, float64), the decay mask's rule,
 * the ps applying all of it exactly as a single process does (ps threads on 127.0.0.1), and the
 * flags' refusals. */
#include <math.h>

#include "compute/optim.h"
#include "compute/schedule.h"
#include "ps_harness.h"
#include "io/safetensors.h"
#include "update/decay_mask.h"

static float lr_of(dt_lr_schedule s, float lr0, int64_t step) { return dt_lr_at(&s, lr0, step); }
/* A rate is a float: right to its rounding (2^-23 relative) of the exact value. */
#define CHECK_LR(got, want) CHECK_NEAR(got, want, 1.2e-7 * fabs(want) + 1e-12)

/* tf.train.exponential_decay: lr0 * rate ^ (step / decay_steps), the exponent floored with staircase. */
static void test_exponential(void) {
    dt_lr_schedule s = {.kind = DT_LR_EXPONENTIAL, .decay_steps = 100, .decay_rate = 0.5f};
    CHECK(dt_lr_schedule_check(&s, NULL) == DT_OK);
    CHECK_LR(lr_of(s, 0.1f, 0), 0.1);
    CHECK_LR(lr_of(s, 0.1f, 50), 0.1 * M_SQRT1_2);     /* 0.5^0.5 */
    CHECK_LR(lr_of(s, 0.1f, 100), 0.05);
    CHECK_LR(lr_of(s, 0.1f, 250), 0.1 * 0.25 * M_SQRT1_2); /* 0.5^2.5 */
    CHECK_LR(lr_of(s, 0.1f, 25), 0.1 / pow(2.0, 0.25));
    s.staircase = 1;
    CHECK_LR(lr_of(s, 0.1f, 50), 0.1);
    CHECK_LR(lr_of(s, 0.1f, 99), 0.1);
    CHECK_LR(lr_of(s, 0.1f, 100), 0.05);
    CHECK_LR(lr_of(s, 0.1f, 250), 0.025);
    CHECK_LR(lr_of(s, 0.1f, 1000), 0.1 / 1024);
}

/* tf.train.piecewise_constant: values[0] while step <= boundaries[0], ... */
static void test_piecewise(void) {
    dt_lr_schedule s = {.kind = DT_LR_PIECEWISE};
    CHECK(dt_lr_parse_boundaries(&s, "100,200", NULL) == DT_OK);
    CHECK(dt_lr_parse_values(&s, "1,0.5,0.1", NULL) == DT_OK);
    CHECK(dt_lr_schedule_check(&s, NULL) == DT_OK);
    CHECK(lr_of(s, 9.0f, 0) == 1.0f);
    CHECK(lr_of(s, 9.0f, 100) == 1.0f); /* the boundary itself still has the earlier value */
    CHECK(lr_of(s, 9.0f, 101) == 0.5f);
    CHECK(lr_of(s, 9.0f, 200) == 0.5f);
    CHECK(lr_of(s, 9.0f, 201) == 0.1f);
    CHECK(lr_of(s, 9.0f, 1000000) == 0.1f);
}

/* Cosine with linear warmup (tf.keras CosineDecay with warmup_target lr0 from 0; without warmup
 * tf.train.cosine_decay): lr0 = 0.2, warmup 10, decay 100, alpha 0.1. At the decay's middle the
 * cosine is 0, so the rate is lr0 * (0.9 * 0.5 + 0.1) = 0.11; at a quarter, cos(pi/4). */
static void test_cosine(void) {
    dt_lr_schedule s = {.kind = DT_LR_COSINE, .warmup_steps = 10, .decay_steps = 100, .alpha = 0.1f};
    CHECK(dt_lr_schedule_check(&s, NULL) == DT_OK);
    CHECK(lr_of(s, 0.2f, 0) == 0.0f);
    CHECK_LR(lr_of(s, 0.2f, 5), 0.1);
    CHECK_LR(lr_of(s, 0.2f, 9), 0.18);
    CHECK_LR(lr_of(s, 0.2f, 10), 0.2);
    CHECK_LR(lr_of(s, 0.2f, 35), 0.2 * (0.9 * 0.5 * (1 + M_SQRT1_2) + 0.1));
    CHECK_LR(lr_of(s, 0.2f, 60), 0.11);
    CHECK_LR(lr_of(s, 0.2f, 85), 0.2 * (0.9 * 0.5 * (1 - M_SQRT1_2) + 0.1));
    CHECK_LR(lr_of(s, 0.2f, 110), 0.02);
    CHECK_LR(lr_of(s, 0.2f, 5000), 0.02);
    dt_lr_schedule plain = {.kind = DT_LR_COSINE, .decay_steps = 100}; /* tf.train.cosine_decay, alpha 0 */
    CHECK_LR(lr_of(plain, 1.0f, 0), 1.0);
    CHECK_LR(lr_of(plain, 1.0f, 50), 0.5);
    CHECK_LR(lr_of(plain, 1.0f, 100), 0.0);
    dt_lr_schedule constant = {.kind = DT_LR_CONSTANT};
    CHECK(lr_of(constant, 0.002f, 123456) == 0.002f);
}

/* Bad input: one-line errors naming the flag. */
static void test_schedule_refusals(void) {
    dt_lr_schedule s = {.kind = DT_LR_PIECEWISE};
    dt_error e = {0};
    CHECK(dt_lr_parse_boundaries(&s, "100,50", &e) == DT_EINVAL);
    CHECK_CONTAINS(e.msg, "--lr_boundaries");
    CHECK_CONTAINS(e.msg, "not increasing");
    CHECK(dt_lr_parse_boundaries(&s, "100,100", &e) == DT_EINVAL);
    CHECK_CONTAINS(e.msg, "not increasing");
    CHECK(dt_lr_parse_boundaries(&s, "100,,200", &e) == DT_EINVAL);
    CHECK_CONTAINS(e.msg, "empty");
    CHECK(dt_lr_parse_boundaries(&s, "-5", &e) == DT_EINVAL);
    CHECK(dt_lr_parse_boundaries(&s, "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17", &e) == DT_EINVAL);
    CHECK_CONTAINS(e.msg, "more than 16");
    CHECK(dt_lr_parse_boundaries(&s, "10,20", &e) == DT_OK);
    CHECK(dt_lr_parse_values(&s, "0.1,0.01", &e) == DT_EINVAL);
    CHECK_CONTAINS(e.msg, "--lr_values");
    CHECK_CONTAINS(e.msg, "expected 3");
    CHECK(dt_lr_parse_values(&s, "0.1,-1,0.01", &e) == DT_EINVAL);
    CHECK_CONTAINS(e.msg, "'-1'");
    CHECK(dt_lr_parse_values(&s, "0.1,nan,0.01", &e) == DT_EINVAL);
    dt_lr_schedule x = {.kind = DT_LR_EXPONENTIAL, .decay_steps = 0, .decay_rate = 0.5f};
    CHECK(dt_lr_schedule_check(&x, &e) == DT_EINVAL);
    CHECK_CONTAINS(e.msg, "--lr_decay_steps");
    dt_lr_schedule c = {.kind = DT_LR_CONSTANT, .warmup_steps = 5};
    CHECK(dt_lr_schedule_check(&c, &e) == DT_EINVAL);
    CHECK_CONTAINS(e.msg, "--warmup_steps needs --lr_schedule cosine");
    dt_lr_kind k;
    CHECK(dt_lr_kind_parse("linear", &k, &e) == DT_EINVAL);
    CHECK_CONTAINS(e.msg, "--lr_schedule");
}

/* Kernels decay, rank-1 variables (biases, batch norm's gamma and beta) only when asked; the
 * flat mask and a ps's shard of it agree with the rule. */
static void test_decay_mask(void) {
    dt_param_view v[3] = {{.name = "conv/kernel", .offset = 0, .count = 6, .ndim = 4},
                          {.name = "conv/bias", .offset = 6, .count = 2, .ndim = 1},
                          {.name = "bn/gamma", .offset = 8, .count = 2, .ndim = 1}};
    dt_opt_config c;
    dt_opt_config_init(&c, "sgd", 0.1f, NULL);
    uint8_t *m = (uint8_t *)1;
    CHECK(dt_decay_mask_flat(&m, &c, v, 3, 10, NULL) == DT_OK && m == NULL); /* no weight decay: no mask */
    c.weight_decay = 0.1f;
    CHECK(dt_decay_mask_flat(&m, &c, v, 3, 10, NULL) == DT_OK && m);
    if (!m) return;
    for (int i = 0; i < 10; i++) CHECK_MSG(m[i] == (i < 6), "float %d", i);
    free(m);
    c.decay_rank1 = 1;
    CHECK(dt_decay_mask_flat(&m, &c, v, 3, 10, NULL) == DT_OK && m);
    for (int i = 0; m && i < 10; i++) CHECK(m[i] == 1);
    free(m);
    /* Batch norm's moving statistics are not trained: they never decay, even with the biases. */
    dt_param_view mv[2] = {v[0], {.name = "bn/moving_mean", .offset = 6, .count = 4, .ndim = 1, .not_trained = 1}};
    CHECK(dt_decay_mask_flat(&m, &c, mv, 2, 10, NULL) == DT_OK && m);
    for (int i = 0; m && i < 10; i++) CHECK_MSG(m[i] == (i < 6), "float %d with a moving statistic", i);
    free(m);
    dt_placement mpl;
    CHECK(dt_placement_compute(&mpl, mv, 2, 1, DT_PLACE_ROUND_ROBIN, NULL) == DT_OK);
    uint8_t ms[10];
    dt_decay_mask_shard(ms, &c, &mpl, 0);
    for (int i = 0; i < 10; i++) CHECK_MSG(ms[i] == (i < 6), "shard float %d with a moving statistic", i);
    dt_placement_free(&mpl);
    c.decay_rank1 = 0;
    dt_placement pl;
    CHECK(dt_placement_compute(&pl, v, 3, 2, DT_PLACE_ROUND_ROBIN, NULL) == DT_OK);
    uint8_t s0[10], s1[10];
    dt_decay_mask_shard(s0, &c, &pl, 0); /* kernel + gamma */
    dt_decay_mask_shard(s1, &c, &pl, 1); /* bias */
    CHECK(pl.shard_count[0] == 8 && pl.shard_count[1] == 2);
    for (int i = 0; i < 8; i++) CHECK(s0[i] == (i < 6));
    CHECK(s1[0] == 0 && s1[1] == 0);
    dt_placement_free(&pl);
}

/* The optimizer's skip ranges: the not-trained views, neighbours merged, in the flat layout and in
 * each ps's shard (where placement puts them). */
static void test_state_ranges(void) {
    dt_param_view v[5] = {{.name = "conv/kernel", .offset = 0, .count = 6, .ndim = 4},
                          {.name = "bn/gamma", .offset = 6, .count = 2, .ndim = 1},
                          {.name = "bn/moving_mean", .offset = 8, .count = 2, .ndim = 1, .not_trained = 1},
                          {.name = "bn/moving_variance", .offset = 10, .count = 2, .ndim = 1, .not_trained = 1},
                          {.name = "dense/kernel", .offset = 12, .count = 3, .ndim = 2}};
    size_t *r = NULL;
    int n = -1;
    CHECK(dt_state_ranges_flat(&r, &n, v, 5, NULL) == DT_OK && n == 1 && r);
    if (r) CHECK(r[0] == 8 && r[1] == 4);
    free(r);
    CHECK(dt_state_ranges_flat(&r, &n, v, 2, NULL) == DT_OK && n == 0 && !r); /* none */
    dt_placement pl;
    CHECK(dt_placement_compute(&pl, v, 5, 2, DT_PLACE_ROUND_ROBIN, NULL) == DT_OK);
    for (int ps = 0; ps < 2; ps++) {
        CHECK(dt_state_ranges_shard(&r, &n, &pl, ps, NULL) == DT_OK);
        /* every listed float is a moving statistic's, and there are as many as the ps holds */
        size_t listed = 0, held = 0;
        for (int k = 0; k < n; k++) {
            listed += r[2 * k + 1];
            for (size_t i = r[2 * k]; i < r[2 * k] + r[2 * k + 1]; i++) {
                size_t flat = 0;
                for (int j = pl.ps_begin[ps]; j < pl.ps_begin[ps + 1]; j++) {
                    const dt_slice *sl = &pl.slices[pl.ps_slices[j]];
                    if (i >= sl->shard_offset && i < sl->shard_offset + sl->count) flat = sl->offset + i - sl->shard_offset;
                }
                CHECK_MSG(flat >= 8 && flat < 12, "ps %d shard float %zu is flat %zu", ps, i, flat);
            }
            if (k) CHECK(r[2 * k] > r[2 * k - 2] + r[2 * k - 1]); /* ascending, touching ones merged */
        }
        for (int j = pl.ps_begin[ps]; j < pl.ps_begin[ps + 1]; j++) {
            const dt_slice *sl = &pl.slices[pl.ps_slices[j]];
            if (pl.views[sl->view].not_trained) held += sl->count;
        }
        CHECK_MSG(listed == held, "ps %d: %zu listed, %zu held", ps, listed, held);
        free(r);
    }
    dt_placement_free(&pl);
}

/* ---- against PyTorch ---- */

static float *fixture(const dt_st_file *f, const char *name, size_t want) {
    const dt_st_info *t = dt_st_find(f, name);
    float *out = t && t->count == want ? malloc(want * sizeof(float)) : NULL;
    if (out && dt_st_read(f, name, DT_ST_F32, out, want, NULL) != 0) {
        free(out);
        out = NULL;
    }
    CHECK_MSG(out != NULL, "fixture tensor %s [%zu] missing", name, want);
    return out;
}

static double meta(const dt_st_file *f, const char *key) {
    const char *v = dt_st_meta_get(f, key);
    CHECK_MSG(v != NULL, "fixture metadata %s missing", key);
    return v ? atof(v) : 0;
}

/* Runs a case the way dtrain does: clip the whole gradient (if asked), then the optimizer with the
 * schedule and the decay mask; returns the largest error against the torch result. */
static double run_case(const dt_st_file *f, const char *name, const char *optimizer, int clip, float wd, int rank1) {
    enum { N = 15 };
    int steps = (int)meta(f, "steps");
    float *p = fixture(f, "p0", N), *grads = fixture(f, "grads", (size_t)steps * N);
    char key[64];
    snprintf(key, sizeof key, "out/%s", name);
    float *want = fixture(f, key, N);
    snprintf(key, sizeof key, "base_lr/%s", name);
    double err = INFINITY;
    dt_opt_config c;
    if (p && grads && want && dt_opt_config_init(&c, optimizer, (float)meta(f, key), NULL) == DT_OK) {
        c.schedule = (dt_lr_schedule){.kind = DT_LR_COSINE, .warmup_steps = (int64_t)meta(f, "warmup"),
                                      .decay_steps = (int64_t)meta(f, "decay"), .alpha = (float)meta(f, "alpha")};
        c.weight_decay = wd;
        c.decay_rank1 = rank1;
        dt_param_view v[2] = {{.name = "w", .offset = 0, .count = 12, .ndim = 2, .shape = {4, 3}},
                              {.name = "b", .offset = 12, .count = 3, .ndim = 1, .shape = {3}}};
        uint8_t *mask = NULL;
        float state[2 * N] = {0};
        CHECK(dt_decay_mask_flat(&mask, &c, v, 2, N, NULL) == DT_OK);
        for (int t = 0; t < steps; t++) {
            float *g = grads + (size_t)t * N;
            if (clip) dt_clip_global_norm(g, N, (float)meta(f, "clip"));
            dt_opt_apply(&c, p, g, state, mask, N, t);
        }
        err = 0;
        for (int i = 0; i < N; i++) err = fmax(err, fabs((double)p[i] - want[i]) / fmax(1.0, fabs(want[i])));
        free(mask);
    }
    free(p), free(grads), free(want);
    return err;
}

static void test_against_pytorch(void) {
    dt_st_file *f = NULL;
    dt_error e = {0};
    if (dt_st_open(&f, "tests/fixtures/optim.safetensors", &e) != 0) {
        CHECK_MSG(0, "%s (make it with /usr/bin/python3 tests/fixtures/gen_optim_fixtures.py)", e.msg);
        return;
    }
    float wd = (float)meta(f, "wd");
    struct { const char *name, *opt; int clip; } cases[] = {
        {"sgd_wd", "sgd", 0}, {"momentum_wd", "momentum", 0}, {"adamw", "adam", 0},
        {"clip_sgd_wd", "sgd", 1}, {"clip_adamw", "adam", 1},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        double err = run_case(f, cases[k].name, cases[k].opt, cases[k].clip, wd, 0);
        CHECK_MSG(err < 1e-4, "%s: max relative error %g against torch", cases[k].name, err);
        /* The bound bites: without the decay, with decay on the bias too, or without clipping, the
         * same run misses the reference by far more. */
        double off = run_case(f, cases[k].name, cases[k].opt, cases[k].clip, 0, 0);
        CHECK_MSG(off > 1e-3, "%s without weight decay: error only %g", cases[k].name, off);
        off = run_case(f, cases[k].name, cases[k].opt, cases[k].clip, wd, 1);
        CHECK_MSG(off > 1e-4, "%s with the bias decayed too: error only %g", cases[k].name, off);
        off = run_case(f, cases[k].name, cases[k].opt, !cases[k].clip, wd, 0);
        CHECK_MSG(off > 1e-3, "%s with clipping %s: error only %g", cases[k].name, cases[k].clip ? "off" : "on", off);
    }
    /* One gradient clipped (torch.nn.utils.clip_grad_norm_), and one below the bound left alone. */
    float *in = fixture(f, "clip_in", 15), *want = fixture(f, "clip_out", 15);
    if (in && want) {
        double norm = 0;
        for (int i = 0; i < 15; i++) norm += (double)in[i] * in[i];
        CHECK_NEAR(dt_clip_global_norm(in, 15, (float)meta(f, "clip_one")), sqrt(norm), 1e-5);
        for (int i = 0; i < 15; i++) CHECK_NEAR(in[i], want[i], 1e-5);
        float keep[15];
        memcpy(keep, in, sizeof keep);
        dt_clip_global_norm(in, 15, 100.0f);
        CHECK(memcmp(keep, in, sizeof keep) == 0);
    }
    free(in), free(want);
    dt_st_close(f);
}

/* ---- on the ps tasks ---- */

/* Two ps threads, each shard cut into chunks, get the schedule, weight decay and a decay mask in
 * INIT; asynchronous pushes then leave exactly (bit for bit) what dt_opt_apply with the same mask
 * computes in one process, for each optimizer, from a non-zero start step. */
static void check_ps_applies_options(const char *name) {
    enum { N0 = 500, N1 = 301, STEPS = 5 };
    ps_thread ps[2];
    ps_start(&ps[0], 0, N0, NULL, 0);
    ps_start(&ps[1], 1, N1, NULL, 0);
    size_t sizes[2] = {N0, N1};
    chunk_bytes = 512; /* 128 floats a chunk: the mask's runs cross chunk edges */
    dt_ps_client *c = client(2, ps, sizes, DT_ROLE_CHIEF, 0);
    chunk_bytes = 0;
    CHECK(c != NULL);
    if (!c) goto out;
    dt_opt_config opt;
    dt_opt_config_init(&opt, name, 0.05f, NULL);
    opt.schedule = (dt_lr_schedule){.kind = DT_LR_COSINE, .warmup_steps = 3, .decay_steps = 6, .alpha = 0.2f};
    opt.weight_decay = 0.1f;
    static float p0[N0], p1[N1], s0[2 * N0], s1[2 * N1], g0[N0], r0[N0], r1[N1];
    static uint8_t m0[N0], m1[N1];
    fill(p0, N0, 1.0f, 3);
    fill(p1, N1, 1.0f, 4);
    memset(s0, 0, sizeof s0), memset(s1, 0, sizeof s1);
    for (int i = 0; i < N0; i++) m0[i] = (i / 90) % 2; /* runs of 90 */
    for (int i = 0; i < N1; i++) m1[i] = i >= 200;
    const float *src[2] = {p0, p1};
    const uint8_t *masks[2] = {m0, m1};
    dt_error e = {0};
    CHECK(dt_ps_client_init(c, &opt, src, NULL, masks, 2, &e) == DT_OK);
    float *pp[2] = {p0, p1}, *ss[2] = {s0, s1};
    push_and_mirror(c, &opt, pp, ss, masks, sizes, STEPS, 2);
    float *dst[2] = {r0, r1};
    CHECK(dt_ps_client_pull_all(c, dst, 0, NULL, &e) == DT_OK);
    CHECK_MSG(memcmp(r0, p0, sizeof r0) == 0 && memcmp(r1, p1, sizeof r1) == 0, "%s: the ps differs from dt_opt_apply",
              name);
    /* And the decay did something: a masked float moved differently from an unmasked one would
     * without it (the same run with no mask differs). */
    static float q0[N0], sq[2 * N0];
    fill(q0, N0, 1.0f, 3);
    memset(sq, 0, sizeof sq);
    for (int t = 0; t < STEPS; t++) {
        fill(g0, N0, 0.5f, 100 + t);
        dt_opt_apply(&opt, q0, g0, sq, NULL, N0, 2 + t);
    }
    CHECK(memcmp(q0, r0, sizeof q0) != 0);
out:
    dt_ps_client_close(c);
    CHECK(ps_stop(&ps[0]) == DT_EINTR);
    CHECK(ps_stop(&ps[1]) == DT_EINTR);
}

static void test_ps_applies_options(void) {
    check_ps_applies_options("sgd");
    check_ps_applies_options("momentum");
    check_ps_applies_options("adam");
}

int main(void) {
    RUN(test_exponential);
    RUN(test_piecewise);
    RUN(test_cosine);
    RUN(test_schedule_refusals);
    RUN(test_decay_mask);
    RUN(test_state_ranges);
    RUN(test_against_pytorch);
    RUN(test_ps_applies_options);
    return test_summary();
}
