package client_test

// These examples need a running coordinator (sbx serve) at SBX_ADDR, with SBX_TOKEN: they are
// compiled by go test but not run, as their output is a live machine's. The package's tests run the
// same calls against a real coordinator (client_test.go).

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/sbx-dev/sbx/coordinator/client"
)

// Start a job, let it run in the background, and wait for its end.
func ExampleClient_Start() {
	ctx := context.Background()
	c, err := client.FromEnv(os.Getenv)
	if err != nil {
		log.Fatal(err)
	}
	started, err := c.Start(ctx, client.StartRequest{
		Command: "make test",
		Cwd:     "/home/dev/app",
		Title:   "unit tests",
		// Wait up to 10 s in the call; a longer job comes back backgrounded.
		BlockUntil: 10 * time.Second,
	})
	if err != nil {
		log.Fatal(err)
	}
	job := started.Job
	if started.Backgrounded {
		w, err := c.Wait(ctx, job.ID, 5*time.Minute, "")
		if err != nil {
			log.Fatal(err)
		}
		job = w.Job
	}
	if job.Ended() && job.ExitCode != nil {
		fmt.Println(job.ID, job.Status, *job.ExitCode)
	}
}

// Wait until a server's output says it is ready (an RE2 pattern, multiline), or until it listens.
func ExampleClient_Wait() {
	ctx := context.Background()
	c := client.New(client.DefaultAddr, os.Getenv("SBX_TOKEN"))
	started, err := c.Start(ctx, client.StartRequest{Command: "npm run dev", Cwd: "/home/dev/app"})
	if err != nil {
		log.Fatal(err)
	}
	w, err := c.Wait(ctx, started.Job.ID, time.Minute, `^ready on port \d+`)
	if err != nil {
		log.Fatal(err)
	}
	if w.PatternMatched {
		fmt.Printf("matched %q at byte %d\n", *w.Matched, *w.MatchedOffset)
	}
	if w, err = c.WaitPort(ctx, started.Job.ID, time.Minute, "", "any"); err == nil && w.Port != nil {
		fmt.Println("listening on", w.Port.Address)
	}
}

// Follow a job's output as it comes, until the job ends.
func ExampleClient_Follow() {
	ctx := context.Background()
	c := client.New(client.DefaultAddr, os.Getenv("SBX_TOKEN"))
	started, err := c.Start(ctx, client.StartRequest{Command: "for i in 1 2 3; do echo $i; sleep 1; done", Cwd: "/tmp"})
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Follow(ctx, started.Job.ID, 0, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

// Read a session's notifications with a long poll, and acknowledge them so that the next read
// starts after them.
func ExampleClient_Notifications() {
	ctx := context.Background()
	c := client.New(client.DefaultAddr, os.Getenv("SBX_TOKEN"))
	const session = "agent-1"
	if _, err := c.Start(ctx, client.StartRequest{Command: "sleep 2; false", Cwd: "/tmp", Session: session}); err != nil {
		log.Fatal(err)
	}
	// Up to 30 s for something to arrive; after nil means from the session's acked cursor.
	page, err := c.Notifications(ctx, session, nil, 30*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	for _, n := range page.Notifications {
		fmt.Println(n.Seq, n.Kind, n.Status, n.JobID)
		fmt.Println(n.Text) // the <system_notification> an agent harness injects as it is
	}
	if len(page.Notifications) > 0 {
		if _, err := c.Ack(ctx, session, page.Next); err != nil {
			log.Fatal(err)
		}
	}
}
