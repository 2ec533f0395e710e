package gendurable_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gendurable/gendurable"
)

// Order is a machine's state: stored as JSON, committed with every step's outcome.
type Order struct {
	ID       int  `json:"id"`
	Items    int  `json:"items"`
	Reserved bool `json:"reserved"`
	Charged  bool `json:"charged"`
}

var errOutOfStock = errors.New("out of stock")

// A machine is a value: named steps, each a function from the committed state to an outcome.
// Next moves on, Retry tries the same step again, Done finishes with a result, Stop fails for good.
func ExampleFSM() {
	ctx := context.Background()
	pool, schema, cleanup := examplePool("fsm")
	defer cleanup()

	// docs:begin fsm
	order := gendurable.FSM[Order]{
		Name:  "order",
		Start: "reserve",
		Steps: map[string]gendurable.StepFunc[Order]{
			"reserve": func(ctx *gendurable.Ctx, o Order) (gendurable.Outcome, error) {
				if o.Items > 10 {
					return gendurable.Stop(errOutOfStock), nil // fails the instance, no retry
				}
				o.Reserved = true
				return gendurable.Next("charge", o), nil // commits o, then runs charge
			},
			"charge": func(ctx *gendurable.Ctx, o Order) (gendurable.Outcome, error) {
				if ctx.Attempt == 1 {
					return gendurable.Retry(10 * time.Millisecond), nil // the gateway was busy
				}
				o.Charged = true
				return gendurable.Done(fmt.Sprintf("receipt-%d", o.ID)), nil
			},
		},
	}
	// docs:end
	client, err := gendurable.NewClient(pool, &gendurable.Config{
		Schema:   schema,
		Machines: []gendurable.Machine{order},
		Queues:   map[string]gendurable.QueueConfig{gendurable.DefaultQueue: {}},
	})
	if err != nil {
		panic(err)
	}
	if err := client.Start(ctx); err != nil {
		panic(err)
	}
	defer func() { _ = client.Stop(ctx) }()

	for _, o := range []Order{{ID: 1, Items: 2}, {ID: 2, Items: 50}} {
		res, err := client.Insert(ctx, order.With(o), nil)
		if err != nil {
			panic(err)
		}
		a, err := client.Await(ctx, res.ID, 10*time.Second, &gendurable.AwaitOpts{UntilTerminal: true})
		if err != nil {
			panic(err)
		}
		in := a.Instance
		switch a.Status {
		case gendurable.AwaitDone:
			var receipt string
			if err := a.Decode(&receipt); err != nil {
				panic(err)
			}
			fmt.Printf("order %d: %s at %s (attempt %d), path %v, %s\n", o.ID, in.Status, in.Step, in.Attempt, in.Path, receipt)
		default:
			last := in.Errors[len(in.Errors)-1]
			fmt.Printf("order %d: %s at %s, path %v: %s\n", o.ID, in.Status, in.Step, in.Path, last.Error)
		}
	}
	// Output:
	// order 1: done at charge (attempt 2), path [reserve charge], receipt-1
	// order 2: failed at reserve, path [reserve]: out of stock
}
