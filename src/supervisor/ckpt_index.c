#include "supervisor/ckpt_index.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "io/fsutil.h"

void dt_ckpt_free_paths(char **paths, int n) {
    for (int i = 0; i < n; i++) free(paths[i]);
    free(paths);
}

void dt_ckpt_index_free(dt_ckpt_index *idx) {
    if (!idx) return;
    free(idx->model_checkpoint_path);
    dt_ckpt_free_paths(idx->paths, idx->n_paths);
    dt_ckpt_free_paths(idx->ignored, idx->n_ignored);
    memset(idx, 0, sizeof *idx);
}

static char *dup_n(const char *s, size_t n, dt_error *err) {
    char *d = dt_malloc(n + 1, "checkpoint path", err);
    if (d) {
        memcpy(d, s, n);
        d[n] = 0;
    }
    return d;
}

/* ---- The path rule -------------------------------------------------------------------------- */

int64_t dt_ckpt_name_step(const char *name) {
    size_t lp = sizeof DT_CKPT_PREFIX - 1, ls = sizeof DT_CKPT_SUFFIX - 1, n = strlen(name);
    /* At most 18 digits: DT_CKPT_MAX_STEP, so the sum below cannot overflow. */
    if (n <= lp + ls || n - lp - ls > 18 || memcmp(name, DT_CKPT_PREFIX, lp) != 0 ||
        memcmp(name + n - ls, DT_CKPT_SUFFIX, ls) != 0)
        return -1;
    const char *d = name + lp;
    size_t nd = n - lp - ls;
    if (nd > 1 && d[0] == '0') return -1;
    int64_t step = 0;
    for (size_t i = 0; i < nd; i++) {
        if (d[i] < '0' || d[i] > '9') return -1;
        step = step * 10 + (d[i] - '0');
    }
    return step;
}

/* Why the path rule refuses p, or NULL if it accepts it. Only a bare checkpoint file name can neither
 * leave the log folder nor name something dtrain did not write there. */
static const char *path_fault(const char *p) {
    if (p[0] == '/') return "an absolute path";
    for (const char *c = p; *c;) {
        size_t len = strcspn(c, "/");
        if (len == 2 && c[0] == '.' && c[1] == '.') return "it leads out of the log folder (\"..\")";
        c += len;
        if (*c == '/') c++;
    }
    if (strchr(p, '/')) return "it has a '/' (a file in another folder)";
    if (dt_ckpt_name_step(p) < 0) return "not named " DT_CKPT_PREFIX "<step>" DT_CKPT_SUFFIX;
    return NULL;
}

/* p for a message: printable ASCII kept, other bytes as octal escapes, cut after about 100 bytes. */
static void quote_path(char *out, size_t cap, const char *p) {
    size_t n = 0;
    for (const unsigned char *c = (const unsigned char *)p; *c && n + 8 < cap; c++) {
        if ((const char *)c - p >= 100) {
            n += (size_t)snprintf(out + n, cap - n, "...");
            break;
        }
        if (*c < 32 || *c >= 127 || *c == '"' || *c == '\\') n += (size_t)snprintf(out + n, cap - n, "\\%03o", *c);
        else out[n++] = (char)*c;
    }
    out[n] = 0;
}

/* The paths the parser ignored so far (the first DT_CKPT_MAX_IGNORED, for one warning per path) and a
 * count of the entries beyond them. */
typedef struct {
    char *raw[DT_CKPT_MAX_IGNORED];
    int n, more;
} ignore_log;

static int add_warning(dt_ckpt_index *idx, char *msg, dt_error *err) {
    char **w = msg ? realloc(idx->ignored, (size_t)(idx->n_ignored + 1) * sizeof *w) : NULL;
    if (!w) {
        free(msg);
        return dt_errorf(err, DT_ENOMEM, "out of memory noting an ignored checkpoint path");
    }
    idx->ignored = w;
    w[idx->n_ignored++] = msg;
    return 0;
}

static int note_ignored(dt_ckpt_index *idx, ignore_log *il, const char *path, const char *why, const char *label,
                        int line, dt_error *err) {
    for (int i = 0; i < il->n; i++)
        if (strcmp(il->raw[i], path) == 0) return 0; /* warned already (TensorFlow lists the newest twice) */
    if (il->n == DT_CKPT_MAX_IGNORED) {
        il->more++;
        return 0;
    }
    if (!(il->raw[il->n] = dup_n(path, strlen(path), err))) return DT_ENOMEM;
    il->n++;
    char q[420];
    quote_path(q, sizeof q, path);
    size_t cap = strlen(label) + strlen(q) + 256;
    char *msg = malloc(cap);
    if (msg)
        snprintf(msg, cap, "%s:%d: ignoring checkpoint path \"%s\": %s; only " DT_CKPT_PREFIX "<step>" DT_CKPT_SUFFIX
                 " files directly in the log folder are read or deleted", label, line, q, why);
    return add_warning(idx, msg, err);
}

