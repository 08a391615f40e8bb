/* warmshell-launch: the host-side prefix of every local sandbox's command line.
 *
 *   warmshell-launch [--cgroup=PROCS] [--priority=NICE] [--RLIMIT=SOFT[:HARD]]... [--uid=UID]
 *                    [--rootfs=DIR --root-size=BYTES --layer=PATH...] [--keep[-tree]=PATH...] -- PROGRAM ARG...
 *
 * Moves itself into a cgroup (--cgroup names its cgroup.procs file, or its `tasks` file once per
 * hierarchy on cgroup v1; written while still the gateway's uid, and before PROGRAM, so everything
 * PROGRAM starts is in it), sets its
 * nice value (--priority; a pool refill starts below the creates it serves), its rlimits (the
 * option names and value syntax of util-linux prlimit, e.g. --fsize=4294967296 --nproc=1024),
 * then drops to UID (that gid, no supplementary groups), and execs PROGRAM (an absolute path:
 * bwrap). One static exec where there were three dynamically linked ones (a shell for the cgroup,
 * prlimit, setpriv): every start of a sandbox pays for it. Any failure exits 125 with a message
 * on stderr, before PROGRAM runs.
 *
 * With --layer (top first, an image's unpacked layers) it also makes the image's root, while still
 * root: in a mount namespace of its own (so nothing reaches the host's mounts and everything goes
 * with the sandbox), a tmpfs of --root-size bytes on DIR holding the upper and work directories,
 * a read-only clone of each layer idmapped so that files owned by uid 0 (the store's owner)
 * show as UID (the layers stay root-owned and shared; copy-up of an image file is then the
 * sandbox's own), and an overlay of them at DIR/m, which bwrap binds as the sandbox's /. The
 * mounts are nosuid and nodev: a setuid file in an image gives nothing. Idmapped mounts need
 * root, so a root caller gives --uid. A caller that is not root (a gateway of a normal user, whose
 * sandboxes all run as its own uid) makes a user namespace of its own first, mapping its uid to 0
 * there (overlayfs mounts in a user namespace since Linux 5.11): the store's files, its own, show
 * as 0 without an idmap, and bwrap runs in that namespace and makes the sandbox's inside it.
 *
 * With --keep-tree (bwrap's bind sources) and --keep (what else it reads: /proc, /tmp, the device
 * nodes of its --dev), a root caller leaves in its mount namespace (an image root's, or one of its
 * own for the host's root) only the mounts that hold those paths and those within a kept tree:
 * see trim_mounts.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static const struct { const char *name; int resource; } LIMITS[] = {
    {"as", RLIMIT_AS}, {"core", RLIMIT_CORE}, {"cpu", RLIMIT_CPU}, {"data", RLIMIT_DATA},
    {"fsize", RLIMIT_FSIZE}, {"locks", RLIMIT_LOCKS}, {"memlock", RLIMIT_MEMLOCK},
    {"msgqueue", RLIMIT_MSGQUEUE}, {"nice", RLIMIT_NICE}, {"nofile", RLIMIT_NOFILE},
    {"nproc", RLIMIT_NPROC}, {"rss", RLIMIT_RSS}, {"rtprio", RLIMIT_RTPRIO}, {"rttime", RLIMIT_RTTIME},
    {"sigpending", RLIMIT_SIGPENDING}, {"stack", RLIMIT_STACK},
};

static void fail(const char *what, const char *detail) {
    fprintf(stderr, "warmshell-launch: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
    exit(125);
}

static long long number(const char *text, const char *option) {
    char *end = NULL;
    errno = 0;
    long long value = strtoll(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || value < 0) fail("not a number", option);
    return value;
}

static void limit(const char *name, size_t length, const char *value, const char *option) {
    for (size_t i = 0; i < sizeof LIMITS / sizeof LIMITS[0]; i++) {
        if (strlen(LIMITS[i].name) != length || strncmp(LIMITS[i].name, name, length) != 0) continue;
        char soft[32];
        const char *colon = strchr(value, ':');
        size_t soft_length = colon ? (size_t)(colon - value) : strlen(value);
        if (soft_length >= sizeof soft) fail("value too long", option);
        memcpy(soft, value, soft_length);
        soft[soft_length] = '\0';
        struct rlimit rl;
        rl.rlim_cur = (rlim_t)number(soft, option);
        rl.rlim_max = colon ? (rlim_t)number(colon + 1, option) : rl.rlim_cur;
        if (setrlimit(LIMITS[i].resource, &rl) != 0) fail("setrlimit", option);
        return;
    }
    fail("unknown option", option);
}

/* PROCS is a cgroup.procs file (this pid is written) or a cgroup v1 `tasks` file: 0 is written
 * there, the calling thread, which is the whole of this single-threaded process. Moving a pid
 * takes the kernel's threadgroup lock for writing, which waits for an RCU grace period when no
 * migration ran in the last few ms (7-14 ms on Linux 6.18, most of a lone start's wall); moving
 * the calling thread alone does not take it. */
