// Command signup is a complete gendurable program: a two-step signup workflow, a client that
// works it, and one instance run to completion.
package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Signup is the workflow's state. It is stored as JSON and committed with every step's outcome.
type Signup struct {
	Email    string `json:"email"`
	Account  int64  `json:"account,omitempty"`
	Welcomed bool   `json:"welcomed"`
}

// signup is the machine: named steps, each a plain Go function from the committed state to an
// outcome. A step may run again after a crash, so it must be safe to repeat.
var signup = gendurable.FSM[Signup]{
	Name:  "signup",
	Start: "create_account",
	Steps: map[string]gendurable.StepFunc[Signup]{
		"create_account": func(ctx *gendurable.Ctx, s Signup) (gendurable.Outcome, error) {
			s.Account = 1000 + ctx.ID // create the account here (idempotently)
			return gendurable.Next("send_welcome", s), nil
		},
		"send_welcome": func(ctx *gendurable.Ctx, s Signup) (gendurable.Outcome, error) {
			// An error here is retried with exponential backoff, then fails the instance.
			s.Welcomed = true
			return gendurable.Done(s), nil
		},
	},
}

func run(ctx context.Context, databaseURL, schema string) error {
	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := gendurable.Migrate(ctx, pool, &gendurable.MigrateOpts{Schema: schema}); err != nil {
		return err
	}
	client, err := gendurable.NewClient(pool, &gendurable.Config{
		Schema:   schema,
		Machines: []gendurable.Machine{signup},
		Queues:   map[string]gendurable.QueueConfig{gendurable.DefaultQueue: {Concurrency: 10}},
	})
	if err != nil {
		return err
	}
	if err := client.Start(ctx); err != nil {
		return err
	}
	defer func() {
		// Stop drains: running steps get up to ten seconds to finish.
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = client.Stop(stopCtx)
	}()

	// The correlation key makes the insert idempotent: inserting the same signup again
	// returns the same instance.
	res, err := client.Insert(ctx, signup.With(Signup{Email: "ada@example.com"}),
		&gendurable.InsertOpts{CorrelationKey: "ada@example.com"})
	if err != nil {
		return err
	}
	for {
		in, err := client.Get(ctx, res.ID)
		if err != nil {
			return err
		}
		if in.Status.Terminal() {
			fmt.Printf("%s after step %s: %s\n", in.Status, in.Step, in.Result)
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func main() {
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		url = "postgres://postgres@127.0.0.1:5432/postgres"
	}
	if err := run(context.Background(), url, "gendurable"); err != nil {
		log.Fatal(err)
	}
}
