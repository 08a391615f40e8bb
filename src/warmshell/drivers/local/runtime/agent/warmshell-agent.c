/* warmshell-agent: pid 1 of every local sandbox (bubblewrap --as-pid-1).
 *
 * It holds no secret and trusts nothing it is sent. It serves one SOCK_SEQPACKET control socket:
 * inherited (the fd number is argv[1]; the local driver), or connected to the Unix socket path
 * after "--connect" (a Kubernetes pod, where the supervisor is another container; retried every
 * 100 ms for 60 s while it is not listening yet). The other end is the sandbox's supervisor,
 * outside the sandbox. The agent starts commands whose stdin/stdout/stderr arrive
 * as file descriptors (the host keeps the other pipe ends, so output never passes through
 * here), signals their process groups, reaps every process of the sandbox as pid 1, and when
 * the control socket closes exits, which ends the pid namespace: the kernel kills every other
 * process of it when its init exits.
 *
 * Records (host byte order, every field a uint32; mirrored in agentwire.py):
 *   host -> agent
 *     EXEC   {'X', id, argc, envc} then cwd, argv[argc], env[envc] as NUL-terminated strings
 *            filling the rest of the message exactly; exactly 3 fds attached.
 *     EXEC_TTY {'T', ...} as EXEC, the 3 fds a terminal's slave: the command leads a new session
 *            with that terminal as its controlling terminal (setsid + TIOCSCTTY).
 *     SIGNAL {'K', id, signo, 0}; no fds.
 *     PING   {'P', id, 0, 0}; no fds. A liveness probe (idle pool members are probed before a claim).
 *     ROOT   {'G', id, 0, 0}; no fds. Asks for the agent's root directory (a Kubernetes pod's
 *            supervisor serves file operations in the workload container's filesystem through it).
 *     FINISH {'Q', 0, 0, 0}; no fds. The sandbox is over: the agent exits 0. (The socket closing
 *            without it means the supervisor was lost: under "--connect" the agent exits 1.)
 *   agent -> host
 *     HELLO    {'H', 0, pid, version}       once, at start
 *     STARTED  {'S', id, pid, 0}            the command is running
 *     FAILED   {'F', id, stage, errno}      it did not start (stage 1 chdir, 2 exec, 3 fork)
 *     EXITED   {'E', id, wait status, 0}    it ended
 *     REJECTED {'R', id or 0, reason, 0}    a malformed or refused record (nothing was done)
 *     PONG     {'O', id, 0, 0}              the answer to PING
 *     ROOTDIR  {'D', id, errno, 0}          the answer to ROOT: one fd attached, an O_PATH fd
 *                                           on "/" (errno 0), or none (the open's errno)
 *
 * Install ("--install DIR", a Kubernetes pod's init container): the agent copies itself
 * (/proc/self/exe) to DIR/warmshell-agent (written as DIR/.warmshell-agent.tmp, mode 0755, then
 * renamed over it, so the workload never execs half a file), prints that path and exits 0; 2 on
 * a usage error, 1 with the reason on stderr if the copy fails. It is the whole of the init
 * container, and does none of the agent's pid-1 work: a pod's start then spends no Python process
 * on the copy (a forked interpreter cost ~4 ms of CPU per pod on kubesim, a fresh one ~40).
 *
 * Egress (argv[2], a port, given when the gateway may bind an egress proxy socket into the
 * sandbox): the agent itself listens on 127.0.0.1:PORT. At the first connection it accepts, it
 * connects a channel to the Unix socket EGRESS_SOCKET (the gateway's proxy) and sends two
 * SOCK_SEQPACKET records of one byte, each with a socket attached (SCM_RIGHTS): {'C'} with that
 * connection, then {'L'} with the listener itself. From then on the gateway accepts on the
 * listener directly and the agent leaves the per-connection path: it no longer polls the
 * listener, only the channel, and when the gateway closes that (the proxy's socket replaced at a
 * new activation, or refused) it takes the listener back and starts again at the next
 * connection. The gateway reads and writes the sockets itself (they stay in this sandbox's
 * network namespace). The sandbox has no other way out (its network namespace has loopback
 * only), and the agent decides nothing: the proxy applies the sandbox's policy. The workload can
 * connect to that socket too: the proxy serves a channel only from pid 1 of the sandbox, a {'C'}
 * only with a connected TCP socket and an {'L'} only with a listening TCP socket on loopback
 * outside the gateway's own network namespace. Without a socket there (no policy allows
 * anything) a connection is closed at once. The listener is pid 1's own rather than a process
 * of its own: an idle pool member is then two processes, not three, and its start spends no
 * fork and exec on a listener most sandboxes never use.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h> /* rename only: no stdio stream is used */
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#define VERSION 1
#define MAX_MESSAGE (128 * 1024)
#define MAX_STRINGS 4096
#define MAX_EXECS 256
#define MAX_FDS 8
#define HEADER 16
#define CONNECT_ATTEMPTS 600
#define EGRESS_SOCKET "/run/warmshell/egress/proxy.sock"

