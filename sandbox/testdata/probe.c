// probe.c tries one thing a readonly job must not be able to do and prints what happened:
// "ok" when the call succeeded, "errno N" when it failed. The tests build it with gcc and run it
// inside the sandbox; x32 and i386 do not return when the filter kills the process.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

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
	if (strcmp(c, "fds") == 0) { // every open descriptor
		for (int fd = 0; fd < 65536; fd++)
			if (fcntl(fd, F_GETFD) >= 0)
				printf("%d\n", fd);
		return 0;
	}
	fprintf(stderr, "probe: unknown check %s\n", c);
	return 2;
}
