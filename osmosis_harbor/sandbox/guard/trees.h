/* The toolchain's whole trees: where anything added is a finding, whatever its name.
 * Part of guard.c's single translation unit.
 *
 * Why trees and not names: a name list (sitecustomize, *.pth, pytest's files) is one name short
 * of every attack (a `python312.zip` that does not exist yet, an `enum/` package beside
 * `enum.py`). So the start records the trees a verifier's programs are looked up in: every
 * directory on PATH (and /root/.local/bin), the lib dirs of each PATH entry's prefix (a Python's
 * stdlib, its zip, lib-dynload and site-packages, the user site, Debian's dist-packages: all
 * under <prefix>/lib), every entry of each python's sys.path (asked at the start, see
 * ``ask_python``), the loader's default dirs and its configuration dir, and PYTHONPATH.
 * The roots travel in the signed manifest, so the check judges by what the start saw. */

#define MAX_TREES 128
static char TREES[MAX_TREES][512];
static int NTREES;

static int seq_n(const char *a, size_t n, const char *b) { return slen(b) == n && !memcmp(a, b, n); }
/* Whether ``path`` is a tree's root or under one. */
static int in_tree(const char *path, size_t n) {
    for (int i = 0; i < NTREES; i++) {
        size_t m = slen(TREES[i]);
        if (n >= m && !memcmp(path, TREES[i], m) && (n == m || path[m] == '/')) return 1;
    }
    return 0;
}
static void add_tree_n(const char *p, size_t k) {
    while (k > 1 && p[k - 1] == '/') k--;
    if (k < 2 || k >= 511 || p[0] != '/' || NTREES >= MAX_TREES) return; /* never "/" itself */
    if (in_tree(p, k)) return; /* already covered */
    memcpy(TREES[NTREES], p, k);
    TREES[NTREES++][k] = 0;
}
/* A root whose first component is a symlink (a merged /usr: /bin -> usr/bin) is also recorded
 * as its target, which is where the walk (it never follows links) sees the entries. */
static void add_tree(const char *p, size_t k) {
    add_tree_n(p, k);
    size_t first = 1;
    while (first < k && p[first] != '/') first++;
    char top[512], target[512];
    if (first >= sizeof top) return;
    memcpy(top, p, first);
    top[first] = 0;
    struct stx st;
    if (lstatx(AT_FDCWD, top, &st) < 0 || (st.mode & S_IFMT) != S_IFLNK) return;
    long t = sc4(SYS_readlinkat, AT_FDCWD, top, target, sizeof target - 1);
    if (t <= 0 || (size_t)t + k + 2 >= sizeof target) return;
    char full[1100];
    size_t n = 0;
    if (target[0] != '/') full[n++] = '/';
    memcpy(full + n, target, (size_t)t);
    n += (size_t)t;
    memcpy(full + n, p + first, k - first);
    add_tree_n(full, n + k - first);
}
/* Each entry of a colon list (PATH, PYTHONPATH); PATH's also gives its prefix's lib dirs. */
static void add_list(const char *p, int with_libs) {
    while (p && *p) {
        const char *e = p;
        while (*e && *e != ':') e++;
        size_t k = (size_t)(e - p);
        if (k && p[0] == '/') {
            add_tree(p, k);
            size_t d = k;
            while (d > 1 && p[d - 1] == '/') d--;
            const char *b = basename_of(p, d);
            size_t prefix = (size_t)(b - p) - 1; /* "/usr/local/bin" -> "/usr/local" */
            if (with_libs && (seq_n(b, d - (size_t)(b - p), "bin") || seq_n(b, d - (size_t)(b - p), "sbin"))) {
                char lib[600];
                if (prefix + 8 < sizeof lib) {
                    memcpy(lib, p, prefix);
                    memcpy(lib + prefix, "/lib", 5);
                    add_tree(lib, prefix + 4);
                    memcpy(lib + prefix, "/lib64", 7);
                    add_tree(lib, prefix + 6);
                }
            }
        }
        p = *e ? e + 1 : e;
    }
}
/* What an interpreter imports from: each python on PATH, asked while the sandbox is still as
 * the image made it (the start runs before any agent command), prints its sys.path; every
 * absolute entry becomes a tree, present or not (a zip named there that does not exist yet).
 * Interpreters (python, python3, python3.N in each PATH dir; at most 8) are told apart by
 * (dev, inode), so python3 and python3.12 run once; each gets 5 s and 64 KiB, and the key is
 * not in its environment. */
