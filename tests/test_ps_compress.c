/* --compression through real ps tasks (threads on 127.0.0.1): 16-bit pushes and pulls round trip
 * exactly as the arithmetic says (the ps applies the unpacked gradient with error feedback to its
 * float32 masters, a pull is the masters rounded once), in chunks over two ps; a bf16 worker and a
 * float32 worker share a sync cluster; a stale 16-bit push leaves its residual owed; the ps refuses
 * an fp16 pull of a parameter beyond fp16's range, and 16-bit payloads of the wrong size. */
#include "compute/optim.h"
#include "ps_harness.h"
#include "transport/compress.h"

/* A client as ps_harness.h's client_sync, sending and pulling in encoding enc. */
static dt_ps_client *client_enc(int n_ps, ps_thread *ps, const size_t *sizes, dt_wire_role role, int task,
                                int aggregate, int total, dt_encoding enc) {
    const char *eps[8];
    for (int i = 0; i < n_ps; i++) eps[i] = ps[i].endpoint;
    dt_ps_client_config cc = {.n_ps = n_ps, .endpoints = eps, .shard_floats = sizes, .role = role, .task = task,
                              .connect_timeout_ms = 3000, .request_timeout_ms = request_ms,
                              .replicas_to_aggregate = aggregate, .total_num_replicas = total,
                              .chunk_bytes = chunk_bytes, .compression = enc};
    dt_ps_client *c = NULL;
    dt_error e = {0};
    if (dt_ps_client_open(&c, &cc, &e)) fprintf(stderr, "  open: %s\n", e.msg);
    return c;
}

/* What a worker with error feedback sends: c = Q(g + e), e = (g + e) - c; sent = c unpacked. */
static void mirror_send(dt_encoding enc, const float *g, float *e, float *sent, size_t n) {
    uint16_t *w = malloc(n * sizeof *w);
    dt_pack_ef(enc, w, e, g, e, n);
    dt_unpack(enc, sent, w, n);
    free(w);
}

/* x rounded to the encoding and back: what a 16-bit pull gives. */
static void rounded(dt_encoding enc, const float *x, float *out, size_t n) {
    uint16_t *w = malloc(n * sizeof *w);
    dt_pack(enc, w, x, n);
    dt_unpack(enc, out, w, n);
    free(w);
}

/* Async, two ps of different sizes, each cut into chunks: every step's push applies Q(g + e), the
 * masters (fetched in float32) equal dt_opt_apply of exactly that, bit for bit, and a 16-bit pull is
 * the masters rounded once. */