static int finish_ignored(dt_ckpt_index *idx, ignore_log *il, const char *label, dt_error *err) {
    int rc = 0;
    if (il->more) {
        size_t cap = strlen(label) + 128;
        char *msg = malloc(cap);
        if (msg)
            snprintf(msg, cap, "%s: %d more entries ignored (not checkpoint file names in the log folder)", label,
                     il->more);
        rc = add_warning(idx, msg, err);
    }
    for (int i = 0; i < il->n; i++) free(il->raw[i]);
    il->n = 0;
    return rc;
}

/* Appends a copy of s to idx->paths, unless it is listed already: a path named twice would be
 * deleted twice by max_to_keep, and the order of the copies would not survive a rewrite (found by
 * fuzz/fuzz_ckpt_index.c). */
static int push_path(dt_ckpt_index *idx, const char *s, dt_error *err) {
    for (int i = 0; i < idx->n_paths; i++)
        if (strcmp(idx->paths[i], s) == 0) return 0;
    if (idx->n_paths >= DT_CKPT_MAX_PATHS)
        return dt_errorf(err, DT_EFORMAT, "more than %d checkpoint paths", DT_CKPT_MAX_PATHS);
    char **p = realloc(idx->paths, (size_t)(idx->n_paths + 1) * sizeof *p);
    if (!p) return dt_errorf(err, DT_ENOMEM, "out of memory growing the checkpoint list");
    idx->paths = p;
    if (!(p[idx->n_paths] = dup_n(s, strlen(s), err))) return DT_ENOMEM;
    idx->n_paths++;
    return 0;
}

/* Moves (or adds) idx->model_checkpoint_path to the end of the list. */
static int newest_last(dt_ckpt_index *idx, dt_error *err) {
    const char *m = idx->model_checkpoint_path;
    for (int i = 0; i < idx->n_paths; i++) {
        if (strcmp(idx->paths[i], m) != 0) continue;
        char *keep = idx->paths[i];
        memmove(idx->paths + i, idx->paths + i + 1, (size_t)(idx->n_paths - i - 1) * sizeof *idx->paths);
        idx->paths[idx->n_paths - 1] = keep;
        return 0;
    }
    return push_path(idx, m, err);
}

/* ---- Parser: the subset of protobuf text format a CheckpointState uses ------------------------ */

typedef struct {
    const char *s, *end, *label;
    int line;
    dt_error *err;
} lexer;

static void skip_space(lexer *lx) {
    while (lx->s < lx->end) {
        char c = *lx->s;
        if (c == '\n') lx->line++;
        if (c == '#') {
            while (lx->s < lx->end && *lx->s != '\n') lx->s++;
        } else if (c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\f' || c == '\v') {
            lx->s++;
        } else {
            break;
        }
    }
}

static int is_ident(char c, int first) {
    return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (!first && c >= '0' && c <= '9');
}

/* A field name for a message: what a file that is not an index starts with may be anyone's text, so
 * only its first TOKEN_SHOWN bytes are shown (identifier characters already: printable ASCII), then
 * "...". */
