package gendurable_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/gendurable/gendurable"
)

// Report is a job of one tenant's.
type Report struct {
	Tenant string `json:"tenant"`
}

// FairnessKey shares a queue between tenants: while several have runnable instances, the picks
// take them in turn (in proportion to Config.FairnessWeights), so a tenant that arrives behind
// another's backlog starts at once. Here acme queues 100 reports, then globex 3; one worker slot
// runs them, and globex's are done among the first seven.
func ExampleFairnessKey() {
	ctx := context.Background()
	pool, schema, cleanup := examplePool("fairness")
	defer cleanup()
	var mu sync.Mutex
	var started []string

	// docs:begin fairness
	report := gendurable.Job[Report]{
		Name: "report",
		Perform: func(ctx *gendurable.Ctx, r Report) error {
			mu.Lock()
			defer mu.Unlock()
			started = append(started, r.Tenant)
			return nil
		},
	}
	client, err := gendurable.NewClient(pool, &gendurable.Config{
		Schema:   schema,
		Machines: []gendurable.Machine{report},
		Queues:   map[string]gendurable.QueueConfig{gendurable.DefaultQueue: {Concurrency: 1}},
		// A weight of 2 would give a tenant two picks for another's one; unnamed tenants weigh 1.
		FairnessWeights: map[string]float64{"enterprise": 2},
	})
	if err != nil {
		panic(err)
	}
	insert := func(tenant string, n int) {
		params := make([]gendurable.InsertManyParams, n)
		for i := range params {
			params[i] = gendurable.InsertManyParams{Input: report.With(Report{Tenant: tenant}),
				Opts: &gendurable.InsertOpts{FairnessKey: tenant}}
		}
		if _, err := client.InsertMany(ctx, params); err != nil {
			panic(err)
		}
	}
	insert("acme", 100)
	insert("globex", 3)
	// docs:end
	if err := client.Start(ctx); err != nil {
		panic(err)
	}
	defer func() { _ = client.Stop(ctx) }()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		mu.Lock()
		n := len(started)
		mu.Unlock()
		if n >= 7 {
			break
		}
		if time.Now().After(deadline) {
			panic("the reports did not start")
		}
	}
	mu.Lock()
	defer mu.Unlock()
	fmt.Println(strings.Join(started[:7], " "))
	// Output:
	// acme acme globex acme globex acme globex
}
