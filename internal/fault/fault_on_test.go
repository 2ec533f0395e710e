//go:build chaos

package fault

import (
	"errors"
	"testing"
	"time"
)

// A hook sees only its point, runs in the goroutine that reached it, can hold it, and its error
// comes out of the point; removing it restores the point.
func TestChaosHooksHoldAndFailAPoint(t *testing.T) {
	defer Quiet()()
	if !Enabled {
		t.Fatal("not Enabled in a chaos build")
	}
	release := make(chan struct{})
	var seen []string
	remove := Set(BeforeOutcome, func(subject string) error {
		seen = append(seen, subject)
		if subject == "hold" {
			<-release
		}
		if subject == "fail" {
			return errors.New("boom")
		}
		return nil
	})
	done := make(chan error)
	go func() { done <- PointFor(BeforeOutcome, "hold") }()
	select {
	case <-done:
		t.Fatal("the point did not wait for its hook")
	case <-time.After(20 * time.Millisecond):
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := PointFor(BeforeOutcome, "fail"); err == nil || err.Error() != "boom" {
		t.Fatalf("want the hook's error, got %v", err)
	}
	if err := PointFor(Heartbeat, "fail"); err != nil {
		t.Fatalf("another point's hook ran: %v", err)
	}
	before := Hits(BeforeOutcome)
	remove()
	if err := PointFor(BeforeOutcome, "fail"); err != nil {
		t.Fatalf("a removed hook ran: %v", err)
	}
	if Hits(BeforeOutcome) != before+1 {
		t.Fatal("hits not counted")
	}
	if len(seen) != 2 || seen[0] != "hold" || seen[1] != "fail" {
		t.Fatalf("subjects seen: %v", seen)
	}
}
