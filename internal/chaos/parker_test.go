package chaos

import "github.com/gendurable/gendurable"

// parked is T5's state; parkerFSM is T5's machine: s0 parks on "go", s1 finishes.
type parked struct {
	Woke bool `json:"woke"`
	I    int  `json:"i"`
}

func parkerFSM() gendurable.FSM[parked] {
	return gendurable.FSM[parked]{Name: "parker", Start: "s0", Queue: "park", Steps: map[string]gendurable.StepFunc[parked]{
		"s0": func(ctx *gendurable.Ctx, p parked) (gendurable.Outcome, error) {
			p.I = 1
			return gendurable.Await([]string{"go"}, "s1", p), nil
		},
		"s1": func(ctx *gendurable.Ctx, p parked) (gendurable.Outcome, error) {
			p.I, p.Woke = 2, len(ctx.Awaited) == 1
			return gendurable.Done(p), nil
		},
	}}
}
