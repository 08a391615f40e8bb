/* A forked container's set-up, in C (kubesim.kubelet.forkserver loads it through
 * kubesim.kubelet.native): session, output, working directory, the network namespace, the mount
 * namespace exactly as kubesim.kubelet.mountns.setup makes it, the PID namespace's /proc, and for
 * an exec'd container its exec.
 *
 * Why C: the same steps in the Python the fork server forked cost ~3.5 ms per container, most of
 * it copy-on-write faults of the interpreter's pages rather than the ~0.9 ms of system calls, and
 * a sandbox pod starts three containers.
 *
 * The set-up is a flat list of words (what the fork server parsed from the container's mount spec
 * before it forked), read left to right:
 *   log PATH | cwd DIR | netns PATH | scratch DIR | bind SOURCE TARGET 0|1 | hosts PATH
 *   | top POINT (the host's top-level mount points, shortest first) | private ROOT POD | hide PATH
 *   | proc (a /proc of the container's PID namespace)
 * kubesim_container() returns only when a step failed (-1, kubesim_error() says which), or, when
 * it is given no program to exec, once the container is set up (0).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <dirent.h>
#include <unistd.h>

#define MAX_ITEMS 256
#define OLD_ROOT ".kubesim-old-root"

extern char **environ;

static char error_text[PATH_MAX + 256];

const char *kubesim_error(void) { return error_text; }

static int fail(const char *format, ...) {
    int saved = errno;
    va_list args;
    va_start(args, format);
    vsnprintf(error_text, sizeof error_text, format, args);
    va_end(args);
    size_t used = strlen(error_text);
    if (saved != 0)
        snprintf(error_text + used, sizeof error_text - used, ": %s", strerror(saved));
    return -1;
}

/* `out` (PATH_MAX bytes) = the formatted path; -1 if it does not fit. */
static int pathf(char *out, const char *format, ...) {
    va_list args;
    va_start(args, format);
    int n = vsnprintf(out, PATH_MAX, format, args);
    va_end(args);
    if (n < 0 || n >= PATH_MAX)
        return errno = ENAMETOOLONG, fail("path too long: %s", out);
    return 0;
}

struct bind {
    const char *source, *target;
    int read_only, fd;
};

struct spec {
    const char *log, *cwd, *netns, *scratch, *hosts, *private_root, *private_pod;
    struct bind binds[MAX_ITEMS];
    const char *top[MAX_ITEMS], *hide[MAX_ITEMS];
    int n_binds, n_top, n_hide, proc;
};

static int exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

static int is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Path(p).parts' length, less the root: comparing binds, parents sort before children. */
static int depth(const char *path) {
    int n = 0;
    for (const char *p = path; *p; p++)
        if (*p != '/' && (p == path || p[-1] == '/'))
            n++;
    return n;
}

/* mountns.existing_parent: the deepest existing ancestor of `target`, symlinks resolved. */
static int existing_parent(const char *target, char out[PATH_MAX]) {
    char current[PATH_MAX];
    if (snprintf(current, sizeof current, "%s", target) >= (int)sizeof current)
        return fail("path too long: %s", target);
    while (!exists(current)) {
        char *slash = strrchr(current, '/');
        if (slash == NULL || slash == current) {
            strcpy(current, "/");
            break;
        }
        *slash = '\0';
    }
    if (realpath(current, out) == NULL)
        return fail("resolve %s", current);
    return 0;
}

/* `a` equal to `b` or below it. */
static int within(const char *a, const char *b) {
    size_t n = strlen(b);
    if (strcmp(b, "/") == 0)
        return 1;
    return strncmp(a, b, n) == 0 && (a[n] == '\0' || a[n] == '/');
}

static int mount_or_fail(const char *source, const char *target, const char *type, unsigned long flags,
                         const char *data) {
    if (mount(source, target, type, flags, data) != 0)
        return fail("mount '%s' on '%s' (%s)", source ? source : "None", target, type ? type : "bind");
    return 0;
}

static int mkdirs(const char *path) {
    char buf[PATH_MAX];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
        return fail("path too long: %s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(buf, 0777) != 0 && errno != EEXIST)
            return fail("mkdir %s", buf);
        *p = '/';
    }
    if (mkdir(buf, 0777) != 0 && errno != EEXIST)
        return fail("mkdir %s", buf);
    errno = 0;
    return 0;
}

