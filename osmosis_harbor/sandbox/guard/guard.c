/*
 * osmosis-guard: the verifier guard's in-sandbox half (osmosis_harbor/sandbox/guard/).
 *
 * Why a libc-free static program: inside a sandbox where a root workflow ran, every binary on
 * the disk (the loader and libc included) may have been replaced. This one depends on nothing of
 * the sandbox: it makes system calls only. It is started once while the sandbox is pristine and
 * re-executes itself from a sealed memfd, so /proc/<daemon>/exe is an image no process can alter.
 *
 * Modes (argv[1]):
 *   start  --id ID [--workdir W]...   env OSMOSIS_GUARD_KEY=<64 hex>
 *          forks the daemon (holding the key in its environment), records the manifest of the
 *          verifier's toolchain, prints "osmosis-guard started pid=<daemon> marker=<cap>".
 *   daemon <readyfd>                  (internal) waits forever, every catchable signal ignored.
 *   drop   -- ARGV...                 drops the marker capability from the bounding, permitted,
 *          effective and inheritable sets (ambient cleared), then execs ARGV: every process the
 *          agent ever starts carries the mark, and a marked process may not ptrace, nor read the
 *          environment, memory, fds or exe of, an unmarked one (the kernel's capability check).
 *   record --daemon D --id ID [--workdir W]...   records the manifest again (a later step).
 *   check  --daemon D --nonce N --id ID [--workdir W]... [--keep-ports P,P | --keep-listening]
 *          ends every marked process (but kept services and their descendants), empties
 *          /logs/verifier, compares the toolchain with the manifest, and prints a report
 *          authenticated with HMAC-SHA256 under the daemon's key.
 *   probe  prints what the host needs to know about this sandbox (caps, marker, arch, parent).
 *
 * Build: cc -static -nostdlib -ffreestanding -fno-stack-protector -fno-pic -no-pie -Os
 */

typedef unsigned long size_t;
typedef long ssize_t;
typedef unsigned long long u64;
typedef long long i64;
typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;

#define NULL ((void *)0)

/* ── system calls ─────────────────────────────────────────────────────────────────────── */

