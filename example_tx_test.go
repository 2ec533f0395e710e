package gendurable_test

import (
	"context"
	"fmt"
	"time"

	"github.com/gendurable/gendurable"
)

// Transfer is a state whose step writes to the application's own tables.
type Transfer struct {
	From, To string
	Cents    int
}

// A step's writes through ctx.Tx commit in the same transaction as its outcome: exactly once.
func ExampleCtx_Tx() {
	ctx := context.Background()
	pool, schema, cleanup := examplePool("tx")
	defer cleanup()
	if _, err := pool.Exec(ctx, `CREATE TABLE ledger (account text, cents int)`); err != nil {
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
				_, err = tx.Exec(ctx, `INSERT INTO ledger VALUES ($1, $2), ($3, $4)`,
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
		Schema:   schema,
		Machines: []gendurable.Machine{transfer},
		Queues:   map[string]gendurable.QueueConfig{gendurable.DefaultQueue: {}},
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
	if _, err := client.Await(ctx, res.ID, 10*time.Second, &gendurable.AwaitOpts{UntilTerminal: true}); err != nil {
		panic(err)
	}
	var sum, rows int
	if err := pool.QueryRow(ctx, `SELECT sum(cents), count(*) FROM ledger`).Scan(&sum, &rows); err != nil {
		panic(err)
	}
	fmt.Println(rows, "ledger rows, balance", sum)
	// Output: 2 ledger rows, balance 0
}
