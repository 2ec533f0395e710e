package oracle

import (
	"encoding/json"
	"testing"
)

// Summary is one reliability test's figures, as `make chaos` tabulates them. Zero fields do not
// apply to the test.
type Summary struct {
	Test           string `json:"test"`
	Seed           uint64 `json:"seed"`
	Instances      int    `json:"instances"`
	Kills          int    `json:"kills"`
	Pauses         int    `json:"pauses"`
	Restarts       int    `json:"restarts"`        // Postgres restarts
	ConnectionsCut int    `json:"connections_cut"` // backends terminated, connections reset by the proxy
	Faults         int    `json:"faults"`          // other injected faults (fault points hit, blackholes, …)
	// Violations counts the oracle's violated invariants (must be 0); Lost, instances not
	// finished (must be 0); DuplicateTerminal, terminal transitions beyond one per instance
	// (must be 0); Deadlocks, the deadlock count's delta (must be 0).
	Violations        int `json:"violations"`
	Lost              int `json:"lost"`
	DuplicateTerminal int `json:"duplicate_terminal"`
	Deadlocks         int `json:"deadlocks"`
	// Throughput is completed steps per second during the faults; Baseline the fault-free
	// run's, when the test measured one.
	Throughput float64 `json:"throughput,omitempty"`
	Baseline   float64 `json:"baseline,omitempty"`
	Seconds    float64 `json:"seconds"`
}

// SummaryPrefix starts the line Report writes; `make chaos` collects these lines.
const SummaryPrefix = "chaos-summary "

// Report logs s as one line (with -v, or when the test fails) for `make chaos` to collect.
func Report(t testing.TB, s Summary) {
	t.Helper()
	b, err := json.Marshal(s)
	if err != nil {
		t.Errorf("oracle: report: %v", err)
		return
	}
	t.Log(SummaryPrefix + string(b))
}
