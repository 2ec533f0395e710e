package gendurable_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/durablemigrate"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The examples run against the tests' Postgres (DATABASE_URL), each in a schema of its own that
// it drops afterwards. The parts between "docs:begin" and "docs:end" are quoted by the guides
// in docs/, and TestGuidesQuoteCompiledCode keeps them identical.

func examplePool(schema string) (*pgxpool.Pool, func()) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	_ = durablemigrate.Drop(ctx, pool, schema)
	if err := gendurable.Migrate(ctx, pool, &gendurable.MigrateOpts{Schema: schema}); err != nil {
		panic(err)
	}
	return pool, func() {
		_ = durablemigrate.Drop(ctx, pool, schema)
		pool.Close()
	}
}

func waitTerminal(ctx context.Context, client *gendurable.Client, id int64) *gendurable.Instance {
	for {
		in, err := client.Get(ctx, id)
		if err != nil {
			panic(err)
		}
		if in.Status.Terminal() {
			return in
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Email is a job's arguments.
type Email struct {
	To      string `json:"to"`
	Subject string `json:"subject"`
}

var errMailboxFull = errors.New("mailbox full")

func deliver(_ context.Context, e Email) error {
	if e.To == "full@example.com" {
		return errMailboxFull
	}
	return nil
}

// A Job is a one-step machine with retries built in.
func ExampleJob() {
	ctx := context.Background()
	pool, cleanup := examplePool("example_job")
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
		Schema:   "example_job",
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
		in := waitTerminal(ctx, client, res.ID)
		fmt.Printf("%q: %s after %d attempt(s)\n", to, in.Status, in.Attempt)
	}
	// Output:
	// "ada@example.com": done after 1 attempt(s)
	// "": failed after 1 attempt(s)
	// "full@example.com": failed after 3 attempt(s)
}

// Transfer is a state whose step writes to the application's own tables.
type Transfer struct {
	From, To string
	Cents    int
}

// A step's writes through ctx.Tx commit in the same transaction as its outcome: exactly once.
func ExampleCtx_Tx() {
	ctx := context.Background()
	pool, cleanup := examplePool("example_tx")
	defer cleanup()
	if _, err := pool.Exec(ctx, `CREATE TABLE example_tx.ledger (account text, cents int)`); err != nil {
		panic(err)
	}

	// docs:begin tx
	transfer := gendurable.FSM[Transfer]{
		Name:  "transfer",
		Start: "book",
		Steps: map[string]gendurable.StepFunc[Transfer]{
			"book": func(ctx *gendurable.Ctx, t Transfer) (gendurable.Outcome, error) {
				tx, err := ctx.Tx() // commits with this step's outcome, or not at all
				if err != nil {
					return gendurable.Outcome{}, err
				}
				_, err = tx.Exec(ctx, `INSERT INTO example_tx.ledger VALUES ($1, $2), ($3, $4)`,
					t.From, -t.Cents, t.To, t.Cents)
				if err != nil {
					return gendurable.Outcome{}, err // the writes roll back with the error
				}
				return gendurable.Done(nil), nil
			},
		},
	}
	// docs:end
	client, err := gendurable.NewClient(pool, &gendurable.Config{
		Schema: "example_tx", Machines: []gendurable.Machine{transfer},
		Queues: map[string]gendurable.QueueConfig{gendurable.DefaultQueue: {}},
	})
	if err != nil {
		panic(err)
	}
	if err := client.Start(ctx); err != nil {
		panic(err)
	}
	defer func() { _ = client.Stop(ctx) }()
	res, err := client.Insert(ctx, transfer.With(Transfer{From: "alice", To: "bob", Cents: 500}), nil)
	if err != nil {
		panic(err)
	}
	waitTerminal(ctx, client, res.ID)
	var sum, rows int
	if err := pool.QueryRow(ctx, `SELECT sum(cents), count(*) FROM example_tx.ledger`).Scan(&sum, &rows); err != nil {
		panic(err)
	}
	fmt.Println(rows, "ledger rows, balance", sum)
	// Output: 2 ledger rows, balance 0
}
