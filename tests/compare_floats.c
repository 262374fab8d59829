/* compare_floats A B [MAX_NORM_REL]: two raw float32 files (--debug_dump_params, --debug_dump_grads)
 * compared, for the GPU tests (tests/test_gpu_*.sh), which may run where no numpy is installed.
 * Prints "identical", or the largest difference relative to the largest |B| and the L2 norm of the
 * difference relative to that of B. Exit 0 when the sizes agree and (with MAX_NORM_REL) the norm
 * ratio is at most it; 1 otherwise; 2 on bad use. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static float *load(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    float *x = NULL;
    size_t cap = 0;
    *n = 0;
    for (;;) {
        if (*n == cap) {
            cap = cap ? 2 * cap : 1 << 16;
            float *y = realloc(x, cap * sizeof *x);
            if (!y) break;
            x = y;
        }
        size_t got = fread(x + *n, sizeof *x, cap - *n, f);
        *n += got;
        if (got == 0) break;
    }
    fclose(f);
    return x;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: compare_floats A B [MAX_NORM_REL]\n");
        return 2;
    }
    size_t na = 0, nb = 0;
    float *a = load(argv[1], &na), *b = load(argv[2], &nb);
    if (!a || !b || na != nb || na == 0) {
        printf("sizes differ or unreadable: %zu and %zu floats\n", na, nb);
        return 1;
    }
    if (memcmp(a, b, na * sizeof *a) == 0) {
        printf("identical (%zu floats)\n", na);
        return 0;
    }
    double mx = 0, dmax = 0, d2 = 0, b2 = 0;
    size_t at = 0;
    for (size_t i = 0; i < na; i++) {
        double d = fabs((double)a[i] - b[i]);
        mx = fmax(mx, fabs((double)b[i]));
        if (d > dmax || d != d) dmax = d, at = i;
        d2 += d * d, b2 += (double)b[i] * b[i];
    }
    double norm_rel = b2 > 0 ? sqrt(d2 / b2) : sqrt(d2);
    printf("max %.3g (at %zu: %.9g vs %.9g) norm %.3g (%zu floats)\n", mx > 0 ? dmax / mx : dmax, at, (double)a[at],
           (double)b[at], norm_rel, na);
    if (argc > 3 && !(norm_rel <= atof(argv[3]))) return 1;
    return 0;
}