enum { REJ_SIZE = 1, REJ_TYPE = 2, REJ_FDS = 3, REJ_STRINGS = 4, REJ_ID = 5, REJ_FULL = 6, REJ_SIGNAL = 7,
       REJ_TRUNCATED = 8 };
enum { STAGE_CHDIR = 1, STAGE_EXEC = 2, STAGE_FORK = 3 };

extern char **environ;

static int ctl = -1;
/* How the agent ends when its supervisor goes: 0 for the local driver (the sandbox is over); 1 on
 * Kubernetes ("--connect"), so that the kubelet (restartPolicy OnFailure) starts the workload
 * container again beside a restarted supervisor. */
static int end_status = 0;
/* The egress listener's port (argv[2] after an inherited socket's fd; the local driver), or none. */
static const char *egress_port = NULL;
/* The hand-off channel to the gateway's proxy (-1: none yet), a connection waiting for it, and
 * whether the gateway holds the listener over that channel (the agent then leaves it alone). */
static int handoff = -1;
static int pending = -1;
static int listener_handed = 0;
static struct { pid_t pid; uint32_t id; } execs[MAX_EXECS];
static char message[MAX_MESSAGE + 1];  /* one byte more than allowed, to see an oversized one */
static char *strings[2 * MAX_STRINGS + 3];

static void die(void) {
    /* As pid 1: the kernel SIGKILLs every other process of the namespace as it exits (walking the
     * namespace's own pids). kill(-1) would do the same by walking every process on the host:
     * O(host), where a host with a pool of 1,000 members has thousands. */
    _exit(end_status);
}

static void reply(uint32_t type, uint32_t id, uint32_t a, uint32_t b) {
    uint32_t record[4] = {type, id, a, b};
    while (send(ctl, record, sizeof record, MSG_NOSIGNAL) < 0)
        if (errno != EINTR) die();  /* the host is gone */
}

static uint32_t field(int index) {
    uint32_t value;
    memcpy(&value, message + 4 * index, sizeof value);
    return value;
}

static int find(uint32_t id) {
    for (int i = 0; i < MAX_EXECS; i++)
        if (execs[i].pid > 0 && execs[i].id == id) return i;
    return -1;
}

static void close_all(const int *fds, int nfds) {
    for (int i = 0; i < nfds; i++) close(fds[i]);
}

/* Splits message[HEADER..size) into exactly `count` NUL-terminated strings; 0 on success. */
static int split(size_t size, uint32_t count) {
    size_t at = HEADER;
    for (uint32_t i = 0; i < count; i++) {
        if (at >= size) return -1;
        char *end = memchr(message + at, '\0', size - at);
        if (end == NULL) return -1;
        strings[i] = message + at;
        at = (size_t)(end - message) + 1;
    }
    return at == size ? 0 : -1;
}