static void enter_cgroup(const char *procs) {
    int fd = open(procs, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);  /* O_CREAT: as the shell's `>` had */
    if (fd < 0) fail("cannot open the cgroup", strerror(errno));
    const char *slash = strrchr(procs, '/');
    int self = strcmp(slash ? slash + 1 : procs, "tasks") == 0;
    char pid[24];
    int length = snprintf(pid, sizeof pid, "%d\n", self ? 0 : (int)getpid());
    if (write(fd, pid, (size_t)length) != length) fail("cannot enter the cgroup", strerror(errno));
    close(fd);
}

#ifndef OPEN_TREE_CLONE
#define OPEN_TREE_CLONE 1
#endif
#ifndef MOVE_MOUNT_F_EMPTY_PATH
#define MOVE_MOUNT_F_EMPTY_PATH 0x00000004
#endif
#define IDMAP 0x00100000     /* MOUNT_ATTR_IDMAP */
#define ATTR_RDONLY 0x00000001
#define ATTR_NOSUID 0x00000002
#define ATTR_NODEV 0x00000004
#define MAX_LAYERS 500       /* the OCI spec's practical limit is 127; docker's is 125 */
#define MAX_KEEP 500
#define MAX_MOUNTS 16384

struct idmap_attr { unsigned long long set, clear, propagation, userns_fd; };

/* A user namespace mapping 0 to UID, for idmapping the layers: its creator child is killed at
 * once, the namespace lives on through the descriptor. */
static int userns_of(long long uid) {
    pid_t child = (pid_t)syscall(SYS_clone, CLONE_NEWUSER | SIGCHLD, NULL, NULL, NULL, NULL);
    if (child < 0) fail("cannot make the idmap's user namespace", strerror(errno));
    if (child == 0) { for (;;) pause(); }
    char path[64], map[64];
    int length = snprintf(map, sizeof map, "0 %lld 1\n", uid);
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "/proc/%d/%s", (int)child, i ? "gid_map" : "uid_map");
        int fd = open(path, O_WRONLY | O_CLOEXEC);
        if (fd < 0 || write(fd, map, (size_t)length) != length) fail("cannot write the idmap", strerror(errno));
        close(fd);
    }
    snprintf(path, sizeof path, "/proc/%d/ns/user", (int)child);
    int ns = open(path, O_RDONLY | O_CLOEXEC);
    if (ns < 0) fail("cannot open the idmap's user namespace", strerror(errno));
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    return ns;
}

static void write_file(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    size_t length = strlen(text);
    if (fd < 0 || write(fd, text, length) != (ssize_t)length) fail("cannot write", path);
    close(fd);
}

