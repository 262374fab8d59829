#include "plot/svg.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

/* Geometry, in SVG user units (pixels at 100%). Two panels side by side; the legend below. */
enum { PANEL_W = 460, PANEL_H = 320, MARGIN_L = 64, MARGIN_T = 48, GAP = 40, PLOT_W = PANEL_W - MARGIN_L - 16,
       PLOT_H = PANEL_H - MARGIN_T - 44, LEGEND_ROW = 20 };

/* Colour-blind-safe (Okabe-Ito), then repeated with another dash pattern for the training line. */
static const char *const palette[] = {"#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9", "#000000",
                                      "#f0e442"};
#define N_COLOURS ((int)(sizeof palette / sizeof palette[0]))

typedef struct {
    double x0, x1, y0, y1; /* data ranges */
    double px, py;         /* top-left corner of the plot area */
} axes;

static void put_escaped(FILE *f, const char *s) {
    for (; *s; s++) {
        switch (*s) {
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '&': fputs("&amp;", f); break;
        case '"': fputs("&quot;", f); break;
        default:
            /* XML 1.0 allows no control characters but tab and line breaks */
            if ((unsigned char)*s < 0x20 && *s != '\t' && *s != '\n' && *s != '\r') fputc('?', f);
            else fputc(*s, f);
        }
    }
}

static double sx(const axes *a, double x) { return a->px + (x - a->x0) / (a->x1 - a->x0) * PLOT_W; }
static double sy(const axes *a, double y) { return a->py + PLOT_H - (y - a->y0) / (a->y1 - a->y0) * PLOT_H; }

/* Tick spacing of 1, 2 or 5 times a power of ten giving at most about 6 ticks over range. */
static double tick_step(double range) {
    double raw = range / 5, p = pow(10, floor(log10(raw))), m = raw / p;
    return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p;
}

/* The data range of one panel over every run and both splits; y from 0 (accuracy up to 1 at least)
 * unless values go below. Empty: 0..1 both ways. A single value is widened so the range is not 0. */
static void panel_range(axes *a, const dt_run_curves *runs, int n_runs, int tag) {
    double x0 = INFINITY, x1 = -INFINITY, y0 = 0, y1 = tag == DT_TAG_ACCURACY ? 1 : -INFINITY;
    for (int r = 0; r < n_runs; r++)
        for (int sp = 0; sp < 2; sp++) {
            const dt_series *s = &runs[r].s[sp][tag];
            for (size_t i = 0; i < s->n; i++) {
                double x = (double)s->step[i], y = s->value[i];
                x0 = x < x0 ? x : x0;
                x1 = x > x1 ? x : x1;
                y0 = y < y0 ? y : y0;
                y1 = y > y1 ? y : y1;
            }
        }
    if (!(x0 <= x1)) x0 = 0, x1 = 1;
    if (!(y0 <= y1)) y0 = 0, y1 = 1;
    /* Steps are integers; far from 0 a step of 1 is lost in a double's rounding, so widen relatively. */
    if (x1 - x0 < 1) x1 = x0 + fmax(1, fabs(x0) * 1e-9);
    if (y1 - y0 < 1e-30 * (fabs(y0) + fabs(y1)) || y1 - y0 < 1e-300) y1 = y0 + (y0 ? fabs(y0) : 1);
    if (tag == DT_TAG_COST) y1 += (y1 - y0) * 0.05; /* headroom: the first loss is the largest */
    a->x0 = x0, a->x1 = x1, a->y0 = y0, a->y1 = y1;
}

static void draw_axes(FILE *f, const axes *a, const char *title) {
    fprintf(f, "<text class=\"panel-title\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"15\" "
               "font-weight=\"bold\">", a->px + PLOT_W / 2.0, a->py - 14);
    put_escaped(f, title);
    fprintf(f, "</text>\n<rect x=\"%.1f\" y=\"%.1f\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#888\"/>\n", a->px,
            a->py, PLOT_W, PLOT_H);
    for (int axis = 0; axis < 2; axis++) {
        double lo = axis ? a->y0 : a->x0, hi = axis ? a->y1 : a->x1, step = tick_step(hi - lo);
        if (!(step > 0) || !isfinite(step)) continue;
        double first = ceil(lo / step) * step;
        for (int k = 0; k <= 12; k++) {
            double v = first + k * step;
            if (v > hi + step * 1e-9) break;
            if (fabs(v) < step * 1e-9) v = 0; /* -0 and 1e-17 print as 0 */
            if (axis) {
                double y = sy(a, v);
                fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                           "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\" font-size=\"11\">%.6g</text>\n",
                        a->px, y, a->px + PLOT_W, y, a->px - 6, y + 4, v);
            } else {
                double x = sx(a, v);
                fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                           "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"11\">%.10g</text>\n",
                        x, a->py, x, a->py + PLOT_H, x, a->py + PLOT_H + 16, v);
            }
        }
    }
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"12\">global step</text>\n",
            a->px + PLOT_W / 2.0, a->py + PLOT_H + 34);
}

