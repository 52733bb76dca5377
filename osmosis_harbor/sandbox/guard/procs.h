/* Processes: the marked ones ended, the allowed services (and their children) kept.
 * Part of guard.c's single translation unit. */

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
