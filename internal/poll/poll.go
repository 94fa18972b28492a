// Package poll is how the tests of every package wait for something to happen: they poll its
// condition until a deadline, rather than sleep for a time that is too long on a quiet machine and
// too short on a busy one.
package poll

import (
	"testing"
	"time"
)

// interval is how long Within waits between two looks at the condition: short, as the tests wait
// for in-process work, and long enough not to starve the work it waits for.
const interval = 5 * time.Millisecond

// Until calls cond until it returns true and returns how long that took; past d it fails t with
// what, which names what was waited for.
func Until(t testing.TB, d time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	if !Within(d, cond) {
		t.Fatalf("%s: not within %s", what, d)
	}
	return time.Since(start)
}

// Within calls cond until it returns true or d has passed, and reports whether it returned true:
// for a test that checks what it waited for itself, or a goroutine that may not fail its test.
func Within(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(interval)
	}
	return true
}
