#include "dtrain.h"

const char *dt_version(void) { return DTRAIN_VERSION; }