static void child(char **argv, char **envp, const char *cwd, const int *fds, int report, int tty) {
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    /* Every signal's default action: an ignored one stays ignored across exec, and a gateway
       started by nohup or in a script's background ignores SIGHUP, or SIGINT and SIGQUIT. */
    for (int number = 1; number < NSIG; number++)
        if (number != SIGKILL && number != SIGSTOP) signal(number, SIG_DFL);
    if (tty) {
        if (setsid() < 0) goto fail_setup;  /* a session (and group) of its own, without a terminal */
    } else {
        setpgid(0, 0);  /* its own group: a signal reaches everything it starts */
    }
    for (int i = 0; i < 3; i++)
        if (dup2(fds[i], i) < 0) goto fail_setup;
    if (tty && ioctl(0, TIOCSCTTY, 0) < 0) goto fail_setup;  /* the terminal it was given, nothing else */
    if (dup3(report, 3, O_CLOEXEC) < 0) goto fail_setup;
    syscall(SYS_close_range, 4, ~0U, 0);  /* nothing of the agent's survives into the command */
    int stage = STAGE_CHDIR;
    if (chdir(cwd) == 0) {
        stage = STAGE_EXEC;
        environ = envp;  /* execvp searches the command's own PATH */
        execvp(argv[0], argv);
    }
    int failure[2] = {stage, errno};
    (void)!write(3, failure, sizeof failure);
    _exit(127);
fail_setup:;
    int setup[2] = {STAGE_FORK, errno};
    (void)!write(report, setup, sizeof setup);
    _exit(127);
}

static void start(size_t size, const int *fds, int nfds, int tty) {
    uint32_t id = field(1), argc = field(2), envc = field(3);
    if (nfds != 3) { close_all(fds, nfds); reply('R', id, REJ_FDS, 0); return; }
    if (argc < 1 || argc > MAX_STRINGS || envc > MAX_STRINGS || split(size, 1 + argc + envc) != 0) {
        close_all(fds, nfds); reply('R', id, REJ_STRINGS, 0); return;
    }
    if (id == 0 || find(id) >= 0) { close_all(fds, nfds); reply('R', id, REJ_ID, 0); return; }
    int slot = -1;
    for (int i = 0; i < MAX_EXECS && slot < 0; i++)
        if (execs[i].pid == 0) slot = i;
    if (slot < 0) { close_all(fds, nfds); reply('R', id, REJ_FULL, 0); return; }
    /* argv and envp as NULL-terminated arrays, in place after the strings they point into */
    char *cwd = strings[0];
    char **argv = strings + 1;
    memmove(argv + argc + 1, argv + argc, envc * sizeof *argv);
    argv[argc] = NULL;
    char **envp = argv + argc + 1;
    envp[envc] = NULL;
    int report[2];
    if (pipe2(report, O_CLOEXEC) < 0) { close_all(fds, nfds); reply('F', id, STAGE_FORK, (uint32_t)errno); return; }
    pid_t pid = fork();
    if (pid == 0) child(argv, envp, cwd, fds, report[1], tty);
    int fork_errno = errno;
    close_all(fds, nfds);
    close(report[1]);
    if (pid < 0) { close(report[0]); reply('F', id, STAGE_FORK, (uint32_t)fork_errno); return; }
    int failure[2];
    ssize_t got;
    do got = read(report[0], failure, sizeof failure); while (got < 0 && errno == EINTR);
    close(report[0]);
    if (got == (ssize_t)sizeof failure) {  /* it never ran: reap it here, report why */
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {}
        reply('F', id, (uint32_t)failure[0], (uint32_t)failure[1]);
        return;
    }
    execs[slot].pid = pid;
    execs[slot].id = id;
    reply('S', id, (uint32_t)pid, 0);
}

static void signal_exec(size_t size, int nfds) {
    uint32_t id = field(1), signo = field(2);
    if (size != HEADER || field(3) != 0) { reply('R', id, REJ_SIZE, 0); return; }
    if (nfds != 0) { reply('R', id, REJ_FDS, 0); return; }
    if (signo < 1 || signo > 64) { reply('R', id, REJ_SIGNAL, 0); return; }
    int slot = find(id);
    if (slot >= 0) kill(-execs[slot].pid, (int)signo);  /* unknown: it already ended */
}

static void ping(size_t size, int nfds) {
    uint32_t id = field(1);
    if (size != HEADER || field(2) != 0 || field(3) != 0) { reply('R', id, REJ_SIZE, 0); return; }
    if (nfds != 0) { reply('R', id, REJ_FDS, 0); return; }
    reply('O', id, 0, 0);
}

