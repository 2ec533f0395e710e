package gendurable_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/gendurable/gendurable"
)

// Approval is a request that waits for a person's answer.
type Approval struct {
	Amount   int    `json:"amount"`
	Decision string `json:"decision,omitempty"`
	By       string `json:"by,omitempty"`
}

// Await parks an instance, holding nothing, until a signal it awaits arrives; Timeout wakes it
// anyway after a while, with nothing on ctx.Awaited. Here a request is answered by key; another
// is not, and falls back when its timeout passes.
func ExampleAwait() {
	ctx := context.Background()
	pool, schema, cleanup := examplePool("await")
	defer cleanup()
	answerWithin := 50 * time.Millisecond // days, in a real approval flow

	// docs:begin approval
	approval := gendurable.FSM[Approval]{
		Name:  "approval",
		Start: "ask",
		Steps: map[string]gendurable.StepFunc[Approval]{
			"ask": func(ctx *gendurable.Ctx, a Approval) (gendurable.Outcome, error) {
				// Send the request here (mail, chat). An answer that arrives before the park
				// commits waits in the inbox and wakes it at once.
				return gendurable.Await([]string{"approved", "rejected"}, "decide", a,
					gendurable.Timeout(answerWithin)), nil
			},
			"decide": func(ctx *gendurable.Ctx, a Approval) (gendurable.Outcome, error) {
				if len(ctx.Awaited) == 0 {
					a.Decision = "timed out" // the fallback: nobody answered in time
					return gendurable.Done(a), nil
				}
				var answer struct{ By string }
				if err := ctx.Awaited[0].Decode(&answer); err != nil {
					return gendurable.Outcome{}, err
				}
				a.Decision, a.By = ctx.Awaited[0].Name, answer.By
				return gendurable.Done(a), nil
			},
		},
	}
	// docs:end
	client, err := gendurable.NewClient(pool, &gendurable.Config{
		Schema:   schema,
		Machines: []gendurable.Machine{approval},
		Queues:   map[string]gendurable.QueueConfig{gendurable.DefaultQueue: {}},
		// The reaper fires await timeouts: its interval is their resolution (default 5s).
		Reaper: &gendurable.ReaperConfig{Interval: 10 * time.Millisecond},
	})
	if err != nil {
		panic(err)
	}

	var ids []int64
	for _, key := range []string{"expense-7", "expense-8"} {
		res, err := client.Insert(ctx, approval.With(Approval{Amount: 120}),
			&gendurable.InsertOpts{CorrelationKey: key})
		if err != nil {
			panic(err)
		}
		ids = append(ids, res.ID)
	}
	// The approver answers by the request's key, without knowing the instance's id.
	// docs:begin send
	_, err = client.Signal(ctx, gendurable.ByKey("approval", "expense-7"), "approved", map[string]string{"By": "ada"})
	// docs:end
	if err != nil {
		panic(err)
	}
	// The client starts working the queue only now, so that the answer is in expense-7's inbox
	// before its step asks, whatever the machine's speed: its park finds it and wakes at once,
	// while expense-8 waits out its 50ms.
	if err := client.Start(ctx); err != nil {
		panic(err)
	}
	defer func() { _ = client.Stop(ctx) }()
	for _, id := range ids {
		a, err := client.Await(ctx, id, 10*time.Second, &gendurable.AwaitOpts{UntilTerminal: true})
		if err != nil {
			panic(err)
		}
		var got Approval
		if err := a.Decode(&got); err != nil {
			panic(err)
		}
		fmt.Printf("%s: %s %s\n", a.Instance.CorrelationKey, got.Decision, got.By)
	}
	// Output:
	// expense-7: approved ada
	// expense-8: timed out
}

// Ticket waits for its resolution and keeps what it saw.
type Ticket struct {
	Inbox   []string `json:"inbox"`
	Awaited []string `json:"awaited"`
}

func signalNames(sigs []gendurable.Signal) []string {
	names := []string{}
	for _, s := range sigs {
		names = append(names, s.Name)
	}
	return names
}

