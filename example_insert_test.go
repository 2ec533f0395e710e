package gendurable_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gendurable/gendurable"
)

// Welcome is the arguments of a job that greets a new user.
type Welcome struct {
	Email string `json:"email"`
}

// InsertTx inserts an instance in the application's own transaction: workers see it only once
// the transaction commits, and never if it rolls back. With PokePostgres, its poke leaves with
// the commit too (while the server's NOTIFY queue is less than half full), so a worker on any
// node starts it at once.
func ExampleClient_InsertTx() {
	ctx := context.Background()
	pool, schema, cleanup := examplePool("insert_tx")
	defer cleanup()
	if _, err := pool.Exec(ctx, `CREATE TABLE users (email text PRIMARY KEY)`); err != nil {
		panic(err)
	}
	welcome := gendurable.Job[Welcome]{
		Name:    "welcome",
		Perform: func(ctx *gendurable.Ctx, w Welcome) error { return nil }, // send the email here
	}
	client, err := gendurable.NewClient(pool, &gendurable.Config{
		Schema:   schema,
		Machines: []gendurable.Machine{welcome},
		Queues:   map[string]gendurable.QueueConfig{gendurable.DefaultQueue: {}},
		Poke:     gendurable.PokePostgres(),
	})
	if err != nil {
		panic(err)
	}
	if err := client.Start(ctx); err != nil {
		panic(err)
	}
	defer func() { _ = client.Stop(ctx) }()

	// docs:begin insert-tx
	// signUp records a user and the job that welcomes them in one transaction: both or neither.
	signUp := func(ctx context.Context, email string) (int64, error) {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return 0, err
		}
		defer func() { _ = tx.Rollback(ctx) }() // a no-op once committed
		res, err := client.InsertTx(ctx, tx, welcome.With(Welcome{Email: email}), nil)
		if err != nil {
			return 0, err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO users (email) VALUES ($1)`, email); err != nil {
			return res.ID, err // rolled back: the job goes with the user
		}
		return res.ID, tx.Commit(ctx)
	}
	// docs:end

	for range 2 {
		id, err := signUp(ctx, "ada@example.com")
		if err != nil {
			fmt.Println("sign-up refused:", err)
		}
		a, err := client.Await(ctx, id, 10*time.Second, &gendurable.AwaitOpts{UntilTerminal: true})
		if err != nil {
			panic(err)
		}
		fmt.Println("its welcome job:", a.Status)
	}
	// Output:
	// its welcome job: done
	// sign-up refused: ERROR: duplicate key value violates unique constraint "users_pkey" (SQLSTATE 23505)
	// its welcome job: not_found
}

// Invoice is the arguments of a job that sends an invoice.
type Invoice struct {
	Number string `json:"number"`
}

// InsertMany inserts any number of instances in one statement. Correlation keys deduplicate:
// while an instance with the key is live, inserting the key again returns it as a duplicate. If
// any row is invalid, nothing is inserted and the *InputError names the row.
func ExampleClient_InsertMany() {
	ctx := context.Background()
	pool, schema, cleanup := examplePool("insert_many")
	defer cleanup()
	sendInvoice := gendurable.Job[Invoice]{
		Name:    "send_invoice",
		Perform: func(ctx *gendurable.Ctx, inv Invoice) error { return nil },
	}
	// A client that only inserts: no queues, so it runs nothing and need not be started.
	client, err := gendurable.NewClient(pool, &gendurable.Config{Schema: schema})
	if err != nil {
		panic(err)
	}

	// docs:begin insert-many
	batch := func(numbers ...string) []gendurable.InsertManyParams {
		params := make([]gendurable.InsertManyParams, len(numbers))
		for i, n := range numbers {
			params[i] = gendurable.InsertManyParams{
				Input: sendInvoice.With(Invoice{Number: n}),
				Opts:  &gendurable.InsertOpts{CorrelationKey: "invoice-" + n},
			}
		}
		return params
	}
	first, err := client.InsertMany(ctx, batch("1001", "1002", "1003"))
	if err != nil {
		panic(err)
	}
	// Sent again, with one more: the three live instances come back as duplicates.
	again, err := client.InsertMany(ctx, batch("1001", "1002", "1003", "1004"))
	if err != nil {
		panic(err)
	}
	// docs:end
	fmt.Println("first:", len(first), "inserted")
	for i, r := range again {
		fmt.Printf("again %d: duplicate %t, same id %t\n", i, r.Duplicate, i < len(first) && r.ID == first[i].ID)
	}

	params := batch("2001", "2002")
	params[1].Opts.Priority = 12 // priorities are 1 to 9
	_, err = client.InsertMany(ctx, params)
	var bad *gendurable.InputError
	if errors.As(err, &bad) {
		fmt.Printf("refused: row %d, field %s\n", bad.Index, bad.Field)
	}
	page, err := client.List(ctx, &gendurable.ListOpts{Machine: "send_invoice"})
	if err != nil {
		panic(err)
	}
	fmt.Println("instances:", len(page.Instances))
	// Output:
	// first: 3 inserted
	// again 0: duplicate true, same id true
	// again 1: duplicate true, same id true
	// again 2: duplicate true, same id true
	// again 3: duplicate false, same id false
	// refused: row 1, field Priority
	// instances: 4
}