static int parse(int argc, char **argv, struct spec *s) {
    memset(s, 0, sizeof *s);
    for (int i = 0; i < argc; i++) {
        const char *word = argv[i];
        int left = argc - i - 1;
#define NEED(n)                                                                                                        \
    if (left < (n))                                                                                                    \
        return errno = 0, fail("set-up word '%s': %d values needed", word, n);
        if (strcmp(word, "log") == 0) {
            NEED(1) s->log = argv[++i];
        } else if (strcmp(word, "cwd") == 0) {
            NEED(1) s->cwd = argv[++i];
        } else if (strcmp(word, "netns") == 0) {
            NEED(1) s->netns = argv[++i];
        } else if (strcmp(word, "scratch") == 0) {
            NEED(1) s->scratch = argv[++i];
        } else if (strcmp(word, "hosts") == 0) {
            NEED(1) s->hosts = argv[++i];
        } else if (strcmp(word, "private") == 0) {
            NEED(2) s->private_root = argv[i + 1], s->private_pod = argv[i + 2], i += 2;
        } else if (strcmp(word, "bind") == 0 && s->n_binds < MAX_ITEMS) {
            NEED(3) s->binds[s->n_binds++] = (struct bind){argv[i + 1], argv[i + 2], strcmp(argv[i + 3], "1") == 0, -1};
            i += 3;
        } else if (strcmp(word, "top") == 0 && s->n_top < MAX_ITEMS) {
            NEED(1) s->top[s->n_top++] = argv[++i];
        } else if (strcmp(word, "hide") == 0 && s->n_hide < MAX_ITEMS) {
            NEED(1) s->hide[s->n_hide++] = argv[++i];
        } else if (strcmp(word, "proc") == 0) {
            s->proc = 1;
        } else {
            return errno = 0, fail("set-up word '%s': unknown or too many", word);
        }
#undef NEED
    }
    return 0;
}

/* Session, stdin /dev/null, stdout and stderr the log, no other descriptor, the working directory,
 * death with the fork server: forkserver._container's first steps. */
static int process_setup(const struct spec *s) {
    if (setsid() < 0)
        return fail("setsid");
    if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0)
        return fail("prctl(PR_SET_PDEATHSIG)");
    if (s->log != NULL) {
        int null = open("/dev/null", O_RDONLY);
        int log = open(s->log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (null < 0 || log < 0)
            return fail("open %s", null < 0 ? "/dev/null" : s->log);
        if (dup2(null, 0) < 0 || dup2(log, 1) < 0 || dup2(log, 2) < 0)
            return fail("dup2");
    }
    if (syscall(SYS_close_range, 3, ~0U, 0) != 0)
        for (int fd = 3; fd < 1024; fd++)
            close(fd);
    if (s->cwd != NULL && chdir(s->cwd) != 0)
        return fail("chdir %s", s->cwd);
    if (s->netns != NULL) {
        int fd = open(s->netns, O_RDONLY | O_CLOEXEC);
        if (fd < 0 || setns(fd, CLONE_NEWNET) != 0)
            return fail("setns(%s)", s->netns);
        close(fd);
    }
    return 0;
}

/* mountns.overlay_roots: for each missing target, its nearest existing parent, none below another. */
static int overlay_roots(const struct spec *s, char roots[][PATH_MAX], int *n_roots) {
    *n_roots = 0;
    for (int i = 0; i < s->n_binds; i++) {
        char parent[PATH_MAX];
        if (exists(s->binds[i].target))
            continue;
        if (existing_parent(s->binds[i].target, parent) != 0)
            return -1;
        int covered = 0;
        for (int r = 0; r < *n_roots; r++)
            covered |= within(parent, roots[r]);
        if (covered)
            continue;
        int kept = 0;
        for (int r = 0; r < *n_roots; r++)
            if (!(within(roots[r], parent) && strcmp(roots[r], parent) != 0))
                memmove(roots[kept++], roots[r], PATH_MAX);
        strcpy(roots[kept], parent);
        *n_roots = kept + 1;
    }
    return 0;
}

/* The top-level directories of / that no missing mount point goes into (the host's own, bound, not
 * overlaid: a Unix socket is not reachable through an overlay), as mountns binds them; their names
 * in `bound`. */
