package gendurable_test

import (
	"context"
	"fmt"
	"time"

	"github.com/gendurable/gendurable"
)

// Line is one line of a basket; a child instance prices it.
type Line struct {
	SKU string `json:"sku"`
	Qty int    `json:"qty"`
}

// Basket is the parent's state: it prices every line in parallel, then charges once.
type Basket struct {
	Lines  []Line   `json:"lines"`
	Total  int      `json:"total"`
	Failed []string `json:"failed,omitempty"`
}

var unitPrices = map[string]int{"apple": 30, "bread": 250, "cheese": 700}

// Spawn starts any number of child instances in the statement that parks the parent; the last
// child to finish makes the parent runnable, and its join step sees every child's result.
func ExampleSpawn() {
	ctx := context.Background()
	pool, schema, cleanup := examplePool("spawn")
	defer cleanup()

	// docs:begin fanout
	priceLine := gendurable.FSM[Line]{
		Name:  "price_line",
		Start: "price",
		Steps: map[string]gendurable.StepFunc[Line]{
			"price": func(ctx *gendurable.Ctx, l Line) (gendurable.Outcome, error) {
				unit, ok := unitPrices[l.SKU]
				if !ok {
					return gendurable.Stop(fmt.Errorf("unknown sku %q", l.SKU)), nil
				}
				return gendurable.Done(unit * l.Qty), nil // the child's result
			},
		},
	}
	checkout := gendurable.FSM[Basket]{
		Name:  "checkout",
		Start: "fan_out",
		Steps: map[string]gendurable.StepFunc[Basket]{
			"fan_out": func(ctx *gendurable.Ctx, b Basket) (gendurable.Outcome, error) {
				children := make([]gendurable.Child, len(b.Lines))
				for i, l := range b.Lines {
					children[i] = gendurable.Child{Input: priceLine.With(l)}
				}
				return gendurable.Spawn(children, "charge", b), nil
			},
			"charge": func(ctx *gendurable.Ctx, b Basket) (gendurable.Outcome, error) {
				for _, c := range ctx.Children { // in id order: the order they were spawned
					if c.Status != gendurable.StatusDone {
						b.Failed = append(b.Failed, c.Error) // a failed child does not fail the parent
						continue
					}
					var cents int
					if err := c.Decode(&cents); err != nil {
						return gendurable.Outcome{}, err
					}
					b.Total += cents
				}
				return gendurable.Done(b), nil // charge b.Total here
			},
		},
	}
	// docs:end
	client, err := gendurable.NewClient(pool, &gendurable.Config{
		Schema:   schema,
		Machines: []gendurable.Machine{checkout, priceLine},
		Queues:   map[string]gendurable.QueueConfig{gendurable.DefaultQueue: {}},
	})
	if err != nil {
		panic(err)
	}
	if err := client.Start(ctx); err != nil {
		panic(err)
	}
	defer func() { _ = client.Stop(ctx) }()

	basket := Basket{Lines: []Line{{"apple", 6}, {"bread", 1}, {"caviar", 1}, {"cheese", 2}}}
	res, err := client.Insert(ctx, checkout.With(basket), nil)
	if err != nil {
		panic(err)
	}
	a, err := client.Await(ctx, res.ID, 10*time.Second, &gendurable.AwaitOpts{UntilTerminal: true})
	if err != nil {
		panic(err)
	}
	var b Basket
	if err := a.Decode(&b); err != nil {
		panic(err)
	}
	fmt.Println(a.Status, "total", b.Total, "failed", b.Failed)
	// Output: done total 1830 failed [unknown sku "caviar"]
}
