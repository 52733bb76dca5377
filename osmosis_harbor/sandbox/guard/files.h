/* Files read and hashed without following links or blocking on FIFOs.
 * Part of guard.c's single translation unit. */

/* ── files ────────────────────────────────────────────────────────────────────────────── */

struct stx {
    u32 mask, blksize;
    u64 attributes;
    u32 nlink, uid, gid;
    u16 mode, spare0;
    u64 ino, size, blocks, attributes_mask;
    struct {
        i64 sec;
        u32 nsec;
        int reserved;
    } atime, btime, ctime, mtime;
    u32 rdev_major, rdev_minor, dev_major, dev_minor;
    u64 spare[14];
};
static long lstatx(int dirfd, const char *path, struct stx *st) {
    return sc5(SYS_statx, dirfd, path, AT_SYMLINK_NOFOLLOW, STATX_BASIC, st);
}
static long xopen(const char *path, int flags) { return sc4(SYS_openat, AT_FDCWD, path, flags | O_CLOEXEC, 0); }
static void xclose(long fd) {
    if (fd >= 0) sc1(SYS_close, fd);
}
/* The whole of a small file (procfs files report size 0: read until EOF), NUL-terminated. */
static char *read_small(const char *path, size_t limit, size_t *len) {
    long fd = xopen(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) return NULL;
    char *p = alloc(limit + 1);
    size_t n = 0;
    while (n < limit) {
        long r = sc3(SYS_read, fd, p + n, limit - n);
        if (r == -EINTR) continue;
        if (r <= 0) break;
        n += (size_t)r;
    }
    xclose(fd);
    p[n] = 0;
    if (len) *len = n;
    return p;
}
static int write_all(long fd, const void *d, size_t n) {
    const u8 *p = d;
    while (n) {
        long w = sc3(SYS_write, fd, p, n);
        if (w == -EINTR) continue;
        if (w <= 0) return -1;
        p += w, n -= (size_t)w;
    }
    return 0;
}
/* SHA-256 of a regular file, never following a link nor blocking on a FIFO. 0 on success. */
static int hash_file(const char *path, u8 out[32]) {
    long fd = xopen(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) return -1;
    struct stx st;
    if (sc5(SYS_statx, fd, "", AT_EMPTY_PATH, STATX_BASIC, &st) < 0 || (st.mode & S_IFMT) != S_IFREG) {
        xclose(fd);
        return -1;
    }
    struct sha s;
    sha_init(&s);
    static u8 chunk[1 << 16];
    for (;;) {
        long r = sc3(SYS_read, fd, chunk, sizeof chunk);
        if (r == -EINTR) continue;
        if (r < 0) {
            xclose(fd);
            return -1;
        }
        if (r == 0) break;
        sha_update(&s, chunk, (size_t)r);
    }
    xclose(fd);
    sha_final(&s, out);
    return 0;
}
/* Whether a (small, regular) file contains ``needle``: a config file's section marker. */
static int file_contains(const char *path, const char *needle) {
    u8 *m = mark();
    size_t n = 0;
    char *text = read_small(path, 1 << 20, &n);
    int found = 0;
    if (text) {
        size_t k = slen(needle);
        for (size_t i = 0; i + k <= n && !found; i++) found = !memcmp(text + i, needle, k);
    }
    release(m);
    return found;
}
