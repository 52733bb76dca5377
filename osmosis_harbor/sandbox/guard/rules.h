/* The check's report, and the rules that make a change to the toolchain a finding.
 * Part of guard.c's single translation unit. */

/* ── the report ───────────────────────────────────────────────────────────────────────── */

static struct out *R;
#define MAX_RECORDS 1000
static u64 N_FINDINGS, N_CURED, N_SETASIDE;
static char SETASIDE[64][4096], SCRATCH[4096];
static int NSETASIDE;

static char type_char(u32 mode) {
    switch (mode & S_IFMT) {
    case S_IFREG: return 'f';
    case S_IFDIR: return 'd';
    case S_IFLNK: return 'l';
    default: return 'o';
    }
}
static void report_digest(const char *path, u32 mode) {
    u8 h[32];
    if ((mode & S_IFMT) == S_IFREG) {
        if (hash_file(path, h) == 0) out_hex(R, h, 32);
        else out_s(R, "-");
    } else if ((mode & S_IFMT) == S_IFLNK) {
        char t[4096];
        long k = sc4(SYS_readlinkat, AT_FDCWD, path, t, sizeof t);
        if (k > 0) out_hex(R, t, (size_t)k);
        else out_s(R, "-");
    } else if ((mode & S_IFMT) == S_IFDIR) {
        out_oct(R, mode & 07777);
    } else out_s(R, "-");
}
static const u8 *SUBTREE_DIGEST; /* set while a new subtree's one finding is written */
static void finding(const char *kind, const char *rule, const char *path, size_t n, u32 mode, int present) {
    if (++N_FINDINGS > MAX_RECORDS) return;
    out_s(R, "finding ");
    out_s(R, kind);
    out_s(R, " ");
    out_s(R, rule ? rule : "-");
    out_s(R, " ");
    char t = type_char(mode);
    out_bytes(R, &t, 1);
    out_s(R, " ");
    out_hex(R, path, n);
    out_s(R, " ");
    if (SUBTREE_DIGEST) out_hex(R, SUBTREE_DIGEST, 32);
    else if (present) report_digest(path, mode);
    else out_s(R, "-");
    out_s(R, "\n");
}
static void note_setaside(const char *path) {
    char root[4096];
    if (!cache_root(path, root)) return;
    for (int i = 0; i < NSETASIDE; i++)
        if (seq(SETASIDE[i], root)) return;
    if (NSETASIDE < 64) memcpy(SETASIDE[NSETASIDE++], root, slen(root) + 1);
}
static void cure(const char *path, size_t n) {
    if (sc4(SYS_unlinkat, AT_FDCWD, path, 0, 0) == 0 && ++N_CURED <= MAX_RECORDS) {
        out_s(R, "cured ");
        out_hex(R, path, n);
        out_s(R, "\n");
    }
}

/* ── rules for entries the agent added ───────────────────────────────────────────────── */

static char PATH_DIRS[64][512];
static int NPATH;
static void setup_path_dirs(void) {
    const char *extra[] = {"/root/.local/bin", NULL};
    for (int i = 0; extra[i]; i++) memcpy(PATH_DIRS[NPATH++], extra[i], slen(extra[i]) + 1);
    const char *p = getenv_of(ENVP, "PATH");
    if (!p) p = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
    while (*p && NPATH < 64) {
        const char *e = p;
        while (*e && *e != ':') e++;
        size_t k = (size_t)(e - p);
        if (k && k < 511 && p[0] == '/') {
            memcpy(PATH_DIRS[NPATH], p, k);
            PATH_DIRS[NPATH][k] = 0;
            while (k > 1 && PATH_DIRS[NPATH][k - 1] == '/') PATH_DIRS[NPATH][--k] = 0;
            int dup = 0;
            for (int i = 0; i < NPATH; i++) dup |= seq(PATH_DIRS[i], PATH_DIRS[NPATH]);
            if (!dup) NPATH++;
        }
        p = *e ? e + 1 : e;
    }
}
/* What a verifier script runs by name: shells, interpreters, package managers, downloaders,
 * the test runner. An agent that adds one, where the verifier would find it first, has
 * replaced a verifier tool even when the image had none yet. */
