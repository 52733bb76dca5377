/* Types, the two architectures' system calls and the kernel's constants: all the guard asks of the OS.
 * Part of guard.c's single translation unit. */

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
    SYS_pidfd_send_signal = 424, SYS_pidfd_open = 434, SYS_getdents64 = 217, SYS_fchmod = 91, SYS_lseek = 8, SYS_chdir = 80, SYS_wait4 = 61,
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
    SYS_pidfd_send_signal = 424, SYS_pidfd_open = 434, SYS_getdents64 = 61, SYS_fchmod = 52, SYS_lseek = 62, SYS_chdir = 49, SYS_wait4 = 260,
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