// Signal stores a signal in an instance's inbox and wakes the instance if it awaits that name. A
// signal it does not await is kept, unseen until a step reads the inbox; a finished or missing
// target is ErrNoTarget, and nothing is stored.
func ExampleClient_Signal() {
	ctx := context.Background()
	pool, schema, cleanup := examplePool("signal")
	defer cleanup()
	ticket := gendurable.FSM[Ticket]{
		Name:  "ticket",
		Start: "open",
		Steps: map[string]gendurable.StepFunc[Ticket]{
			"open": func(ctx *gendurable.Ctx, t Ticket) (gendurable.Outcome, error) {
				return gendurable.Await([]string{"resolved"}, "close", t), nil
			},
			"close": func(ctx *gendurable.Ctx, t Ticket) (gendurable.Outcome, error) {
				t.Inbox, t.Awaited = signalNames(ctx.Inbox), signalNames(ctx.Awaited)
				return gendurable.Done(t), nil
			},
		},
	}
	client, err := gendurable.NewClient(pool, &gendurable.Config{
		Schema:   schema,
		Machines: []gendurable.Machine{ticket},
		Queues:   map[string]gendurable.QueueConfig{gendurable.DefaultQueue: {}},
	})
	if err != nil {
		panic(err)
	}
	if err := client.Start(ctx); err != nil {
		panic(err)
	}
	defer func() { _ = client.Stop(ctx) }()

	res, err := client.Insert(ctx, ticket.With(Ticket{}), &gendurable.InsertOpts{CorrelationKey: "T-42"})
	if err != nil {
		panic(err)
	}
	// Await (without UntilTerminal) answers as soon as the instance parks.
	a, err := client.Await(ctx, res.ID, 10*time.Second, nil)
	if err != nil {
		panic(err)
	}
	fmt.Println(a.Status, a.Instance.AwaitNames)

	note, err := client.Signal(ctx, gendurable.ByID(res.ID), "note", map[string]string{"text": "customer called"})
	if err != nil {
		panic(err)
	}
	fmt.Println("note woke it:", note.Woke)
	resolved, err := client.Signal(ctx, gendurable.ByKey("ticket", "T-42"), "resolved", nil)
	if err != nil {
		panic(err)
	}
	fmt.Println("resolved woke it:", resolved.Woke)

	a, err = client.Await(ctx, res.ID, 10*time.Second, &gendurable.AwaitOpts{UntilTerminal: true})
	if err != nil {
		panic(err)
	}
	var t Ticket
	if err := a.Decode(&t); err != nil {
		panic(err)
	}
	fmt.Println(a.Status, "inbox", t.Inbox, "awaited", t.Awaited)

	_, err = client.Signal(ctx, gendurable.ByID(res.ID), "resolved", nil)
	fmt.Println("once finished:", errors.Is(err, gendurable.ErrNoTarget))
	// Output:
	// awaiting [resolved]
	// note woke it: false
	// resolved woke it: true
	// done inbox [note resolved] awaited [resolved]
	// once finished: true
}

// SignOff collects the sign-offs a release needs, in whatever order they come.
type SignOff struct {
	Got []string `json:"got"`
}

var signOffs = []string{"legal", "finance", "security"}

// Accumulating a set: each wake records what it saw and awaits what is still missing. The
// instance parks between arrivals; it never spins.
func ExampleAwait_accumulate() {
	ctx := context.Background()
	pool, schema, cleanup := examplePool("accumulate")
	defer cleanup()

	// docs:begin pack
	release := gendurable.FSM[SignOff]{
		Name:  "release",
		Start: "collect",
		Steps: map[string]gendurable.StepFunc[SignOff]{
			"collect": func(ctx *gendurable.Ctx, s SignOff) (gendurable.Outcome, error) {
				for _, sig := range ctx.Awaited {
					if !slices.Contains(s.Got, sig.Name) {
						s.Got = append(s.Got, sig.Name)
					}
				}
				var missing []string
				for _, name := range signOffs {
					if !slices.Contains(s.Got, name) {
						missing = append(missing, name)
					}
				}
				if len(missing) == 0 {
					return gendurable.Done(s), nil
				}
				return gendurable.Await(missing, "collect", s), nil
			},
		},
	}
	// docs:end
	client, err := gendurable.NewClient(pool, &gendurable.Config{
		Schema:   schema,
		Machines: []gendurable.Machine{release},
		Queues:   map[string]gendurable.QueueConfig{gendurable.DefaultQueue: {}},
	})
	if err != nil {
		panic(err)
	}
	if err := client.Start(ctx); err != nil {
		panic(err)
	}
	defer func() { _ = client.Stop(ctx) }()

	res, err := client.Insert(ctx, release.With(SignOff{}), nil)
	if err != nil {
		panic(err)
	}
	for _, name := range []string{"security", "legal", "security", "finance"} {
		if _, err := client.Signal(ctx, gendurable.ByID(res.ID), name, nil); err != nil {
			panic(err)
		}
	}
	a, err := client.Await(ctx, res.ID, 10*time.Second, &gendurable.AwaitOpts{UntilTerminal: true})
	if err != nil {
		panic(err)
	}
	var s SignOff
	if err := a.Decode(&s); err != nil {
		panic(err)
	}
	fmt.Println(a.Status, s.Got)
	// Output: done [security legal finance]
}
