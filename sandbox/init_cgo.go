//go:build cgo && linux

package sandbox

// The v1 init step done before the Go runtime starts, as runc's nsexec does: a C constructor runs
// when the binary is re-executed as "sbx-init", joins the job's cgroups and execs the job's program.
// Starting the Go runtime and every package's init functions first costs tens of milliseconds in a
// binary as large as sbx; the constructor costs the exec alone. Without cgo, MaybeInit does the same
// in Go (see init.go). The arguments and the status pipe are those of initArgs and statusFD.

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
#include <sys/mount.h>
#include <sys/prctl.h>
#include <unistd.h>

// sbx_init_fail reports a failure on the status pipe (fd 3) and exits.
static void sbx_init_fail(const char *what, const char *arg) {
	char buf[1024];
	int n = snprintf(buf, sizeof buf, "%s %s: %s", what, arg, strerror(errno));
	if (n > (int)sizeof buf - 1)
		n = sizeof buf - 1;
	if (n > 0) {
		ssize_t w = write(3, buf, n);
		(void)w;
	}
	_exit(1);
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

// sbx_drop switches to the credential "uid:gid:g1,g2,..." ("-": stay), after the cgroups were joined:
// writing cgroup.procs needs the runner's privileges. A credential change clears the parent-death
// signal, so it is armed again and the parent checked: a runner that died meanwhile must not leave
// the job running.
static void sbx_drop(const char *cred, pid_t parent) {
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
	if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0)
		sbx_init_fail("init:", "parent-death signal");
	if (getppid() != parent) {
		errno = ESRCH;
		sbx_init_fail("init:", "the runner exited");
	}
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

// sbx_warm tells the runner it joined its cgroups (one '+' on the status pipe), waits for the job on
// fd 5: NUL-terminated fields seccomp, credential, dir, path, argc, argv..., envc, env...
// (warmMessage), and runs the job as the cold init step does. Descriptors 4 and 6 hold a readonly
// job's seccomp program and environment (bwrap's --args); they are closed unless the seccomp field
// is "1".
static void sbx_warm(pid_t parent) {
	if (write(3, "+", 1) != 1)
		sbx_init_fail("init:", "status pipe");
	size_t len;
	char *buf = sbx_read_all(5, &len, "job message");
	long nfields;
	char **fields = sbx_fields(buf, len, &nfields, "job message");
	errno = EINVAL;
	if (nfields < 6)
		sbx_init_fail("init:", "malformed job message");
	char *seccomp = fields[0], *cred = fields[1], *dir = fields[2], *path = fields[3];
	long argc = sbx_count(fields[4], nfields - 6);
	char **argv = fields + 5;
	long envc = sbx_count(fields[5 + argc], nfields - 6 - argc);
	char **envp = fields + 6 + argc;
	if (6 + argc + envc != nfields)
		sbx_init_fail("init:", "malformed job message");
	if (strcmp(seccomp, "1") != 0) {
		close(4);
		close(6);
	}
	// A readonly job gets a private mount namespace before bwrap, as Start gives it on the cold path
	// (SysProcAttr.Unshareflags): nothing the host mounts later propagates into the sandbox.
	if (strcmp(seccomp, "1") == 0) {
		if (unshare(CLONE_NEWNS) < 0)
			sbx_init_fail("init:", "unshare mount namespace");
		if (mount("none", "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
			sbx_init_fail("init:", "make mounts private");
	}
	// Both lists must end with NULL: argv's end is the envc field, parsed already, and envp's is the
	// spare slot calloc left after the last field.
	argv[argc] = NULL;
	envp[envc] = NULL;
	sbx_drop(cred, parent);
	if (chdir(dir) < 0)
		sbx_init_fail("chdir", dir);
	if (fcntl(3, F_SETFD, FD_CLOEXEC) < 0)
		sbx_init_fail("init:", "status pipe");
	execve(path, argv, envp);
	sbx_init_fail("exec", path);
}

#ifdef __GLIBC__
// glibc passes argc, argv and envp to constructors; elsewhere MaybeInit does the work in Go.
__attribute__((constructor)) static void sbx_init(int argc, char **argv) {
	if (argc < 2 || argv[0] == NULL)
		return;
	pid_t parent = getppid();
	if (strcmp(argv[0], "sbx-init-warm") == 0) {
		long n = sbx_count(argv[1], argc - 2);
		sbx_join(n, argv + 2);
		sbx_warm(parent);
	}
	if (argc < 4 || strcmp(argv[0], "sbx-init") != 0)
		return;
	const char *cred = argv[1];
	long n = sbx_count(argv[2], argc - 4);
	sbx_join(n, argv + 3);
	sbx_drop(cred, parent);
	// The runner entered the directory before the drop; the job must be allowed to as well.
	if (strcmp(cred, "-") != 0 && chdir(".") < 0)
		sbx_init_fail("chdir", "to the working directory");
	if (fcntl(3, F_SETFD, FD_CLOEXEC) < 0)
		sbx_init_fail("init:", "status pipe");
	// This process started with no environment: the job's comes on fd 5 (initEnv).
	size_t len;
	char *buf = sbx_read_all(5, &len, "environment");
	long nenv;
	char **envp = sbx_fields(buf, len, &nenv, "environment");
	const char *path = argv[3 + n];
	execve(path, &argv[4 + n], envp);
	sbx_init_fail("exec", path);
}
#endif
*/
import "C"

// warmInit reports that this build can keep pre-joined init steps (see warm.go).
const warmInit = true