#define PY_CODE "import sys\nfor p in sys.path: print(p)"
static void ask_python(const char *exe) {
    int fds[2];
    if (sc2(SYS_pipe2, fds, O_CLOEXEC) < 0) return;
    long pid = sc5(SYS_clone, SIGCHLD, 0, 0, 0, 0);
    if (pid == 0) {
        sc3(SYS_dup3, fds[1], 1, 0);
        long nul = sc4(SYS_openat, AT_FDCWD, "/dev/null", O_RDWR, 0);
        if (nul >= 0) sc3(SYS_dup3, nul, 0, 0), sc3(SYS_dup3, nul, 2, 0);
        static char *env[256];
        int k = 0;
        for (char **e = ENVP; e && *e && k < 255; e++)
            if (!starts(*e, KEY_VAR)) env[k++] = *e;
        env[k] = NULL;
        char *av[] = {(char *)exe, "-c", PY_CODE, NULL};
        sc3(SYS_execve, exe, av, env);
        die_exit(127);
    }
    xclose(fds[1]);
    if (pid < 0) {
        xclose(fds[0]);
        return;
    }
    static char out[1 << 16];
    size_t n = 0;
    struct {
        int fd;
        short events, revents;
    } pfd = {fds[0], 1 /* POLLIN */, 0};
    struct {
        i64 sec, nsec;
    } limit = {5, 0};
    while (n < sizeof out - 1) {
        long r = sc5(SYS_ppoll, &pfd, 1, &limit, 0, 8);
        if (r == -EINTR) continue;
        if (r <= 0) break; /* out of time (ppoll counted down what it waited) */
        r = sc3(SYS_read, fds[0], out + n, sizeof out - 1 - n);
        if (r == -EINTR) continue;
        if (r <= 0) break;
        n += (size_t)r;
    }
    xclose(fds[0]);
    sc2(SYS_kill, pid, SIGKILL);
    int status;
    sc4(SYS_wait4, pid, &status, 0, 0);
    for (size_t i = 0; i < n;) {
        size_t e = i;
        while (e < n && out[e] != '\n') e++;
        if (e > i && out[i] == '/') add_tree(out + i, e - i);
        i = e + 1;
    }
}
/* python, python3 and python3.N: the names a verifier runs an interpreter by. */
static int python_name(const char *b) {
    if (seq(b, "python") || seq(b, "python3")) return 1;
    if (!starts(b, "python3.") || !b[8]) return 0;
    for (const char *c = b + 8; *c; c++)
        if (*c < '0' || *c > '9') return 0;
    return 1;
}
static void add_python_paths(void) {
    u64 seen[8][2];
    int nseen = 0;
    const char *p = getenv_of(ENVP, "PATH");
    if (!p) p = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
    static u8 dents[1 << 15];
    while (*p) {
        const char *e = p;
        while (*e && *e != ':') e++;
        size_t k = (size_t)(e - p);
        char exe[512];
        long fd = -1;
        if (k && p[0] == '/' && k < 400) {
            memcpy(exe, p, k);
            exe[k] = 0;
            fd = xopen(exe, O_RDONLY | O_DIRECTORY);
        }
        for (long r; fd >= 0 && (r = sc3(SYS_getdents64, fd, dents, sizeof dents)) > 0;) {
            for (long off = 0; off < r;) {
                const char *name = (const char *)dents + off + 19; /* d_ino, d_off, d_reclen, d_type */
                u16 reclen;
                memcpy(&reclen, dents + off + 16, 2);
                off += reclen;
                if (!python_name(name) || nseen >= 8) continue;
                exe[k] = '/';
                memcpy(exe + k + 1, name, slen(name) + 1);
                struct stx st;
                if (sc5(SYS_statx, AT_FDCWD, exe, 0, STATX_BASIC, &st) < 0) continue; /* follows links */
                if ((st.mode & S_IFMT) != S_IFREG || !(st.mode & 0111)) continue;
                u64 dev = ((u64)st.dev_major << 32) | st.dev_minor;
                int dup = 0;
                for (int i = 0; i < nseen; i++) dup |= seen[i][0] == dev && seen[i][1] == st.ino;
                if (dup) continue;
                seen[nseen][0] = dev, seen[nseen++][1] = st.ino;
                ask_python(exe);
            }
        }
        xclose(fd);
        p = *e ? e + 1 : e;
    }
}
static void setup_trees(void) {
    static const char *fixed[] = {"/root/.local/bin", "/root/.local/lib", "/lib",          "/lib64",
                                  "/usr/lib",         "/usr/lib64",       "/usr/local/lib", "/usr/local/lib64",
                                  "/etc/ld.so.conf.d", NULL};
    NTREES = 0;
    for (int i = 0; fixed[i]; i++) add_tree(fixed[i], slen(fixed[i]));
    const char *path = getenv_of(ENVP, "PATH");
    add_list(path ? path : "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", 1);
    add_list(getenv_of(ENVP, "PYTHONPATH"), 0);
    add_python_paths();
}
