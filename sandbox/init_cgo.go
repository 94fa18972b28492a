//go:build cgo && linux

package sandbox

// The init step done before the Go runtime starts, as runc's nsexec does: a C constructor runs when
// the binary is re-executed as "sbx-init", pid 1 of a new pid and mount namespace: it joins the job's
// cgroups (v1), reads the job, mounts a fresh /proc, starts the job's program as its child and reaps
// until the namespace is empty (init.go). Starting the Go runtime and every package's init functions
// first costs tens of milliseconds in a binary as large as sbx; the constructor costs the exec alone.
// Without cgo, MaybeInit does the same in Go. The arguments, descriptors and status messages are
// those of initArgs, statusFD, jobFD and jobMessage.

/*
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

// sbx_fail_fd is where sbx_init_fail reports: the status pipe (fd 3), or in the job's child before
// its exec the pipe to the init.
static int sbx_fail_fd = 3;

// sbx_init_fail reports a failure on sbx_fail_fd and exits.
static void sbx_init_fail(const char *what, const char *arg) {
	char buf[1024];
	int n = snprintf(buf, sizeof buf, "%s %s: %s", what, arg, strerror(errno));
	if (n > (int)sizeof buf - 1)
		n = sizeof buf - 1;
	if (n > 0) {
		ssize_t w = write(sbx_fail_fd, buf, n);
		(void)w;
	}
	_exit(1);
}

// sbx_now is CLOCK_MONOTONIC in nanoseconds: the stamps of the status messages (Process.Stages).
static long long sbx_now(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

// sbx_join writes this process's pid into each of n cgroup.procs files.
static void sbx_join(long n, char **procs) {
	char pid[32];
	int len = snprintf(pid, sizeof pid, "%d", (int)getpid());
	for (long i = 0; i < n; i++) {
		int fd = open(procs[i], O_WRONLY | O_CLOEXEC);
		if (fd < 0)
			sbx_init_fail("join cgroup", procs[i]);
		if (write(fd, pid, len) != len)
			sbx_init_fail("join cgroup", procs[i]);
		close(fd);
	}
}

// sbx_id parses one decimal id of a credential up to the character stop, advancing *s past it.
static unsigned long sbx_id(const char **s, char stop, const char *cred) {
	char *end;
	errno = EINVAL;
	if (**s < '0' || **s > '9')
		sbx_init_fail("init: credential", cred);
	unsigned long v = strtoul(*s, &end, 10);
	if (*end != stop || v > 0xffffffffUL)
		sbx_init_fail("init: credential", cred);
	*s = end + (stop != '\0');
	return v;
}

// sbx_drop switches to the credential "uid:gid:g1,g2,..." ("-": stay). Only the job's process does,
// after the init joined the cgroups (writing cgroup.procs needs the runner's privileges); the init
// stays the runner's user, which the job cannot signal or trace.
static void sbx_drop(const char *cred) {
	if (strcmp(cred, "-") == 0)
		return;
	const char *s = cred;
	uid_t uid = sbx_id(&s, ':', cred);
	gid_t gid = sbx_id(&s, ':', cred);
	size_t n = 0;
	for (const char *c = s; *c; c++)
		if (*c == ',')
			n++;
	gid_t *groups = calloc(n + 1, sizeof(gid_t));
	if (groups == NULL)
		sbx_init_fail("init:", "out of memory");
	size_t ngroups = 0;
	while (*s) {
		const char *comma = strchr(s, ',');
		groups[ngroups++] = sbx_id(&s, comma ? ',' : '\0', cred);
	}
	if (setgroups(ngroups, groups) < 0)
		sbx_init_fail("setgroups", cred);
	if (setgid(gid) < 0)
		sbx_init_fail("setgid", cred);
	if (setuid(uid) < 0)
		sbx_init_fail("setuid", cred);
	free(groups);
}

// sbx_count parses a count of arguments that must leave at least min more of avail.
static long sbx_count(const char *s, long avail) {
	char *end;
	errno = EINVAL;
	long n = strtol(s, &end, 10);
	if (*end != '\0' || n < 0 || n > avail)
		sbx_init_fail("init:", "malformed arguments");
	return n;
}

// sbx_read_all reads fd to EOF (at most 8 MiB) into a new buffer, sets *lenp and closes fd.
static char *sbx_read_all(int fd, size_t *lenp, const char *what) {
	size_t cap = 1 << 16, len = 0;
	char *buf = malloc(cap);
	if (buf == NULL)
		sbx_init_fail("init:", "out of memory");
	for (;;) {
		if (len == cap) {
			if (cap >= (8u << 20)) {
				errno = E2BIG;
				sbx_init_fail("init:", what);
			}
			cap *= 2;
			buf = realloc(buf, cap);
			if (buf == NULL)
				sbx_init_fail("init:", "out of memory");
		}
		ssize_t r = read(fd, buf + len, cap - len);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			sbx_init_fail("init: read", what);
		if (r == 0)
			break;
		len += r;
	}
	close(fd);
	*lenp = len;
	return buf;
}

// sbx_fields splits buf (len bytes of NUL-terminated fields) into a NULL-terminated array of
// pointers into it, with one spare slot, and sets *n to the number of fields.
static char **sbx_fields(char *buf, size_t len, long *n, const char *what) {
	long nfields = 0;
	for (size_t i = 0; i < len; i++)
		if (buf[i] == '\0')
			nfields++;
	errno = EINVAL;
	if (len > 0 && buf[len - 1] != '\0')
		sbx_init_fail("init: malformed", what);
	char **fields = calloc(nfields + 2, sizeof(char *));
	if (fields == NULL)
		sbx_init_fail("init:", "out of memory");
	for (size_t i = 0, f = 0; i < len; f++) {
		fields[f] = buf + i;
		i += strlen(buf + i) + 1;
	}
	*n = nfields;
	return fields;
}

// sbx_write writes all of buf to fd; a failure ends the init (the runner is gone).
static void sbx_write(int fd, const char *buf, size_t len) {
	while (len > 0) {
		ssize_t w = write(fd, buf, len);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			_exit(1);
		buf += w;
		len -= w;
	}
}

// sbx_run_job is the job's child of the init: its own process group, the job's credential and
// directory, then the program. With tty its descriptor 0 is the job's terminal: it starts a session
// of its own (its own group too) and makes the terminal its controlling terminal, as exec.Cmd's
// Setsid and Setctty do, so that the kernel sends it SIGWINCH on a resize and SIGHUP when the
// terminal goes; the init, not a session leader, never gets one. Before the exec it writes its pid
// as the host sees it ("pid N\n", read through the host's /proc, still open as oldproc) on fd; a
// failure after that follows it as text. The line is stamped when it is written ("pid N T\n", T
// from sbx_now): the program is executed right after, without waiting for anything.
static void sbx_run_job(int fd, int oldproc, int tty, char *cred, char *dir, char *path, char **argv, char **envp) {
	sbx_fail_fd = fd;
	close(3);
	if (tty) {
		if (setsid() < 0)
			sbx_init_fail("init:", "setsid");
		// 0: take the terminal only if no session has it (nobody does: it is the job's alone).
		if (ioctl(0, TIOCSCTTY, 0) < 0)
			sbx_init_fail("init: controlling terminal", "TIOCSCTTY");
	} else if (setpgid(0, 0) < 0)
		sbx_init_fail("init:", "setpgid");
	char self[32], line[80];
	ssize_t n = readlinkat(oldproc, "self", self, sizeof self - 1);
	if (n <= 0)
		sbx_init_fail("init: read host pid from", "/proc/self");
	self[n] = '\0';
	int len = snprintf(line, sizeof line, "pid %s %lld\n", self, sbx_now());
	sbx_write(fd, line, len);
	close(oldproc);
	sbx_drop(cred);
	if (chdir(dir) < 0)
		sbx_init_fail("chdir", dir);
	execve(path, argv, envp);
	sbx_init_fail("exec", path);
}

// sbx_init_main is the init step: pid 1 of a new pid and mount namespace (Start clones it so), in
// the job's cgroups once n cgroup.procs files are joined (v1; v2 clones it into the cgroup). It tells
// the runner it joined ("+T\n" on fd 3, T from sbx_now), makes every mount private and mounts a
// fresh /proc, so that the job sees its own processes only, reads the job on fd 5: NUL-terminated
// fields seccomp, tty, credential, dir, path, argc, argv..., envc, env... (jobMessage; a warm step
// waits there until a job comes), and starts the job's program as its child. It reports "pid N\n" (the job's pid on the host)
// or a failure, then "status W L T\n" (the job's wait status; L 1 when other processes of the
// namespace live on, else 0; stamped when it was reaped) when the job's process ends, and reaps
// whatever else is left until the namespace is empty. Descriptors 4 and 6 hold a readonly job's
// seccomp program and environment (bwrap's --args); they are closed unless the seccomp field is "1".
static void sbx_init_main(long n, char **procs) {
	errno = EINVAL;
	if (getpid() != 1)
		sbx_init_fail("init:", "not pid 1 of a new pid namespace");
	sbx_join(n, procs);
	char joined[32];
	int jlen = snprintf(joined, sizeof joined, "+%lld\n", sbx_now());
	if (write(3, joined, jlen) != jlen)
		sbx_init_fail("init:", "status pipe");
	// The mounts are the same for every job: a warm step makes them before its job comes (0.14 ms
	// of a warm start here).
	// Private: nothing mounted here (the fresh /proc, bwrap's sandbox) reaches the host, and nothing
	// the host mounts later reaches the job (bwrap makes its mounts slaves of this namespace).
	if (mount("none", "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
		sbx_init_fail("init:", "make mounts private");
	// The host's /proc stays reachable through oldproc only, to read the job's host pid: detached,
	// it is not under the fresh one, where a job with every capability could unmount to it.
	// Above the job's descriptors (0 to 6), some of which may be free now and are closed later.
	int procfd = open("/proc", O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (procfd < 0)
		sbx_init_fail("init: open", "/proc");
	int oldproc = fcntl(procfd, F_DUPFD_CLOEXEC, 10);
	if (oldproc < 0)
		sbx_init_fail("init: open", "/proc");
	close(procfd);
	if (umount2("/proc", MNT_DETACH) < 0)
		sbx_init_fail("init: detach", "/proc");
	if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0)
		sbx_init_fail("init: mount", "/proc");
	size_t len;
	char *buf = sbx_read_all(5, &len, "job message");
	long nfields;
	char **fields = sbx_fields(buf, len, &nfields, "job message");
	errno = EINVAL;
	if (nfields < 7)
		sbx_init_fail("init:", "malformed job message");
	char *seccomp = fields[0], *cred = fields[2], *dir = fields[3], *path = fields[4];
	int tty = strcmp(fields[1], "1") == 0;
	long argc = sbx_count(fields[5], nfields - 7);
	char **argv = fields + 6;
	long envc = sbx_count(fields[6 + argc], nfields - 7 - argc);
	char **envp = fields + 7 + argc;
	if (7 + argc + envc != nfields)
		sbx_init_fail("init:", "malformed job message");
	// Both lists must end with NULL: argv's end is the envc field, parsed already, and envp's is the
	// spare slot sbx_fields left after the last field.
	argv[argc] = NULL;
	envp[envc] = NULL;
	if (strcmp(seccomp, "1") != 0) {
		close(4);
		close(6);
	}
	// Above the job's descriptors (0 to 6), which the init closes once the job has them.
	int p[2];
	if (pipe2(p, O_CLOEXEC) < 0)
		sbx_init_fail("init:", "pipe");
	for (int i = 0; i < 2; i++) {
		int fd = fcntl(p[i], F_DUPFD_CLOEXEC, 10);
		if (fd < 0)
			sbx_init_fail("init:", "pipe");
		close(p[i]);
		p[i] = fd;
	}
	// vfork: the child borrows the init's memory until it executes the program, and the init waits
	// for that. A fork copied the page tables of this large binary and then took a fault on every
	// page either side wrote: over a millisecond of each job's start, where page faults are dear (a
	// virtual machine's). The child only makes system calls, allocates (sbx_drop) and sets
	// sbx_fail_fd, which the init sets back; the init is single-threaded and its signals are the
	// defaults, so nothing runs in the borrowed memory meanwhile.
	pid_t job = vfork();
	if (job < 0)
		sbx_init_fail("init:", "fork");
	if (job == 0) {
		close(p[0]);
		sbx_run_job(p[1], oldproc, tty, cred, dir, path, argv, envp);
	}
	sbx_fail_fd = 3;
	close(p[1]);
	close(oldproc);
	// The job has its own copies: the init keeps nothing of the job's, so that the job's output reaches
	// EOF and its input is closed when the job's processes let go of them.
	for (int fd = 0; fd <= 6; fd++)
		if (fd != 3)
			close(fd);
	size_t rlen;
	char *report = sbx_read_all(p[0], &rlen, "job start");
	char *nl = memchr(report, '\n', rlen);
	if (rlen < 5 || strncmp(report, "pid ", 4) != 0 || nl == NULL || nl != report + rlen - 1) {
		// The job did not start: the text after its pid line says why.
		char *why = nl != NULL ? nl + 1 : report;
		sbx_write(3, why, report + rlen - why);
		_exit(1);
	}
	sbx_write(3, report, rlen);
	int code = 1;
	for (;;) {
		int st;
		pid_t w = waitpid(-1, &st, 0);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			break; // ECHILD: the namespace is empty
		if (w == job) {
			long long at = sbx_now();
			// left: whether other processes of the namespace live on. Every one of them is a
			// descendant of the init (orphans are reparented to it), so none is left when waitpid
			// finds no child after reaping those already exited.
			int zst;
			pid_t z;
			while ((z = waitpid(-1, &zst, WNOHANG)) > 0 || (z < 0 && errno == EINTR))
				;
			int left = !(z < 0 && errno == ECHILD);
			char line[80];
			int l = snprintf(line, sizeof line, "status %d %d %lld\n", st, left, at);
			sbx_write(3, line, l);
			code = WIFSIGNALED(st) ? 128 + WTERMSIG(st) : WEXITSTATUS(st);
		}
	}
	_exit(code);
}

#ifdef __GLIBC__
// glibc passes argc, argv and envp to constructors; elsewhere MaybeInit does the work in Go.
__attribute__((constructor)) static void sbx_init(int argc, char **argv) {
	if (argc < 2 || argv[0] == NULL || strcmp(argv[0], "sbx-init") != 0)
		return;
	long n = sbx_count(argv[1], argc - 2);
	if (n != argc - 2) {
		errno = EINVAL;
		sbx_init_fail("init:", "malformed arguments");
	}
	sbx_init_main(n, argv + 2);
}
#endif
*/
import "C"

// warmInit reports that this build can keep pre-joined init steps (see warm.go).
const warmInit = true