static int bind_top_dirs(const struct spec *s, const char *new_root, char bound[][NAME_MAX + 1], int *n_bound) {
    char creating[MAX_ITEMS][NAME_MAX + 1];
    int n_creating = 0;
    *n_bound = 0;
    for (int i = 0; i < s->n_binds && n_creating < MAX_ITEMS; i++) {
        char parent[PATH_MAX];
        if (exists(s->binds[i].target))
            continue;
        if (existing_parent(s->binds[i].target, parent) != 0)
            return -1;
        if (strcmp(parent, "/") == 0)
            continue;
        size_t len = strcspn(parent + 1, "/");
        snprintf(creating[n_creating++], NAME_MAX + 1, "%.*s", (int)len, parent + 1);
    }
    struct dirent **entries;
    int n = scandir("/", &entries, NULL, alphasort);
    if (n < 0)
        return fail("list /");
    int result = 0;
    for (int i = 0; i < n; i++) {
        const char *name = entries[i]->d_name;
        char path[PATH_MAX], target[PATH_MAX];
        struct stat st;
        int skip = strcmp(name, ".") == 0 || strcmp(name, "..") == 0 || strcmp(name, "proc") == 0;
        for (int c = 0; c < n_creating && !skip; c++)
            skip = strcmp(name, creating[c]) == 0;
        snprintf(path, sizeof path, "/%s", name);
        if (!skip && result == 0 && *n_bound < MAX_ITEMS && lstat(path, &st) == 0 && !S_ISLNK(st.st_mode) &&
            is_dir(path)) {
            result = pathf(target, "%s/%s", new_root, name);
            if (result == 0)
                result = mount_or_fail(path, target, NULL, MS_BIND | MS_REC, NULL);
            snprintf(bound[(*n_bound)++], NAME_MAX + 1, "%s", name);
        }
        free(entries[i]);
    }
    free(entries);
    return result;
}

/* The overlay of / built aside, its top-level binds, the host's other top-level mounts (from the
 * handles held) and /proc, then pivot_root into it (the old root at /.kubesim-old-root). */
static int overlay_root(const struct spec *s, const char *new_root, const int *held) {
    static char bound[MAX_ITEMS][NAME_MAX + 1];
    int n_bound;
    if (bind_top_dirs(s, new_root, bound, &n_bound) != 0)
        return -1;
    for (int i = 0; i < s->n_top; i++) {
        const char *point = s->top[i];
        char name[NAME_MAX + 1], source[64], target[PATH_MAX];
        if (strcmp(point, "/proc") == 0)
            continue;
        /* Under a top-level directory bound above: MS_REC took it along. */
        snprintf(name, sizeof name, "%.*s", (int)strcspn(point + 1, "/"), point + 1);
        int taken = 0;
        for (int b = 0; b < n_bound && !taken; b++)
            taken = strcmp(name, bound[b]) == 0;
        if (taken)
            continue;
        snprintf(source, sizeof source, "/proc/self/fd/%d", held[i]);
        if (pathf(target, "%s%s", new_root, point) != 0 || mount_or_fail(source, target, NULL, MS_BIND | MS_REC, NULL) != 0)
            return -1;
    }
    char proc[PATH_MAX], old[PATH_MAX], cwd[PATH_MAX];
    if (pathf(proc, "%s/proc", new_root) != 0 || mount_or_fail("proc", proc, "proc", 0, NULL) != 0)
        return -1;
    if (getcwd(cwd, sizeof cwd) == NULL)
        return fail("getcwd");
    if (pathf(old, "%s/" OLD_ROOT, new_root) != 0)
        return -1;
    if (mkdir(old, 0777) != 0 && errno != EEXIST)
        return fail("mkdir %s", old);
    if (chdir(new_root) != 0 || syscall(SYS_pivot_root, ".", OLD_ROOT) != 0)
        return fail("pivot_root");
    if (chdir(cwd) != 0)
        return fail("chdir %s", cwd);
    return 0;
}

static int by_depth(const void *a, const void *b) {
    const struct bind *x = a, *y = b;
    int d = depth(x->target) - depth(y->target);
    return d != 0 ? d : (x < y ? -1 : x > y); /* stable: the spec's order among equals */
}

/* Each volume at its mount point (from the handle held before any mount could hide its source). */
static int bind_volumes(struct spec *s) {
    for (int i = 0; i < s->n_binds; i++) {
        struct bind *b = &s->binds[i];
        char source[64], parent[PATH_MAX];
        struct stat st;
        if (lstat(b->target, &st) == 0 && S_ISLNK(st.st_mode) && unlink(b->target) != 0)
            return fail("unlink %s", b->target); /* the host-view symlink volumes.mount left */
        if (fstat(b->fd, &st) != 0)
            return fail("stat %s", b->source);
        if (S_ISDIR(st.st_mode)) {
            if (mkdirs(b->target) != 0)
                return -1;
        } else {
            snprintf(parent, sizeof parent, "%s", b->target);
            char *slash = strrchr(parent, '/');
            if (slash != NULL && slash != parent) {
                *slash = '\0';
                if (mkdirs(parent) != 0)
                    return -1;
            }
            int fd = open(b->target, O_WRONLY | O_CREAT | O_CLOEXEC, 0666);
            if (fd < 0 && errno != EISDIR && !exists(b->target))
                return fail("create %s", b->target);
            if (fd >= 0)
                close(fd);
        }
        snprintf(source, sizeof source, "/proc/self/fd/%d", b->fd);
        if (mount_or_fail(source, b->target, NULL, MS_BIND | MS_REC, NULL) != 0)
            return -1;
    }
    /* Read-only last (children first), so mount points inside a read-only mount could be made. */
    for (int i = s->n_binds - 1; i >= 0; i--)
        if (s->binds[i].read_only &&
            mount_or_fail(NULL, s->binds[i].target, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY, NULL) != 0)
            return -1;
    return 0;
}

