package gendurable_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/durabletest"
	"github.com/stretchr/testify/require"
)

type order struct {
	ID    int      `json:"id"`
	Path  []string `json:"path"`
	Fails int      `json:"fails"`
}

func (o order) with(step string) order {
	o.Path = append(append([]string(nil), o.Path...), step)
	return o
}

var orderFSM = gendurable.FSM[order]{
	Name:  "order",
	Start: "reserve",
	Steps: map[string]gendurable.StepFunc[order]{
		"reserve": func(ctx *gendurable.Ctx, o order) (gendurable.Outcome, error) {
			return gendurable.Next("charge", o.with("reserve")), nil
		},
		"charge": func(ctx *gendurable.Ctx, o order) (gendurable.Outcome, error) {
			if ctx.Attempt <= o.Fails {
				return gendurable.Outcome{}, errors.New("card declined")
			}
			return gendurable.Next("ship", o.with("charge"), gendurable.After(time.Hour)), nil
		},
		"ship": func(ctx *gendurable.Ctx, o order) (gendurable.Outcome, error) {
			return gendurable.Done(map[string]any{"shipped": o.ID, "path": o.with("ship").Path}), nil
		},
	},
	MaxAttempts: 3,
	Backoff:     func(int) time.Duration { return time.Minute },
}

func TestDrainRunsAMachineToDone(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{orderFSM}})
	kit := durabletest.New(t, cl, nil)
	ctx := context.Background()

	res, err := cl.Insert(ctx, orderFSM.With(order{ID: 7, Fails: 2}), nil)
	require.NoError(t, err)
	dr := kit.Drain(ctx)
	require.Equal(t, 5, dr.Steps) // reserve, charge ×3 (two failures), ship
	var result struct {
		Shipped int      `json:"shipped"`
		Path    []string `json:"path"`
	}
	in := kit.RequireDone(ctx, res.ID, &result)
	require.Equal(t, 7, result.Shipped)
	require.Equal(t, []string{"reserve", "charge", "ship"}, result.Path)
	require.Len(t, in.Errors, 2)
	require.Equal(t, "card declined", in.Errors[0].Error)
	require.Equal(t, "charge", in.Errors[0].Step)
	require.Equal(t, 1, in.Errors[0].Attempt)
	require.Equal(t, 2, in.Errors[1].Attempt)
}
