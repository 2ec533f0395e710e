package gendurable_test

import (
	"github.com/gendurable/gendurable"
)

// fanState is the fan-out parent's state: the plan (waves of perWave children over queues) set
// at insert, and what the join steps saw.
type fanState struct {
	I       int      `json:"i"`
	Path    []string `json:"path"`
	Waves   int      `json:"waves"`
	PerWave int      `json:"per_wave"`
	Queues  []string `json:"queues"`
	Wave    int      `json:"wave"`
	// Seen counts the children the join steps saw done.
	Seen int `json:"seen"`
}

// fanMachine is the fan-out parent ("fan", queue "crash"): step spawn starts perWave linear5
// children spread over the plan's queues and parks until they finish; step join counts those
// done and spawns the next wave, or finishes after the last. onStep (may be nil) records the
// step's effect.
func fanMachine(onStep func(ctx *gendurable.Ctx)) gendurable.FSM[fanState] {
	child := linear("linear5", 0, nil)
	return gendurable.FSM[fanState]{Name: "fan", Start: "spawn", Queue: "crash", Steps: map[string]gendurable.StepFunc[fanState]{
		"spawn": func(ctx *gendurable.Ctx, s fanState) (gendurable.Outcome, error) {
			if onStep != nil {
				onStep(ctx)
			}
			kids := make([]gendurable.Child, s.PerWave)
			for i := range kids {
				kids[i] = gendurable.Child{Input: child.With(path{}), Opts: &gendurable.InsertOpts{Queue: s.Queues[i%len(s.Queues)]}}
			}
			s.I++
			s.Path = append(s.Path, "spawn")
			return gendurable.Spawn(kids, "join", s), nil
		},
		"join": func(ctx *gendurable.Ctx, s fanState) (gendurable.Outcome, error) {
			if onStep != nil {
				onStep(ctx)
			}
			for _, c := range ctx.Children {
				if c.Status == gendurable.StatusDone {
					s.Seen++
				}
			}
			s.Wave++
			s.I++
			s.Path = append(s.Path, "join")
			if s.Wave < s.Waves {
				return gendurable.Next("spawn", s), nil
			}
			return gendurable.Done(s), nil
		},
	}}
}