#define TOKEN_SHOWN 24
static const char *shown_token(char out[TOKEN_SHOWN + 4], const char *name, size_t nl) {
    size_t k = 0;
    for (; k < nl && k < TOKEN_SHOWN; k++) out[k] = (name[k] >= 32 && name[k] < 127) ? name[k] : '?';
    if (nl > TOKEN_SHOWN) memcpy(out + k, "...", 3), k += 3;
    out[k] = 0;
    return out;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* One or more adjacent quoted literals (concatenated, as the text format allows), unescaped. */
static int parse_string(lexer *lx, char *out, size_t cap, size_t *len) {
    size_t n = 0;
    int pieces = 0;
    for (;;) {
        skip_space(lx);
        if (lx->s >= lx->end || (*lx->s != '"' && *lx->s != '\'')) break;
        char q = *lx->s++;
        pieces++;
        for (;;) {
            if (lx->s >= lx->end || *lx->s == '\n')
                return dt_errorf(lx->err, DT_EFORMAT, "%s:%d: unterminated string", lx->label, lx->line);
            char c = *lx->s++;
            if (c == q) break;
            int v = (unsigned char)c;
            if (c == '\\') {
                if (lx->s >= lx->end)
                    return dt_errorf(lx->err, DT_EFORMAT, "%s:%d: unterminated string", lx->label, lx->line);
                char e = *lx->s++;
                switch (e) {
                case 'n': v = '\n'; break;
                case 't': v = '\t'; break;
                case 'r': v = '\r'; break;
                case 'a': v = '\a'; break;
                case 'b': v = '\b'; break;
                case 'f': v = '\f'; break;
                case 'v': v = '\v'; break;
                case '\\': case '\'': case '"': case '?': v = e; break;
                case 'x': {
                    int h = lx->s < lx->end ? hexval(*lx->s) : -1;
                    if (h < 0)
                        return dt_errorf(lx->err, DT_EFORMAT, "%s:%d: \\x without hex digits", lx->label, lx->line);
                    v = h;
                    lx->s++;
                    if (lx->s < lx->end && (h = hexval(*lx->s)) >= 0) v = v * 16 + h, lx->s++;
                    break;
                }
                default:
                    if (e >= '0' && e <= '7') {
                        v = e - '0';
                        for (int k = 0; k < 2 && lx->s < lx->end && *lx->s >= '0' && *lx->s <= '7'; k++)
                            v = v * 8 + (*lx->s++ - '0');
                        if (v > 255)
                            return dt_errorf(lx->err, DT_EFORMAT, "%s:%d: octal escape above \\377", lx->label, lx->line);
                    } else {
                        return dt_errorf(lx->err, DT_EFORMAT, "%s:%d: unknown escape \\%c", lx->label, lx->line,
                                         (e >= 32 && e < 127) ? e : '?');
                    }
                }
            }
            if (v == 0) return dt_errorf(lx->err, DT_EFORMAT, "%s:%d: NUL byte in a path", lx->label, lx->line);
            if (n + 1 >= cap)
                return dt_errorf(lx->err, DT_EFORMAT, "%s:%d: path longer than %zu bytes", lx->label, lx->line, cap - 1);
            out[n++] = (char)v;
        }
    }
    if (!pieces) return dt_errorf(lx->err, DT_EFORMAT, "%s:%d: expected a quoted string", lx->label, lx->line);
    out[n] = 0;
    *len = n;
    return 0;
}

/* A number (the timestamps TensorFlow writes); the value is not needed, only its validity. */
static int parse_number(lexer *lx) {
    skip_space(lx);
    char tok[64];
    size_t n = 0;
    while (lx->s < lx->end && n < sizeof tok - 1 && strchr("0123456789+-.eEinfatyINFATY", *lx->s) && *lx->s)
        tok[n++] = *lx->s++;
    tok[n] = 0;
    char *endp;
    if (n == 0 || (strtod(tok, &endp), *endp != 0))
        return dt_errorf(lx->err, DT_EFORMAT, "%s:%d: expected a number", lx->label, lx->line);
    return 0;
}

/* What the parse has seen so far, beyond the index itself. */
typedef struct {
    int seen_preserved, seen_newest;
    ignore_log il;
    char *buf;                /* [DT_PATH_MAX] a path as read */
} parse_state;

/* A path field's value (the newest, or one of all): kept, or ignored with a note when it breaks
 * the path rule (applied here, where every reader and retention get their paths). */
static int parse_path_field(dt_ckpt_index *out, lexer *lx, parse_state *ps, int newest, int line) {
    size_t pl = 0;
    int rc = parse_string(lx, ps->buf, DT_PATH_MAX, &pl);
    if (rc) return rc;
    if (pl == 0) return dt_errorf(lx->err, DT_EFORMAT, "%s:%d: empty checkpoint path", lx->label, line);
    const char *why = path_fault(ps->buf);
    if (newest && ps->seen_newest++)
        return dt_errorf(lx->err, DT_EFORMAT, "%s:%d: model_checkpoint_path given twice", lx->label, line);
    if (why) return note_ignored(out, &ps->il, ps->buf, why, lx->label, line, lx->err);
    if (newest) return (out->model_checkpoint_path = dup_n(ps->buf, pl, lx->err)) ? DT_OK : DT_ENOMEM;
    rc = push_path(out, ps->buf, lx->err);
    if (rc == DT_EFORMAT) dt_error_wrap(lx->err, rc, "%s:%d: ", lx->label, line);
    return rc;
}

/* One "name: value" field, its separator included. */
static int parse_field(dt_ckpt_index *out, lexer *lx, parse_state *ps) {
    int line = lx->line;
    const char *name = lx->s;
    while (lx->s < lx->end && is_ident(*lx->s, lx->s == name)) lx->s++;
    size_t nl = (size_t)(lx->s - name);
    char tok[TOKEN_SHOWN + 4];
    if (nl == 0) {
        char c = *lx->s;
        return dt_errorf(lx->err, DT_EFORMAT, "%s:%d: expected a field name, found '%c'", lx->label, line,
                         (c >= 32 && c < 127) ? c : '?');
    }
    skip_space(lx);
    if (lx->s >= lx->end || *lx->s != ':')
        return dt_errorf(lx->err, DT_EFORMAT, "%s:%d: expected ':' after %s", lx->label, line,
                         shown_token(tok, name, nl));
    lx->s++;
#define IS(lit) (nl == sizeof(lit) - 1 && memcmp(name, lit, nl) == 0)
    int rc;
    if (IS("model_checkpoint_path") || IS("all_model_checkpoint_paths")) {
        rc = parse_path_field(out, lx, ps, IS("model_checkpoint_path"), line);
    } else if (IS("all_model_checkpoint_timestamps") || IS("last_preserved_timestamp")) {
        if (IS("last_preserved_timestamp") && ps->seen_preserved++)
            return dt_errorf(lx->err, DT_EFORMAT, "%s:%d: last_preserved_timestamp given twice", lx->label, line);
        rc = parse_number(lx);
    } else {
        return dt_errorf(lx->err, DT_EFORMAT, "%s:%d: unknown field \"%s\" (not a checkpoint index?)", lx->label,
                         line, shown_token(tok, name, nl));
    }
#undef IS
    if (rc) return rc;
    skip_space(lx);
    if (lx->s < lx->end && (*lx->s == ';' || *lx->s == ',')) lx->s++;
    return DT_OK;
}

int dt_ckpt_index_parse(dt_ckpt_index *out, const char *text, size_t len, const char *label, dt_error *err) {
    memset(out, 0, sizeof *out);
    if (len > DT_CKPT_INDEX_MAX_BYTES)
        return dt_errorf(err, DT_EFORMAT, "%s: %zu bytes, more than the %zu allowed", label, len, DT_CKPT_INDEX_MAX_BYTES);
    lexer lx = {text, text + len, label, 1, err};
    parse_state ps = {.buf = dt_malloc(DT_PATH_MAX, "checkpoint index path", err)};
    if (!ps.buf) return DT_ENOMEM;
    int rc = 0;
    for (;;) {
        skip_space(&lx);
        if (lx.s >= lx.end || (rc = parse_field(out, &lx, &ps))) break;
    }
    free(ps.buf);
    if (!rc && !ps.seen_newest)
        rc = dt_errorf(err, DT_EFORMAT, "%s: no model_checkpoint_path (empty or not a checkpoint index)", label);
    int fin = finish_ignored(out, &ps.il, label, err);
    if (!rc) rc = fin;
    /* An ignored newest: the last accepted entry stands in for it (none: an empty index). */
    if (!rc && !out->model_checkpoint_path && out->n_paths > 0) {
        const char *last = out->paths[out->n_paths - 1];
        if (!(out->model_checkpoint_path = dup_n(last, strlen(last), err))) rc = DT_ENOMEM;
    }
    if (!rc && out->model_checkpoint_path) rc = newest_last(out, err);
    if (rc) dt_ckpt_index_free(out);
    return rc;
}

int dt_ckpt_index_read(dt_ckpt_index *out, const char *logdir, dt_error *err) {
    memset(out, 0, sizeof *out);
    char path[DT_PATH_MAX];
    int rc = dt_path_join(path, sizeof path, logdir, DT_CKPT_INDEX_FILE, err);
    if (rc) return rc;
    if (access(path, F_OK) != 0 && errno == ENOENT) return 0;
    uint8_t *text;
    size_t len;
    /* O_NOFOLLOW: a link planted at the index's name would have its target's first token shown in a
     * warning (and any file parsed as the index). */
    if ((rc = dt_read_plain_file(&text, &len, path, DT_CKPT_INDEX_MAX_BYTES, err))) return rc;
    rc = dt_ckpt_index_parse(out, (const char *)text, len, path, err);
    free(text);
    return rc;
}

/* ---- Writer --------------------------------------------------------------------------------- */

/* Appends `field: "escaped"\n`; escapes as protobuf's text format does (octal for non-printables). */
static void put_field(char *out, size_t *n, const char *field, const char *s) {
    *n += (size_t)sprintf(out + *n, "%s: \"", field);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') {
            out[(*n)++] = '\\';
            out[(*n)++] = (char)*p;
        } else if (*p < 32 || *p >= 127) {
            *n += (size_t)sprintf(out + *n, "\\%03o", *p);
        } else {
            out[(*n)++] = (char)*p;
        }
    }
    out[(*n)++] = '"';
    out[(*n)++] = '\n';
    out[*n] = 0;
}

