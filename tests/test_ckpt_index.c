/* The `checkpoint` index: TensorFlow's text format written and parsed, samples as TensorFlow writes
 * them, refusals naming the line, and retention (which files to delete, oldest first). */
#include <dirent.h>
#include <sys/stat.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "supervisor/ckpt_index.h"
#include "io/fsutil.h"
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
        snprintf(name, sizeof name, "model.ckpt-%d.safetensors", 3000 + i);
        CHECK(dt_ckpt_index_add(&idx, name, 0, &dropped, &nd, &err) == 0 && nd == 0);
        dt_ckpt_free_paths(dropped, nd);
    }
    CHECK(idx.n_paths == 13);
    /* Shrinking max_to_keep drops several at once, oldest first. */
    CHECK(dt_ckpt_index_add(&idx, "model.ckpt-4000.safetensors", DT_CKPT_MAX_TO_KEEP, &dropped, &nd, &err) == 0);
    CHECK(nd == 9 && idx.n_paths == 5 && strcmp(dropped[0], "model.ckpt-1600.safetensors") == 0 &&
          strcmp(dropped[8], "model.ckpt-3005.safetensors") == 0 && strcmp(idx.paths[0], "model.ckpt-3006.safetensors") == 0);
    dt_ckpt_free_paths(dropped, nd);
    dt_ckpt_index_free(&idx);
    rm_tree(dir);
}

static void test_tensorflow_samples(void) {
    dt_error err = {0};
    dt_ckpt_index idx;
    /* The fields TensorFlow 1.15's Saver writes (timestamps included), over dtrain's file names. */
    const char *tf = "model_checkpoint_path: \"model.ckpt-1200.safetensors\"\n"
                     "all_model_checkpoint_paths: \"model.ckpt-400.safetensors\"\n"
                     "all_model_checkpoint_paths: \"model.ckpt-800.safetensors\"\n"
                     "all_model_checkpoint_paths: \"model.ckpt-1200.safetensors\"\n"
                     "all_model_checkpoint_timestamps: 1564000000.123456\n"
                     "all_model_checkpoint_timestamps: 1564000060.5\n"
                     "all_model_checkpoint_timestamps: 1.56400012e+09\n"
                     "last_preserved_timestamp: 1563999990.0\n";
    CHECK_MSG(parse(&idx, tf, &err) == 0, "%s", err.msg);
    CHECK(idx.n_paths == 3 && strcmp(idx.model_checkpoint_path, "model.ckpt-1200.safetensors") == 0);
    CHECK(idx.n_paths == 3 && strcmp(idx.paths[0], "model.ckpt-400.safetensors") == 0 &&
          strcmp(idx.paths[2], "model.ckpt-1200.safetensors") == 0);
    CHECK(idx.n_ignored == 0);
    dt_ckpt_index_free(&idx);
    /* TensorFlow's own prefixes (no .safetensors: not dtrain checkpoints) parse, and are ignored with
     * one warning per path (the newest is listed twice); the index is then empty, as if absent. */
    const char *tf_own = "model_checkpoint_path: \"model.ckpt-1200\"\n"
                         "all_model_checkpoint_paths: \"model.ckpt-400\"\n"
                         "all_model_checkpoint_paths: \"model.ckpt-1200\"\n";
    CHECK_MSG(parse(&idx, tf_own, &err) == 0, "%s", err.msg);
    CHECK(idx.model_checkpoint_path == NULL && idx.n_paths == 0 && idx.n_ignored == 2);
    if (idx.n_ignored == 2) {
        CHECK_CONTAINS(idx.ignored[0], "logdir/checkpoint:1: ignoring checkpoint path \"model.ckpt-1200\": not named model.ckpt-<step>.safetensors");
        CHECK_CONTAINS(idx.ignored[1], "logdir/checkpoint:2: ignoring checkpoint path \"model.ckpt-400\"");
    }
    dt_ckpt_index_free(&idx);
    /* Older TensorFlow: absolute paths, CRLF, no list: parsed, the path ignored. */
    CHECK(parse(&idx, "model_checkpoint_path: \"/tmp/train_logs/model.ckpt-5.safetensors\"\r\n", &err) == 0);
    CHECK(idx.n_paths == 0 && idx.n_ignored == 1 && strstr(idx.ignored[0], "absolute"));
    dt_ckpt_index_free(&idx);
    /* The text format's other spellings: comments, single quotes, escapes, adjacent literals,
     * separators, no spaces; the newest is moved to the end of the list. */
    const char *odd = "# written by hand\n"
                      "all_model_checkpoint_paths:'model.ckpt-1.safetensors'  ;\n"
                      "model_checkpoint_path : \"model.ckpt-\" \"3\\x2e\\163afetensors\" # trailing comment\n"
                      "all_model_checkpoint_paths: \"model.ckpt-3.safetensors\",\n"
                      "all_model_checkpoint_paths: 'model.ckpt-\\062.safe' \"tensors\"\n"
                      "all_model_checkpoint_paths: \"c\\\\d\\n\"\n";
    CHECK_MSG(parse(&idx, odd, &err) == 0, "%s", err.msg);
    CHECK(strcmp(idx.model_checkpoint_path, "model.ckpt-3.safetensors") == 0);
    CHECK(idx.n_paths == 3 && strcmp(idx.paths[0], "model.ckpt-1.safetensors") == 0 &&
          strcmp(idx.paths[1], "model.ckpt-2.safetensors") == 0 && strcmp(idx.paths[2], "model.ckpt-3.safetensors") == 0);
    /* A warning shows odd bytes escaped, never raw. */
    CHECK(idx.n_ignored == 1 && strstr(idx.ignored[0], ":6: ignoring checkpoint path \"c\\134d\\012\""));
    dt_ckpt_index_free(&idx);
}