/* The caller's uid and gid as 0 in a new user namespace, with a mount namespace it owns. */
static void own_user_namespace(void) {
    char uid_map[64], gid_map[64];
    snprintf(uid_map, sizeof uid_map, "0 %u 1\n", (unsigned)getuid());
    snprintf(gid_map, sizeof gid_map, "0 %u 1\n", (unsigned)getgid());
    if (unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) fail("cannot make a user namespace", strerror(errno));
    write_file("/proc/self/uid_map", uid_map);
    write_file("/proc/self/setgroups", "deny");
    write_file("/proc/self/gid_map", gid_map);
}

/* userns < 0: no idmap (the caller's own user namespace already shows the store's files as 0). */
static void attach_layer(const char *layer, const char *target, int userns) {
    int tree = (int)syscall(SYS_open_tree, AT_FDCWD, layer, OPEN_TREE_CLONE | O_CLOEXEC);
    if (tree < 0) fail("cannot clone a layer", layer);
    struct idmap_attr attr = {ATTR_RDONLY | ATTR_NOSUID | ATTR_NODEV, 0, 0, 0};
    if (userns >= 0) {
        attr.set |= IDMAP;
        attr.userns_fd = (unsigned long long)userns;
    }
    if (syscall(SYS_mount_setattr, tree, "", AT_EMPTY_PATH, &attr, sizeof attr) != 0)
        fail("cannot idmap a layer (its filesystem must support idmapped mounts: ext4, xfs, btrfs, tmpfs)", layer);
    if (mkdir(target, 0700) != 0 || syscall(SYS_move_mount, tree, "", AT_FDCWD, target, MOVE_MOUNT_F_EMPTY_PATH) != 0)
        fail("cannot mount a layer", strerror(errno));
    close(tree);
}

/* A mount namespace of this launch's own (in a user namespace of its own when OWN_USER: a caller
 * that is not root), its mounts private, so nothing mounted or detached here reaches the host's:
 * an image root's, and a host-root sandbox's launch as root (one to trim). */
static void private_namespace(int own_user) {
    if (own_user)
        own_user_namespace();
    else if (unshare(CLONE_NEWNS) != 0)
        fail("cannot make a mount namespace", strerror(errno));
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) fail("cannot make mounts private", strerror(errno));
}

/* Relative paths from inside DIR (as docker's overlay2 does) keep the mount options under the
 * one page the kernel takes, whatever DIR is: about 4 bytes a layer. */
static void mount_image_root(const char *dir, const char *size, const char **layers, int count, long long uid) {
    int own = getuid() != 0;
    if (own != (uid < 0)) fail("an image root needs --uid from a root caller, and none from another", NULL);
    private_namespace(own);
    char options[4096];
    snprintf(options, sizeof options, "size=%s,mode=0711", size);
    if (mount("warmshell-root", dir, "tmpfs", MS_NOSUID | MS_NODEV, options) != 0) fail("cannot mount the root's tmpfs", strerror(errno));
    if (chdir(dir) != 0) fail("cannot enter the root's tmpfs", strerror(errno));
    int userns = own ? -1 : userns_of(uid);
    int used = snprintf(options, sizeof options, "userxattr,upperdir=u,workdir=w,lowerdir=");
    for (int i = 0; i < count; i++) {
        char target[16];
        snprintf(target, sizeof target, "%d", i);
        attach_layer(layers[i], target, userns);
        used += snprintf(options + used, sizeof options - (size_t)used, "%s%s", i ? ":" : "", target);
    }
    if (userns >= 0) close(userns);
    if (mkdir("u", 0755) != 0 || mkdir("w", 0700) != 0 || mkdir("m", 0755) != 0 || (!own && chown("u", (uid_t)uid, (gid_t)uid) != 0))
        fail("cannot make the upper directory", strerror(errno));
    if (mount("overlay", "m", "overlay", MS_NOSUID | MS_NODEV, options) != 0) fail("cannot mount the image's overlay", strerror(errno));
    if (chdir("/") != 0) fail("chdir", strerror(errno));
}