#if defined(__x86_64__)
#define ARCH_NAME "x86_64"
enum {
    SYS_read = 0, SYS_write = 1, SYS_close = 3, SYS_mmap = 9, SYS_munmap = 11, SYS_rt_sigaction = 13,
    SYS_getpid = 39, SYS_clone = 56, SYS_execve = 59, SYS_kill = 62, SYS_fcntl = 72, SYS_getppid = 110,
    SYS_setsid = 112, SYS_capget = 125, SYS_capset = 126, SYS_prctl = 157, SYS_clock_nanosleep = 230,
    SYS_exit_group = 231, SYS_openat = 257, SYS_mkdirat = 258, SYS_unlinkat = 263, SYS_readlinkat = 267,
    SYS_fchmodat = 268, SYS_ppoll = 271, SYS_dup3 = 292, SYS_pipe2 = 293, SYS_prlimit64 = 302,
    SYS_renameat2 = 316, SYS_memfd_create = 319, SYS_execveat = 322, SYS_statx = 332,
    SYS_pidfd_send_signal = 424, SYS_pidfd_open = 434, SYS_getdents64 = 217, SYS_fchmod = 91, SYS_lseek = 8, SYS_chdir = 80,
};
static long sc6(long n, long a, long b, long c, long d, long e, long f) {
    long ret;
    register long r10 __asm__("r10") = d;
    register long r8 __asm__("r8") = e;
    register long r9 __asm__("r9") = f;
    __asm__ volatile("syscall" : "=a"(ret) : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
                     : "rcx", "r11", "memory");
    return ret;
}
__asm__(".text\n.global _start\n_start:\n xor %rbp,%rbp\n mov %rsp,%rdi\n and $-16,%rsp\n call cmain\n hlt\n");
#elif defined(__aarch64__)
#define ARCH_NAME "aarch64"
enum {
    SYS_read = 63, SYS_write = 64, SYS_close = 57, SYS_mmap = 222, SYS_munmap = 215, SYS_rt_sigaction = 134,
    SYS_getpid = 172, SYS_clone = 220, SYS_execve = 221, SYS_kill = 129, SYS_fcntl = 25, SYS_getppid = 173,
    SYS_setsid = 157, SYS_capget = 90, SYS_capset = 91, SYS_prctl = 167, SYS_clock_nanosleep = 115,
    SYS_exit_group = 94, SYS_openat = 56, SYS_mkdirat = 34, SYS_unlinkat = 35, SYS_readlinkat = 78,
    SYS_fchmodat = 53, SYS_ppoll = 73, SYS_dup3 = 24, SYS_pipe2 = 59, SYS_prlimit64 = 261,
    SYS_renameat2 = 276, SYS_memfd_create = 279, SYS_execveat = 281, SYS_statx = 291,
    SYS_pidfd_send_signal = 424, SYS_pidfd_open = 434, SYS_getdents64 = 61, SYS_fchmod = 52, SYS_lseek = 62, SYS_chdir = 49,
};
static long sc6(long n, long a, long b, long c, long d, long e, long f) {
    register long x8 __asm__("x8") = n;
    register long x0 __asm__("x0") = a;
    register long x1 __asm__("x1") = b;
    register long x2 __asm__("x2") = c;
    register long x3 __asm__("x3") = d;
    register long x4 __asm__("x4") = e;
    register long x5 __asm__("x5") = f;
    __asm__ volatile("svc 0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4), "r"(x5) : "memory");
    return x0;
}
__asm__(".text\n.global _start\n_start:\n mov x29, #0\n mov x30, #0\n mov x0, sp\n and sp, x0, #-16\n bl cmain\n b .\n");
#else
#error "osmosis-guard supports x86_64 and aarch64"
#endif

#define sc0(n) sc6(n, 0, 0, 0, 0, 0, 0)
#define sc1(n, a) sc6(n, (long)(a), 0, 0, 0, 0, 0)
#define sc2(n, a, b) sc6(n, (long)(a), (long)(b), 0, 0, 0, 0)
#define sc3(n, a, b, c) sc6(n, (long)(a), (long)(b), (long)(c), 0, 0, 0)
#define sc4(n, a, b, c, d) sc6(n, (long)(a), (long)(b), (long)(c), (long)(d), 0, 0)
#define sc5(n, a, b, c, d, e) sc6(n, (long)(a), (long)(b), (long)(c), (long)(d), (long)(e), 0)

enum {
    AT_FDCWD = -100, AT_SYMLINK_NOFOLLOW = 0x100, AT_REMOVEDIR = 0x200, AT_EMPTY_PATH = 0x1000,
    O_RDONLY = 0, O_WRONLY = 1, O_RDWR = 2, O_CREAT = 0100, O_EXCL = 0200, O_NOCTTY = 0400, O_TRUNC = 01000,
    O_NONBLOCK = 04000, O_CLOEXEC = 02000000,
#if defined(__aarch64__)
    O_DIRECTORY = 040000, O_NOFOLLOW = 0100000,
#else
    O_DIRECTORY = 0200000, O_NOFOLLOW = 0400000,
#endif
    S_IFMT = 0170000, S_IFDIR = 0040000, S_IFREG = 0100000, S_IFLNK = 0120000,
    ENOENT = 2, EINTR = 4, EACCES = 13, EEXIST = 17, ENOTDIR = 20, EINVAL = 22, ESRCH = 3, ENOSYS = 38,
    SIGKILL = 9, SIGSTOP = 19, SIGCHLD = 17,
    PR_SET_DUMPABLE = 4, PR_CAPBSET_READ = 23, PR_CAPBSET_DROP = 24, PR_CAP_AMBIENT = 47,
    PR_CAP_AMBIENT_CLEAR_ALL = 4, MFD_CLOEXEC = 1, MFD_ALLOW_SEALING = 2, MFD_EXEC = 0x10,
    F_ADD_SEALS = 1033, F_SEAL_SEAL = 1, F_SEAL_SHRINK = 2, F_SEAL_GROW = 4, F_SEAL_WRITE = 8,
    PROT_READ = 1, PROT_WRITE = 2, MAP_PRIVATE = 2, MAP_ANONYMOUS = 0x20, MAP_NORESERVE = 0x4000,
    RLIMIT_CORE = 4, STATX_BASIC = 0x7ff,
};

__attribute__((noreturn)) static void die_exit(int code) {
    for (;;) sc1(SYS_exit_group, code);
}

/* ── memory and strings (the compiler may call these) ─────────────────────────────────────── */

void *memcpy(void *d, const void *s, size_t n) {
    u8 *a = d;
    const u8 *b = s;
    while (n--) *a++ = *b++;
    return d;
}
void *memmove(void *d, const void *s, size_t n) {
    u8 *a = d;
    const u8 *b = s;
    if (a < b) {
        while (n--) *a++ = *b++;
    } else {
        while (n--) a[n] = b[n];
    }
    return d;
}
void *memset(void *d, int c, size_t n) {
    u8 *a = d;
    while (n--) *a++ = (u8)c;
    return d;
}
int memcmp(const void *x, const void *y, size_t n) {
    const u8 *a = x, *b = y;
    for (; n; n--, a++, b++)
        if (*a != *b) return *a - *b;
    return 0;
}
static size_t slen(const char *s) {
    size_t n = 0;
    while (s[n]) n++;
    return n;
}
static int seq(const char *a, const char *b) {
    while (*a && *a == *b) a++, b++;
    return *a == *b;
}
static int starts(const char *s, const char *p) {
    while (*p)
        if (*s++ != *p++) return 0;
    return 1;
}
static int ends(const char *s, size_t n, const char *x) {
    size_t m = slen(x);
    return n >= m && !memcmp(s + n - m, x, m);
}
static const char *sstr(const char *h, const char *n) {
    size_t k = slen(n);
    for (; *h; h++)
        if (!memcmp(h, n, k)) return h;
    return NULL;
}
static const char *basename_of(const char *p, size_t n) {
    size_t i = n;
    while (i > 0 && p[i - 1] != '/') i--;
    return p + i;
}
static u64 parse_u64(const char *s, int *ok) {
    u64 v = 0;
    *ok = *s != 0;
    for (; *s; s++) {
        if (*s < '0' || *s > '9') {
            *ok = 0;
            return 0;
        }
        v = v * 10 + (u64)(*s - '0');
    }
    return v;
}
static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* ── an arena (one reservation, stack-like marks) ─────────────────────────────────────── */

static u8 *arena_base, *arena_top, *arena_end;
#define ARENA_BYTES (1UL << 31) /* reserved, not committed: pages count when touched */

static void *xmap(size_t n) {
    long p = sc6(SYS_mmap, 0, (long)n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p < 0 && p > -4096) return NULL;
    return (void *)p;
}
static void fatal(const char *msg);
static void *alloc(size_t n) {
    if (!arena_base) {
        arena_base = arena_top = xmap(ARENA_BYTES);
        if (!arena_base) fatal("cannot reserve memory");
        arena_end = arena_base + ARENA_BYTES;
    }
    n = (n + 15) & ~15UL;
    if ((size_t)(arena_end - arena_top) < n) fatal("out of memory");
    void *p = arena_top;
    arena_top += n;
    return p;
}
static u8 *mark(void) {
    if (!arena_base) alloc(0);
    return arena_top;
}
static void release(u8 *m) { arena_top = m; }

/* a growable buffer in its own mapping (the manifest, a report) */
struct buf {
    u8 *p;
    size_t n, cap;
};
static void buf_put(struct buf *b, const void *d, size_t n) {
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 1 << 20;
        while (cap < b->n + n) cap *= 2;
        u8 *p = xmap(cap);
        if (!p) fatal("out of memory");
        if (b->p) {
            memcpy(p, b->p, b->n);
            sc2(SYS_munmap, b->p, b->cap);
        }
        b->p = p, b->cap = cap;
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}

/* ── SHA-256 and HMAC ─────────────────────────────────────────────────────────────────── */

struct sha {
    u32 h[8];
    u8 blk[64];
    u64 len;
    u32 used;
};
static const u32 K256[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};
#define ROR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))
static void sha_block(struct sha *s, const u8 *p) {
    u32 w[64], a, b, c, d, e, f, g, h;
    for (int i = 0; i < 16; i++)
        w[i] = (u32)p[4 * i] << 24 | (u32)p[4 * i + 1] << 16 | (u32)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        u32 s0 = ROR(w[i - 15], 7) ^ ROR(w[i - 15], 18) ^ (w[i - 15] >> 3);
        u32 s1 = ROR(w[i - 2], 17) ^ ROR(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    a = s->h[0], b = s->h[1], c = s->h[2], d = s->h[3], e = s->h[4], f = s->h[5], g = s->h[6], h = s->h[7];
    for (int i = 0; i < 64; i++) {
        u32 t1 = h + (ROR(e, 6) ^ ROR(e, 11) ^ ROR(e, 25)) + ((e & f) ^ (~e & g)) + K256[i] + w[i];
        u32 t2 = (ROR(a, 2) ^ ROR(a, 13) ^ ROR(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        h = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
    }
    s->h[0] += a, s->h[1] += b, s->h[2] += c, s->h[3] += d, s->h[4] += e, s->h[5] += f, s->h[6] += g, s->h[7] += h;
}
static void sha_init(struct sha *s) {
    static const u32 iv[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                              0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(s->h, iv, sizeof iv);
    s->len = 0, s->used = 0;
}
static void sha_update(struct sha *s, const void *data, size_t n) {
    const u8 *p = data;
    s->len += n;
    while (n) {
        u32 take = 64 - s->used;
        if (take > n) take = (u32)n;
        memcpy(s->blk + s->used, p, take);
        s->used += take, p += take, n -= take;
        if (s->used == 64) sha_block(s, s->blk), s->used = 0;
    }
}
static void sha_final(struct sha *s, u8 out[32]) {
    u64 bits = s->len * 8;
    u8 pad = 0x80, zero = 0, lenb[8];
    sha_update(s, &pad, 1);
    while (s->used != 56) sha_update(s, &zero, 1);
    for (int i = 0; i < 8; i++) lenb[i] = (u8)(bits >> (56 - 8 * i));
    sha_update(s, lenb, 8);
    for (int i = 0; i < 8; i++)
        out[4 * i] = (u8)(s->h[i] >> 24), out[4 * i + 1] = (u8)(s->h[i] >> 16), out[4 * i + 2] = (u8)(s->h[i] >> 8),
        out[4 * i + 3] = (u8)s->h[i];
}
struct hmac {
    struct sha inner;
    u8 okey[64];
};
static void hmac_init(struct hmac *m, const u8 key[32]) {
    u8 ik[64];
    memset(ik, 0x36, 64), memset(m->okey, 0x5c, 64);
    for (int i = 0; i < 32; i++) ik[i] ^= key[i], m->okey[i] ^= key[i];
    sha_init(&m->inner);
    sha_update(&m->inner, ik, 64);
}
static void hmac_final(struct hmac *m, u8 out[32]) {
    u8 ih[32];
    struct sha o;
    sha_final(&m->inner, ih);
    sha_init(&o);
    sha_update(&o, m->okey, 64);
    sha_update(&o, ih, 32);
    sha_final(&o, out);
}

/* ── output (buffered; a report is authenticated as it is written) ─────────────────────── */

struct out {
    int fd;
    struct hmac *mac;
    u32 n;
    char b[8192];
};
static struct out STDOUT = {1, NULL, 0, {0}}, STDERR = {2, NULL, 0, {0}};
static void out_flush(struct out *o) {
    u32 off = 0;
    while (off < o->n) {
        long w = sc3(SYS_write, o->fd, o->b + off, o->n - off);
        if (w == -EINTR) continue;
        if (w <= 0) break;
        off += (u32)w;
    }
    o->n = 0;
}
static void out_bytes(struct out *o, const void *d, size_t n) {
    if (o->mac) sha_update(&o->mac->inner, d, n);
    const u8 *p = d;
    while (n) {
        u32 room = sizeof o->b - o->n;
        u32 take = n < room ? (u32)n : room;
        memcpy(o->b + o->n, p, take);
        o->n += take, p += take, n -= take;
        if (o->n == sizeof o->b) out_flush(o);
    }
}
static void out_s(struct out *o, const char *s) { out_bytes(o, s, slen(s)); }
static void out_u(struct out *o, u64 v) {
    char t[24];
    int i = 24;
    do t[--i] = (char)('0' + v % 10), v /= 10;
    while (v);
    out_bytes(o, t + i, (size_t)(24 - i));
}
static void out_oct(struct out *o, u32 v) {
    char t[12];
    int i = 12;
    do t[--i] = (char)('0' + (v & 7)), v >>= 3;
    while (v);
    out_bytes(o, t + i, (size_t)(12 - i));
}
static void out_hex(struct out *o, const void *d, size_t n) {
    static const char *digits = "0123456789abcdef";
    const u8 *p = d;
    if (n == 0) {
        out_s(o, "-");
        return;
    }
    for (size_t i = 0; i < n; i++) {
        char two[2] = {digits[p[i] >> 4], digits[p[i] & 15]};
        out_bytes(o, two, 2);
    }
}
static void fatal(const char *msg) {
    out_s(&STDERR, "osmosis-guard: ");
    out_s(&STDERR, msg);
    out_s(&STDERR, "\n");
    out_flush(&STDERR);
    die_exit(82);
}
static void fatal_errno(const char *what, long err) {
    out_s(&STDERR, "osmosis-guard: ");
    out_s(&STDERR, what);
    out_s(&STDERR, " (errno ");
    out_u(&STDERR, (u64)-err);
    out_s(&STDERR, ")\n");
    out_flush(&STDERR);
    die_exit(82);
}

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

/* ── capabilities: the mark ───────────────────────────────────────────────────────────── */

struct cap_header {
    u32 version;
    int pid;
};
struct cap_data {
    u32 effective, permitted, inheritable;
};
#define CAP_V3 0x20080522
#define CAP_SETPCAP 8
/* The capability every agent process loses: the first of these the sandbox's root holds.
 * CAP_MKNOD is first: a workflow never needs to make device nodes. */
static const int MARKERS[] = {27 /* MKNOD */, 29 /* AUDIT_WRITE */, 31 /* SETFCAP */, 18 /* SYS_CHROOT */,
                              10 /* NET_BIND_SERVICE */, CAP_SETPCAP};
static int capget_self(struct cap_data d[2]) {
    struct cap_header h = {CAP_V3, 0};
    return (int)sc2(SYS_capget, &h, d);
}
static int has_cap(const struct cap_data d[2], int cap, int which) {
    u32 word = which == 0 ? d[cap / 32].effective : d[cap / 32].permitted;
    return (word >> (cap % 32)) & 1;
}
/* The marker of this (unmarked) process, or -1 when it holds none of them with CAP_SETPCAP. */
static int choose_marker(void) {
    struct cap_data d[2];
    if (capget_self(d) < 0 || !has_cap(d, CAP_SETPCAP, 0)) return -1;
    for (unsigned i = 0; i < sizeof MARKERS / sizeof *MARKERS; i++) {
        int c = MARKERS[i];
        if (sc2(SYS_prctl, PR_CAPBSET_READ, c) == 1 && has_cap(d, c, 0) && has_cap(d, c, 1)) return c;
    }
    return -1;
}
static void drop_marker(int marker) {
    if (sc2(SYS_prctl, PR_CAPBSET_DROP, marker) < 0) fatal("cannot drop the marker from the bounding set");
    struct cap_header h = {CAP_V3, 0};
    struct cap_data d[2];
    if (sc2(SYS_capget, &h, d) < 0) fatal("capget failed");
    u32 bit = 1u << (marker % 32);
    d[marker / 32].effective &= ~bit, d[marker / 32].permitted &= ~bit, d[marker / 32].inheritable &= ~bit;
    if (sc2(SYS_capset, &h, d) < 0) fatal("capset failed");
    sc5(SYS_prctl, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
    if (sc2(SYS_prctl, PR_CAPBSET_READ, marker) != 0) fatal("the marker is still in the bounding set");
}
/* Bounding set of a process from /proc/<pid>/status, and its state, parent and start. */
struct proc {
    long pid, ppid;
    u64 capbnd, start;
    char state;
    int marked, kept, killed, listening_port;
};

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

typedef void (*visit_fn)(const char *path, size_t n, const struct stx *st, int probe);
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
        visit(path, n + 1 + k, &st, 0);
        if ((st.mode & S_IFMT) == S_IFDIR) walk_dir(path, n + 1 + k, depth + 1, visit);
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
struct rec { /* fixed part of one entry, after its u16 path length and path */
    u32 mode, uid, gid, probe;
    u64 ino, size;
    i64 csec;
    u32 cnsec, pad;
};
static struct buf MANIFEST;
static void record_visit(const char *path, size_t n, const struct stx *st, int probe) {
    u16 len = (u16)n;
    struct rec r = {st->mode, st->uid, st->gid, (u32)probe, st->ino, st->size, st->ctime.sec, st->ctime.nsec, 0};
    buf_put(&MANIFEST, &len, 2);
    buf_put(&MANIFEST, path, n);
    buf_put(&MANIFEST, &r, sizeof r);
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
    while (pos + 2 <= end) {
        u16 len;
        memcpy(&len, b.p + pos, 2);
        if (pos + 2 + len + sizeof(struct rec) > end) return "forged";
        const char *p = (const char *)b.p + pos + 2;
        u64 i = path_hash(p, len) & (TABLE_SLOTS - 1);
        while (TABLE[i].path) i = (i + 1) & (TABLE_SLOTS - 1);
        TABLE[i].path = p, TABLE[i].len = len;
        memcpy(&TABLE[i].r, b.p + pos + 2 + len, sizeof(struct rec));
        pos += 2 + len + sizeof(struct rec);
    }
    return NULL;
}

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
    if (present) report_digest(path, mode);
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
    return NULL;
}
static int differs(const struct rec *r, const struct stx *st) {
    if ((r->mode & S_IFMT) != (u32)(st->mode & S_IFMT)) return 1;
    if (r->mode != st->mode || r->uid != st->uid || r->gid != st->gid) return 1;
    if ((st->mode & S_IFMT) == S_IFDIR) return 0; /* its entries are compared one by one */
    return r->ino != st->ino || r->size != st->size || r->csec != st->ctime.sec || r->cnsec != st->ctime.nsec;
}
static void check_visit(const char *path, size_t n, const struct stx *st, int probe) {
    struct entry *e = lookup(path, n);
    if (e) e->seen = 1;
    if (e && !differs(&e->r, st)) return;
    if (!probe && cache_root(path, SCRATCH)) {
        note_setaside(path);
        return;
    }
    if (is_pycache_pyc(path, n) && (st->mode & S_IFMT) == S_IFREG) {
        cure(path, n);
        return;
    }
    if (e) {
        finding("changed", probe ? pytest_rule(path, basename_of(path, n)) : NULL, path, n, st->mode, 1);
        return;
    }
    const char *rule = probe ? pytest_rule(path, basename_of(path, n)) : added_rule(path, n, st);
    if (rule) finding("added", rule, path, n, st->mode, 1);
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

/* ── processes ────────────────────────────────────────────────────────────────────────── */

#define MAX_PROCS 8192
static struct proc PROCS[MAX_PROCS];
static int NPROCS;
static long SELF, DAEMON;

static int read_proc(long pid, struct proc *p) {
    char path[64], *t;
    u8 *m = mark();
    memcpy(path, "/proc/", 6);
    int k = 6;
    char num[24];
    int j = 24;
    long v = pid;
    do num[--j] = (char)('0' + v % 10), v /= 10;
    while (v);
    memcpy(path + k, num + j, (size_t)(24 - j));
    k += 24 - j;
    memcpy(path + k, "/stat", 6);
    size_t n = 0;
    t = read_small(path, 4096, &n);
    if (!t || n == 0) {
        release(m);
        return -1;
    }
    /* "pid (comm) state ppid ...": counted from the state, field 21 here is proc(5)'s 22, starttime */
    size_t r = n;
    while (r > 0 && t[r - 1] != ')') r--;
    if (r == 0) {
        release(m);
        return -1;
    }
    int field = 2;
    u64 cur = 0;
    p->pid = pid;
    for (size_t i = r + 1; i <= n; i++) {
        if (i == n || t[i] == ' ') {
            if (field == 3) p->ppid = (long)cur;
            if (field == 21) p->start = cur;
            field++;
            cur = 0;
            continue;
        }
        if (t[i] >= '0' && t[i] <= '9') cur = cur * 10 + (u64)(t[i] - '0');
    }
    p->state = t[r + 1];
    memcpy(path + k, "/status", 8);
    t = read_small(path, 8192, &n);
    p->capbnd = ~0ULL;
    if (t) {
        char *c = (char *)sstr(t, "\nCapBnd:");
        if (c) {
            c += 8;
            while (*c == ' ' || *c == '\t') c++;
            u64 x = 0;
            for (; hexval(*c) >= 0; c++) x = x << 4 | (u64)hexval(*c);
            p->capbnd = x;
        }
    }
    release(m);
    return 0;
}
static void pid_path(char *out, long pid, const char *tail) {
    char num[24];
    int j = 24;
    long v = pid;
    do num[--j] = (char)('0' + v % 10), v /= 10;
    while (v);
    memcpy(out, "/proc/", 6);
    memcpy(out + 6, num + j, (size_t)(24 - j));
    memcpy(out + 6 + 24 - j, tail, slen(tail) + 1);
}
static int MARKER;
static void scan_procs(void) {
    NPROCS = 0;
    long fd = xopen("/proc", O_RDONLY | O_DIRECTORY);
    if (fd < 0) fatal("cannot list /proc");
    static u8 dents[1 << 16];
    for (;;) {
        long r = sc3(SYS_getdents64, fd, dents, sizeof dents);
        if (r <= 0) break;
        for (long off = 0; off < r;) {
            struct linux_dirent64 *d = (struct linux_dirent64 *)(dents + off);
            off += d->reclen;
            int ok;
            long pid = (long)parse_u64(d->name, &ok);
            if (!ok || pid == SELF || pid == DAEMON || pid == 1 || NPROCS >= MAX_PROCS) continue;
            struct proc p;
            memset(&p, 0, sizeof p);
            if (read_proc(pid, &p) < 0) continue;
            p.marked = !((p.capbnd >> MARKER) & 1);
            if (!p.marked || p.state == 'Z' || p.state == 'X') continue;
            PROCS[NPROCS++] = p;
        }
    }
    xclose(fd);
}
/* listening TCP sockets: inode -> port, from /proc/net/tcp{,6} */
static u64 LISTEN_INODES[4096];
static u32 LISTEN_PORTS[4096];
static int NLISTEN;
static void scan_listening(void) {
    NLISTEN = 0;
    const char *files[] = {"/proc/net/tcp", "/proc/net/tcp6"};
    for (int f = 0; f < 2; f++) {
        u8 *m = mark();
        size_t n = 0;
        char *t = read_small(files[f], 8 << 20, &n);
        for (size_t i = 0; t && i < n;) {
            size_t e = i;
            while (e < n && t[e] != '\n') e++;
            /* fields: sl local rem st txq:rxq tr:when retrnsmt uid timeout inode */
            int field = 0;
            size_t s = i;
            u32 port = 0;
            int listen = 0;
            u64 inode = 0;
            for (size_t j = i; j <= e; j++) {
                if (j == e || t[j] == ' ') {
                    if (j > s) {
                        if (field == 1) {
                            size_t c = s;
                            while (c < j && t[c] != ':') c++;
                            for (c++; c < j; c++) port = port << 4 | (u32)hexval(t[c]);
                        } else if (field == 3) listen = (j - s == 2 && t[s] == '0' && t[s + 1] == 'A');
                        else if (field == 9)
                            for (size_t c = s; c < j; c++) inode = inode * 10 + (u64)(t[c] - '0');
                        field++;
                    }
                    s = j + 1;
                }
            }
            if (listen && inode && NLISTEN < 4096) LISTEN_INODES[NLISTEN] = inode, LISTEN_PORTS[NLISTEN++] = port;
            i = e + 1;
        }
        release(m);
    }
}
/* The first listening port among a process's fds (0: none). */
static u32 listening_port_of(long pid) {
    char dir[64];
    pid_path(dir, pid, "/fd");
    long fd = xopen(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0) return 0;
    static u8 dents[1 << 14];
    u32 found = 0;
    for (;;) {
        long r = sc3(SYS_getdents64, fd, dents, sizeof dents);
        if (r <= 0) break;
        for (long off = 0; off < r && !found;) {
            struct linux_dirent64 *d = (struct linux_dirent64 *)(dents + off);
            off += d->reclen;
            char link[64];
            long k = sc4(SYS_readlinkat, fd, d->name, link, sizeof link - 1);
            if (k <= 8 || memcmp(link, "socket:[", 8)) continue;
            u64 inode = 0;
            for (long c = 8; c < k && link[c] != ']'; c++) inode = inode * 10 + (u64)(link[c] - '0');
            for (int i = 0; i < NLISTEN; i++)
                if (LISTEN_INODES[i] == inode) found = LISTEN_PORTS[i];
        }
    }
    xclose(fd);
    return found;
}
static int port_allowed(const struct opts *o, u32 port) {
    if (o->keep_listening) return port != 0;
    if (!o->ports || !port) return 0;
    for (const char *p = o->ports; *p;) {
        u32 v = 0;
        while (*p >= '0' && *p <= '9') v = v * 10 + (u32)(*p++ - '0');
        if (v == port) return 1;
        while (*p && (*p < '0' || *p > '9')) p++;
    }
    return 0;
}
static void out_proc_file(long pid, const char *tail, int nul_to_space) {
    char path[64], t[512];
    pid_path(path, pid, tail);
    long k;
    if (seq(tail, "/exe")) {
        k = sc4(SYS_readlinkat, AT_FDCWD, path, t, sizeof t);
    } else {
        long fd = xopen(path, O_RDONLY);
        k = fd < 0 ? -1 : sc3(SYS_read, fd, t, sizeof t);
        xclose(fd);
    }
    if (k <= 0) {
        out_s(R, "-");
        return;
    }
    if (nul_to_space)
        for (long i = 0; i < k; i++)
            if (!t[i]) t[i] = ' ';
    while (k > 0 && t[k - 1] == ' ') k--;
    out_hex(R, t, (size_t)k);
}
static int signal_proc(const struct proc *p, int sig) {
    long pfd = sc2(SYS_pidfd_open, p->pid, 0);
    struct proc again;
    memset(&again, 0, sizeof again);
    if (read_proc(p->pid, &again) < 0 || again.start != p->start) { /* exited, or its pid was reused */
        xclose(pfd);
        return -1;
    }
    long r = pfd >= 0 ? sc4(SYS_pidfd_send_signal, pfd, sig, 0, 0) : sc2(SYS_kill, p->pid, sig);
    xclose(pfd);
    return (int)r;
}
static void sleep_ms(long ms) {
    struct {
        i64 s, ns;
    } ts = {ms / 1000, (ms % 1000) * 1000000};
    sc4(SYS_clock_nanosleep, 1 /* CLOCK_MONOTONIC */, 0, &ts, 0);
}
/* Kept: marked processes listening on an allowed port, and their descendants. */
static void mark_kept(const struct opts *o) {
    for (int i = 0; i < NPROCS; i++) {
        PROCS[i].listening_port = (int)listening_port_of(PROCS[i].pid);
        PROCS[i].kept = port_allowed(o, (u32)PROCS[i].listening_port);
    }
    for (int changed = 1; changed;) {
        changed = 0;
        for (int i = 0; i < NPROCS; i++) {
            if (PROCS[i].kept) continue;
            for (int j = 0; j < NPROCS; j++)
                if (PROCS[j].kept && PROCS[j].pid == PROCS[i].ppid) {
                    PROCS[i].kept = 1, changed = 1;
                    break;
                }
        }
    }
}
static long KILLED[MAX_PROCS];
static int NKILLED;
static void end_processes(const struct opts *o) {
    int first = 1;
    for (int round = 0; round < 400; round++) {
        scan_procs();
        scan_listening();
        mark_kept(o);
        int victims = 0;
        for (int i = 0; i < NPROCS; i++) {
            struct proc *p = &PROCS[i];
            if (first && p->listening_port) {
                out_s(R, "listening ");
                out_u(R, (u64)p->listening_port);
                out_s(R, " ");
                out_u(R, (u64)p->pid);
                out_s(R, "\n");
            }
            if (p->kept) {
                if (first) {
                    out_s(R, "kept ");
                    out_u(R, (u64)p->pid);
                    out_s(R, " ");
                    if (p->listening_port) out_u(R, (u64)p->listening_port);
                    else out_s(R, "-");
                    out_s(R, " ");
                    out_proc_file(p->pid, "/exe", 0);
                    out_s(R, "\n");
                }
                continue;
            }
            victims++;
            int seen = 0;
            for (int k = 0; k < NKILLED; k++) seen |= KILLED[k] == p->pid;
            if (!seen && NKILLED < MAX_PROCS) {
                signal_proc(p, SIGSTOP); /* frozen first: it forks and writes no more */
                KILLED[NKILLED++] = p->pid;
                if (NKILLED <= MAX_RECORDS) {
                    out_s(R, "killed ");
                    out_u(R, (u64)p->pid);
                    out_s(R, " ");
                    out_proc_file(p->pid, "/exe", 0);
                    out_s(R, " ");
                    out_proc_file(p->pid, "/cmdline", 1);
                    out_s(R, "\n");
                }
            }
        }
        for (int i = 0; i < NPROCS; i++)
            if (!PROCS[i].kept) signal_proc(&PROCS[i], SIGKILL);
        first = 0;
        if (!victims) return;
        sleep_ms(round < 20 ? 1 : 25);
    }
    for (int i = 0; i < NPROCS; i++)
        if (!PROCS[i].kept) {
            out_s(R, "unkillable ");
            out_u(R, (u64)PROCS[i].pid);
            out_s(R, "\n");
        }
}

/* ── /logs/verifier: emptied, as Harbor's own multi-step reset does ───────────────────── */

static void remove_tree_at(long dirfd, int depth) {
    static u8 dents[MAX_DEPTH + 1][4096];
    if (depth > MAX_DEPTH) return;
    for (int pass = 0; pass < 64; pass++) {
        sc3(SYS_lseek, dirfd, 0, 0);
        int removed = 0, any = 0;
        for (;;) {
            long r = sc3(SYS_getdents64, dirfd, dents[depth], sizeof dents[depth]);
            if (r <= 0) break;
            for (long off = 0; off < r;) {
                struct linux_dirent64 *d = (struct linux_dirent64 *)(dents[depth] + off);
                off += d->reclen;
                if (seq(d->name, ".") || seq(d->name, "..")) continue;
                any = 1;
                if (sc3(SYS_unlinkat, dirfd, d->name, 0) == 0) {
                    removed = 1;
                    continue;
                }
                long sub = sc4(SYS_openat, dirfd, d->name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC, 0);
                if (sub >= 0) {
                    remove_tree_at(sub, depth + 1);
                    xclose(sub);
                }
                removed |= sc3(SYS_unlinkat, dirfd, d->name, AT_REMOVEDIR) == 0;
            }
        }
        if (!any || !removed) return;
    }
}
/* Harbor reads the reward from /logs/verifier: it starts empty, a real directory of root's. */
static const char *reset_verifier_logs(void) {
    struct stx st;
    if (lstatx(AT_FDCWD, "/logs", &st) < 0) sc3(SYS_mkdirat, AT_FDCWD, "/logs", 0755);
    else if ((st.mode & S_IFMT) != S_IFDIR) return "replaced-logs";
    long logs = xopen("/logs", O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
    if (logs < 0) return "replaced-logs";
    const char *state = "ok";
    if (lstatx((int)logs, "verifier", &st) == 0 && (st.mode & S_IFMT) != S_IFDIR) {
        sc3(SYS_unlinkat, logs, "verifier", 0);
        state = "replaced-verifier";
    }
    sc3(SYS_mkdirat, logs, "verifier", 0777);
    long v = sc4(SYS_openat, logs, "verifier", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC, 0);
    if (v < 0) {
        xclose(logs);
        return "replaced-verifier";
    }
    remove_tree_at(v, 0);
    sc2(SYS_fchmod, v, 0777);
    xclose(v);
    xclose(logs);
    return state;
}

/* ── modes ────────────────────────────────────────────────────────────────────────────── */

static void out_num_line(struct out *o, const char *label, u64 v) {
    out_s(o, label);
    out_u(o, v);
    out_s(o, "\n");
}
static void no_marker(void) {
    out_s(&STDERR, "osmosis-guard: the sandbox's root holds no capability to mark the agent's processes with "
                   "(it needs CAP_SETPCAP and one of MKNOD, AUDIT_WRITE, SETFCAP, SYS_CHROOT, NET_BIND_SERVICE): "
                   "run the sandbox as root with the runtime's default capabilities\n");
    out_flush(&STDERR);
    die_exit(80);
}
static long xfork(void) { return sc5(SYS_clone, SIGCHLD, 0, 0, 0, 0); }

/* The daemon's image is a sealed memfd copy of this program: nothing can rewrite it later. */
static void become_daemon(long ready, const char *keyhex) {
    sc0(SYS_setsid);
    long nul = sc4(SYS_openat, AT_FDCWD, "/dev/null", O_RDWR, 0);
    if (nul >= 0) {
        for (int fd = 0; fd < 3; fd++)
            if (nul != fd) sc3(SYS_dup3, nul, fd, 0);
        if (nul > 2) xclose(nul);
    }
    long self = xopen("/proc/self/exe", O_RDONLY);
    long mfd = sc2(SYS_memfd_create, "osmosis-guard", MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_EXEC);
    if (mfd == -EINVAL) mfd = sc2(SYS_memfd_create, "osmosis-guard", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (self < 0 || mfd < 0) die_exit(82);
    static u8 chunk[1 << 16];
    for (;;) {
        long r = sc3(SYS_read, self, chunk, sizeof chunk);
        if (r == -EINTR) continue;
        if (r < 0) die_exit(82);
        if (r == 0) break;
        if (write_all(mfd, chunk, (size_t)r) < 0) die_exit(82);
    }
    xclose(self);
    if (sc3(SYS_fcntl, mfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) < 0) die_exit(82);
    if (sc3(SYS_dup3, mfd, 200, O_CLOEXEC) < 0) die_exit(82);
    if (ready != 3 && sc3(SYS_dup3, ready, 3, 0) < 0) die_exit(82);
    for (int fd = 4; fd < 1024; fd++)
        if (fd != 200) sc1(SYS_close, fd);
    static char env[sizeof KEY_VAR + 64];
    memcpy(env, KEY_VAR, sizeof KEY_VAR - 1);
    memcpy(env + sizeof KEY_VAR - 1, keyhex, 64);
    char *av[] = {"osmosis-guard", "daemon", "3", NULL};
    char *ev[] = {env, NULL};
    sc5(SYS_execveat, 200, "", av, ev, AT_EMPTY_PATH);
    die_exit(82);
}
static int mode_start(int argc, char **argv) {
    struct opts o;
    parse_opts(argc, argv, 2, &o);
    u8 key[32];
    const char *hex = getenv_of(ENVP, "OSMOSIS_GUARD_KEY");
    if (parse_key(hex, key) < 0) fatal("OSMOSIS_GUARD_KEY must be 64 hex digits");
    int marker = choose_marker();
    if (marker < 0) no_marker();
    int ready[2];
    if (sc2(SYS_pipe2, ready, 0) < 0) fatal("pipe2 failed");
    long pid = xfork();
    if (pid < 0) fatal_errno("cannot fork the daemon", pid);
    if (pid == 0) {
        xclose(ready[0]);
        become_daemon(ready[1], hex);
    }
    xclose(ready[1]);
    char c = 0;
    long r;
    do r = sc3(SYS_read, ready[0], &c, 1);
    while (r == -EINTR);
    if (r != 1) fatal("the guard daemon did not start");
    xclose(ready[0]);
    record_manifest(&o, key);
    out_s(&STDOUT, "osmosis-guard started pid=");
    out_u(&STDOUT, (u64)pid);
    out_s(&STDOUT, " marker=");
    out_u(&STDOUT, (u64)marker);
    out_s(&STDOUT, " arch=" ARCH_NAME " entries=");
    out_u(&STDOUT, ENTRIES);
    out_s(&STDOUT, "\n");
    out_flush(&STDOUT);
    return 0;
}
__attribute__((noreturn)) static int mode_daemon(int argc, char **argv) {
    struct {
        void *handler;
        unsigned long flags;
        void *restorer;
        u64 mask;
    } ignore = {(void *)1 /* SIG_IGN */, 0, NULL, 0};
    for (int s = 1; s <= 64; s++)
        if (s != SIGKILL && s != SIGSTOP) sc4(SYS_rt_sigaction, s, &ignore, 0, 8);
    u64 zero[2] = {0, 0};
    sc4(SYS_prlimit64, 0, RLIMIT_CORE, zero, 0);
    sc1(SYS_chdir, "/");
    if (argc > 2) {
        int ok;
        long fd = (long)parse_u64(argv[2], &ok);
        if (ok) {
            sc3(SYS_write, fd, "1", 1);
            xclose(fd);
        }
    }
    for (;;) sc5(SYS_ppoll, 0, 0, 0, 0, 8);
}
static int daemon_key(long pid, u8 key[32]) {
    char path[64];
    pid_path(path, pid, "/environ");
    u8 *m = mark();
    size_t n = 0;
    char *t = read_small(path, 1 << 16, &n);
    int found = -1;
    for (size_t i = 0; t && i < n && found < 0;) {
        size_t k = slen(t + i);
        if (starts(t + i, KEY_VAR)) found = parse_key(t + i + sizeof KEY_VAR - 1, key);
        i += k + 1;
    }
    release(m);
    return found;
}
static void run_argv(char **av, char **envp) {
    const char *name = av[0];
    long err = -ENOENT;
    if (sstr(name, "/")) {
        err = sc3(SYS_execve, name, av, envp);
    } else {
        const char *p = getenv_of(envp, "PATH");
        if (!p) p = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
        char full[4096];
        while (1) {
            const char *e = p;
            while (*e && *e != ':') e++;
            size_t a = (size_t)(e - p), b = slen(name);
            if (a + b + 2 < sizeof full) {
                memcpy(full, a ? p : ".", a ? a : 1);
                size_t at = a ? a : 1;
                full[at] = '/';
                memcpy(full + at + 1, name, b + 1);
                long r = sc3(SYS_execve, full, av, envp);
                if (r == -EACCES) err = r;
            }
            if (!*e) break;
            p = e + 1;
        }
    }
    out_s(&STDERR, "osmosis-guard: ");
    out_s(&STDERR, name);
    out_s(&STDERR, err == -EACCES ? ": permission denied\n" : ": not found\n");
    out_flush(&STDERR);
    die_exit(err == -EACCES ? 126 : 127);
}
static int mode_drop(int argc, char **argv) {
    struct opts o;
    parse_opts(argc, argv, 2, &o);
    if (!o.rest || !o.rest[0]) fatal("drop needs -- ARGV");
    int marker = choose_marker();
    if (marker < 0) no_marker();
    drop_marker(marker);
    int n = 0;
    while (ENVP[n]) n++;
    char **env = alloc(sizeof(char *) * (size_t)(n + 1));
    int k = 0;
    for (int i = 0; i < n; i++)
        if (!starts(ENVP[i], KEY_VAR)) env[k++] = ENVP[i];
    env[k] = NULL;
    run_argv(o.rest, env);
    return 127;
}
static int mode_record(int argc, char **argv) {
    struct opts o;
    parse_opts(argc, argv, 2, &o);
    u8 key[32];
    if (o.daemon < 2 || daemon_key(o.daemon, key) < 0) fatal("cannot read the guard daemon's key");
    record_manifest(&o, key);
    out_s(&STDOUT, "osmosis-guard recorded entries=");
    out_u(&STDOUT, ENTRIES);
    out_s(&STDOUT, "\n");
    out_flush(&STDOUT);
    return 0;
}
static int mode_check(int argc, char **argv) {
    struct opts o;
    parse_opts(argc, argv, 2, &o);
    if (o.daemon < 2 || !o.nonce || !o.id) fatal("check needs --daemon, --nonce and --id");
    SELF = sc0(SYS_getpid);
    DAEMON = o.daemon;
    u8 key[32];
    if (daemon_key(DAEMON, key) < 0) {
        out_s(&STDOUT, "osmosis-guard-report 1\nerror no-key\n");
        out_flush(&STDOUT);
        return 83;
    }
    MARKER = choose_marker();
    if (MARKER < 0) no_marker();
    struct hmac mac;
    hmac_init(&mac, key);
    STDOUT.mac = &mac;
    R = &STDOUT;
    out_s(R, "osmosis-guard-report 1\nnonce ");
    out_s(R, o.nonce);
    out_s(R, "\nid ");
    out_s(R, o.id);
    out_s(R, "\n");
    out_num_line(R, "marker ", (u64)MARKER);
    end_processes(&o);
    out_s(R, "logs ");
    out_s(R, reset_verifier_logs());
    out_s(R, "\n");
    setup_exclusions(&o);
    setup_path_dirs();
    const char *problem = load_manifest(&o, key);
    out_s(R, "manifest ");
    out_s(R, problem ? problem : "ok");
    out_s(R, "\n");
    if (!problem) {
        walk_all(&o, check_visit);
        report_removed();
        set_aside_caches(o.nonce);
    }
    if (TRUNCATED) out_num_line(R, "truncated walk ", TRUNCATED);
    if (N_FINDINGS > MAX_RECORDS) out_num_line(R, "truncated findings ", N_FINDINGS - MAX_RECORDS);
    if (N_CURED > MAX_RECORDS) out_num_line(R, "truncated cured ", N_CURED - MAX_RECORDS);
    if ((u64)NKILLED > MAX_RECORDS) out_num_line(R, "truncated killed ", (u64)NKILLED - MAX_RECORDS);
    out_num_line(R, "entries ", ENTRIES);
    out_s(R, "end\n");
    STDOUT.mac = NULL;
    u8 h[32];
    hmac_final(&mac, h);
    out_s(R, "hmac ");
    out_hex(R, h, 32);
    out_s(R, "\n");
    out_flush(R);
    return 0;
}
static int mode_probe(void) {
    struct proc self;
    memset(&self, 0, sizeof self);
    read_proc(sc0(SYS_getpid), &self);
    out_s(&STDOUT, "osmosis-guard probe arch=" ARCH_NAME " marker=");
    int m = choose_marker();
    if (m < 0) out_s(&STDOUT, "none");
    else out_u(&STDOUT, (u64)m);
    out_s(&STDOUT, " capbnd=");
    u8 bytes[8];
    for (int i = 0; i < 8; i++) bytes[i] = (u8)(self.capbnd >> (56 - 8 * i));
    out_hex(&STDOUT, bytes, 8);
    out_s(&STDOUT, "\n");
    out_flush(&STDOUT);
    return 0;
}

__attribute__((used, noreturn)) void cmain(long *sp) {
    int argc = (int)sp[0];
    char **argv = (char **)(sp + 1);
    ENVP = argv + argc + 1;
    int code = 2;
    if (argc < 2) fatal("usage: osmosis-guard start|drop|record|check|probe ...");
    const char *mode = argv[1];
    if (seq(mode, "start")) code = mode_start(argc, argv);
    else if (seq(mode, "daemon")) code = mode_daemon(argc, argv);
    else if (seq(mode, "drop")) code = mode_drop(argc, argv);
    else if (seq(mode, "record")) code = mode_record(argc, argv);
    else if (seq(mode, "check")) code = mode_check(argc, argv);
    else if (seq(mode, "probe")) code = mode_probe();
    else fatal("unknown mode");
    out_flush(&STDOUT);
    die_exit(code);
}
