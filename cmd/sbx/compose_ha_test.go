package main

import (
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/sbx-dev/sbx/coordinator/client"
)

// TestComposeHA brings up docker-compose.ha.yml (three NATS servers clustered, two coordinators,
// two runners) and checks, with the checkable workload of TestComposeFleet, through the published
// ports as a user would: jobs started through either coordinator are seen through both; the leading
// coordinator killed mid-workload, then a NATS server killed mid-workload, then the new leader cut off
// from the network (docker network disconnect) mid-workload, lose nothing: every job ends with every
// byte of its output, one finished notification, its command started once.
func TestComposeHA(t *testing.T) {
	f := startFleetFrom(t, "docker-compose.ha.yml", "up", "-d", "--no-build", "--scale", "runner=2")
	ctx := t.Context()
	c1, c2 := f.clientOf("coordinator-1"), f.clientOf("coordinator-2")
	f.runners(ctx, c1, 2)
	f.runners(ctx, c2, 2)

	leads := func(c *client.Client) bool {
		body, err := c.Do(ctx, "GET", "/readyz", nil)
		return err == nil && strings.Contains(string(body), `"leader":true`)
	}
	leader, survivor := "coordinator-1", c2
	if !leads(c1) {
		leader, survivor = "coordinator-2", c1
	}
	// takeover waits until c (who) leads, at most 30 s after the fault at, then checks that each job
	// of ids ended after the fault with all n lines of its output.
	takeover := func(t *testing.T, c *client.Client, who, fault string, at time.Time, ids []string, n int) {
		t.Helper()
		for deadline := at.Add(30 * time.Second); !leads(c); time.Sleep(100 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s does not lead 30 s after %s", who, fault)
			}
		}
		t.Logf("%s leads %s after %s", who, time.Since(at).Round(time.Millisecond), fault)
		for _, id := range ids {
			if j := pollJob(t, ctx, c, id, 90*time.Second, jobEnded); j.EndedAt.Before(at) {
				t.Errorf("job %s ended before %s: the case tests nothing for it", id, fault)
			}
			checkOutput(t, ctx, c, id, n)
		}
	}

	t.Run("kill-leader", func(t *testing.T) {
		const session, n = "kill-leader", 2000
		tg := tags("lead", 4) // the runners have 2 slots each: none queues behind another
		var ids []string
		for i, tag := range tg {
			c := []*client.Client{c1, c2}[i%2]
			ids = append(ids, startJobs(t, ctx, c, session, []string{tag}, 15*time.Second, n)...)
			if _, err := []*client.Client{c2, c1}[i%2].Job(ctx, ids[i]); err != nil {
				t.Fatalf("job %s started through one coordinator, not seen through the other: %v", ids[i], err)
			}
		}
		for _, id := range ids {
			pollJob(t, ctx, survivor, id, time.Minute, jobStarted)
		}
		killed := time.Now()
		f.docker("kill", f.container(leader))
		// docker kill itself takes a while (1.4 s seen): the leader died somewhere in between.
		t.Logf("docker kill took %s", time.Since(killed).Round(time.Millisecond))
		takeover(t, survivor, "the other coordinator", leader+" was killed", killed, ids, n)
		finishedOnce(t, ctx, survivor, session, ids)
		startedOnce(t, f.startLog(), tg)
	})

	t.Run("kill-nats", func(t *testing.T) {
		const session, n = "kill-nats", 2000
		tg := tags("nats", 4)
		ids := startJobs(t, ctx, survivor, session, tg, 15*time.Second, n)
		for _, id := range ids {
			pollJob(t, ctx, survivor, id, time.Minute, jobStarted)
		}
		killed := time.Now()
		f.docker("kill", f.container("nats-2"))
		for _, id := range ids {
			if j := pollJob(t, ctx, survivor, id, 90*time.Second, jobEnded); j.EndedAt.Before(killed) {
				t.Errorf("job %s ended before nats-2 was killed: the case tests nothing for it", id)
			}
			checkOutput(t, ctx, survivor, id, n)
		}
		after := startAfterOutage(t, ctx, survivor, session, "nats-after")
		pollJob(t, ctx, survivor, after, time.Minute, jobEnded)
		checkOutput(t, ctx, survivor, after, 10)
		finishedOnce(t, ctx, survivor, session, append(ids, after))
		startedOnce(t, f.startLog(), append(tg, "nats-after"))
	})

	// The killed coordinator and NATS server come back, the first as a standby; then the leader is
	// cut off from the network mid-workload: it steps down, the other takes over and finishes its
	// jobs, through which the jobs were started.
	t.Run("disconnect-leader", func(t *testing.T) {
		f.docker("start", f.container("nats-2"))
		f.docker("start", f.container(leader))
		back := f.clientOf(leader) // its published port may have changed
		f.runners(ctx, back, 2)
		cutOff := map[string]string{"coordinator-1": "coordinator-2", "coordinator-2": "coordinator-1"}[leader]
		if !leads(survivor) || leads(back) {
			t.Fatalf("after its restart %s leads, or %s does not", leader, cutOff)
		}
		const session, n = "disconnect", 2000
		tg := tags("cut", 4)
		ids := startJobs(t, ctx, back, session, tg, 15*time.Second, n)
		for _, id := range ids {
			pollJob(t, ctx, back, id, time.Minute, jobStarted)
		}
		ctr := f.container(cutOff)
		network := f.docker("inspect", "--format", "{{range $k, $v := .NetworkSettings.Networks}}{{$k}} {{end}}", ctr)
		network = strings.Fields(network)[0]
		cut := time.Now()
		f.docker("network", "disconnect", network, ctr)
		t.Cleanup(func() { _ = exec.Command("docker", "network", "connect", network, ctr).Run() })
		takeover(t, back, leader, cutOff+" was cut off", cut, ids, n)
		finishedOnce(t, ctx, back, session, ids)
		startedOnce(t, f.startLog(), tg)
	})
}

// jobStarted: the job left the queue (it runs, or already ended: the caller checks when).
func jobStarted(j *client.Job) bool { return j.Status != "queued" }
