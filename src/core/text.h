/* Small text helpers shared by the parsers that suggest a fix for a misspelled word. */
#ifndef DT_CORE_TEXT_H
#define DT_CORE_TEXT_H

/* Levenshtein distance between a and b, ignoring ASCII case; INT_MAX when either is longer than 63
 * bytes (such words never get a suggestion). */
int dt_edit_distance(const char *a, const char *b);

#endif
