package gendurable_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gendurable/gendurable"
)

// Email is a job's arguments.
type Email struct {
	To      string `json:"to"`
	Subject string `json:"subject"`
}

var errMailboxFull = errors.New("mailbox full")

// deliver stands for the call to the mail provider.
func deliver(_ context.Context, e Email) error {
	if e.To == "full@example.com" {
		return errMailboxFull
	}
	return nil
}

// A Job is a one-step machine with retries built in: an error retries it with backoff, up to
// MaxAttempts; Unrecoverable fails it at once.
func ExampleJob() {
	ctx := context.Background()
	pool, schema, cleanup := examplePool("job")
	defer cleanup()

	// docs:begin job
	sendEmail := gendurable.Job[Email]{
		Name:        "send_email",
		MaxAttempts: 3,
		Backoff:     func(attempt int) time.Duration { return 10 * time.Millisecond },
		Perform: func(ctx *gendurable.Ctx, e Email) error {
			if e.To == "" {
				// Unrecoverable fails the job at once instead of retrying it.
				return gendurable.Unrecoverable(errors.New("no recipient"))
			}
			return deliver(ctx, e) // any other error retries with backoff
		},
	}
	client, err := gendurable.NewClient(pool, &gendurable.Config{
		Schema:   schema,
		Machines: []gendurable.Machine{sendEmail},
		Queues:   map[string]gendurable.QueueConfig{gendurable.DefaultQueue: {Concurrency: 5}},
	})
	// docs:end
	if err != nil {
		panic(err)
	}
	if err := client.Start(ctx); err != nil {
		panic(err)
	}
	defer func() { _ = client.Stop(ctx) }()

	for _, to := range []string{"ada@example.com", "", "full@example.com"} {
		res, err := client.Insert(ctx, sendEmail.With(Email{To: to, Subject: "hello"}), nil)
		if err != nil {
			panic(err)
		}
		a, err := client.Await(ctx, res.ID, 10*time.Second, &gendurable.AwaitOpts{UntilTerminal: true})
		if err != nil {
			panic(err)
		}
		fmt.Printf("%q: %s after %d attempt(s)\n", to, a.Status, a.Instance.Attempt)
	}
	// Output:
	// "ada@example.com": done after 1 attempt(s)
	// "": failed after 1 attempt(s)
	// "full@example.com": failed after 3 attempt(s)
}