/* The path rule: an entry is used only if it is a checkpoint file name (model.ckpt-<step>.safetensors)
 * directly in the log folder; anything else is ignored with one warning per path naming the line, so
 * neither a reader nor retention ever sees it. */
static void test_path_rule(void) {
    CHECK(dt_ckpt_name_step("model.ckpt-0.safetensors") == 0);
    CHECK(dt_ckpt_name_step("model.ckpt-1200.safetensors") == 1200);
    CHECK(dt_ckpt_name_step("model.ckpt-999999999999999999.safetensors") == DT_CKPT_MAX_STEP);
    const char *not_names[] = {"model.ckpt-1000000000000000000.safetensors", "model.ckpt-007.safetensors",
                               "model.ckpt-.safetensors", "model.ckpt--1.safetensors", "model.ckpt-+1.safetensors",
                               "model.ckpt-1.safetensors.tmp.12", "model.ckpt-1", "./model.ckpt-1.safetensors",
                               "model.ckpt-1.safetensorsx", "Model.ckpt-1.safetensors", "model.ckpt-1 .safetensors",
                               "", ".", "..", "checkpoint"};
    for (size_t i = 0; i < sizeof not_names / sizeof *not_names; i++)
        CHECK_MSG(dt_ckpt_name_step(not_names[i]) == -1, "accepted \"%s\"", not_names[i]);

    dt_error err = {0};
    dt_ckpt_index idx;
    const char *text = "model_checkpoint_path: \"model.ckpt-20.safetensors\"\n"
                       "all_model_checkpoint_paths: \"../victim.txt\"\n"
                       "all_model_checkpoint_paths: \"/etc/passwd\"\n"
                       "all_model_checkpoint_paths: \"sub/model.ckpt-5.safetensors\"\n"
                       "all_model_checkpoint_paths: \"model.ckpt-5.safetensors/../../x\"\n"
                       "all_model_checkpoint_paths: \"model.ckpt-10.safetensors\"\n"
                       "all_model_checkpoint_paths: \"..\"\n"
                       "all_model_checkpoint_paths: \"../victim.txt\"\n"
                       "all_model_checkpoint_paths: \"model.ckpt-20.safetensors\"\n"
                       "all_model_checkpoint_paths: \"model.ckpt-1\\n.safetensors\"\n";
    CHECK_MSG(parse(&idx, text, &err) == 0, "%s", err.msg);
    CHECK(idx.n_paths == 2 && !strcmp(idx.paths[0], "model.ckpt-10.safetensors") &&
          !strcmp(idx.paths[1], "model.ckpt-20.safetensors") && !strcmp(idx.model_checkpoint_path, idx.paths[1]));
    CHECK_MSG(idx.n_ignored == 6, "%d warnings", idx.n_ignored); /* ../victim.txt once, though listed twice */
    if (idx.n_ignored == 6) {
        CHECK_CONTAINS(idx.ignored[0], "logdir/checkpoint:2: ignoring checkpoint path \"../victim.txt\": it leads out of the log folder");
        CHECK_CONTAINS(idx.ignored[0], "only model.ckpt-<step>.safetensors files directly in the log folder are read or deleted");
        CHECK_CONTAINS(idx.ignored[1], "logdir/checkpoint:3: ignoring checkpoint path \"/etc/passwd\": an absolute path");
        CHECK_CONTAINS(idx.ignored[2], "logdir/checkpoint:4: ignoring checkpoint path \"sub/model.ckpt-5.safetensors\": it has a '/'");
        CHECK_CONTAINS(idx.ignored[3], "logdir/checkpoint:5: ignoring checkpoint path \"model.ckpt-5.safetensors/../../x\": it leads out");
        CHECK_CONTAINS(idx.ignored[4], "logdir/checkpoint:7: ignoring checkpoint path \"..\": it leads out");
        CHECK_CONTAINS(idx.ignored[5], "logdir/checkpoint:10: ignoring checkpoint path \"model.ckpt-1\\012.safetensors\": not named model.ckpt-<step>.safetensors");
    }
    /* Retention over it hands out only accepted names to delete. */
    char **dropped;
    int nd;
    CHECK(dt_ckpt_index_add(&idx, "model.ckpt-30.safetensors", 1, &dropped, &nd, &err) == 0);
    CHECK(nd == 2 && !strcmp(dropped[0], "model.ckpt-10.safetensors") && !strcmp(dropped[1], "model.ckpt-20.safetensors"));
    dt_ckpt_free_paths(dropped, nd);
    dt_ckpt_index_free(&idx);

    /* A refused newest: the last accepted entry stands in for it; with none, the index is empty. */
    CHECK(parse(&idx, "model_checkpoint_path: \"../../../../etc/passwd\"\n"
                      "all_model_checkpoint_paths: \"model.ckpt-3.safetensors\"\n"
                      "all_model_checkpoint_paths: \"../../../../etc/passwd\"\n", &err) == 0);
    CHECK(idx.model_checkpoint_path && !strcmp(idx.model_checkpoint_path, "model.ckpt-3.safetensors") &&
          idx.n_paths == 1 && idx.n_ignored == 1);
    dt_ckpt_index_free(&idx);
    CHECK(parse(&idx, "model_checkpoint_path: \"/etc/passwd\"\n", &err) == 0);
    CHECK(idx.model_checkpoint_path == NULL && idx.paths == NULL && idx.n_paths == 0 && idx.n_ignored == 1);
    dt_ckpt_index_free(&idx);

    /* Many refused paths: DT_CKPT_MAX_IGNORED warnings, then one line counting the rest. */
    char many[4096];
    size_t n = (size_t)snprintf(many, sizeof many, "model_checkpoint_path: \"model.ckpt-1.safetensors\"\n");
    for (int i = 0; i < DT_CKPT_MAX_IGNORED + 12; i++)
        n += (size_t)snprintf(many + n, sizeof many - n, "all_model_checkpoint_paths: \"../x%d\"\n", i);
    CHECK(parse(&idx, many, &err) == 0);
    CHECK(idx.n_paths == 1 && idx.n_ignored == DT_CKPT_MAX_IGNORED + 1);
    if (idx.n_ignored == DT_CKPT_MAX_IGNORED + 1) CHECK_CONTAINS(idx.ignored[DT_CKPT_MAX_IGNORED], "12 more");
    dt_ckpt_index_free(&idx);

    /* The writer keeps to the rule: what it writes parses back whole. */
    dt_ckpt_index w = {0};
    const char *refused[] = {"../x", "/abs/model.ckpt-1.safetensors", "sub/model.ckpt-1.safetensors", "model.ckpt-1",
                             "..", "model.ckpt-01.safetensors"};
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        CHECK_MSG(dt_ckpt_index_add(&w, refused[i], 5, &dropped, &nd, &err) == DT_EINVAL, "added \"%s\"", refused[i]);
        CHECK_CONTAINS(err.msg, "not a checkpoint file name in the log folder");
    }
    CHECK(w.n_paths == 0 && w.model_checkpoint_path == NULL);
    CHECK(dt_ckpt_index_add(&w, "model.ckpt-1.safetensors", 5, &dropped, &nd, &err) == 0);
    dt_ckpt_free_paths(dropped, nd);
    char *saved = w.paths[0], *text_out = NULL;
    w.paths[0] = "../victim.txt";
    CHECK(dt_ckpt_index_format(&w, &text_out, &err) == DT_EINVAL && text_out == NULL);
    CHECK_CONTAINS(err.msg, "entry 0 \"../victim.txt\"");
    w.paths[0] = saved;
    dt_ckpt_index_free(&w);
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
#define A "\"model.ckpt-1.safetensors\"\n"
#define B "\"model.ckpt-2.safetensors\"\n"
#define C "\"model.ckpt-3.safetensors\"\n"
    CHECK(parse(&idx, "model_checkpoint_path: " C "all_model_checkpoint_paths: " A "all_model_checkpoint_paths: " C
                      "all_model_checkpoint_paths: " B "all_model_checkpoint_paths: " A
                      "all_model_checkpoint_paths: " C, &err) == 0);
