/* What the manifest covers, the walk over it, and the signed manifest itself.
 * Part of guard.c's single translation unit. */

/* ── paths the manifest covers ────────────────────────────────────────────────────────── */

/* Data, not toolchain: never recorded (the verifier's own dirs, scratch, state, the bundle). */
static const char *DATA_DIRS[] = {"/proc", "/sys", "/dev", "/run", "/tmp", "/var", "/logs", "/osmosis",
                                  "/opt/osmosis", "/mnt", "/media", "/lost+found", "/boot", NULL};
static char *EXCLUDED[512];
static int NEXCLUDED;
static void exclude(const char *p) {
    if (NEXCLUDED < 512 && !seq(p, "/")) EXCLUDED[NEXCLUDED++] = (char *)p;
}
/* mount points other than /: other filesystems (the runtime's /etc/hosts, volumes, tmpfs). */
static void exclude_mounts(void) {
    size_t n = 0;
    char *t = read_small("/proc/self/mountinfo", 1 << 20, &n);
    if (!t) return;
    for (size_t i = 0; i < n;) {
        size_t e = i;
        while (e < n && t[e] != '\n') e++;
        int field = 0;
        size_t s = i;
        for (size_t j = i; j <= e; j++) {
            if (j == e || t[j] == ' ') {
                if (field == 4) { /* mount point, octal escapes */
                    char *p = alloc(j - s + 1);
                    size_t k = 0;
                    for (size_t q = s; q < j; q++) {
                        if (t[q] == '\\' && q + 3 < j) {
                            p[k++] = (char)((t[q + 1] - '0') * 64 + (t[q + 2] - '0') * 8 + (t[q + 3] - '0'));
                            q += 3;
                        } else p[k++] = t[q];
                    }
                    p[k] = 0;
                    exclude(p);
                    break;
                }
                field++;
                s = j + 1;
            }
        }
        i = e + 1;
    }
}
static void setup_exclusions(const struct opts *o) {
    for (int i = 0; DATA_DIRS[i]; i++) exclude(DATA_DIRS[i]);
    exclude_mounts();
    for (int i = 0; i < o->nworkdirs; i++) exclude(o->workdirs[i]);
}
static int excluded(const char *path) {
    for (int i = 0; i < NEXCLUDED; i++)
        if (seq(EXCLUDED[i], path)) return 1;
    return 0;
}
/* Under a ``.cache`` dir only the package managers' caches are recorded (what a verifier's
 * `uvx` or `pip install` would take from); other caches are data. */
static int cache_skipped(const char *parent_base, const char *name) {
    return seq(parent_base, ".cache") && !seq(name, "uv") && !seq(name, "pip");
}
/* The root of a package cache ``path`` is under (``.../.cache/uv``), written into ``root``. */
static int cache_root(const char *path, char *root) {
    const char *hit = NULL;
    for (const char *p = path; (p = sstr(p, "/.cache/")) != NULL; p++) hit = p;
    if (!hit) return 0;
    const char *name = hit + 8;
    size_t k = starts(name, "uv") && (name[2] == '/' || !name[2]) ? 2
               : starts(name, "pip") && (name[3] == '/' || !name[3]) ? 3
                                                                    : 0;
    if (!k) return 0;
    size_t n = (size_t)(name - path) + k;
    memcpy(root, path, n);
    root[n] = 0;
    return 1;
}
static int is_pycache_pyc(const char *path, size_t n) {
    return ends(path, n, ".pyc") && sstr(path, "/__pycache__/") != NULL;
}

/* ── the walk ─────────────────────────────────────────────────────────────────────────── */

/* Returns nonzero when the walk must not descend (a new subtree already judged whole). */
typedef int (*visit_fn)(const char *path, size_t n, const struct stx *st, int probe);
static u64 ENTRIES;
#define MAX_ENTRIES 4000000ULL
#define MAX_DEPTH 200

struct linux_dirent64 {
    u64 ino;
    i64 off;
    u16 reclen;
    u8 type;
    char name[];
};
/* What the walk could not cover: too many entries, too deep, a path too long. A check that did
 * not see everything reports it, and the host counts it as tampering (the record refuses). */
