package sandbox

import "golang.org/x/sys/unix"

// archCalls adds the system calls of amd64 that newer architectures do without.
func archCalls(m map[int64]int) map[int64]int {
	m[unix.SYS_SELECT] = callSelect
	m[unix.SYS_POLL] = callPoll
	return m
}
