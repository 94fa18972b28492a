//go:build cgo && linux

package sandbox

// The v1 init step done before the Go runtime starts, as runc's nsexec does: a C constructor runs
// when the binary is re-executed as "sbx-init", joins the job's cgroups and execs the job's program.
// Starting the Go runtime and every package's init functions first costs tens of milliseconds in a
// binary as large as sbx; the constructor costs the exec alone. Without cgo, MaybeInit does the same
// in Go (see init.go). The arguments and the status pipe are those of initArgs and statusFD.

/*
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern char **environ;

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

#ifdef __GLIBC__
// glibc passes argc, argv and envp to constructors; elsewhere MaybeInit does the work in Go.
__attribute__((constructor)) static void sbx_init(int argc, char **argv) {
	if (argc < 3 || argv[0] == NULL || strcmp(argv[0], "sbx-init") != 0)
		return;
	char *end;
	errno = EINVAL;
	long n = strtol(argv[1], &end, 10);
	if (*end != '\0' || n < 0 || n > argc - 3)
		sbx_init_fail("init:", "malformed arguments");
	char pid[32];
	int len = snprintf(pid, sizeof pid, "%d", (int)getpid());
	for (long i = 0; i < n; i++) {
		const char *procs = argv[2 + i];
		int fd = open(procs, O_WRONLY | O_CLOEXEC);
		if (fd < 0)
			sbx_init_fail("join cgroup", procs);
		if (write(fd, pid, len) != len)
			sbx_init_fail("join cgroup", procs);
		close(fd);
	}
	if (fcntl(3, F_SETFD, FD_CLOEXEC) < 0)
		sbx_init_fail("init:", "status pipe");
	const char *path = argv[2 + n];
	execve(path, &argv[3 + n], environ);
	sbx_init_fail("exec", path);
}
#endif
*/
import "C"
