package engine

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"

	"github.com/gendurable/gendurable/durabletype"
	"github.com/gendurable/gendurable/internal/store"
)

// The heartbeat reports a claim lost by its token, and only that claim's step is cancelled. The
// flights are keyed by instance id, so between an outcome's commit and its flight's settling,
// the same instance can be claimed again by this client: a heartbeat whose snapshot still had the
// old token reports it lost, and cancelling by id alone would cancel the new, valid claim's step
// (an error, an attempt and a repeated effect for nothing). Found by T1c under load.
func TestHeartbeatCancelsOnlyTheLostClaim(t *testing.T) {
	e := New(nil, nil, Config{Name: "t", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	e.stepParent = context.Background()
	// The first claim's outcome committed; before its flight settled, the instance was claimed
	// again under a new token.
	old, oldCtx := e.track("q", "w#1", &store.Claimed{ID: 7, Machine: "m", Step: "s0"}, nil)
	old.state = flightHanded
	fresh, freshCtx := e.track("q", "w#2", &store.Claimed{ID: 7, Machine: "m", Step: "s1"}, nil)
	defer e.settle(old)
	defer e.settle(fresh)

	e.cancelAll([]int64{7}, []string{"w#1"}) // the heartbeat's snapshot had the old token
	if err := freshCtx.Err(); err != nil {
		t.Fatalf("the new claim's step was cancelled for the old claim's loss: %v", context.Cause(freshCtx))
	}
	if oldCtx.Err() != nil {
		t.Fatal("a handed-off step was cancelled")
	}

	e.cancelAll([]int64{7}, []string{"w#2"}) // now the new claim is lost
	if !errors.Is(context.Cause(freshCtx), durabletype.ErrLeaseLost) {
		t.Fatalf("the lost claim's step was not cancelled with ErrLeaseLost: %v", context.Cause(freshCtx))
	}
}
