/* Memory, strings and the arena: the little of a libc the guard needs.
 * Part of guard.c's single translation unit. */

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
static int strcmp_(const char *a, const char *b) {
    while (*a && *a == *b) a++, b++;
    return (int)(u8)*a - (int)(u8)*b;
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
