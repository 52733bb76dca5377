/* The environment (the daemon's key) and the options of each mode.
 * Part of guard.c's single translation unit. */

/* ── environment and arguments ────────────────────────────────────────────────────────── */

static char **ENVP;
#define KEY_VAR "OSMOSIS_GUARD_KEY="
static const char *getenv_of(char **envp, const char *name) {
    size_t n = slen(name);
    for (; envp && *envp; envp++)
        if (!memcmp(*envp, name, n) && (*envp)[n] == '=') return *envp + n + 1;
    return NULL;
}
static int parse_key(const char *hex, u8 key[32]) {
    if (!hex || slen(hex) != 64) return -1;
    for (int i = 0; i < 32; i++) {
        int a = hexval(hex[2 * i]), b = hexval(hex[2 * i + 1]);
        if (a < 0 || b < 0) return -1;
        key[i] = (u8)(a << 4 | b);
    }
    return 0;
}

struct opts {
    const char *id, *nonce, *ports;
    long daemon;
    int keep_listening;
    const char *workdirs[16];
    int nworkdirs;
    char **rest; /* after "--" */
};
static void parse_opts(int argc, char **argv, int from, struct opts *o) {
    memset(o, 0, sizeof *o);
    for (int i = from; i < argc; i++) {
        const char *a = argv[i];
        if (seq(a, "--")) {
            o->rest = argv + i + 1;
            return;
        }
        if (seq(a, "--keep-listening")) {
            o->keep_listening = 1;
            continue;
        }
        if (i + 1 >= argc) fatal("option without a value");
        const char *v = argv[++i];
        if (seq(a, "--id")) o->id = v;
        else if (seq(a, "--nonce")) o->nonce = v;
        else if (seq(a, "--keep-ports")) o->ports = v;
        else if (seq(a, "--workdir")) {
            if (o->nworkdirs < 16 && v[0] == '/') o->workdirs[o->nworkdirs++] = v;
        } else if (seq(a, "--daemon")) {
            int ok;
            o->daemon = (long)parse_u64(v, &ok);
            if (!ok || o->daemon < 2) fatal("bad --daemon pid");
        } else fatal("unknown option");
    }
}
