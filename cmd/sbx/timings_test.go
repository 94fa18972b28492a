package main

import (
	"testing"
	"time"

	"github.com/sbx-dev/sbx/coordinator/client"
)

// stages are a job's timings in stage order, by name, then the start reply's own.
func stages(r *client.StartReply) []struct {
	name string
	us   *int64
} {
	t := r.Job.Timings
	return []struct {
		name string
		us   *int64
	}{
		{"stored", t.StoredUS}, {"published", t.PublishedUS}, {"taken", t.TakenUS}, {"cgroup", t.CgroupUS},
		{"exec", t.ExecUS}, {"first_output", t.FirstOutputUS}, {"exit", t.ExitUS}, {"exit_stored", t.ExitStoredUS},
		{"reply", r.ReplyUS},
	}
}

// TestTimings: a job run by a real runner has every stage in its timings, in order, each before
// the start's reply; the stored job keeps them.
func TestTimings(t *testing.T) {
	s := startServe(t)
	ctx := t.Context()
	r, err := s.c.Start(ctx, client.StartRequest{Command: "echo hi", Cwd: "/", BlockUntil: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if r.Backgrounded || r.Output != "hi\n" {
		t.Fatalf("job did not end with its output: %+v", r)
	}
	prev := int64(0)
	for _, st := range stages(r) {
		if st.us == nil {
			t.Errorf("%s: missing from %+v", st.name, r.Job.Timings)
			continue
		}
		t.Logf("%s: %d µs", st.name, *st.us)
		if *st.us < prev {
			t.Errorf("%s at %d µs, before the stage ahead of it (%d µs)", st.name, *st.us, prev)
		}
		prev = *st.us
	}
	j, err := s.c.Job(ctx, r.Job.ID)
	if err != nil {
		t.Fatal(err)
	}
	got, want := stages(&client.StartReply{Job: *j, ReplyUS: r.ReplyUS}), stages(r)
	for i := range want {
		if (got[i].us == nil) != (want[i].us == nil) || got[i].us != nil && *got[i].us != *want[i].us {
			t.Errorf("stored job's %s = %v, the reply's %v", want[i].name, got[i].us, want[i].us)
		}
	}
}
