/* Small text helpers: the parsers' suggestions for a misspelled word, the CSV outputs' fields. */
#ifndef DT_CORE_TEXT_H
#define DT_CORE_TEXT_H

/* Levenshtein distance between a and b, ignoring ASCII case; INT_MAX when either is longer than 63
 * bytes (such words never get a suggestion). */
int dt_edit_distance(const char *a, const char *b);

/* v as one CSV field (RFC 4180): quoted, its quotes doubled, when it holds a comma, quote or line
 * break; as it is otherwise. malloc'd (the caller frees); NULL when out of memory. */
char *dt_csv_field(const char *v);

#endif