static void check_async_exact(dt_encoding enc, const char *optimizer) {
    enum { N0 = 700, N1 = 333, STEPS = 5 };
    ps_thread ps[2];
    ps_start(&ps[0], 0, N0, NULL, 0);
    ps_start(&ps[1], 1, N1, NULL, 0);
    size_t sizes[2] = {N0, N1};
    chunk_bytes = 1000; /* 250 floats: 3 and 2 chunks */
    dt_ps_client *c = client_enc(2, ps, sizes, DT_ROLE_CHIEF, 0, 0, 0, enc);
    chunk_bytes = 0;
    CHECK(c != NULL);
    if (!c) goto out;
    dt_opt_config opt;
    dt_opt_config_init(&opt, optimizer, 0.01f, NULL);
    static float p0[N0], p1[N1], s0[2 * N0], s1[2 * N1], g0[N0], g1[N1], e0[N0], e1[N1], c0[N0], c1[N1];
    static float r0[N0], r1[N1], want0[N0], want1[N1], st0[2 * N0], st1[2 * N1];
    memset(s0, 0, sizeof s0), memset(s1, 0, sizeof s1), memset(e0, 0, sizeof e0), memset(e1, 0, sizeof e1);
    fill(p0, N0, 1.0f, 3);
    fill(p1, N1, 1.0f, 4);
    const float *src[2] = {p0, p1};
    dt_error e = {0};
    CHECK(dt_ps_client_init(c, &opt, src, NULL, NULL, 0, &e) == DT_OK);
    int pull_ok = 1;
    for (int t = 0; t < STEPS; t++) {
        fill(g0, N0, 0.37f, 100 + t); /* values a 16-bit encoding cannot hold exactly */
        fill(g1, N1, 0.37f, 200 + t);
        const float *gs[2] = {g0, g1};
        const float *views[2];
        int64_t steps[2];
        CHECK(dt_ps_client_push_pull(c, gs, t, 0, views, steps, NULL, &e) == DT_OK);
        mirror_send(enc, g0, e0, c0, N0);
        mirror_send(enc, g1, e1, c1, N1);
        dt_opt_apply(&opt, p0, c0, s0, NULL, N0, t);
        dt_opt_apply(&opt, p1, c1, s1, NULL, N1, t);
        rounded(enc, p0, want0, N0);
        rounded(enc, p1, want1, N1);
        pull_ok &= steps[0] == t + 1 && memcmp(views[0], want0, sizeof want0) == 0 &&
                   memcmp(views[1], want1, sizeof want1) == 0;
    }
    CHECK_MSG(pull_ok, "%s %s: pulled parameters differ from the masters rounded once", dt_enc_name(enc), optimizer);
    float *dst[2] = {r0, r1}, *st[2] = {st0, st1};
    int64_t steps[2];
    CHECK(dt_ps_client_fetch_state(c, &opt, dst, st, steps, NULL, &e) == DT_OK); /* float32, always */
    CHECK_MSG(memcmp(r0, p0, sizeof r0) == 0 && memcmp(r1, p1, sizeof r1) == 0,
              "%s %s: masters differ from dt_opt_apply of the fed-back gradients", dt_enc_name(enc), optimizer);
    CHECK(memcmp(st0, s0, (size_t)dt_opt_slots(&opt) * N0 * sizeof(float)) == 0);
    CHECK(steps[0] == STEPS && steps[1] == STEPS);
out:
    dt_ps_client_close(c);
    ps_stop(&ps[0]);
    ps_stop(&ps[1]);
}
static void test_async_bf16_adam_exact(void) { check_async_exact(DT_ENC_BF16, "adam"); }
static void test_async_fp16_sgd_exact(void) { check_async_exact(DT_ENC_FP16, "sgd"); }

/* One sync cluster, a bf16 worker (0, the chief) and a float32 one (1): each step's mean is
 * (Q(g0 + e0) + g1) / 2 in worker order; each worker pulls in its own encoding. Then a third,
 * backup worker case: a bf16 gradient that arrives stale is dropped with its residual still owed,
 * so the next push carries what was rounded away before it. */
static void test_sync_mixed_cluster(void) {
    enum { N = 301, STEPS = 4 };
    ps_thread ps;
    ps_start(&ps, 0, N, NULL, 0);
    size_t sizes[1] = {N};
    dt_ps_client *w0 = client_enc(1, &ps, sizes, DT_ROLE_CHIEF, 0, 2, 2, DT_ENC_BF16);
    dt_ps_client *w1 = client_enc(1, &ps, sizes, DT_ROLE_WORKER, 1, 2, 2, DT_ENC_FP32);
    CHECK(w0 && w1);
    if (w0 && w1) {
        static float p[N], g0[N], g1[N], e0[N], c0[N], mean[N], r[N], want[N], state[1];
        memset(e0, 0, sizeof e0);
        fill(p, N, 1.0f, 7);
        const float *src[1] = {p};
        dt_opt_config opt;
        dt_opt_config_init(&opt, "sgd", 0.5f, NULL);
        dt_error e = {0};
        CHECK(dt_ps_client_init(w0, &opt, src, NULL, NULL, 0, &e) == DT_OK);
        int ok = 1;
        for (int t = 0; t < STEPS; t++) {
            fill(g0, N, 0.31f, 10 + t);
            fill(g1, N, 0.29f, 20 + t);
            const float *a[1] = {g0}, *b[1] = {g1};
            dt_push_result res;
            ok &= dt_ps_client_push_all(w1, b, t, &res, &e) == DT_OK; /* held: the step needs both */
            ok &= dt_ps_client_push_all(w0, a, t, &res, &e) == DT_OK && res.global_step == t + 1;
            mirror_send(DT_ENC_BF16, g0, e0, c0, N);
            for (int i = 0; i < N; i++) mean[i] = (c0[i] + g1[i]) / 2.0f; /* as the ps: worker order */
            dt_opt_apply(&opt, p, mean, state, NULL, N, t);
            float *dst[1] = {r};
            ok &= dt_ps_client_pull_all(w1, dst, t + 1, NULL, &e) == DT_OK && memcmp(r, p, sizeof r) == 0;
            rounded(DT_ENC_BF16, p, want, N);
            ok &= dt_ps_client_pull_all(w0, dst, t + 1, NULL, &e) == DT_OK && memcmp(r, want, sizeof r) == 0;
        }
        CHECK_MSG(ok, "mixed cluster: %s", e.msg);
    }
    dt_ps_client_close(w0);
    dt_ps_client_close(w1);
    ps_stop(&ps);
}

