// probe.c tries one thing a readonly job must not be able to do (or, as setlk and alloc, still can)
// and prints what happened: "ok" when the call succeeded, "errno N" when it failed. The tests of
// sandbox and cmd/sbx build it with gcc and run it inside the sandbox; x32 and i386 do not return when
// the filter kills the process. Nothing it does outlives it when it succeeds, except what it was asked
// to change (cgroup-lift).
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/sched.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef AF_VSOCK
#define AF_VSOCK 40
#endif
#ifndef CLONE_INTO_CGROUP
#define CLONE_INTO_CGROUP 0x200000000ULL
#endif
#define KEY_SPEC_SESSION_KEYRING -3
#define KEYCTL_GET_KEYRING_ID 0
#define KEYCTL_UNLINK 9

#ifndef __NR_io_uring_setup
#define __NR_io_uring_setup 425
#define __NR_io_uring_enter 426
#define __NR_io_uring_register 427
#endif

static int report(long r) {
	if (r < 0) {
		printf("errno %d\n", errno);
		return 1;
	}
	printf("ok\n");
	return 0;
}

int main(int argc, char **argv) {
	if (argc < 2) {
		fprintf(stderr, "usage: probe CHECK [ARG]\n");
		return 2;
	}
	const char *c = argv[1];
	if (strcmp(c, "unix") == 0)
		return report(socket(AF_UNIX, SOCK_STREAM, 0));
	if (strcmp(c, "unix-high") == 0) // the domain with junk in its high 32 bits: still AF_UNIX to the kernel
		return report(syscall(__NR_socket, (long)AF_UNIX | (1L << 32), (long)SOCK_STREAM, 0L));
	if (strcmp(c, "socketpair-dgram") == 0) {
		int sv[2];
		return report(socketpair(AF_UNIX, SOCK_DGRAM, 0, sv));
	}
	if (strcmp(c, "inet") == 0)
		return report(socket(AF_INET, SOCK_STREAM, 0));
	if (strcmp(c, "connect") == 0 && argc == 3) { // connect to 127.0.0.1:PORT
		int s = socket(AF_INET, SOCK_STREAM, 0);
		if (s < 0)
			return report(s);
		struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[2]))};
		a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		return report(connect(s, (struct sockaddr *)&a, sizeof a));
	}
	if (strcmp(c, "io_uring_setup") == 0) {
		char params[120] = {0};
		return report(syscall(__NR_io_uring_setup, 1L, params));
	}
	if (strcmp(c, "io_uring_enter") == 0) // EBADF without the filter
		return report(syscall(__NR_io_uring_enter, -1L, 0L, 0L, 0L, 0L, 0L));
	if (strcmp(c, "io_uring_register") == 0) // EBADF without the filter
		return report(syscall(__NR_io_uring_register, -1L, 0L, 0L, 0L));
	if (strcmp(c, "x32") == 0) // getpid through the x32 ABI
		return report(syscall(__NR_getpid | 0x40000000));
	if (strcmp(c, "i386") == 0) { // getpid (20) through the i386 ABI
		long r;
		__asm__ volatile("int $0x80" : "=a"(r) : "a"(20L) : "memory");
		if (r < 0) {
			errno = -r;
			r = -1;
		}
		return report(r);
	}
	if (strcmp(c, "vsock") == 0)
		return report(socket(AF_VSOCK, SOCK_STREAM, 0));
	if (strcmp(c, "vsock-high") == 0)
		return report(syscall(__NR_socket, (long)AF_VSOCK | (1L << 32), (long)SOCK_STREAM, 0L));
	if (strcmp(c, "add_key") == 0) { // a key in the session keyring, which the runner shares
		long id = syscall(__NR_add_key, "user", "sbx-probe", "x", 1L, (long)KEY_SPEC_SESSION_KEYRING);
		if (id >= 0) // take it out again: the probe must not leave keys in the runner's keyring
			syscall(__NR_keyctl, (long)KEYCTL_UNLINK, id, (long)KEY_SPEC_SESSION_KEYRING);
		return report(id);
	}
	if (strcmp(c, "keyctl") == 0)
		return report(syscall(__NR_keyctl, (long)KEYCTL_GET_KEYRING_ID, (long)KEY_SPEC_SESSION_KEYRING, 0L));
	if (strcmp(c, "request_key") == 0) // ENOKEY without the filter
		return report(syscall(__NR_request_key, "user", "sbx-probe-none", NULL, 0L));
	if (strcmp(c, "flock") == 0 && argc == 3) { // an exclusive lock on a file opened read-only
		int fd = open(argv[2], O_RDONLY);
		if (fd < 0)
			return report(fd);
		return report(flock(fd, LOCK_EX | LOCK_NB));
	}
	if (strcmp(c, "lease") == 0 && argc == 3) { // a read lease: a writer opening the file waits for it
		int fd = open(argv[2], O_RDONLY);
		if (fd < 0)
			return report(fd);
		return report(fcntl(fd, F_SETLEASE, F_RDLCK));
	}
	if (strcmp(c, "lease-high") == 0 && argc == 3) { // F_SETLEASE with junk in the command's high 32 bits
		int fd = open(argv[2], O_RDONLY);
		if (fd < 0)
			return report(fd);
		return report(syscall(__NR_fcntl, (long)fd, (long)F_SETLEASE | (1L << 32), (long)F_RDLCK));
	}
	if (strcmp(c, "setlk") == 0 && argc == 3) { // a POSIX read lock, as sqlite takes to read
		int fd = open(argv[2], O_RDONLY);
		if (fd < 0)
			return report(fd);
		struct flock l = {.l_type = F_RDLCK, .l_whence = SEEK_SET};
		return report(fcntl(fd, F_SETLK, &l));
	}
	if (strcmp(c, "clone3") == 0 || (strcmp(c, "clone3-cgroup") == 0 && argc == 3)) {
		// clone3, into the cgroup directory argv[2] for clone3-cgroup; the child exits at once.
		struct clone_args a = {.exit_signal = SIGCHLD};
		if (argc == 3) {
			int cg = open(argv[2], O_RDONLY | O_DIRECTORY);
			if (cg < 0)
				return report(cg);
			a.flags = CLONE_INTO_CGROUP;
			a.cgroup = cg;
		}
		long pid = syscall(__NR_clone3, &a, sizeof a);
		if (pid == 0)
			_exit(0);
		if (pid > 0)
			waitpid(pid, NULL, 0);
		return report(pid);
	}
	if (strcmp(c, "userns") == 0)
		return report(unshare(CLONE_NEWUSER));
	if (strcmp(c, "cgroup-lift") == 0 && argc == 5) {
		// In new user, mount and cgroup namespaces, where the caller holds every capability: mount
		// the job's own cgroup (v1 controller argv[2], or cgroup2) on /tmp and write argv[4] to its
		// file argv[3], e.g. memory memory.limit_in_bytes -1.
		if (unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWCGROUP) < 0)
			return report(-1);
		int r = strcmp(argv[2], "cgroup2") == 0 ? mount("none", "/tmp", "cgroup2", 0, NULL)
		                                        : mount("none", "/tmp", "cgroup", 0, argv[2]);
		if (r < 0)
			return report(r);
		char path[4096];
		snprintf(path, sizeof path, "/tmp/%s", argv[3]);
		int fd = open(path, O_WRONLY);
		if (fd < 0)
			return report(fd);
		return report(write(fd, argv[4], strlen(argv[4])));
	}
	if (strcmp(c, "alloc") == 0 && argc == 3) { // touches argv[2] MiB
		size_t n = (size_t)atol(argv[2]) << 20;
		char *p = malloc(n);
		if (p == NULL)
			return report(-1);
		memset(p, 1, n);
		return report(p[n - 1] == 1 ? 0 : -1);
	}
	if (strcmp(c, "open-write") == 0 && argc == 3) // opens argv[2] for writing, and writes nothing
		return report(open(argv[2], O_WRONLY));
	if (strcmp(c, "fds") == 0) { // every open descriptor
		for (int fd = 0; fd < 65536; fd++)
			if (fcntl(fd, F_GETFD) >= 0)
				printf("%d\n", fd);
		return 0;
	}
	fprintf(stderr, "probe: unknown check %s\n", c);
	return 2;
}