#undef A
#undef B
#undef C
    CHECK_MSG(idx.n_paths == 3 && !strcmp(idx.paths[0], "model.ckpt-1.safetensors") &&
              !strcmp(idx.paths[1], "model.ckpt-2.safetensors") && !strcmp(idx.paths[2], "model.ckpt-3.safetensors"),
              "%d paths", idx.n_paths);
    char *text = NULL;
    CHECK(dt_ckpt_index_format(&idx, &text, &err) == 0);
    CHECK(text && parse(&again, text, &err) == 0 && again.n_paths == 3);
    for (int i = 0; i < 3 && again.n_paths == 3 && idx.n_paths == 3; i++) CHECK(!strcmp(again.paths[i], idx.paths[i]));
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
    CHECK(dt_ckpt_index_add(&idx, "/abs/model.ckpt-1.safetensors", 5, &dropped, &nd, &err) == DT_EINVAL);
    CHECK_CONTAINS(err.msg, "absolute");
    CHECK(dt_ckpt_index_write(&idx, dir, &err) == DT_EINVAL);
    CHECK(count_entries(dir) == 0);
    CHECK(dt_ckpt_index_add(&idx, "", 5, &dropped, &nd, &err) == DT_EINVAL);
    /* A refused name is shown escaped in the message, never raw. */
    CHECK(dt_ckpt_index_add(&idx, "we\"ird\\na\tme-\xc3\xa9.safetensors", 5, &dropped, &nd, &err) == DT_EINVAL);
    CHECK_CONTAINS(err.msg, "\"we\\042ird\\134na\\011me-\\303\\251.safetensors\"");
    dt_ckpt_index_free(&idx);
    dt_ckpt_index back;
    /* A garbage index on disk is refused naming the file and line. */
    char path[256];
    snprintf(path, sizeof path, "%s/checkpoint", dir);
    CHECK(dt_atomic_write_file(path, "model_checkpoint_path: \"a\"\nxyz\n", 31, &err) == 0);
    CHECK(dt_ckpt_index_read(&back, dir, &err) == DT_EFORMAT);
    CHECK_CONTAINS(err.msg, "checkpoint:2:");
    rm_tree(dir);
}

