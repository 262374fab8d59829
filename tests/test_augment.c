/* Data augmentation (--augment): the crop is a window of the zero-padded image at an offset in
 * -P..P on each axis, every offset drawn; the flip mirrors about half the examples; the draws are
 * the same for a seed whatever the number of workers or decode threads, differ for another seed,
 * and touch training batches only. Images are 8x6 with distinct non-zero pixels, so a window can
 * be recognised and padding told from picture. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "data/loader.h"
#include "idx_fixture.h"
#include "test.h"

enum { H = 8, W = 6, NEX = 64 };

/* Example i: pixel (r, c) = 1 + (7 i + r W + c) % 250, label i % 10. */
static uint8_t picture_pixel(uint32_t i, uint32_t p) { return (uint8_t)(1 + (7 * i + p) % 250); }
static uint8_t picture_label(uint32_t i) { return (uint8_t)(i % 10); }
static dt_dataset *pictures(void) { return idx_dataset("pictures", NEX, H, W, picture_pixel, picture_label); }

static void test_parse_and_check(void) {
    dt_augment a;
    dt_error e = {0};
    CHECK(dt_augment_parse(&a, "crop=4,flip", &e) == DT_OK && a.crop == 4 && a.flip == 1);
    CHECK(dt_augment_parse(&a, "flip", &e) == DT_OK && a.crop == 0 && a.flip == 1);
    CHECK(dt_augment_parse(&a, "", &e) == DT_OK && !dt_augment_on(&a));
    CHECK(dt_augment_parse(&a, "none", &e) == DT_OK && !dt_augment_on(&a));
    const char *bad[] = {"crop=0", "crop=-1", "crop=x", "crop=", "rotate", "flip,", ",flip", "flip,flip", "crop=2,crop=3"};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        CHECK_MSG(dt_augment_parse(&a, bad[k], &e) == DT_EINVAL, "'%s' accepted", bad[k]);
        CHECK_CONTAINS(e.msg, "--augment");
    }
    CHECK(dt_augment_parse(&a, "crop=28", &e) == DT_OK);
    CHECK(dt_augment_check(&a, 28, 28, &e) == DT_EINVAL);
    CHECK_CONTAINS(e.msg, "--augment: crop=28 is larger than the 28x28 image");
    a.crop = 27;
    CHECK(dt_augment_check(&a, 28, 28, &e) == DT_OK);
    CHECK(dt_augment_check(&a, 28, 20, &e) == DT_EINVAL);
}

/* out is x shifted by (oy, ox) with zeros where the window leaves the image, mirrored if flip. */
static int is_window(const float *out, const float *x, int oy, int ox, int flip) {
    for (int i = 0; i < H; i++)
        for (int j = 0; j < W; j++) {
            int si = i + oy, sj = (flip ? W - 1 - j : j) + ox;
            float want = si >= 0 && si < H && sj >= 0 && sj < W ? x[si * W + sj] : 0.0f;
            if (out[i * W + j] != want) return 0;
        }
    return 1;
}

static void test_crop_and_flip(void) {
    dt_dataset *ds = pictures();
    float x[H * W], out[H * W], scratch[H * W];
    int32_t y;
    CHECK(dt_dataset_get(ds, 5, x, &y, NULL) == DT_OK);
    enum { P = 2, KEYS = 400 };
    int seen[2 * P + 1][2 * P + 1] = {{0}}, flips = 0;
    dt_augment crop = {.crop = P}, flip = {.flip = 1};
    for (int k = 0; k < KEYS; k++) {
        memcpy(out, x, sizeof x);
        dt_augment_apply(&crop, out, scratch, H, W, 1, dt_augment_key(9, 0, (size_t)k));
        int matches = 0;
        for (int oy = -P; oy <= P; oy++)
            for (int ox = -P; ox <= P; ox++)
                if (is_window(out, x, oy, ox, 0)) matches++, seen[oy + P][ox + P]++;
        CHECK_MSG(matches == 1, "key %d: the crop is not one window of the padded image (%d matches)", k, matches);
        memcpy(out, x, sizeof x);
        dt_augment_apply(&flip, out, scratch, H, W, 1, dt_augment_key(9, 0, (size_t)k));
        int mirrored = is_window(out, x, 0, 0, 1);
        CHECK(mirrored || is_window(out, x, 0, 0, 0));
        flips += mirrored;
    }
    for (int a = 0; a <= 2 * P; a++)
        for (int b = 0; b <= 2 * P; b++) CHECK_MSG(seen[a][b] > 0, "offset (%d, %d) never drawn", a - P, b - P);
    CHECK_MSG(flips > KEYS / 2 - 60 && flips < KEYS / 2 + 60, "%d of %d mirrored", flips, KEYS);
    /* Channels move together: a 2-channel image's crop is the same window in both. */
    float x2[H * W * 2], o2[H * W * 2], s2[H * W * 2], c0[H * W], c1[H * W];
    for (int p = 0; p < H * W; p++) x2[2 * p] = x[p], x2[2 * p + 1] = 2 * x[p]; /* exact in float */
    memcpy(o2, x2, sizeof x2);
    dt_augment both = {.crop = P, .flip = 1};
    dt_augment_apply(&both, o2, s2, H, W, 2, 77);
    for (int p = 0; p < H * W; p++) c0[p] = o2[2 * p], c1[p] = 0.5f * o2[2 * p + 1];
    CHECK(memcmp(c0, c1, sizeof c0) == 0 && memcmp(c0, x, sizeof c0) != 0);
    dt_dataset_free(ds);
}

