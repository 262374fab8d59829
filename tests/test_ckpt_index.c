/* The `checkpoint` index: TensorFlow's text format written and parsed, samples as TensorFlow writes
 * them, refusals naming the line, and retention (which files to delete, oldest first). */
#include <dirent.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "supervisor/ckpt_index.h"
#include "supervisor/fsutil.h"
#include "test.h"

static int rm_one(const char *p, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(p);
}
static void rm_tree(const char *dir) { nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS); }

static int count_entries(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    if (d) closedir(d);
    return n;
}

static int parse(dt_ckpt_index *idx, const char *text, dt_error *err) {
    return dt_ckpt_index_parse(idx, text, strlen(text), "logdir/checkpoint", err);
}

static void test_retention_and_round_trip(void) {
    char dir[] = "/tmp/dtrain_ckidx_XXXXXX";
    if (!mkdtemp(dir)) return;
    dt_error err = {0};
    dt_ckpt_index idx;
    CHECK(dt_ckpt_index_read(&idx, dir, &err) == 0); /* no index yet: empty, not an error */
    CHECK(idx.model_checkpoint_path == NULL && idx.n_paths == 0);

    const int steps[] = {0, 400, 800, 1200, 1600, 2000};
    int total_dropped = 0;
    for (int i = 0; i < 6; i++) {
        char name[64];
        snprintf(name, sizeof name, "model.ckpt-%d.safetensors", steps[i]);
        char **dropped;
        int nd;
        CHECK(dt_ckpt_index_add(&idx, name, 3, &dropped, &nd, &err) == 0);
        /* Keeps the newest 3: from the 4th checkpoint on, exactly the oldest one goes. */
        CHECK(nd == (i >= 3 ? 1 : 0));
        if (nd == 1) {
            char want[64];
            snprintf(want, sizeof want, "model.ckpt-%d.safetensors", steps[i - 3]);
            CHECK_MSG(strcmp(dropped[0], want) == 0, "dropped %s, expected %s", dropped[0], want);
        }
        total_dropped += nd;
        dt_ckpt_free_paths(dropped, nd);
        CHECK(dt_ckpt_index_write(&idx, dir, &err) == 0);
    }
    CHECK(total_dropped == 3);
    CHECK(count_entries(dir) == 1); /* only `checkpoint`: no temporary file left */

    char path[256];
    snprintf(path, sizeof path, "%s/checkpoint", dir);
    uint8_t *text;
    size_t n;
    CHECK(dt_read_file(&text, &n, path, 1 << 16, &err) == 0);
    const char *want = "model_checkpoint_path: \"model.ckpt-2000.safetensors\"\n"
                       "all_model_checkpoint_paths: \"model.ckpt-1200.safetensors\"\n"
                       "all_model_checkpoint_paths: \"model.ckpt-1600.safetensors\"\n"
                       "all_model_checkpoint_paths: \"model.ckpt-2000.safetensors\"\n";
    CHECK_MSG(text && strcmp((char *)text, want) == 0, "index text:\n%s", text ? (char *)text : "");
    free(text);

    dt_ckpt_index back;
    CHECK(dt_ckpt_index_read(&back, dir, &err) == 0);
    CHECK(back.n_paths == 3 && strcmp(back.model_checkpoint_path, "model.ckpt-2000.safetensors") == 0);
    for (int i = 0; i < 3 && back.n_paths == 3; i++) CHECK(strcmp(back.paths[i], idx.paths[i]) == 0);
    dt_ckpt_index_free(&back);

    /* Saving an already listed checkpoint again moves it to the end; nothing is dropped. */
    char **dropped;
    int nd;
    CHECK(dt_ckpt_index_add(&idx, "model.ckpt-1200.safetensors", 3, &dropped, &nd, &err) == 0);
    CHECK(nd == 0 && idx.n_paths == 3 && strcmp(idx.paths[2], "model.ckpt-1200.safetensors") == 0 &&
          strcmp(idx.paths[0], "model.ckpt-1600.safetensors") == 0);
    dt_ckpt_free_paths(dropped, nd);
    /* max_to_keep <= 0 keeps everything. */
    for (int i = 0; i < 10; i++) {
        char name[64];
        snprintf(name, sizeof name, "m-%d", i);
        CHECK(dt_ckpt_index_add(&idx, name, 0, &dropped, &nd, &err) == 0 && nd == 0);
        dt_ckpt_free_paths(dropped, nd);
    }
    CHECK(idx.n_paths == 13);
    /* Shrinking max_to_keep drops several at once, oldest first. */
    CHECK(dt_ckpt_index_add(&idx, "m-last", DT_CKPT_MAX_TO_KEEP, &dropped, &nd, &err) == 0);
    CHECK(nd == 9 && idx.n_paths == 5 && strcmp(dropped[0], "model.ckpt-1600.safetensors") == 0 &&
          strcmp(dropped[8], "m-5") == 0 && strcmp(idx.paths[0], "m-6") == 0);
    dt_ckpt_free_paths(dropped, nd);
    dt_ckpt_index_free(&idx);
    rm_tree(dir);
}