/* An empty tmpfs over the kubelet's root but for this pod's directory, then over each volume of the
 * pod this container does not mount; then the container's own devpts (mountns._own_devpts). */
static int cover(const struct spec *s) {
    char cwd[PATH_MAX];
    if (getcwd(cwd, sizeof cwd) == NULL)
        return fail("getcwd");
    if (is_dir("/dev/pts") && mount_or_fail("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC,
                                            "newinstance,ptmxmode=0666,mode=0620") != 0)
        return -1;
    if (s->private_root != NULL) {
        char source[64];
        int pod = open(s->private_pod, O_PATH | O_CLOEXEC);
        if (pod < 0)
            return fail("open %s", s->private_pod);
        if (mount_or_fail("tmpfs", s->private_root, "tmpfs", 0, "mode=0755") != 0 || mkdirs(s->private_pod) != 0)
            return -1;
        snprintf(source, sizeof source, "/proc/self/fd/%d", pod);
        if (mount_or_fail(source, s->private_pod, NULL, MS_BIND | MS_REC, NULL) != 0)
            return -1;
        close(pod);
    }
    for (int i = 0; i < s->n_hide; i++)
        if (is_dir(s->hide[i]) && mount_or_fail("tmpfs", s->hide[i], "tmpfs", MS_RDONLY, "mode=0755") != 0)
            return -1;
    if (chdir(cwd) != 0) /* the working directory as the container sees it (the old one may be covered) */
        errno = 0;
    return 0;
}

static int open_path(const char *path) {
    int fd = open(path, O_PATH | O_CLOEXEC);
    if (fd < 0)
        fail("open %s", path);
    return fd;
}