static void test_stale_push_keeps_residual(void) {
    enum { N = 64 };
    ps_thread ps;
    ps_start(&ps, 0, N, NULL, 0);
    size_t sizes[1] = {N};
    dt_ps_client *w[3];
    for (int k = 0; k < 3; k++)
        w[k] = client_enc(1, &ps, sizes, k ? DT_ROLE_WORKER : DT_ROLE_CHIEF, k, 2, 3, k == 2 ? DT_ENC_BF16 : DT_ENC_FP32);
    CHECK(w[0] && w[1] && w[2]);
    if (w[0] && w[1] && w[2]) {
        static float p[N], g[N], zero[N], r[N];
        for (int i = 0; i < N; i++) g[i] = 1.0f + 0x1p-9f; /* bf16 sends 1 and owes 2^-9 */
        const float *src[1] = {p};
        dt_opt_config opt;
        dt_opt_config_init(&opt, "sgd", 1.0f, NULL);
        dt_error e = {0};
        CHECK(dt_ps_client_init(w[0], &opt, src, NULL, NULL, 0, &e) == DT_OK);
        const float *gz[1] = {zero}, *gg[1] = {g};
        dt_push_result res;
        /* step 0: worker 2 accepted (sends 1, owes 2^-9), worker 0 completes it */
        CHECK(dt_ps_client_push_all(w[2], gg, 0, &res, &e) == DT_OK && res.n_stale == 0);
        CHECK(dt_ps_client_push_all(w[0], gz, 0, &res, &e) == DT_OK && res.global_step == 1);
        /* step 1: workers 0 and 1 make it; worker 2's gradient arrives stale: dropped, and its
         * residual stays 2^-9 (the one it computed, 2^-8, is not taken) */
        CHECK(dt_ps_client_push_all(w[0], gz, 1, &res, &e) == DT_OK);
        CHECK(dt_ps_client_push_all(w[1], gz, 1, &res, &e) == DT_OK && res.global_step == 2);
        CHECK(dt_ps_client_push_all(w[2], gg, 1, &res, &e) == DT_OK && res.n_stale == 1);
        /* step 2: worker 2 again: 1 + 2^-9 + 2^-9 = 1 + 2^-8, a tie, rounds to 1 and owes 2^-8; had
         * the stale push advanced the residual (to 2^-8), this one would be 1 + 3 * 2^-9 -> 1 + 2^-7 */
        CHECK(dt_ps_client_push_all(w[2], gg, 2, &res, &e) == DT_OK && res.n_stale == 0);
        CHECK(dt_ps_client_push_all(w[0], gz, 2, &res, &e) == DT_OK && res.global_step == 3);
        float *dst[1] = {r};
        CHECK(dt_ps_client_pull_all(w[0], dst, 3, NULL, &e) == DT_OK);
        /* SGD lr 1 from 0: -(1/2) per accepted worker-2 push of 1, twice */
        CHECK_MSG(r[0] == -1.0f && r[N - 1] == -1.0f, "got %.9g", (double)r[0]);
    }
    for (int k = 0; k < 3; k++) dt_ps_client_close(w[k]);
    ps_stop(&ps);
}

/* fp16 cannot hold a parameter beyond 65504: the ps refuses to send it (bf16 and float32 can);
 * raw 16-bit requests: a PULL in fp16 gets 2 bytes a value back, a PUSH of the wrong size is
 * refused. */
