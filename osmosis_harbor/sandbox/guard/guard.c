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
 *   trees  prints the whole trees a start here would record (trees.h), one per line.
 *
 * Build: cc -static -nostdlib -ffreestanding -fno-stack-protector -fno-pic -no-pie -Os
 */

#include "sys.h"
#include "lib.h"
#include "sha256.h"
#include "out.h"
#include "files.h"
#include "args.h"
#include "caps.h"
#include "trees.h"
#include "walk.h"
#include "rules.h"
#include "procs.h"

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
/* The start refuses a sandbox the guard cannot protect: the daemon's key must be readable by an
 * unmarked process (no security module in the way) and unreadable by a marked one. */
static void refuse(long daemon, const char *why) {
    sc2(SYS_kill, daemon, SIGKILL);
    out_s(&STDERR, "osmosis-guard: ");
    out_s(&STDERR, why);
    out_s(&STDERR, "\n");
    out_flush(&STDERR);
    die_exit(84);
}
static void self_test(long daemon, const u8 key[32], int marker) {
    u8 seen[32];
    if (daemon_key(daemon, seen) < 0 || memcmp(seen, key, 32))
        refuse(daemon, "the guard cannot read its daemon's key in this sandbox (a security module denies ptrace reads)");
    long child = xfork();
    if (child == 0) {
        drop_marker(marker);
        die_exit(daemon_key(daemon, seen) < 0 ? 0 : 1);
    }
    int status = 0;
    if (child < 0 || sc4(SYS_wait4, child, &status, 0, 0) != child || status != 0)
        refuse(daemon, "a marked process can read the guard daemon's key here: this kernel does not enforce the mark");
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
    self_test(pid, key, marker);
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

/* The trees a start here would record (one per line): what `sandbox-check` and tests look at. */
static int mode_trees(void) {
    setup_trees();
    for (int i = 0; i < NTREES; i++) {
        out_s(&STDOUT, TREES[i]);
        out_s(&STDOUT, "\n");
    }
    out_flush(&STDOUT);
    return 0;
}

__attribute__((used, noreturn)) void cmain(long *sp) {
    int argc = (int)sp[0];
    char **argv = (char **)(sp + 1);
    ENVP = argv + argc + 1;
    int code = 2;
    if (argc < 2) fatal("usage: osmosis-guard start|drop|record|check|probe|trees ...");
    const char *mode = argv[1];
    if (seq(mode, "start")) code = mode_start(argc, argv);
    else if (seq(mode, "daemon")) code = mode_daemon(argc, argv);
    else if (seq(mode, "drop")) code = mode_drop(argc, argv);
    else if (seq(mode, "record")) code = mode_record(argc, argv);
    else if (seq(mode, "check")) code = mode_check(argc, argv);
    else if (seq(mode, "probe")) code = mode_probe();
    else if (seq(mode, "trees")) code = mode_trees();
    else fatal("unknown mode");
    out_flush(&STDOUT);
    die_exit(code);
}
