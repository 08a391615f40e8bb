/* warmshell-launch: the host-side prefix of every local sandbox's command line.
 *
 *   warmshell-launch [--cgroup=PROCS] [--priority=NICE] [--RLIMIT=SOFT[:HARD]]... [--uid=UID] -- PROGRAM ARG...
 *
 * Moves itself into a cgroup (--cgroup names its cgroup.procs file, once per hierarchy on cgroup
 * v1; written while still the gateway's uid, and before PROGRAM, so everything PROGRAM starts is
 * in it), sets its
 * nice value (--priority; a pool refill starts below the creates it serves), its rlimits (the
 * option names and value syntax of util-linux prlimit, e.g. --fsize=4294967296 --nproc=1024),
 * then drops to UID (that gid, no supplementary groups), and execs PROGRAM (an absolute path:
 * bwrap). One static exec where there were three dynamically linked ones (a shell for the cgroup,
 * prlimit, setpriv): every start of a sandbox pays for it. Any failure exits 125 with a message
 * on stderr, before PROGRAM runs.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
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

static void enter_cgroup(const char *procs) {
    int fd = open(procs, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);  /* O_CREAT: as the shell's `>` had */
    if (fd < 0) fail("cannot open the cgroup", strerror(errno));
    char pid[24];
    int length = snprintf(pid, sizeof pid, "%d\n", (int)getpid());
    if (write(fd, pid, (size_t)length) != length) fail("cannot enter the cgroup", strerror(errno));
    close(fd);
}

int main(int argc, char **argv) {
    long long uid = -1;
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
        } else {
            limit(name, length, value, option);
        }
    }
    if (i + 1 >= argc) fail("usage: warmshell-launch [--cgroup=PROCS] [--priority=NICE] [--RLIMIT=N]... [--uid=UID] -- PROGRAM ARG...", NULL);
    if (argv[i + 1][0] != '/') fail("PROGRAM must be an absolute path", argv[i + 1]);
    if (uid >= 0) {
        gid_t gid = (gid_t)uid;
        if (setgroups(0, NULL) != 0 || setresgid(gid, gid, gid) != 0 || setresuid((uid_t)uid, (uid_t)uid, (uid_t)uid) != 0)
            fail("cannot switch to the sandbox's uid", strerror(errno));
    }
    execv(argv[i + 1], argv + i + 1);
    fail("cannot exec", argv[i + 1]);
}