int dt_ckpt_index_format(const dt_ckpt_index *idx, char **text, dt_error *err) {
    *text = NULL;
    if (!idx->model_checkpoint_path || !idx->model_checkpoint_path[0])
        return dt_errorf(err, DT_EINVAL, "checkpoint index: no newest checkpoint to write");
    if (idx->n_paths < 0 || idx->n_paths > DT_CKPT_MAX_PATHS)
        return dt_errorf(err, DT_EINVAL, "checkpoint index: %d paths (at most %d)", idx->n_paths, DT_CKPT_MAX_PATHS);
    /* The writer holds itself to the path rule, so what it writes parses back to the same list. */
    const char *why;
    char q[420];
    size_t cap = 64 + 4 * strlen(idx->model_checkpoint_path);
    for (int i = 0; i < idx->n_paths; i++) {
        const char *p = idx->paths[i];
        if (!p || !p[0]) return dt_errorf(err, DT_EINVAL, "checkpoint index: entry %d is empty", i);
        if ((why = path_fault(p))) {
            quote_path(q, sizeof q, p);
            return dt_errorf(err, DT_EINVAL, "checkpoint index: entry %d \"%s\" is not a checkpoint file name in the "
                             "log folder (%s)", i, q, why);
        }
        cap += 64 + 4 * strlen(p);
    }
    if ((why = path_fault(idx->model_checkpoint_path))) {
        quote_path(q, sizeof q, idx->model_checkpoint_path);
        return dt_errorf(err, DT_EINVAL, "checkpoint index: newest \"%s\" is not a checkpoint file name in the log "
                         "folder (%s)", q, why);
    }
    char *out = dt_malloc(cap, "checkpoint index text", err);
    if (!out) return DT_ENOMEM;
    size_t n = 0;
    put_field(out, &n, "model_checkpoint_path", idx->model_checkpoint_path);
    for (int i = 0; i < idx->n_paths; i++) put_field(out, &n, "all_model_checkpoint_paths", idx->paths[i]);
    *text = out;
    return 0;
}