static void test_fp16_range_and_raw_sizes(void) {
    enum { N = 10 };
    ps_thread ps;
    ps_start(&ps, 0, N, NULL, 0);
    size_t sizes[1] = {N};
    dt_ps_client *chief = client_enc(1, &ps, sizes, DT_ROLE_CHIEF, 0, 0, 0, DT_ENC_FP32);
    dt_ps_client *h16 = client_enc(1, &ps, sizes, DT_ROLE_WORKER, 1, 0, 0, DT_ENC_FP16);
    dt_ps_client *b16 = client_enc(1, &ps, sizes, DT_ROLE_WORKER, 1, 0, 0, DT_ENC_BF16);
    void *ctx = zmq_ctx_new();
    void *raw = raw_open(ctx, ps.endpoint);
    CHECK(chief && h16 && b16);
    if (chief && h16 && b16) {
        static float p[N], r[N];
        fill(p, N, 1.0f, 9);
        p[3] = 70000.0f;
        const float *src[1] = {p};
        dt_opt_config opt;
        dt_opt_config_init(&opt, "sgd", 0.1f, NULL);
        dt_error e = {0};
        CHECK(dt_ps_client_init(chief, &opt, src, NULL, NULL, 0, &e) == DT_OK);
        float *dst[1] = {r};
        CHECK(dt_ps_client_pull_all(h16, dst, 0, NULL, &e) == DT_EPROTO);
        CHECK_CONTAINS(e.msg, "beyond fp16's range");
        CHECK(dt_ps_client_last_refusal(h16) == DT_WIRE_E_BAD_VALUE);
        CHECK(dt_ps_client_pull_all(b16, dst, 0, NULL, &e) == DT_OK && r[3] == 70144.0f); /* bf16 of 70000 */

        /* raw: a PULL in fp16 of a shard that fits */
        p[3] = 1.0f;
        CHECK(dt_ps_client_init(chief, &opt, src, NULL, NULL, 0, &e) == DT_OK);
        dt_wire_header h = dt_wire_header_make(DT_MSG_PULL, DT_ROLE_WORKER, 1, 5);
        h.encoding = DT_ENC_FP16;
        dt_wire_send(raw, NULL, &h, NULL, 0, NULL);
        dt_wire_in in;
        CHECK(raw_reply(raw, &in) == DT_OK && in.hdr.type == DT_MSG_PARAMS && in.hdr.encoding == DT_ENC_FP16 &&
              in.hdr.payload_bytes == 2 * N && zmq_msg_size(&in.payload) == 2 * N);
        if (in.hdr.type == DT_MSG_PARAMS && zmq_msg_size(&in.payload) == 2 * N) {
            dt_unpack(DT_ENC_FP16, r, zmq_msg_data(&in.payload), N);
            CHECK(r[3] == 1.0f && fabsf(r[0] - p[0]) <= fabsf(p[0]) * 0x1p-11f);
        }
        dt_wire_in_close(&in);
        /* raw: a bf16 PUSH with a float32-sized payload */
        h = dt_wire_header_make(DT_MSG_PUSH, DT_ROLE_WORKER, 1, 6);
        h.encoding = DT_ENC_BF16;
        zmq_msg_t m;
        zmq_msg_init_size(&m, 4 * N);
        memset(zmq_msg_data(&m), 0, 4 * N);
        dt_wire_send(raw, NULL, &h, &m, 0, NULL);
        CHECK(raw_reply(raw, &in) == DT_OK && raw_error_says(&in, DT_WIRE_E_MALFORMED, "expected 20"));
        dt_wire_in_close(&in);
    }
    zmq_close(raw);
    zmq_ctx_term(ctx);
    dt_ps_client_close(chief);
    dt_ps_client_close(h16);
    dt_ps_client_close(b16);
    ps_stop(&ps);
}

int main(void) {
    RUN(test_async_bf16_adam_exact);
    RUN(test_async_fp16_sgd_exact);
    RUN(test_sync_mixed_cluster);
    RUN(test_stale_push_keeps_residual);
    RUN(test_fp16_range_and_raw_sizes);
    return test_summary();
}