/* What the index parser shows of a file that is not an index (anyone's text, maybe a secret): a
 * field name cut to 24 characters, then "..."; and an index that is a symbolic link is not read at
 * all (its target's first word would be shown, and its text taken for the index). */
static void test_hostile_index_file(void) {
    dt_error err = {0};
    dt_ckpt_index idx;
    CHECK(parse(&idx, "abcdefghijklmnopqrstuvwxSECRETTAIL: 1\n", &err) == DT_EFORMAT);
    CHECK_CONTAINS(err.msg, "unknown field \"abcdefghijklmnopqrstuvwx...\"");
    CHECK_MSG(strstr(err.msg, "SECRET") == NULL, "%s", err.msg);
    CHECK(parse(&idx, "abcdefghijklmnopqrstuvwxSECRETTAIL\n", &err) == DT_EFORMAT);
    CHECK_CONTAINS(err.msg, "expected ':' after abcdefghijklmnopqrstuvwx...");
    CHECK_MSG(strstr(err.msg, "SECRET") == NULL, "%s", err.msg);

    char dir[] = "/tmp/dtrain_ckidx_XXXXXX", target[64], link[64];
    if (!mkdtemp(dir)) return;
    snprintf(target, sizeof target, "%s/elsewhere", dir);
    snprintf(link, sizeof link, "%s/checkpoint", dir);
    FILE *f = fopen(target, "w");
    CHECK(f && fputs("model_checkpoint_path: \"model.ckpt-5.safetensors\"\n", f) >= 0 && fclose(f) == 0);
    CHECK(symlink(target, link) == 0);
    CHECK(dt_ckpt_index_read(&idx, dir, &err) == DT_EIO);
    CHECK_CONTAINS(err.msg, "checkpoint: is a symbolic link (not followed");
    /* A FIFO there is refused at once, not waited on. */
    CHECK(unlink(link) == 0 && mkfifo(link, 0600) == 0);
    CHECK(dt_ckpt_index_read(&idx, dir, &err) == DT_EIO);
    CHECK_CONTAINS(err.msg, "checkpoint: not a regular file (a FIFO)");
    unlink(link);
    unlink(target);
    rmdir(dir);
}

int main(void) {
    RUN(test_retention_and_round_trip);
    RUN(test_tensorflow_samples);
    RUN(test_path_rule);
    RUN(test_duplicate_paths);
    RUN(test_refusals);
    RUN(test_writer_refusals);
    RUN(test_hostile_index_file);
    return test_summary();
}
