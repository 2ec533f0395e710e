package gendurable_test

import (
	"context"
	"fmt"
	"time"

	"github.com/gendurable/gendurable"
)

// Quote is a price computed by a workflow that a caller waits for.
type Quote struct {
	Item  string `json:"item"`
	Cents int    `json:"cents,omitempty"`
}

// Await holds the caller until an instance settles or the timeout passes, and answers from its
// row: done (with the result), failed, cancelled, awaiting a signal, busy (the timeout passed
// first: the work goes on, and the id is the retry token) or not found.
func ExampleClient_Await() {
	ctx := context.Background()
	pool, schema, cleanup := examplePool("client_await")
	defer cleanup()
	quote := gendurable.FSM[Quote]{
		Name:  "quote",
		Start: "price",
		Steps: map[string]gendurable.StepFunc[Quote]{
			"price": func(ctx *gendurable.Ctx, q Quote) (gendurable.Outcome, error) {
				q.Cents = 4200
				return gendurable.Done(q), nil
			},
		},
	}
	client, err := gendurable.NewClient(pool, &gendurable.Config{
		Schema:   schema,
		Machines: []gendurable.Machine{quote},
		Queues:   map[string]gendurable.QueueConfig{gendurable.DefaultQueue: {}},
	})
	if err != nil {
		panic(err)
	}
	if err := client.Start(ctx); err != nil {
		panic(err)
	}
	defer func() { _ = client.Stop(ctx) }()

	now, err := client.Insert(ctx, quote.With(Quote{Item: "kettle"}), nil)
	if err != nil {
		panic(err)
	}
	later, err := client.Insert(ctx, quote.With(Quote{Item: "toaster"}), &gendurable.InsertOpts{In: time.Hour})
	if err != nil {
		panic(err)
	}
	// A caller waits as long as it can afford: the answer comes as soon as the instance settles
	// (the kettle's in milliseconds), the timeout only bounds the wait (the toaster's, an hour
	// off, is busy at it).
	for _, c := range []struct {
		id      int64
		timeout time.Duration
	}{{now.ID, 10 * time.Second}, {later.ID, 200 * time.Millisecond}, {1 << 40, 200 * time.Millisecond}} {
		a, err := client.Await(ctx, c.id, c.timeout, nil)
		if err != nil {
			panic(err) // no answer: ctx ended, or the database could not be read in time
		}
		switch a.Status {
		case gendurable.AwaitDone:
			var q Quote
			if err := a.Decode(&q); err != nil {
				panic(err)
			}
			fmt.Println("done:", q.Item, q.Cents)
		case gendurable.AwaitFailed, gendurable.AwaitCancelled:
			fmt.Println("failed:", a.Err())
		case gendurable.AwaitBusy, gendurable.AwaitAwaiting:
			fmt.Println(a.Status, "at step", a.Instance.Step, "- ask again later with the id")
		case gendurable.AwaitNotFound:
			fmt.Println("no such instance")
		}
	}
	// Output:
	// done: kettle 4200
	// busy at step price - ask again later with the id
	// no such instance
}
