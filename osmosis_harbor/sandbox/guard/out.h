/* Buffered output; a report is signed as it is written.
 * Part of guard.c's single translation unit. */

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