/* One message of `size` bytes at `data` with `fd` attached (SCM_RIGHTS); sendmsg's result. */
static ssize_t send_fd(int to, void *data, size_t size, int fd, int flags) {
    char control[CMSG_SPACE(sizeof(int))] = {0};
    struct iovec iov = {data, size};
    struct msghdr header = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control, .msg_controllen = sizeof control};
    struct cmsghdr *c = CMSG_FIRSTHDR(&header);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof fd);
    return sendmsg(to, &header, MSG_NOSIGNAL | flags);
}

/* Answers ROOT with an O_PATH fd on this process's root. It grants the supervisor nothing the
 * workload lacks: the supervisor resolves every path under it with RESOLVE_IN_ROOT, with the
 * workload's uid, so what it reaches is what the workload could. */
static void root_dir(size_t size, int nfds) {
    uint32_t id = field(1);
    if (size != HEADER || field(2) != 0 || field(3) != 0) { reply('R', id, REJ_SIZE, 0); return; }
    if (nfds != 0) { reply('R', id, REJ_FDS, 0); return; }
    int fd = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) { reply('D', id, (uint32_t)errno, 0); return; }
    uint32_t record[4] = {'D', id, 0, 0};
    while (send_fd(ctl, record, sizeof record, fd, 0) < 0)
        if (errno != EINTR) die();  /* the host is gone */
    close(fd);
}

static void finish(size_t size, int nfds) {
    if (size != HEADER || field(1) != 0 || field(2) != 0 || field(3) != 0) { reply('R', 0, REJ_SIZE, 0); return; }
    if (nfds != 0) { reply('R', 0, REJ_FDS, 0); return; }
    end_status = 0;
    die();
}

static void serve_one(void) {
    char control[CMSG_SPACE(MAX_FDS * sizeof(int))];
    struct iovec iov = {message, sizeof message};
    struct msghdr header = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control, .msg_controllen = sizeof control};
    ssize_t got = recvmsg(ctl, &header, MSG_CMSG_CLOEXEC);
    if (got < 0 && errno == EINTR) return;
    if (got <= 0) die();  /* the supervisor closed the socket (or it broke): the sandbox ends */
    int fds[MAX_FDS], nfds = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&header); c != NULL; c = CMSG_NXTHDR(&header, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < n && nfds < MAX_FDS; i++) memcpy(&fds[nfds++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
    }
    size_t size = (size_t)got;
    uint32_t id = size >= 8 ? field(1) : 0;
    if ((header.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) || size > MAX_MESSAGE) {
        close_all(fds, nfds); reply('R', id, REJ_TRUNCATED, 0); return;
    }
    if (size < HEADER) { close_all(fds, nfds); reply('R', id, REJ_SIZE, 0); return; }
    switch (field(0)) {
    case 'X': start(size, fds, nfds, 0); return;
    case 'T': start(size, fds, nfds, 1); return;
    case 'K': close_all(fds, nfds); signal_exec(size, nfds); return;
    case 'P': close_all(fds, nfds); ping(size, nfds); return;
    case 'Q': close_all(fds, nfds); finish(size, nfds); return;
    case 'G': close_all(fds, nfds); root_dir(size, nfds); return;
    default: close_all(fds, nfds); reply('R', id, REJ_TYPE, 0); return;
    }
}

static void reap(int signals) {
    struct signalfd_siginfo info;
    while (read(signals, &info, sizeof info) > 0) {}
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {  /* orphans of the workload too */
        for (int i = 0; i < MAX_EXECS; i++)
            if (execs[i].pid == pid) {
                execs[i].pid = 0;
                reply('E', execs[i].id, (uint32_t)status, 0);
            }
    }
}

/* The listener on 127.0.0.1:port; -1 when it cannot be made (the sandbox has no way out). */
static int egress_listener(const char *port_text) {
    char *end = NULL;
    long port = strtol(port_text, &end, 10);
    if (end == NULL || *end != '\0' || port < 1 || port > 65535) return -1;
    int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int yes = 1;
    struct sockaddr_in address = {0};
    address.sin_family = AF_INET;
    address.sin_port = htons((uint16_t)port);
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (listener < 0 || setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes) < 0 ||
        bind(listener, (struct sockaddr *)&address, sizeof address) < 0 || listen(listener, 128) < 0) {
        if (listener >= 0) close(listener);
        return -1;
    }
    return listener;
}

