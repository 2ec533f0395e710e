package gendurable_test

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/gendurable/gendurable"
)

// Export is the arguments of a tenant's export job.
type Export struct {
	Tenant string `json:"tenant"`
}

// peaks records how many executions of each key run at once, at most.
type peaks struct {
	mu      sync.Mutex
	running map[string]int
	peak    map[string]int
}

func newPeaks() *peaks { return &peaks{running: map[string]int{}, peak: map[string]int{}} }

func (p *peaks) enter(key string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.running[key]++
	p.peak[key] = max(p.peak[key], p.running[key])
}

func (p *peaks) leave(key string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.running[key]--
}

func (p *peaks) most(key string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.peak[key]
}

var exports, debits = newPeaks(), newPeaks()

// runExport stands for a tenant's export; it records how many run at once per tenant.
func runExport(_ context.Context, e Export) error {
	exports.enter(e.Tenant)
	defer exports.leave(e.Tenant)
	time.Sleep(5 * time.Millisecond)
	return nil
}

// debit stands for an account's debit; it records how many run at once per account.
func debit(_ context.Context, p Payout) error {
	debits.enter(p.Account)
	defer debits.leave(p.Account)
	time.Sleep(2 * time.Millisecond)
	return nil
}

// A gate in Config.ConcurrencyLimits makes every concurrency key under its name a semaphore:
// here at most two exports per tenant run at once, across every node.
func ExampleConfig_concurrencyLimits() {
	ctx := context.Background()
	pool, schema, cleanup := examplePool("gates")
	defer cleanup()
	exports = newPeaks()
	export := gendurable.Job[Export]{Name: "export", Perform: func(ctx *gendurable.Ctx, e Export) error {
		return runExport(ctx, e)
	}}

	// docs:begin gate
	client, err := gendurable.NewClient(pool, &gendurable.Config{
		Schema:   schema,
		Machines: []gendurable.Machine{export},
		Queues:   map[string]gendurable.QueueConfig{gendurable.DefaultQueue: {Concurrency: 20}},
		// "exports" is a gate: the key "exports:acme" is a semaphore of 2, "exports:globex" another.
		ConcurrencyLimits: map[string]gendurable.ConcurrencyLimit{"exports": {Limit: 2}},
	})
	// docs:end
	if err != nil {
		panic(err)
	}
	if err := client.Start(ctx); err != nil {
		panic(err)
	}
	defer func() { _ = client.Stop(ctx) }()

	var params []gendurable.InsertManyParams
	for _, tenant := range []string{"acme", "globex"} {
		for range 6 {
			params = append(params, gendurable.InsertManyParams{
				Input: export.With(Export{Tenant: tenant}),
				Opts:  &gendurable.InsertOpts{ConcurrencyKey: "exports:" + tenant},
			})
		}
	}
	res, err := client.InsertMany(ctx, params)
	if err != nil {
		panic(err)
	}
	for _, r := range res {
		if _, err := client.Await(ctx, r.ID, 10*time.Second, &gendurable.AwaitOpts{UntilTerminal: true}); err != nil {
			panic(err)
		}
	}
	for _, tenant := range []string{"acme", "globex"} {
		fmt.Printf("%s: 6 exports, at most 2 at once: %t\n", tenant, exports.most(tenant) <= 2)
	}
	// Output:
	// acme: 6 exports, at most 2 at once: true
	// globex: 6 exports, at most 2 at once: true
}

// Payout moves money out of an account, through a payment provider.
type Payout struct {
	Account string `json:"account"`
	Tenant  string `json:"tenant"`
	Cents   int    `json:"cents"`
}

// A concurrency key can change from one step to the next: Next keeps the instance's key, or
// switches it with ConcurrencyKey, or drops it with ReleaseConcurrencyKey. A key no gate owns is
// mutual exclusion: one execution at a time.
func ExampleConcurrencyKey() {
	ctx := context.Background()
	pool, schema, cleanup := examplePool("keys")
	defer cleanup()
	debits = newPeaks()

	// docs:begin keys
	payout := gendurable.FSM[Payout]{
		Name:  "payout",
		Start: "debit",
		Steps: map[string]gendurable.StepFunc[Payout]{
			// Inserted with the key "account:<id>", owned by no gate: one debit per account at a time.
			"debit": func(ctx *gendurable.Ctx, p Payout) (gendurable.Outcome, error) {
				if err := debit(ctx, p); err != nil {
					return gendurable.Outcome{}, err
				}
				// The provider's gate: at most 3 calls in flight per tenant.
				return gendurable.Next("send", p, gendurable.ConcurrencyKey("provider:"+p.Tenant)), nil
			},
			"send": func(ctx *gendurable.Ctx, p Payout) (gendurable.Outcome, error) {
				// call the provider here; no key from the next step on
				return gendurable.Next("notify", p, gendurable.ReleaseConcurrencyKey()), nil
			},
			"notify": func(ctx *gendurable.Ctx, p Payout) (gendurable.Outcome, error) {
				return gendurable.Done(nil), nil
			},
		},
	}
	client, err := gendurable.NewClient(pool, &gendurable.Config{
		Schema:            schema,
		Machines:          []gendurable.Machine{payout},
		Queues:            map[string]gendurable.QueueConfig{gendurable.DefaultQueue: {}},
		ConcurrencyLimits: map[string]gendurable.ConcurrencyLimit{"provider": {Limit: 3}},
	})
	// docs:end
	if err != nil {
		panic(err)
	}
	if err := client.Start(ctx); err != nil {
		panic(err)
	}
	defer func() { _ = client.Stop(ctx) }()

	var ids []int64
	for i := range 8 {
		p := Payout{Account: fmt.Sprint("A", i%2), Tenant: "acme", Cents: 100}
		res, err := client.Insert(ctx, payout.With(p), &gendurable.InsertOpts{ConcurrencyKey: "account:" + p.Account})
		if err != nil {
			panic(err)
		}
		ids = append(ids, res.ID)
	}
	done := 0
	for _, id := range ids {
		a, err := client.Await(ctx, id, 10*time.Second, &gendurable.AwaitOpts{UntilTerminal: true})
		if err != nil {
			panic(err)
		}
		if a.Status == gendurable.AwaitDone {
			done++
		}
	}
	fmt.Println(done, "payouts done; one debit at a time per account:", debits.most("A0") == 1 && debits.most("A1") == 1)
	// Output: 8 payouts done; one debit at a time per account: true
}