static dt_loader *make(const dt_dataset *ds, int B, int shuffle, uint64_t seed, int si, int sc, const char *aug,
                       int threads) {
    dt_loader *l = NULL;
    dt_loader_options o = {.batch_size = B, .shuffle = shuffle, .seed = seed, .shard_index = si, .shard_count = sc,
                           .decode_threads = threads};
    dt_error e = {0};
    if (dt_augment_parse(&o.augment, aug, &e) || dt_loader_create(&l, ds, &o, &e)) {
        fprintf(stderr, "loader: %s\n", e.msg);
        exit(1);
    }
    return l;
}

/* steps batches of B rows into out [steps * B * H * W]. */
static void take(dt_loader *l, int steps, int B, float *out) {
    for (int t = 0; t < steps; t++) {
        dt_batch b;
        CHECK(dt_loader_next(l, &b, NULL) == 0 && b.n == B);
        memcpy(out + (size_t)t * B * H * W, b.x, (size_t)B * H * W * sizeof(float));
    }
}

static void test_loader_determinism(void) {
    dt_dataset *ds = pictures();
    enum { B = 8, STEPS = 12 }; /* 12 steps of 8: one and a half epochs */
    static float a[STEPS * B * H * W], b[STEPS * B * H * W], plain[STEPS * B * H * W];
    dt_loader *l1 = make(ds, B, 1, 3, 0, 1, "crop=2,flip", 1), *l2 = make(ds, B, 1, 3, 0, 1, "crop=2,flip", 2);
    take(l1, STEPS, B, a);
    take(l2, STEPS, B, b);
    CHECK_MSG(memcmp(a, b, sizeof a) == 0, "same seed, 1 and 2 decode threads: different batches");
    dt_loader_free(l1), dt_loader_free(l2);

    /* Training images change; the order of the examples does not. */
    dt_loader *lp = make(ds, B, 1, 3, 0, 1, "", 1);
    take(lp, STEPS, B, plain);
    dt_loader_free(lp);
    int changed = 0;
    for (int r = 0; r < STEPS * B; r++) changed += memcmp(a + r * H * W, plain + r * H * W, H * W * sizeof(float)) != 0;
    CHECK_MSG(changed > STEPS * B / 2, "only %d of %d training rows augmented", changed, STEPS * B);

    /* Another seed, other draws. */
    dt_loader *ls = make(ds, B, 1, 4, 0, 1, "crop=2,flip", 1);
    take(ls, STEPS, B, b);
    dt_loader_free(ls);
    CHECK(memcmp(a, b, sizeof a) != 0);

    /* Two workers with batch B/2: shard s's row k at step t is the single loader's row 2k + s. */
    static float s0[STEPS * B / 2 * H * W], s1[STEPS * B / 2 * H * W];
    dt_loader *w0 = make(ds, B / 2, 1, 3, 0, 2, "crop=2,flip", 1), *w1 = make(ds, B / 2, 1, 3, 1, 2, "crop=2,flip", 1);
    take(w0, STEPS, B / 2, s0);
    take(w1, STEPS, B / 2, s1);
    dt_loader_free(w0), dt_loader_free(w1);
    int same = 1;
    for (int t = 0; t < STEPS; t++)
        for (int k = 0; k < B / 2; k++) {
            const float *row = a + ((size_t)t * B + 2 * k) * H * W;
            same &= !memcmp(row, s0 + ((size_t)t * B / 2 + k) * H * W, H * W * sizeof(float));
            same &= !memcmp(row + H * W, s1 + ((size_t)t * B / 2 + k) * H * W, H * W * sizeof(float));
        }
    CHECK_MSG(same, "2 workers with batch %d saw other augmented images than 1 with batch %d", B / 2, B);

    /* Evaluation passes are never augmented. */
    dt_loader *e1 = make(ds, B, 0, 3, 0, 1, "crop=2,flip", 1), *e2 = make(ds, B, 0, 3, 0, 1, "", 1);
    take(e1, NEX / B, B, a);
    take(e2, NEX / B, B, b);
    CHECK(memcmp(a, b, (size_t)NEX * H * W * sizeof(float)) == 0);
    dt_loader_free(e1), dt_loader_free(e2);

    /* A crop the images cannot take is refused when the loader is made. */
    dt_loader *l = NULL;
    dt_loader_options o = {.batch_size = B, .shuffle = 1, .seed = 1, .shard_count = 1, .augment = {.crop = W}};
    dt_error e = {0};
    CHECK(dt_loader_create(&l, ds, &o, &e) == DT_EINVAL && !l);
    CHECK_CONTAINS(e.msg, "--augment: crop=6");
    dt_dataset_free(ds);
}

int main(void) {
    RUN(test_parse_and_check);
    RUN(test_crop_and_flip);
    RUN(test_loader_determinism);
    return test_summary();
}
