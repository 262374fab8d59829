/* The live progress line and the log written while it is drawn: a warning logged mid-training must
 * start on a line of its own, not after the progress text. stderr and the log go to one file here,
 * as they go to one terminal, so the order of their bytes is what a user would see. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test.h"
#include "train/progress.h"

static char *slurp(FILE *f) {
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = calloc((size_t)n + 1, 1);
    if (fread(b, 1, (size_t)n, f) != (size_t)n) b[0] = 0;
    return b;
}

static void test_warning_on_its_own_line(void) {
    FILE *tty = tmpfile();
    if (!tty) return;
    fflush(stderr);
    int saved = dup(2);
    dup2(fileno(tty), 2);
    FILE *out = fdopen(dup(fileno(tty)), "w");

    dt_progress p;
    dt_progress_init(&p, 1, 10);
    FILE *log = dt_progress_wrap(&p, out);
    CHECK(log != out);
    dt_progress_update(&p, 10, 1.0, 0.5); /* the last step is drawn at once */
    fprintf(log, "warning: summaries turned off: disk full\n");
    dt_progress_update(&p, 10, 1.0, 0.5);
    fprintf(log, "step 10  loss 0.5");     /* a line in two writes reaches the log whole */
    fprintf(log, "  val_acc 0.9\n");
    dt_progress_unwrap(log, out);
    fclose(out);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);

    char *text = slurp(tty);
    fclose(tty);
    CHECK_CONTAINS(text, "ETA 0:00:00 \r\033[Kwarning: summaries turned off: disk full\n");
    CHECK_CONTAINS(text, "\r\033[Kstep 10  loss 0.5  val_acc 0.9\n");
    CHECK(strstr(text, "ETA 0:00:00 warning") == NULL);
    free(text);
}

/* The line's figures: examples/s from the rate of global steps since start (a resumed run counts
 * from its first step), the loss; relayed, each state is a whole line starting with '\r'. */
static void test_figures_and_relay(void) {
    FILE *tty = tmpfile();
    if (!tty) return;
    fflush(stderr);
    int saved = dup(2);
    dup2(fileno(tty), 2);
    dt_progress p;
    dt_progress_init(&p, DT_PROGRESS_RELAY, 100);
    dt_progress_start(&p, 40, 128);
    p.t_start -= 2.0; /* 60 steps in 2 s: 30 steps/s, 3840 examples/s, 40 steps left: 1 s */
    dt_progress_update(&p, 100, 2.0, 0.25);
    CHECK(dt_progress_wrap(&p, stdout) == stdout); /* relayed lines are whole: no erasing stream */
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    char *text = slurp(tty);
    fclose(tty);
    CHECK_MSG(strstr(text, "\r  step 100/100  100%  epoch 2.00  38") == text, "%s", text);
    CHECK_CONTAINS(text, " examples/s  loss 0.2500  ETA 0:00:00 \n");
    CHECK(strchr(text + 1, '\r') == NULL);
    CHECK(p.shown == 0); /* nothing to erase on the relay */
    free(text);
}

static void test_disabled_is_the_same_stream(void) {
    dt_progress p;
    dt_progress_init(&p, 0, 10);
    CHECK(dt_progress_wrap(&p, stdout) == stdout);
    dt_progress_unwrap(stdout, stdout); /* closes nothing */
}

int main(void) {
    RUN(test_warning_on_its_own_line);
    RUN(test_figures_and_relay);
    RUN(test_disabled_is_the_same_stream);
    return test_summary();
}