static void test_tensorflow_samples(void) {
    dt_error err = {0};
    dt_ckpt_index idx;
    /* What TensorFlow 1.15's Saver writes (timestamps included). */
    const char *tf = "model_checkpoint_path: \"model.ckpt-1200\"\n"
                     "all_model_checkpoint_paths: \"model.ckpt-400\"\n"
                     "all_model_checkpoint_paths: \"model.ckpt-800\"\n"
                     "all_model_checkpoint_paths: \"model.ckpt-1200\"\n"
                     "all_model_checkpoint_timestamps: 1564000000.123456\n"
                     "all_model_checkpoint_timestamps: 1564000060.5\n"
                     "all_model_checkpoint_timestamps: 1.56400012e+09\n"
                     "last_preserved_timestamp: 1563999990.0\n";
    CHECK_MSG(parse(&idx, tf, &err) == 0, "%s", err.msg);
    CHECK(idx.n_paths == 3 && strcmp(idx.model_checkpoint_path, "model.ckpt-1200") == 0);
    CHECK(idx.n_paths == 3 && strcmp(idx.paths[0], "model.ckpt-400") == 0 && strcmp(idx.paths[2], "model.ckpt-1200") == 0);
    dt_ckpt_index_free(&idx);
    /* Older TensorFlow: absolute paths, CRLF, no list; the newest is then the only entry. */
    CHECK(parse(&idx, "model_checkpoint_path: \"/tmp/train_logs/model.ckpt-5\"\r\n", &err) == 0);
    CHECK(idx.n_paths == 1 && strcmp(idx.paths[0], "/tmp/train_logs/model.ckpt-5") == 0);
    dt_ckpt_index_free(&idx);
    /* The text format's other spellings: comments, single quotes, escapes, adjacent literals,
     * separators, no spaces; the newest is moved to the end of the list. */
    const char *odd = "# written by hand\n"
                      "all_model_checkpoint_paths:'a\\'b'  ;\n"
                      "model_checkpoint_path : \"new\" \"est\\x21\\101\\n\" # trailing comment\n"
                      "all_model_checkpoint_paths: \"newest!A\\n\",\n"
                      "all_model_checkpoint_paths: \"c\\\\d\"\n";
    CHECK_MSG(parse(&idx, odd, &err) == 0, "%s", err.msg);
    CHECK(strcmp(idx.model_checkpoint_path, "newest!A\n") == 0);
    CHECK(idx.n_paths == 3 && strcmp(idx.paths[0], "a'b") == 0 && strcmp(idx.paths[1], "c\\d") == 0 &&
          strcmp(idx.paths[2], "newest!A\n") == 0);
    dt_ckpt_index_free(&idx);
}

static void expect_refusal(const char *text, const char *msg) {
    dt_error err = {0};
    dt_ckpt_index idx;
    int rc = parse(&idx, text, &err);
    CHECK_MSG(rc == DT_EFORMAT, "accepted: %s", text);
    if (rc == DT_EFORMAT) CHECK_CONTAINS(err.msg, msg);
    CHECK(idx.model_checkpoint_path == NULL && idx.paths == NULL);
    if (!rc) dt_ckpt_index_free(&idx);
}

/* A path listed twice is kept once (in its first place), so max_to_keep never deletes it twice and a
 * rewritten index parses to the same list (found by fuzz/fuzz_ckpt_index.c). */
static void test_duplicate_paths(void) {
    dt_error err = {0};
    dt_ckpt_index idx, again;
    CHECK(parse(&idx, "model_checkpoint_path: \"c\"\nall_model_checkpoint_paths: \"a\"\n"
                      "all_model_checkpoint_paths: \"c\"\nall_model_checkpoint_paths: \"b\"\n"
                      "all_model_checkpoint_paths: \"a\"\nall_model_checkpoint_paths: \"c\"\n", &err) == 0);
    CHECK_MSG(idx.n_paths == 3 && !strcmp(idx.paths[0], "a") && !strcmp(idx.paths[1], "b") &&
              !strcmp(idx.paths[2], "c"), "%d paths", idx.n_paths);
    char *text = NULL;
    CHECK(dt_ckpt_index_format(&idx, &text, &err) == 0);
    CHECK(text && parse(&again, text, &err) == 0 && again.n_paths == 3 && !strcmp(again.paths[0], "a") &&
          !strcmp(again.paths[1], "b") && !strcmp(again.paths[2], "c"));
    free(text);
    dt_ckpt_index_free(&again);
    dt_ckpt_index_free(&idx);
}

