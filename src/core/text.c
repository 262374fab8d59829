#include "core/text.h"

#include <ctype.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

int dt_edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63) return INT_MAX;
    int prev[64], cur[64];
    for (size_t j = 0; j <= lb; j++) prev[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        cur[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int sub = prev[j - 1] + (tolower((unsigned char)a[i - 1]) != tolower((unsigned char)b[j - 1]));
            int del = prev[j] + 1, ins = cur[j - 1] + 1;
            cur[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
        memcpy(prev, cur, sizeof(int) * (lb + 1));
    }
    return prev[lb];
}

char *dt_csv_field(const char *v) {
    const int quote = v[strcspn(v, ",\"\r\n")] != 0;
    size_t n = strlen(v), quotes = 0;
    for (const char *c = v; *c; c++) quotes += *c == '"';
    char *f = malloc(n + quotes + 3), *at = f;
    if (!f) return NULL;
    if (quote) *at++ = '"';
    for (const char *c = v; *c; c++) {
        if (*c == '"') *at++ = '"'; /* only in a quoted field: a quote makes it one */
        *at++ = *c;
    }
    if (quote) *at++ = '"';
    *at = 0;
    return f;
}