static int harness_name(const char *b) {
    static const char *names[] = {"sh", "bash", "dash", "env", "python", "pip", "uv", "uvx", "pytest",
                                  "py.test", "curl", "wget", "apt", "apt-get", "dpkg", "sudo", "su",
                                  "timeout", NULL};
    for (int i = 0; names[i]; i++)
        if (seq(b, names[i])) return 1;
    return (starts(b, "python3") || starts(b, "pip3")) && slen(b) <= 12;
}
static int path_dir_index(const char *dir, size_t n) {
    for (int i = 0; i < NPATH; i++)
        if (slen(PATH_DIRS[i]) == n && !memcmp(PATH_DIRS[i], dir, n)) return i;
    return -1;
}
static int exists_later_on_path(const char *name, int index) {
    char p[1024];
    for (int i = index + 1; i < NPATH; i++) {
        size_t a = slen(PATH_DIRS[i]), b = slen(name);
        if (a + b + 2 > sizeof p) continue;
        memcpy(p, PATH_DIRS[i], a);
        p[a] = '/';
        memcpy(p + a + 1, name, b + 1);
        struct stx st;
        if (lstatx(AT_FDCWD, p, &st) == 0 && (st.mode & S_IFMT) != S_IFDIR) return 1;
    }
    return 0;
}
static const char *pytest_rule(const char *path, const char *b) {
    if (seq(b, "conftest.py") || seq(b, "pytest.ini") || seq(b, ".pytest.ini") || seq(b, "pytest.py") ||
        seq(b, "_pytest") || seq(b, "pytest"))
        return "pytest-hook";
    if (seq(b, "tox.ini") && file_contains(path, "[pytest]")) return "pytest-hook";
    if (seq(b, "setup.cfg") && file_contains(path, "[tool:pytest]")) return "pytest-hook";
    if (seq(b, "pyproject.toml") && file_contains(path, "[tool.pytest")) return "pytest-hook";
    if ((seq(b, "pyproject.toml") && file_contains(path, "[tool.uv")) || seq(b, "uv.toml") || seq(b, "pip.conf"))
        return "package-config";
    if (seq(b, "sitecustomize.py") || seq(b, "usercustomize.py")) return "startup-hook";
    return NULL;
}
static const char *added_rule(const char *path, size_t n, const struct stx *st) {
    const char *b = basename_of(path, n);
    size_t dirn = (size_t)(b - path) - 1; /* the parent's length (0 for "/") */
    u32 type = st->mode & S_IFMT;
    if (seq(b, "sitecustomize.py") || seq(b, "usercustomize.py") || ends(b, slen(b), ".pth")) return "startup-hook";
    if (seq(path, "/etc/ld.so.preload") || seq(path, "/etc/ld.so.conf") || starts(path, "/etc/ld.so.conf.d/") ||
        seq(path, "/etc/ld.so.cache"))
        return "loader";
    if (seq(path, "/tests") || starts(path, "/tests/")) return "tests-dir";
    if (dirn == 0) {
        const char *rule = pytest_rule(path, b);
        if (rule) return rule;
    }
    int pi = path_dir_index(path, dirn ? dirn : 1);
    if (pi >= 0 && (type == S_IFLNK || (type == S_IFREG && (st->mode & 0111)))) {
        if (harness_name(b)) return "harness-tool";
        if (exists_later_on_path(b, pi)) return "path-shadow";
    }
    const char *parent = basename_of(path, dirn);
    size_t parentn = dirn - (size_t)(parent - path);
    if ((parentn == 13 && !memcmp(parent, "site-packages", 13)) ||
        (parentn == 13 && !memcmp(parent, "dist-packages", 13))) {
        if (seq(b, "pytest") || seq(b, "_pytest") || seq(b, "pluggy") || seq(b, "py.py") || seq(b, "pytest.py") ||
            seq(b, "iniconfig") || ((starts(b, "pytest-") || starts(b, "pluggy-")) && ends(b, slen(b), ".dist-info")))
            return "test-runner";
    }
    if (seq(b, "entry_points.txt") && parentn > 10 && !memcmp(parent + parentn - 10, ".dist-info", 10) &&
        file_contains(path, "[pytest11]"))
        return "pytest-plugin";
    if (seq(b, "pip.conf") || seq(b, "pip.ini") || seq(b, "uv.toml") || seq(b, ".pydistutils.cfg") ||
        seq(b, ".condarc") || seq(b, ".npmrc") || starts(path, "/etc/apt/"))
        return "package-config";
    if (ends(b, slen(b), ".pyc")) return "bytecode";
    if (in_tree(path, n)) /* a new __pycache__ holds only bytecode, cured above */
        return type == S_IFDIR && seq(b, "__pycache__") ? NULL : "tree";
    return NULL;
}
/* ── a directory added inside a tree: one finding for the whole subtree ─────────────────── */

