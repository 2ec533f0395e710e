package gendurable_test

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/gendurable/gendurable"
)

// Mailing is a message to render, then send through a provider that limits each tenant.
type Mailing struct {
	Tenant     string `json:"tenant"`
	Recipients int    `json:"recipients"`
}

// sent counts the mailings sent, by tenant.
var sent = struct {
	sync.Mutex
	n map[string]int
}{n: map[string]int{}}

// send stands for the call to the mail provider.
func send(_ context.Context, m Mailing) error {
	sent.Lock()
	defer sent.Unlock()
	sent.n[m.Tenant]++
	return nil
}

func sentBy(tenant string) int {
	sent.Lock()
	defer sent.Unlock()
	return sent.n[tenant]
}

// RateLimit runs a step under a token bucket of Config.RateLimits; "mail:acme" is a bucket of its
// own with the settings of "mail", one per tenant, and Weight makes a step take several tokens.
// Here each tenant may send 3 recipients' worth an hour: acme's fourth mail waits for tokens,
// while globex's mailing of 3 recipients goes at once.
func ExampleRateLimit() {
	ctx := context.Background()
	pool, schema, cleanup := examplePool("rate")
	defer cleanup()
	sent.n = map[string]int{}

	// docs:begin rates
	mailing := gendurable.FSM[Mailing]{
		Name:  "mailing",
		Start: "render",
		Steps: map[string]gendurable.StepFunc[Mailing]{
			"render": func(ctx *gendurable.Ctx, m Mailing) (gendurable.Outcome, error) {
				// Rendering is not limited; sending is, per tenant, a token per recipient.
				return gendurable.Next("send", m, gendurable.RateLimit("mail:"+m.Tenant),
					gendurable.Weight(m.Recipients)), nil
			},
			"send": func(ctx *gendurable.Ctx, m Mailing) (gendurable.Outcome, error) {
				if err := send(ctx, m); err != nil {
					return gendurable.Outcome{}, err
				}
				return gendurable.Done(nil), nil
			},
		},
	}
	client, err := gendurable.NewClient(pool, &gendurable.Config{
		Schema:     schema,
		Machines:   []gendurable.Machine{mailing},
		Queues:     map[string]gendurable.QueueConfig{gendurable.DefaultQueue: {}},
		RateLimits: map[string]gendurable.Rate{"mail": {Allowed: 3, Period: time.Hour}},
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
	for range 4 {
		params = append(params, gendurable.InsertManyParams{Input: mailing.With(Mailing{Tenant: "acme", Recipients: 1})})
	}
	params = append(params, gendurable.InsertManyParams{Input: mailing.With(Mailing{Tenant: "globex", Recipients: 3})})
	if _, err := client.InsertMany(ctx, params); err != nil {
		panic(err)
	}
	// Wait until the tokens are spent: four mailings done, and the last one parked at send.
	var waiting []gendurable.InstanceSummary
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		done, err := client.List(ctx, &gendurable.ListOpts{Statuses: []gendurable.Status{gendurable.StatusDone}})
		if err != nil {
			panic(err)
		}
		avail, err := client.List(ctx, &gendurable.ListOpts{Statuses: []gendurable.Status{gendurable.StatusAvailable}})
		if err != nil {
			panic(err)
		}
		waiting = avail.Instances
		if len(done.Instances) == 4 && len(waiting) == 1 && waiting[0].Step == "send" {
			break
		}
		if time.Now().After(deadline) {
			panic("the mailings did not settle")
		}
	}
	fmt.Println("acme sent", sentBy("acme"), "globex sent", sentBy("globex"))
	fmt.Println("waiting for tokens:", waiting[0].Machine, "at", waiting[0].Step)
	// Output:
	// acme sent 3 globex sent 1
	// waiting for tokens: mailing at send
}