int dt_ckpt_index_write(const dt_ckpt_index *idx, const char *logdir, dt_error *err) {
    char path[DT_PATH_MAX], *text;
    int rc = dt_path_join(path, sizeof path, logdir, DT_CKPT_INDEX_FILE, err);
    if (!rc) rc = dt_ckpt_index_format(idx, &text, err);
    if (rc) return rc;
    rc = dt_atomic_write_file(path, text, strlen(text), err);
    free(text);
    return rc;
}

int dt_ckpt_index_add(dt_ckpt_index *idx, const char *path, int max_to_keep, char ***dropped, int *n_dropped,
                      dt_error *err) {
    *dropped = NULL;
    *n_dropped = 0;
    if (!path || !path[0] || strlen(path) >= DT_PATH_MAX)
        return dt_errorf(err, DT_EINVAL, "checkpoint index: empty or too long checkpoint path");
    const char *why = path_fault(path);
    if (why) {
        char q[420];
        quote_path(q, sizeof q, path);
        return dt_errorf(err, DT_EINVAL, "checkpoint index: \"%s\" is not a checkpoint file name in the log folder "
                         "(%s)", q, why);
    }
    char *m = dup_n(path, strlen(path), err);
    if (!m) return DT_ENOMEM;
    free(idx->model_checkpoint_path);
    idx->model_checkpoint_path = m;
    int rc = newest_last(idx, err);
    if (rc) return rc;
    int drop = max_to_keep > 0 && idx->n_paths > max_to_keep ? idx->n_paths - max_to_keep : 0;
    if (!drop) return 0;
    char **d = dt_calloc((size_t)drop, sizeof *d, "dropped checkpoint list", err);
    if (!d) return DT_ENOMEM;
    memcpy(d, idx->paths, (size_t)drop * sizeof *d);
    memmove(idx->paths, idx->paths + drop, (size_t)(idx->n_paths - drop) * sizeof *idx->paths);
    idx->n_paths -= drop;
    *dropped = d;
    *n_dropped = drop;
    return 0;
}
