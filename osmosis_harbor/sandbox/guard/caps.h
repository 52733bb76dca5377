/* The mark: one capability dropped, so the kernel keeps marked processes from unmarked ones.
 * Part of guard.c's single translation unit. */

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