static void draw_series(FILE *f, const axes *a, const dt_run_curves *run, int r, int split, int tag) {
    const dt_series *s = &run->s[split][tag];
    const char *colour = palette[r % N_COLOURS];
    /* Runs past the palette's length are told apart by a heavier line. */
    double width = r / N_COLOURS ? 3.0 : 1.8;
    fputs("<polyline class=\"series\" data-run=\"", f);
    put_escaped(f, run->name);
    fprintf(f, "\" data-split=\"%s\" data-tag=\"%s\" data-points=\"%zu\" fill=\"none\" stroke=\"%s\" "
               "stroke-width=\"%.1f\"%s points=\"",
            split == DT_SPLIT_TRAIN ? "train" : "validation", tag == DT_TAG_COST ? "cost" : "accuracy", s->n, colour,
            width, split == DT_SPLIT_TEST ? " stroke-dasharray=\"6 4\"" : "");
    for (size_t i = 0; i < s->n; i++)
        fprintf(f, "%s%.2f,%.2f", i ? " " : "", sx(a, (double)s->step[i]), sy(a, s->value[i]));
    fputs("\"/>\n", f);
    /* Validation points are few: mark each, so one point alone is visible too. */
    if (split == DT_SPLIT_TEST)
        for (size_t i = 0; i < s->n; i++)
            fprintf(f, "<circle cx=\"%.2f\" cy=\"%.2f\" r=\"2.5\" fill=\"%s\"/>\n", sx(a, (double)s->step[i]),
                    sy(a, s->value[i]), colour);
}

static void draw_legend(FILE *f, const dt_run_curves *runs, int n_runs, double y) {
    fprintf(f, "<g class=\"legend\" font-size=\"12\">\n"
               "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#444\" stroke-width=\"1.8\"/>"
               "<text x=\"%d\" y=\"%.1f\">training</text>\n"
               "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#444\" stroke-width=\"1.8\" "
               "stroke-dasharray=\"6 4\"/><text x=\"%d\" y=\"%.1f\">validation</text>\n",
            MARGIN_L, y - 4, MARGIN_L + 28, y - 4, MARGIN_L + 34, y, MARGIN_L + 120, y - 4, MARGIN_L + 148, y - 4,
            MARGIN_L + 154, y);
    for (int r = 0; r < n_runs; r++) {
        /* Two columns of runs under the two panels. */
        double x = MARGIN_L + (r % 2) * (PANEL_W + GAP), ry = y + LEGEND_ROW * (1 + r / 2);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"%.1f\"/>", x,
                ry - 4, x + 28, ry - 4, palette[r % N_COLOURS], r / N_COLOURS ? 3.0 : 1.8);
        fprintf(f, "<text class=\"run-name\" x=\"%.1f\" y=\"%.1f\">", x + 34, ry);
        put_escaped(f, runs[r].name);
        fputs("</text>\n", f);
    }
    fputs("</g>\n", f);
}

int dt_plot_svg(char **out, size_t *len, const dt_run_curves *runs, int n_runs, const char *title, dt_error *err) {
    *out = NULL;
    *len = 0;
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    if (!f) return dt_errorf(err, DT_ENOMEM, "out of memory for the picture");
    int width = 2 * PANEL_W + GAP + 16, legend_y = MARGIN_T + 16 + PLOT_H + 62;
    int height = legend_y + LEGEND_ROW * (1 + (n_runs + 1) / 2) + 8;
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
               "font-family=\"sans-serif\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
            width, height, width, height);
    fprintf(f, "<text x=\"%d\" y=\"22\" font-size=\"16\">", MARGIN_L);
    put_escaped(f, title ? title : "cost and accuracy against the global step");
    fputs("</text>\n", f);
    static const char *const panel_titles[2] = {"cost", "accuracy"};
    for (int tag = 0; tag < 2; tag++) {
        axes a;
        panel_range(&a, runs, n_runs, tag);
        a.px = MARGIN_L + tag * (PANEL_W + GAP);
        a.py = MARGIN_T + 16;
        fprintf(f, "<g class=\"panel\" data-tag=\"%s\">\n", panel_titles[tag]);
        draw_axes(f, &a, panel_titles[tag]);
        for (int r = 0; r < n_runs; r++)
            for (int sp = 0; sp < 2; sp++) draw_series(f, &a, &runs[r], r, sp, tag);
        fputs("</g>\n", f);
    }
    draw_legend(f, runs, n_runs, legend_y);
    fputs("</svg>\n", f);
    int bad = ferror(f);
    if (fclose(f) != 0 || bad) {
        free(buf);
        return dt_errorf(err, DT_ENOMEM, "out of memory writing the picture");
    }
    *out = buf;
    *len = n;
    return 0;
}
