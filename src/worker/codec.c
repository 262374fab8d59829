#include "worker/codec.h"

#include <stdlib.h>
#include <string.h>

#include "core/assert.h"
#include "core/error.h"
#include "transport/wire.h"

typedef struct {
    size_t n;
    float *res[2];                       /* [n] each: the residual of a chunk is in res[cur[chunk]] */
    unsigned char *wire;                 /* [n * 2] the packed gradient */
    unsigned chunks;                     /* the cut cur[] and pending[] are about */
    uint8_t cur[DT_WIRE_MAX_CHUNKS];
    uint8_t pending[DT_WIRE_MAX_CHUNKS]; /* encoded, not settled: its next residual waits for the reply */
} shard_codec;

struct dt_codec {
    dt_encoding enc;
    int n_ps;
    shard_codec *s;
    uint64_t saturated;
};

void dt_codec_free(dt_codec *c) {
    if (!c) return;
    for (int i = 0; c->s && i < c->n_ps; i++) {
        free(c->s[i].res[0]);
        free(c->s[i].res[1]);
        free(c->s[i].wire);
    }
    free(c->s);
    free(c);
}

int dt_codec_open(dt_codec **out, dt_encoding enc, int n_ps, const size_t *shard_floats, dt_error *err) {
    *out = NULL;
    if (enc != DT_ENC_BF16 && enc != DT_ENC_FP16)
        return dt_errorf(err, DT_EINVAL, "gradient codec: encoding %s has nothing to encode", dt_enc_name(enc));
    if (n_ps <= 0) return dt_errorf(err, DT_EINVAL, "gradient codec: %d ps tasks", n_ps);
    dt_codec *c = dt_calloc(1, sizeof *c, "gradient codec", err);
    if (!c) return DT_ENOMEM;
    c->enc = enc;
    c->n_ps = n_ps;
    if (!(c->s = dt_calloc((size_t)n_ps, sizeof *c->s, "gradient codec", err))) goto oom;
    for (int i = 0; i < n_ps; i++) {
        shard_codec *s = &c->s[i];
        s->n = shard_floats[i];
        s->chunks = 1;
        if (!(s->res[0] = dt_alloc_floats(s->n ? s->n : 1, "gradient residual", err)) ||
            !(s->res[1] = dt_alloc_floats(s->n ? s->n : 1, "gradient residual", err)) ||
            !(s->wire = dt_malloc(s->n ? s->n * 2 : 1, "packed gradient", err)))
            goto oom;
        memset(s->res[0], 0, s->n * sizeof(float));
    }
    *out = c;
    return DT_OK;
oom:
    dt_codec_free(c);
    return DT_ENOMEM;
}

dt_encoding dt_codec_encoding(const dt_codec *c) { return c ? c->enc : DT_ENC_FP32; }

/* A new cut: every chunk's current residual moves into res[0] (chunk ranges change with the cut). */
static void recut(shard_codec *s, unsigned chunks) {
    for (unsigned k = 0; k < s->chunks; k++) {
        if (!s->cur[k]) continue;
        uint64_t off, len;
        dt_wire_chunk(s->n, s->chunks, k, &off, &len);
        memcpy(s->res[0] + off, s->res[1] + off, (size_t)len * sizeof(float));
    }
    memset(s->cur, 0, sizeof s->cur);
    memset(s->pending, 0, sizeof s->pending);
    s->chunks = chunks;
}

const void *dt_codec_encode(dt_codec *c, int ps, unsigned chunks, unsigned chunk, const float *grad, size_t *bytes) {
    shard_codec *s = &c->s[ps];
    if (chunks != s->chunks) recut(s, chunks);
    uint64_t off, len;
    dt_wire_chunk(s->n, chunks, chunk, &off, &len);
    const int cur = s->cur[chunk];
    unsigned char *out = s->wire + off * 2;
    c->saturated += dt_pack_ef(c->enc, out, s->res[!cur] + off, grad + off, s->res[cur] + off, (size_t)len);
    s->pending[chunk] = 1;
    *bytes = (size_t)len * 2;
    return out;
}

void dt_codec_settle(dt_codec *c, int ps, unsigned chunk, int accepted) {
    shard_codec *s = &c->s[ps];
    if (!DT_ASSERT(chunk < s->chunks && s->pending[chunk])) return;
    s->pending[chunk] = 0;
    if (accepted) s->cur[chunk] ^= 1;
}

void dt_codec_residual(const dt_codec *c, int ps, float *out) {
    const shard_codec *s = &c->s[ps];
    for (unsigned k = 0; k < s->chunks; k++) {
        uint64_t off, len;
        dt_wire_chunk(s->n, s->chunks, k, &off, &len);
        memcpy(out + off, s->res[s->cur[k]] + off, (size_t)len * sizeof(float));
    }
}

uint64_t dt_codec_saturated(const dt_codec *c) { return c ? c->saturated : 0; }