/* Whether `path` is `dir` or lies below it. */
static int within(const char *path, const char *dir) {
    size_t n = strlen(dir);
    if (n == 1) return 1;  /* "/" */
    return strncmp(path, dir, n) == 0 && (path[n] == '\0' || path[n] == '/');
}

/* A mount stays when it holds a kept path (the host's / always does), or lies within a kept tree
 * (a bind source: bwrap's recursive bind carries its submounts along). */
static int kept(const char *point, char *const *keep, const int *tree, int count) {
    for (int i = 0; i < count; i++)
        if (within(keep[i], point) || (tree[i] && strcmp(keep[i], "/") != 0 && within(point, keep[i]))) return 1;
    return 0;
}

/* mountinfo escapes space, tab, newline and backslash as \ooo: undone in place. */
static void unescape(char *text) {
    char *out = text;
    for (char *in = text; *in; out++) {
        if (in[0] == '\\' && in[1] >= '0' && in[1] <= '3' && in[2] >= '0' && in[2] <= '7' && in[3] >= '0' && in[3] <= '7') {
            *out = (char)((in[1] - '0') * 64 + (in[2] - '0') * 8 + (in[3] - '0'));
            in += 4;
        } else {
            *out = *in++;
        }
    }
    *out = '\0';
}

static int shallower_first(const void *a, const void *b) {
    size_t la = strlen(*(char *const *)a), lb = strlen(*(char *const *)b);
    return la < lb ? -1 : la > lb ? 1 : 0;
}

