/* dtrain keygen: a CURVE key pair for --auth=curve (docs/security.md). */
#include <stdio.h>

#include "commands.h"
#include "core/flags.h"
#include "transport/auth.h"

int cmd_keygen(int argc, char **argv) {
    const char *out = NULL, *name = NULL;
    flag_def defs[] = {
        FLAG_TEXT("out", &out, "folder to write the keys to (created if missing)"),
        FLAG_TEXT("name", &name, "key name: writes NAME.key (public) and NAME.secret (mode 0600)"),
    };
    int n = (int)(sizeof defs / sizeof defs[0]), help = 0;
    dt_error err = {0};
    if (flags_parse(defs, n, argc, argv, &help, &err)) {
        fprintf(stderr, "dtrain keygen: %s\n", err.msg);
        return 2;
    }
    if (help) {
        printf("usage: dtrain keygen --out DIR --name NAME\n\n"
               "Writes a ZeroMQ CURVE key pair as Z85 text: DIR/NAME.key (public) and DIR/NAME.secret\n"
               "(secret, mode 0600). For --auth=curve a keys folder holds server.secret (a ps),\n"
               "authorized/*.key (the clients a ps accepts), client.secret and server.key (a worker).\n"
               "See docs/security.md.\n\nflags:\n");
        flags_print_help(stdout, defs, n);
        return 0;
    }
    if (!out || !*out || !name || !*name) {
        fprintf(stderr, "dtrain keygen: --out and --name are required\n");
        return 2;
    }
    if (dt_auth_keygen(out, name, &err)) {
        fprintf(stderr, "dtrain keygen: %s\n", err.msg);
        return 1;
    }
    printf("wrote %s/%s.key and %s/%s.secret\n", out, name, out, name);
    return 0;
}