static u64 TRUNCATED;
static void walk_dir(char *path, size_t n, int depth, visit_fn visit) {
    if (depth > MAX_DEPTH) {
        TRUNCATED++;
        return;
    }
    long fd = xopen(n ? path : "/", O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
    if (fd < 0) return;
    u8 *m = mark();
    char *names = (char *)arena_top; /* the directory's names, packed at the arena's top */
    size_t used = 0;
    static u8 dents[1 << 16];
    for (;;) {
        long r = sc3(SYS_getdents64, fd, dents, sizeof dents);
        if (r <= 0) break;
        for (long off = 0; off < r;) {
            struct linux_dirent64 *d = (struct linux_dirent64 *)(dents + off);
            off += d->reclen;
            if (seq(d->name, ".") || seq(d->name, "..")) continue;
            size_t k = slen(d->name) + 1;
            if ((size_t)((u8 *)arena_end - (u8 *)(names + used)) <= k) fatal("out of memory");
            memcpy(names + used, d->name, k);
            used += k;
        }
    }
    xclose(fd);
    alloc(used);
    const char *parent_base = basename_of(path, n);
    for (size_t off = 0; off < used;) {
        const char *name = names + off;
        size_t k = slen(name);
        off += k + 1;
        if (n + 1 + k >= 4096 || ++ENTRIES > MAX_ENTRIES) {
            TRUNCATED++;
            continue;
        }
        path[n] = '/';
        memcpy(path + n + 1, name, k + 1);
        if (excluded(path) || cache_skipped(parent_base, name)) continue;
        struct stx st;
        if (lstatx(AT_FDCWD, path, &st) < 0) continue;
        if (!visit(path, n + 1 + k, &st, 0) && (st.mode & S_IFMT) == S_IFDIR) walk_dir(path, n + 1 + k, depth + 1, visit);
    }
    path[n] = 0;
    release(m);
}
/* What a verifier picks up from the agent's working directory (the tests' cwd). */
static const char *WORKDIR_PROBES[] = {"conftest.py", "pytest.ini", ".pytest.ini", "tox.ini", "setup.cfg",
                                       "pyproject.toml", "uv.toml", "pytest.py", "_pytest", "pytest",
                                       "sitecustomize.py", "usercustomize.py", "pip.conf", NULL};
static void walk_all(const struct opts *o, visit_fn visit) {
    static char path[4096];
    path[0] = 0;
    walk_dir(path, 0, 0, visit);
    for (int w = 0; w < o->nworkdirs; w++) {
        for (int i = 0; WORKDIR_PROBES[i]; i++) {
            size_t a = slen(o->workdirs[w]), b = slen(WORKDIR_PROBES[i]);
            if (a + b + 2 >= sizeof path) continue;
            memcpy(path, o->workdirs[w], a);
            path[a] = '/';
            memcpy(path + a + 1, WORKDIR_PROBES[i], b + 1);
            struct stx st;
            if (lstatx(AT_FDCWD, path, &st) == 0) visit(path, a + 1 + b, &st, 1);
        }
    }
}

/* ── the manifest: what the toolchain was, authenticated with the daemon's key ─────────── */

#define MANIFEST_DIR "/var/tmp/.osmosis-guard"
#define MANIFEST_PATH MANIFEST_DIR "/manifest"
#define MANIFEST_MAGIC "osmosis-guard-manifest 1\n"
#define TREE_ROOT 2 /* a rec's probe for a tree's root (see trees.h), not an entry */
struct rec { /* fixed part of one entry, after its u16 path length and path */
    u32 mode, uid, gid, probe;
    u64 ino, size;
    i64 csec;
    u32 cnsec, pad;
};
static struct buf MANIFEST;
static int record_visit(const char *path, size_t n, const struct stx *st, int probe) {
    u16 len = (u16)n;
    struct rec r = {st->mode, st->uid, st->gid, (u32)probe, st->ino, st->size, st->ctime.sec, st->ctime.nsec, 0};
    buf_put(&MANIFEST, &len, 2);
    buf_put(&MANIFEST, path, n);
    buf_put(&MANIFEST, &r, sizeof r);
    return 0;
}
static void manifest_mac(const u8 key[32], const u8 *body, size_t n, u8 out[32]) {
    struct hmac m;
    hmac_init(&m, key);
    sha_update(&m.inner, "manifest\n", 9);
    sha_update(&m.inner, body, n);
    hmac_final(&m, out);
}
static void record_manifest(const struct opts *o, const u8 key[32]) {
    if (!o->id) fatal("--id is required");
    setup_exclusions(o);
    MANIFEST.n = 0;
    buf_put(&MANIFEST, MANIFEST_MAGIC, sizeof MANIFEST_MAGIC - 1);
    buf_put(&MANIFEST, o->id, slen(o->id));
    buf_put(&MANIFEST, "\n", 1);
    walk_all(o, record_visit);
    setup_trees();
    for (int i = 0; i < NTREES; i++) { /* "T<root>": never a path the walk yields */
        char t[520];
        size_t k = slen(TREES[i]);
        t[0] = 'T';
        memcpy(t + 1, TREES[i], k);
        struct rec r = {0, 0, 0, TREE_ROOT, 0, 0, 0, 0, 0};
        u16 len = (u16)(k + 1);
        buf_put(&MANIFEST, &len, 2);
        buf_put(&MANIFEST, t, k + 1);
        buf_put(&MANIFEST, &r, sizeof r);
    }
    if (TRUNCATED) fatal("the toolchain is too large to record (over 4,000,000 entries, 200 levels or 4 KiB paths)");
    u8 mac[32];
    manifest_mac(key, MANIFEST.p, MANIFEST.n, mac);
    buf_put(&MANIFEST, mac, 32);
    sc3(SYS_mkdirat, AT_FDCWD, "/var/tmp", 01777);
    sc3(SYS_mkdirat, AT_FDCWD, MANIFEST_DIR, 0700);
    sc4(SYS_unlinkat, AT_FDCWD, MANIFEST_DIR "/manifest.part", 0, 0);
    long fd = sc4(SYS_openat, AT_FDCWD, MANIFEST_DIR "/manifest.part",
                  O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) fatal_errno("cannot write the manifest", fd);
    if (write_all(fd, MANIFEST.p, MANIFEST.n) < 0) fatal("cannot write the manifest");
    xclose(fd);
    long r = sc5(SYS_renameat2, AT_FDCWD, MANIFEST_DIR "/manifest.part", AT_FDCWD, MANIFEST_PATH, 0);
    if (r < 0) fatal_errno("cannot put the manifest in place", r);
}

/* the manifest loaded for a check: a hash table of its entries by path */
struct entry {
    const char *path;
    u16 len;
    u8 seen;
    struct rec r;
};
static struct entry *TABLE;
static u64 TABLE_SLOTS;
static u64 path_hash(const char *p, size_t n) {
    u64 h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ (u8)p[i]) * 1099511628211ULL;
    return h;
}
static struct entry *lookup(const char *p, size_t n) {
    u64 i = path_hash(p, n) & (TABLE_SLOTS - 1);
    while (TABLE[i].path) {
        if (TABLE[i].len == n && !memcmp(TABLE[i].path, p, n)) return &TABLE[i];
        i = (i + 1) & (TABLE_SLOTS - 1);
    }
    return NULL;
}
/* 0: loaded; else what went wrong ("missing", "forged", "other-id"). */
static const char *load_manifest(const struct opts *o, const u8 key[32]) {
    long fd = xopen(MANIFEST_PATH, O_RDONLY | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) return "missing";
    struct buf b = {0, 0, 0};
    static u8 chunk[1 << 16];
    for (;;) {
        long r = sc3(SYS_read, fd, chunk, sizeof chunk);
        if (r == -EINTR) continue;
        if (r <= 0) break;
        buf_put(&b, chunk, (size_t)r);
    }
    xclose(fd);
    size_t magic = sizeof MANIFEST_MAGIC - 1;
    if (b.n < magic + 33 || memcmp(b.p, MANIFEST_MAGIC, magic)) return "forged";
    u8 mac[32];
    manifest_mac(key, b.p, b.n - 32, mac);
    u8 diff = 0;
    for (int i = 0; i < 32; i++) diff |= mac[i] ^ b.p[b.n - 32 + i];
    if (diff) return "forged";
    size_t idn = slen(o->id);
    if (b.n < magic + idn + 1 + 32 || memcmp(b.p + magic, o->id, idn) || b.p[magic + idn] != '\n') return "other-id";
    size_t pos = magic + idn + 1, end = b.n - 32;
    u64 count = 0;
    for (size_t q = pos; q + 2 <= end;) {
        u16 len;
        memcpy(&len, b.p + q, 2);
        q += 2 + len + sizeof(struct rec);
        count++;
    }
    TABLE_SLOTS = 1024;
    while (TABLE_SLOTS < count * 2) TABLE_SLOTS *= 2;
    TABLE = xmap(TABLE_SLOTS * sizeof(struct entry));
    if (!TABLE) fatal("out of memory");
    NTREES = 0;
    while (pos + 2 <= end) {
        u16 len;
        memcpy(&len, b.p + pos, 2);
        if (pos + 2 + len + sizeof(struct rec) > end) return "forged";
        const char *p = (const char *)b.p + pos + 2;
        struct rec r;
        memcpy(&r, b.p + pos + 2 + len, sizeof r);
        if (r.probe == TREE_ROOT) {
            if (len > 1 && p[0] == 'T') add_tree_n(p + 1, len - 1u);
            pos += 2 + len + sizeof(struct rec);
            continue;
        }
        u64 i = path_hash(p, len) & (TABLE_SLOTS - 1);
        while (TABLE[i].path) i = (i + 1) & (TABLE_SLOTS - 1);
        TABLE[i].path = p, TABLE[i].len = len;
        memcpy(&TABLE[i].r, b.p + pos + 2 + len, sizeof(struct rec));
        pos += 2 + len + sizeof(struct rec);
    }
    return NULL;
}