/* mountns.setup: a new mount namespace with the mounts the spec asks for. */
static int mounts(struct spec *s) {
    static char roots[MAX_ITEMS][PATH_MAX];
    int n_roots, kept = 0, held[MAX_ITEMS], hosts_fd = -1, root_overlaid = 0;
    if (unshare(CLONE_NEWNS) != 0)
        return fail("unshare(CLONE_NEWNS)");
    if (mount_or_fail(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0)
        return -1;
    for (int i = 0; i < s->n_binds; i++) /* a volume whose source is gone is left out */
        if (exists(s->binds[i].source))
            s->binds[kept++] = s->binds[i];
    s->n_binds = kept;
    if (overlay_roots(s, roots, &n_roots) != 0)
        return -1;
    qsort(s->binds, s->n_binds, sizeof s->binds[0], by_depth);
    /* Hold every source open first: a mount over /tmp (or /) must not hide the sources below it. */
    for (int i = 0; i < s->n_binds; i++)
        if ((s->binds[i].fd = open_path(s->binds[i].source)) < 0)
            return -1;
    if (s->hosts != NULL && (hosts_fd = open_path(s->hosts)) < 0)
        return -1;
    for (int r = 0; r < n_roots; r++)
        root_overlaid |= strcmp(roots[r], "/") == 0;
    if (!root_overlaid)
        s->n_top = 0;
    for (int i = 0; i < s->n_top; i++)
        if ((held[i] = open_path(s->top[i])) < 0)
            return -1;
    for (int r = 0; r < n_roots; r++) {
        char layer[PATH_MAX], upper[PATH_MAX], work[PATH_MAX], new_root[PATH_MAX], options[4 * PATH_MAX];
        if (pathf(layer, "%s/overlay-%d", s->scratch ? s->scratch : ".", r) != 0 ||
            pathf(upper, "%s/upper", layer) != 0 || pathf(work, "%s/work", layer) != 0 ||
            pathf(new_root, "%s/root", layer) != 0 || mkdirs(layer) != 0 || mount_or_fail("tmpfs", layer, "tmpfs", 0, "mode=0755") != 0)
            return -1;
        if (mkdir(upper, 0777) != 0 || mkdir(work, 0777) != 0 || mkdir(new_root, 0777) != 0)
            return fail("mkdir in %s", layer);
        snprintf(options, sizeof options, "lowerdir=%s,upperdir=%s,workdir=%s", roots[r], upper, work);
        if (strcmp(roots[r], "/") != 0) {
            if (mount_or_fail("overlay", roots[r], "overlay", 0, options) != 0)
                return -1;
            continue;
        }
        /* A mount on / itself is never walked into: build the overlay aside, then pivot_root (not
         * chroot: a bwrap inside must pivot too). */
        if (mount_or_fail("overlay", new_root, "overlay", 0, options) != 0 || overlay_root(s, new_root, held) != 0)
            return -1;
    }
    if (bind_volumes(s) != 0)
        return -1;
    if (hosts_fd >= 0 && exists("/etc/hosts")) {
        char source[64];
        snprintf(source, sizeof source, "/proc/self/fd/%d", hosts_fd);
        if (mount_or_fail(source, "/etc/hosts", NULL, MS_BIND, NULL) != 0)
            return -1;
    }
    for (int i = 0; i < s->n_binds; i++)
        close(s->binds[i].fd);
    for (int i = 0; i < s->n_top; i++)
        close(held[i]);
    if (hosts_fd >= 0)
        close(hosts_fd);
    /* Only once every bind is made: a mount cannot be bound from a detached tree. */
    if (root_overlaid && (umount2("/" OLD_ROOT, MNT_DETACH) != 0 || rmdir("/" OLD_ROOT) != 0))
        return fail("umount the old root");
    return cover(s);
}

/* The forked container's set-up (see the top of this file), then, given `exec_argv` (and
 * `exec_env`, both NULL-terminated), its exec; -1 and kubesim_error() when a step fails. */
int kubesim_container(int argc, char **argv, char **exec_argv, char **exec_env) {
    static struct spec s;
    errno = 0;
    error_text[0] = '\0';
    if (parse(argc, argv, &s) != 0 || process_setup(&s) != 0 || mounts(&s) != 0)
        return -1;
    if (s.proc && mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) != 0)
        return fail("mount /proc");
    if (exec_argv == NULL)
        return 0;
    /* What the fork server's interpreter changed that an exec keeps: a container starts with the
     * defaults. The search for the program uses the container's PATH, as os.execvpe does. */
    signal(SIGPIPE, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    environ = exec_env;
    execvp(exec_argv[0], exec_argv);
    return fail("cannot run '%s'", exec_argv[0]);
}

/* Append the NUL-separated words of `buf` (`len` bytes, none when empty) to argv, copied into
 * `storage` at `*used`; -1 when they do not fit. */
static int split(const char *buf, size_t len, char **argv, int *argc, int max, char *storage, size_t *used,
                 size_t size) {
    if (len == 0)
        return 0;
    if (*used + len + 1 > size)
        return -1;
    char *copy = storage + *used;
    memcpy(copy, buf, len);
    copy[len] = '\0';
    *used += len + 1;
    for (size_t at = 0; at <= len; at += strlen(copy + at) + 1) {
        if (*argc == max)
            return -1;
        argv[(*argc)++] = copy + at;
    }
    return 0;
}

/* kubesim_container for a forked Python child: the words packed NUL-separated in two buffers (the
 * container's, then the host's top-level mount points), so that the fork server's interpreter
 * builds nothing per word (every object it makes between forks costs it a page copy). */
int kubesim_container_packed(const char *words, size_t words_len, const char *top, size_t top_len) {
    static char *argv[4 * MAX_ITEMS + 64];
    static char storage[64 * 1024];
    int argc = 0, max = sizeof argv / sizeof argv[0];
    size_t used = 0;
    if (split(words, words_len, argv, &argc, max, storage, &used, sizeof storage) != 0 ||
        split(top, top_len, argv, &argc, max, storage, &used, sizeof storage) != 0)
        return errno = E2BIG, fail("the set-up words");
    return kubesim_container(argc, argv, NULL, NULL);
}

#ifdef KUBESIM_CONTAINER_MAIN
/* kubesim-container N WORD... PROGRAM ARG...: the exec'd container, spawned by the fork server
 * (posix_spawn: no copy of the server's pages, no Python in the child) with the container's
 * environment; N the number of set-up words. */
int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : -1;
    if (n < 0 || n > argc - 3) {
        fprintf(stderr, "usage: kubesim-container N WORD... PROGRAM ARG...\n");
        return 2;
    }
    kubesim_container(n, argv + 2, argv + 2 + n, environ);
    fprintf(stderr, "kubesim: cannot start the container: %s\n", kubesim_error());
    return 127;
}
#endif