/* The hand-off channel: a SOCK_SEQPACKET connection to EGRESS_SOCKET, made at the first
 * connection and again after the gateway closed it (the proxy's socket is replaced when the
 * sandbox is activated again). Non-blocking: pid 1 never waits on the gateway. */
static int handoff_channel(void) {
    if (handoff >= 0) return handoff;
    struct sockaddr_un address = {.sun_family = AF_UNIX};
    strcpy(address.sun_path, EGRESS_SOCKET);
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return -1;
    if (connect(fd, (struct sockaddr *)&address, sizeof address) < 0) {  /* ENOENT: no policy, no way out */
        close(fd);
        return -1;
    }
    return handoff = fd;
}

static void close_channel(void) {
    close(handoff);
    handoff = -1;
    listener_handed = 0;
}

/* One record {'C'} with `client` attached: 0 sent, 1 the channel is full for now (try again
 * when it is writable), -1 not sent (no proxy socket, or the gateway is gone). */
static int send_client(int client) {
    char record = 'C';
    for (int attempt = 0; attempt < 2; attempt++) {  /* a closed channel is made once more */
        if (handoff_channel() < 0) return -1;
        ssize_t sent;
        do sent = send_fd(handoff, &record, 1, client, MSG_DONTWAIT); while (sent < 0 && errno == EINTR);
        if (sent == 1) return 0;
        if (errno == EAGAIN) return 1;
        close_channel();
    }
    return -1;
}

/* Hands the listener over the channel {'L'}: the gateway accepts on it from now on. Not sent
 * (the channel full or broken) it stays the agent's, and the next connection tries again. */
static void send_listener(int listener) {
    char record = 'L';
    ssize_t sent;
    do sent = send_fd(handoff, &record, 1, listener, MSG_DONTWAIT); while (sent < 0 && errno == EINTR);
    if (sent == 1) listener_handed = 1;
    else if (errno != EAGAIN) close_channel();
}

/* The channel of a handed listener is readable: the gateway closed it (it never writes to it),
 * and the listener is the agent's again. */
static void channel_readable(void) {
    char drop;
    ssize_t got = recv(handoff, &drop, 1, MSG_DONTWAIT);
    if (got < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (got <= 0) close_channel();
}

/* Hands the waiting connection to the gateway's proxy, which reads and writes the socket itself
 * (one process and two socket hops fewer per byte than a relay copying it over a Unix socket,
 * and no fork per connection), then the listener, so that the gateway accepts the next ones
 * without waking pid 1. A connection the channel cannot take yet waits in `pending`, and the
 * listener is not polled until it went. */
static void accept_egress(int listener) {
    for (;;) {
        int client = pending;
        pending = -1;
        if (client < 0) client = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
        if (client < 0) {  /* EAGAIN: none left */
            /* out of descriptors or memory host-wide: a pause, not a spin of pid 1 on a listener
             * that stays readable (a waiting client is served once it passes) */
            if (errno == EMFILE || errno == ENFILE || errno == ENOMEM || errno == ENOBUFS) usleep(10000);
            return;
        }
        int sent = send_client(client);
        if (sent == 1) {
            pending = client;
            return;
        }
        close(client);  /* sent: the gateway holds its own; not sent: refused, the next may fare better */
        if (sent == 0) {
            send_listener(listener);
            if (listener_handed) return;
        }
    }
}

static int connect_to(const char *path) {
    struct sockaddr_un address = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof address.sun_path) return -1;
    strcpy(address.sun_path, path);
    for (int attempt = 0; attempt < CONNECT_ATTEMPTS; attempt++) {
        int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        if (fd < 0) return -1;
        if (connect(fd, (struct sockaddr *)&address, sizeof address) == 0) return fd;
        int error = errno;
        close(fd);
        if (error != ENOENT && error != ECONNREFUSED && error != EINTR) return -1;
        usleep(100000);
    }
    return -1;
}

static int control_socket(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--connect") == 0) {
        end_status = 1;
        return connect_to(argv[2]);
    }
    char *end = NULL;
    long fd = argc == 2 || argc == 3 ? strtol(argv[1], &end, 10) : -1;
    if (end == NULL || *end != '\0' || fd < 3 || fd > 1 << 20) return -1;
    if (argc == 3) egress_port = argv[2];
    return (int)fd;
}