static void test_refusals(void) {
    expect_refusal("", "no model_checkpoint_path");
    expect_refusal("# only a comment\n\n", "no model_checkpoint_path");
    expect_refusal("all_model_checkpoint_paths: \"a\"\n", "no model_checkpoint_path");
    expect_refusal("model_checkpoint_path: \"a\"\n\nbogus_field: \"b\"\n", "logdir/checkpoint:3: unknown field \"bogus_field\"");
    expect_refusal("model_checkpoint_path \"a\"\n", ":1: expected ':' after model_checkpoint_path");
    expect_refusal("model_checkpoint_path: \"a\"\nall_model_checkpoint_paths: \"b\n\"", ":2: unterminated string");
    expect_refusal("model_checkpoint_path: a\n", ":1: expected a quoted string");
    expect_refusal("model_checkpoint_path: \"abc\\", ":1: unterminated string");
    expect_refusal("model_checkpoint_path: \"a\"\nmodel_checkpoint_path: \"b\"\n", ":2: model_checkpoint_path given twice");
    expect_refusal("model_checkpoint_path: \"\"\n", ":1: empty checkpoint path");
    expect_refusal("model_checkpoint_path: \"a\\0b\"\n", "NUL");
    expect_refusal("model_checkpoint_path: \"a\\qb\"\n", "unknown escape \\q");
    expect_refusal("model_checkpoint_path: \"a\"\nlast_preserved_timestamp: soon\n", ":2: expected a number");
    expect_refusal("model_checkpoint_path: \"a\"\nlast_preserved_timestamp: 1\nlast_preserved_timestamp: 2\n",
                   ":3: last_preserved_timestamp given twice");
    expect_refusal("\x7f\x45LF\x02\x01", ":1: expected a field name");
    expect_refusal("{\"model_checkpoint_path\": \"a\"}", ":1: expected a field name, found '{'");
    expect_refusal("model_checkpoint_path: [\"a\"]\n", "expected a quoted string");
    /* Bounded: an over-long path is refused, not truncated. */
    size_t big = DT_PATH_MAX + 100;
    char *t = malloc(big + 64);
    strcpy(t, "model_checkpoint_path: \"");
    memset(t + strlen(t), 'p', big);
    strcpy(t + 24 + big, "\"\n");
    expect_refusal(t, "longer than");
    free(t);
}

static void test_writer_refusals(void) {
    char dir[] = "/tmp/dtrain_ckidx_XXXXXX";
    if (!mkdtemp(dir)) return;
    dt_error err = {0};
    dt_ckpt_index idx = {0};
    CHECK(dt_ckpt_index_write(&idx, dir, &err) == DT_EINVAL); /* empty index */
    char **dropped;
    int nd;
    CHECK(dt_ckpt_index_add(&idx, "/abs/model.ckpt-1.safetensors", 5, &dropped, &nd, &err) == 0);
    dt_ckpt_free_paths(dropped, nd);
    CHECK(dt_ckpt_index_write(&idx, dir, &err) == DT_EINVAL);
    CHECK_CONTAINS(err.msg, "relative");
    CHECK(count_entries(dir) == 0);
    CHECK(dt_ckpt_index_add(&idx, "", 5, &dropped, &nd, &err) == DT_EINVAL);
    dt_ckpt_index_free(&idx);
    /* Quotes, backslashes, control and non-ASCII bytes survive a write and read. */
    const char *name = "we\"ird\\na\tme-\xc3\xa9.safetensors";
    CHECK(dt_ckpt_index_add(&idx, name, 5, &dropped, &nd, &err) == 0);
    dt_ckpt_free_paths(dropped, nd);
    CHECK(dt_ckpt_index_write(&idx, dir, &err) == 0);
    dt_ckpt_index back;
    CHECK(dt_ckpt_index_read(&back, dir, &err) == 0);
    CHECK(back.model_checkpoint_path && strcmp(back.model_checkpoint_path, name) == 0 && back.n_paths == 1);
    dt_ckpt_index_free(&back);
    dt_ckpt_index_free(&idx);
    /* A garbage index on disk is refused naming the file and line. */
    char path[256];
    snprintf(path, sizeof path, "%s/checkpoint", dir);
    CHECK(dt_atomic_write_file(path, "model_checkpoint_path: \"a\"\nxyz\n", 31, &err) == 0);
    CHECK(dt_ckpt_index_read(&back, dir, &err) == DT_EFORMAT);
    CHECK_CONTAINS(err.msg, "checkpoint:2:");
    rm_tree(dir);
}

int main(void) {
    RUN(test_retention_and_round_trip);
    RUN(test_tensorflow_samples);
    RUN(test_duplicate_paths);
    RUN(test_refusals);
    RUN(test_writer_refusals);
    return test_summary();
}
