package coordinator

import (
	"testing"
	"time"
)

// TestClockPlacesRunnerStages: the runner's stages are placed by its quickest event, and a stage
// the estimate puts before the one ahead of it is shown equal to it.
func TestClockPlacesRunnerStages(t *testing.T) {
	t0 := time.Now()
	at := func(us int64) time.Time { return t0.Add(time.Duration(us) * time.Microsecond) }
	c := clock{accepted: t0, stored: 100, published: 300}
	// Accepted: sent 50 µs after taking, received at 1000: taken at 950 at the latest.
	c.event(&Stages{SentUS: 50}, at(1000))
	// Started: sent at 400, received at 1500: this one was slower, taken stays 950.
	c.event(&Stages{CgroupUS: 200, ExecUS: 350, SentUS: 400}, at(1500))
	if got := c.timings(); got.TakenUS != 950 || got.CgroupUS != 1150 || got.ExecUS != 1300 || got.ExitUS != 0 {
		t.Fatalf("after started: %+v", got)
	}
	// Exited: sent at 900, received at 1800: quicker, taken moves to 900 and every stage with it.
	c.firstOutput = 2000
	c.event(&Stages{CgroupUS: 200, ExecUS: 350, ExitUS: 880, SentUS: 900}, at(1800))
	c.exitStored = 2100
	want := Timings{StoredUS: 100, PublishedUS: 300, TakenUS: 900, CgroupUS: 1100, ExecUS: 1250, FirstOutputUS: 2000, ExitUS: 2000, ExitStoredUS: 2100}
	if got := c.timings(); got != want {
		t.Fatalf("after exited: %+v, want %+v", got, want)
	}
	// A runner that takes the work before the stream's acknowledgement reaches the coordinator is
	// shown taking it when it was published.
	early := clock{accepted: t0, stored: 100, published: 300}
	early.event(&Stages{SentUS: 50}, at(250))
	if got := early.timings(); got.TakenUS != 300 {
		t.Fatalf("taken before published: %+v", got)
	}
	// A job loaded from the store has no origin here: its runner's stages are not placed.
	var loaded clock
	loaded.event(&Stages{ExecUS: 5, SentUS: 10}, at(1000))
	if got := loaded.timings(); got != (Timings{}) {
		t.Fatalf("loaded job: %+v", got)
	}
}