/* The mount table read whole (it may pass a page: a host can hold hundreds of mounts). */
static char *read_mountinfo(void) {
    int fd = open("/proc/self/mountinfo", O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail("cannot read the mount table", strerror(errno));
    size_t size = 0, capacity = 16384;
    char *text = malloc(capacity);
    for (;;) {
        if (text == NULL || (capacity - size < 4096 && (text = realloc(text, capacity *= 2)) == NULL))
            fail("out of memory", NULL);
        ssize_t got = read(fd, text + size, capacity - size - 1);
        if (got < 0) fail("cannot read the mount table", strerror(errno));
        if (got == 0) break;
        size += (size_t)got;
    }
    close(fd);
    text[size] = '\0';
    return text;
}

/* bwrap reads and parses the whole mount table once per bind mount it makes (~12 times a start,
 * ~0.07 ms of CPU per mount per start here; a host with hundreds of mounts, a Kubernetes node or
 * a Docker host, would pay most of a start for it), and it needs of this namespace only what it
 * binds, /proc, the device nodes of its --dev and its /tmp: every other mount is detached
 * (lazily, which on Linux 6.18 adds no RCU grace period to the start's wall:
 * bench/investigations/fork-copy). Only in a private namespace of this launch's own, where a
 * detach cannot reach the host. Best effort: a mount that will not go stays. */
static void trim_mounts(char **keep, const int *tree, int count) {
    for (int i = 0; i < count; i++) {
        char *real = realpath(keep[i], NULL);  /* a bind source behind a symlink: its target's mounts */
        if (real != NULL) keep[i] = real;
    }
    char *table = read_mountinfo(), *points[MAX_MOUNTS];
    int total = 0;
    for (char *line = table, *next; line && *line && total < MAX_MOUNTS; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = '\0';
        char *field = line, *point = NULL;
        for (int f = 0; f < 5 && field; f++) {  /* the fifth field: the mount point */
            char *space = strchr(field, ' ');
            if (space) *space = '\0';
            if (f == 4) point = field;
            field = space ? space + 1 : NULL;
        }
        if (point == NULL) continue;
        unescape(point);
        if (!kept(point, keep, tree, count)) points[total++] = point;
    }
    /* A lazy detach takes the mounts within along (a host's /sys of a dozen cgroup v1 mounts in one
     * call), so only the outermost are detached, once per mount stacked there; a call costs ~0.01
     * ms of CPU, a seventh of what the mount would cost bwrap (500 sibling mounts: 10.6 ms of CPU
     * a start trimmed, 38 untrimmed). */
    qsort(points, (size_t)total, sizeof points[0], shallower_first);
    int detached = 0;
    for (int i = 0; i < total; i++) {
        int gone = 0;
        for (int j = 0; j < detached && !gone; j++)
            gone = strcmp(points[i], points[j]) != 0 && within(points[i], points[j]);
        if (gone) continue;
        umount2(points[i], MNT_DETACH);
        points[detached++] = points[i];
    }
    free(table);
}

int main(int argc, char **argv) {
    long long uid = -1;
    const char *rootfs = NULL, *root_size = NULL, *layers[MAX_LAYERS];
    char *keep[MAX_KEEP];
    int tree[MAX_KEEP], layer_count = 0, keep_count = 0;
    int i = 1;
    for (; i < argc && strcmp(argv[i], "--") != 0; i++) {
        const char *option = argv[i];
        const char *equals = strchr(option, '=');
        if (strncmp(option, "--", 2) != 0 || equals == NULL) fail("unknown option", option);
        const char *name = option + 2, *value = equals + 1;
        size_t length = (size_t)(equals - name);
        if (length == 6 && strncmp(name, "cgroup", 6) == 0) {
            enter_cgroup(value);
        } else if (length == 8 && strncmp(name, "priority", 8) == 0) {  /* prlimit's --nice is RLIMIT_NICE */
            if (setpriority(PRIO_PROCESS, 0, (int)number(value, option)) != 0) fail("setpriority", option);
        } else if (length == 3 && strncmp(name, "uid", 3) == 0) {
            uid = number(value, option);
        } else if (length == 6 && strncmp(name, "rootfs", 6) == 0) {
            rootfs = value;
        } else if (length == 9 && strncmp(name, "root-size", 9) == 0) {
            number(value, option);
            root_size = value;
        } else if (length == 5 && strncmp(name, "layer", 5) == 0) {
            if (layer_count == MAX_LAYERS) fail("too many layers", option);
            layers[layer_count++] = value;
        } else if ((length == 4 && strncmp(name, "keep", 4) == 0) || (length == 9 && strncmp(name, "keep-tree", 9) == 0)) {
            if (keep_count == MAX_KEEP) fail("too many kept paths", option);
            if (value[0] != '/') fail("a kept path must be absolute", option);
            tree[keep_count] = length == 9;
            keep[keep_count++] = (char *)value;
        } else {
            limit(name, length, value, option);
        }
    }
    if (i + 1 >= argc) fail("usage: warmshell-launch [--cgroup=PROCS] [--priority=NICE] [--RLIMIT=N]... [--uid=UID] [--keep[-tree]=PATH]... -- PROGRAM ARG...", NULL);
    if (argv[i + 1][0] != '/') fail("PROGRAM must be an absolute path", argv[i + 1]);
    if (layer_count > 0) {
        if (rootfs == NULL || root_size == NULL) fail("--layer needs --rootfs and --root-size", NULL);
        mount_image_root(rootfs, root_size, layers, layer_count, uid);
    }
    if (keep_count > 0 && getuid() == 0) {  /* in a user namespace of our own the host's mounts are locked */
        if (layer_count == 0) private_namespace(0);  /* an image root's launch has one already */
        trim_mounts(keep, tree, keep_count);
    }
    if (uid >= 0) {
        gid_t gid = (gid_t)uid;
        if (setgroups(0, NULL) != 0 || setresgid(gid, gid, gid) != 0 || setresuid((uid_t)uid, (uid_t)uid, (uid_t)uid) != 0)
            fail("cannot switch to the sandbox's uid", strerror(errno));
    }
    execv(argv[i + 1], argv + i + 1);
    fail("cannot exec", argv[i + 1]);
}