/* Why one finding: a real solution's `pip install` adds thousands of files to site-packages, more
 * than a report keeps (MAX_RECORDS), so each file as a finding could never be allowed. The
 * subtree's digest covers, in name order, every entry's path relative to the root, type, mode and
 * content (a file's sha256, a link's target): the allowance matches only the very same tree. Bytecode
 * in __pycache__ is cured as elsewhere and left out (Python writes it differently each run). */
static void subtree_hash(char *path, size_t n, size_t root_n, int depth, struct sha *s) {
    if (depth > MAX_DEPTH) {
        TRUNCATED++;
        return;
    }
    long fd = xopen(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
    if (fd < 0) return;
    u8 *m = mark();
    char *names = (char *)arena_top;
    size_t used = 0, count = 0;
    static u8 dents[1 << 16];
    for (long r; (r = sc3(SYS_getdents64, fd, dents, sizeof dents)) > 0;) {
        for (long off = 0; off < r;) {
            struct linux_dirent64 *d = (struct linux_dirent64 *)(dents + off);
            off += d->reclen;
            if (seq(d->name, ".") || seq(d->name, "..")) continue;
            size_t k = slen(d->name) + 1;
            if ((size_t)((u8 *)arena_end - (u8 *)(names + used)) <= k + 64) fatal("out of memory");
            memcpy(names + used, d->name, k);
            used += k, count++;
        }
    }
    xclose(fd);
    alloc(used);
    const char **sorted = alloc(sizeof(char *) * (count + 1));
    size_t c = 0;
    for (size_t off = 0; off < used; off += slen(names + off) + 1) {
        const char *name = names + off;
        size_t j = c++;
        while (j > 0 && strcmp_(sorted[j - 1], name) > 0) sorted[j] = sorted[j - 1], j--;
        sorted[j] = name;
    }
    int pycache = seq(basename_of(path, n), "__pycache__");
    for (size_t i = 0; i < count; i++) {
        size_t k = slen(sorted[i]);
        if (n + 1 + k >= 4096 || ++ENTRIES > MAX_ENTRIES) {
            TRUNCATED++;
            continue;
        }
        path[n] = '/';
        memcpy(path + n + 1, sorted[i], k + 1);
        struct stx st;
        if (lstatx(AT_FDCWD, path, &st) < 0) continue;
        u32 type = st.mode & S_IFMT;
        if (pycache && type == S_IFREG && ends(sorted[i], k, ".pyc")) {
            cure(path, n + 1 + k);
            continue;
        }
        u8 meta[3] = {(u8)type_char(st.mode), (u8)(st.mode >> 8 & 0x0f), (u8)(st.mode & 0xff)};
        if (!(type == S_IFDIR && seq(sorted[i], "__pycache__"))) {
            sha_update(s, path + root_n, n + 1 + k - root_n + 1); /* the relative path and its NUL */
            sha_update(s, meta, 3);
            u8 h[32];
            if (type == S_IFREG && hash_file(path, h) == 0) sha_update(s, h, 32);
            if (type == S_IFLNK) {
                char t[4096];
                long got = sc4(SYS_readlinkat, AT_FDCWD, path, t, sizeof t);
                if (got > 0) sha_update(s, t, (size_t)got);
            }
        }
        if (type == S_IFDIR) subtree_hash(path, n + 1 + k, root_n, depth + 1, s);
    }
    path[n] = 0;
    release(m);
}
static void subtree_finding(const char *path, size_t n, const struct stx *st) {
    static char p[4096];
    memcpy(p, path, n + 1);
    struct sha s;
    sha_init(&s);
    u8 meta[2] = {(u8)(st->mode >> 8 & 0x0f), (u8)(st->mode & 0xff)};
    sha_update(&s, meta, 2);
    subtree_hash(p, n, n, 1, &s);
    u8 h[32];
    sha_final(&s, h);
    SUBTREE_DIGEST = h;
    finding("added", "tree", path, n, st->mode, 1);
    SUBTREE_DIGEST = NULL;
}
static int differs(const struct rec *r, const struct stx *st) {
    if ((r->mode & S_IFMT) != (u32)(st->mode & S_IFMT)) return 1;
    if (r->mode != st->mode || r->uid != st->uid || r->gid != st->gid) return 1;
    if ((st->mode & S_IFMT) == S_IFDIR) return 0; /* its entries are compared one by one */
    return r->ino != st->ino || r->size != st->size || r->csec != st->ctime.sec || r->cnsec != st->ctime.nsec;
}
static int check_visit(const char *path, size_t n, const struct stx *st, int probe) {
    struct entry *e = lookup(path, n);
    if (e) e->seen = 1;
    if (e && !differs(&e->r, st)) return 0;
    if (!probe && cache_root(path, SCRATCH)) {
        note_setaside(path);
        return 0;
    }
    if (is_pycache_pyc(path, n) && (st->mode & S_IFMT) == S_IFREG) {
        cure(path, n);
        return 0;
    }
    if (e) {
        finding("changed", probe ? pytest_rule(path, basename_of(path, n)) : NULL, path, n, st->mode, 1);
        return 0;
    }
    const char *rule = probe ? pytest_rule(path, basename_of(path, n)) : added_rule(path, n, st);
    if (rule && seq(rule, "tree") && (st->mode & S_IFMT) == S_IFDIR) {
        subtree_finding(path, n, st);
        return 1;
    }
    if (rule) finding("added", rule, path, n, st->mode, 1);
    return 0;
}
static void report_removed(void) {
    for (u64 i = 0; i < TABLE_SLOTS; i++) {
        struct entry *e = &TABLE[i];
        if (!e->path || e->seen || e->r.probe) continue;
        char p[4096];
        memcpy(p, e->path, e->len);
        p[e->len] = 0;
        if (cache_root(p, SCRATCH)) {
            note_setaside(p);
            continue;
        }
        if (is_pycache_pyc(p, e->len)) continue;
        finding("removed", NULL, p, e->len, e->r.mode, 0);
    }
}
/* A package cache the agent touched is renamed away: the verifier's `uvx`/`pip` start clean. */
static void set_aside_caches(const char *nonce) {
    for (int i = 0; i < NSETASIDE; i++) {
        char to[4200];
        size_t a = slen(SETASIDE[i]);
        memcpy(to, SETASIDE[i], a);
        memcpy(to + a, ".osmosis-set-aside-", 19);
        size_t b = slen(nonce) < 16 ? slen(nonce) : 16;
        memcpy(to + a + 19, nonce, b);
        to[a + 19 + b] = 0;
        if (sc5(SYS_renameat2, AT_FDCWD, SETASIDE[i], AT_FDCWD, to, 0) == 0 && ++N_SETASIDE <= MAX_RECORDS) {
            out_s(R, "setaside ");
            out_hex(R, SETASIDE[i], a);
            out_s(R, "\n");
        }
    }
}
