package gendurable_test

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/gendurable/gendurable"
)

// SupportTicket is the state of a support ticket's workflow; version 2 of the machine adds Priority.
type SupportTicket struct {
	Title    string `json:"title"`
	Priority string `json:"priority,omitempty"`
}

func openTicket(ctx *gendurable.Ctx, t SupportTicket) (gendurable.Outcome, error) {
	return gendurable.Next("triage", t), nil
}

func triageTicket(ctx *gendurable.Ctx, t SupportTicket) (gendurable.Outcome, error) {
	t.Priority = "normal"
	return gendurable.Await([]string{"approved"}, "approve", t), nil
}

func approveTicket(ctx *gendurable.Ctx, t SupportTicket) (gendurable.Outcome, error) {
	return gendurable.Next("finish", t), nil
}

func finishTicket(ctx *gendurable.Ctx, t SupportTicket) (gendurable.Outcome, error) {
	return gendurable.Done(t), nil
}

// ticketV1 is the machine as version 1 had it: open, parked until approved, review, close.
var ticketV1Machine = gendurable.FSM[SupportTicket]{
	Name:  "ticket",
	Start: "open",
	Steps: map[string]gendurable.StepFunc[SupportTicket]{
		"open": func(ctx *gendurable.Ctx, t SupportTicket) (gendurable.Outcome, error) {
			return gendurable.Await([]string{"approved"}, "review", t), nil
		},
		"review": approveTicket,
		"close":  finishTicket,
	},
}

// docs:begin upgrade
var tickets = gendurable.FSM[SupportTicket]{
	Name:    "ticket",
	Start:   "open",
	Version: 2,
	Steps: map[string]gendurable.StepFunc[SupportTicket]{
		"open":    openTicket,
		"triage":  triageTicket,  // new in version 2
		"approve": approveTicket, // version 1 called it "review"
		"finish":  finishTicket,  // replaces version 1's "close"
	},
	Upgrades: []gendurable.Upgrade{{
		From:  1,
		Steps: map[string]string{"review": "approve", "close": "finish"},
		// Version 2 needs a priority; version 1 had none.
		State: func(step string, state json.RawMessage) (json.RawMessage, error) {
			var m map[string]any
			if err := json.Unmarshal(state, &m); err != nil {
				return nil, err
			}
			if m["priority"] == nil {
				m["priority"] = "normal"
			}
			return json.Marshal(m)
		},
	}},
}

// docs:end

// A machine's Version and Upgrades bring instances of an older version forward: here a ticket
// parked at version 1's "review" goes on at version 2's "approve", with a priority. A node
// brings an instance forward when it claims it; Client.Upgrade does it in bulk for instances
// parked for long.
func ExampleUpgrade() {
	ctx := context.Background()
	pool, schema, cleanup := examplePool("upgrade")
	defer cleanup()
	// Yesterday's deploy, running version 1: the ticket parks at review.
	old, err := gendurable.NewClient(pool, &gendurable.Config{Schema: schema,
		Machines: []gendurable.Machine{ticketV1Machine},
		Queues:   map[string]gendurable.QueueConfig{gendurable.DefaultQueue: {}}})
	if err != nil {
		panic(err)
	}
	if err := old.Start(ctx); err != nil {
		panic(err)
	}
	res, err := old.Insert(ctx, ticketV1Machine.With(SupportTicket{Title: "printer on fire"}), nil)
	if err != nil {
		panic(err)
	}
	if a, err := old.Await(ctx, res.ID, 10*time.Second, nil); err != nil || a.Status != gendurable.AwaitAwaiting {
		panic(fmt.Sprint(a, err))
	}
	if err := old.Stop(ctx); err != nil {
		panic(err)
	}

	// Today's, running version 2.

	client, err := gendurable.NewClient(pool, &gendurable.Config{Schema: schema,
		Machines: []gendurable.Machine{tickets}})
	if err != nil {
		panic(err)
	}
	up, err := client.Upgrade(ctx, "ticket")
	if err != nil {
		panic(err)
	}
	in, err := client.Get(ctx, res.ID)
	if err != nil {
		panic(err)
	}
	fmt.Printf("upgraded %d, blocked %d\n", up.Upgraded, up.Blocked)
	fmt.Printf("version %d, at %s, state %s\n", in.MachineVersion, in.Step, in.State)
	u := in.Upgrades[0]
	fmt.Printf("upgrade: %d → %d, %s → %s\n", u.From, u.To, u.StepFrom, u.StepTo)
	// Output:
	// upgraded 1, blocked 0
	// version 2, at approve, state {"title": "printer on fire", "priority": "normal"}
	// upgrade: 1 → 2, review → approve
}