/* Write the strings to fd, then a newline (no stdio: it would add a fifth to the agent's size,
 * and every pod holds its own copy of the file). */
static void say(int fd, const char *const *parts) {
    for (; *parts != NULL; parts++)
        if (write(fd, *parts, strlen(*parts)) < 0) return;
    if (write(fd, "\n", 1) < 0) return;
}

/* Copy the open file in to out; 0, or -1 with errno. */
static int copy_all(int in, int out) {
    static char buffer[65536];
    for (;;) {
        ssize_t got = read(in, buffer, sizeof buffer);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return (int)got;
        for (ssize_t done = 0; done < got;) {
            ssize_t put = write(out, buffer + done, (size_t)(got - done));
            if (put < 0 && errno == EINTR) continue;
            if (put < 0) return -1;
            done += put;
        }
    }
}

/* "--install DIR" (see the top): 0 when DIR/warmshell-agent is this program, else 1. */
static int install(const char *directory) {
    char partial[4096], target[4096];
    size_t length = strlen(directory);
    if (length + sizeof "/.warmshell-agent.tmp" > sizeof partial) {
        errno = ENAMETOOLONG;
        goto failed;
    }
    memcpy(partial, directory, length);
    memcpy(partial + length, "/.warmshell-agent.tmp", sizeof "/.warmshell-agent.tmp");
    memcpy(target, directory, length);
    memcpy(target + length, "/warmshell-agent", sizeof "/warmshell-agent");
    int in = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
    if (in < 0) goto failed;
    int out = open(partial, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0755);
    /* The mode whatever the umask, as the Python installer's chmod did. */
    if (out < 0 || copy_all(in, out) < 0 || fchmod(out, 0755) < 0 || close(out) < 0) goto failed;
    if (rename(partial, target) < 0) goto failed;
    say(1, (const char *const[]){target, NULL});
    return 0;
failed:
    say(2, (const char *const[]){"warmshell-agent --install: ", directory, ": ", strerror(errno), NULL});
    return 1;
}

int main(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "--install") == 0) {
        if (argc == 3) return install(argv[2]);
        say(2, (const char *const[]){"usage: warmshell-agent --install DIRECTORY", NULL});
        return 2;
    }
    prctl(PR_SET_DUMPABLE, 0);  /* the workload shares our uid: no ptrace, no /proc/1/mem */
    prctl(PR_SET_NAME, "warmshell-agent");
    if (getpid() != 1) return 3;  /* only an init's exit ends everything it started */
    for (int i = 0; i < 3; i++)  /* keep 0-2 taken, so received fds never land on them */
        if (fcntl(i, F_GETFD) < 0 && open("/dev/null", O_RDWR) != i) return 2;
    ctl = control_socket(argc, argv);
    if (ctl < 0) return 2;
    int type;
    socklen_t length = sizeof type;
    if (getsockopt(ctl, SOL_SOCKET, SO_TYPE, &type, &length) < 0 || type != SOCK_SEQPACKET) return 2;
    if (fcntl(ctl, F_SETFD, FD_CLOEXEC) < 0) return 2;
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    sigprocmask(SIG_BLOCK, &mask, NULL);
    int signals = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    if (signals < 0) return 2;
    int listener = egress_port != NULL ? egress_listener(egress_port) : -1;
    reply('H', 0, (uint32_t)getpid(), VERSION);
    for (;;) {
        struct pollfd wait_for[3] = {{ctl, POLLIN, 0}, {signals, POLLIN, 0}, {listener, POLLIN, 0}};
        if (pending >= 0) wait_for[2] = (struct pollfd){handoff, POLLOUT, 0};  /* the listener waits meanwhile */
        else if (listener_handed) wait_for[2] = (struct pollfd){handoff, POLLIN, 0};  /* the gateway accepts */
        if (poll(wait_for, 3, -1) < 0) {
            if (errno == EINTR) continue;
            die();
        }
        if (wait_for[1].revents & POLLIN) reap(signals);
        if (wait_for[2].revents && listener_handed) channel_readable();
        else if (wait_for[2].revents) accept_egress(listener);
        if (wait_for[0].revents & (POLLIN | POLLHUP | POLLERR)) serve_one();
    }
}
