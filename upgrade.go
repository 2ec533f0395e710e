package gendurable

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
)

// maxVersion bounds FSM.Version: far more versions than any machine will have, small enough
// that a typo (a date, a hash) is caught.
const maxVersion = 1 << 16

// Upgrade brings an instance of version From of its machine forward to version From+1: where it
// goes on and what its stored state becomes. An FSM lists one per older version it can still
// take (FSM.Upgrades); a node that runs version N of a machine brings an instance of version
// N−k forward through k of them, in order, when it claims the instance (or when Client.Upgrade
// asks), and records each on the row. docs/upgrading.md says when a machine needs a new version.
type Upgrade struct {
	// From is the version this upgrade starts from (at least 1).
	From int
	// Steps maps the steps of version From that version From+1 renamed or removed to the step an
	// instance at that step goes on at. A step not in Steps keeps its name.
	Steps map[string]string
	// State rewrites the stored state of an instance that was at step (its name in version From)
	// for version From+1: it gets the JSON as stored and returns the JSON to store (for example
	// with a new field filled in). Nil keeps the state as it is. It works on JSON, not on the
	// state's Go type, because version From's type may no longer exist; an error leaves the
	// instance at version From, blocked, with the error as the reason.
	State func(step string, state json.RawMessage) (json.RawMessage, error)
}

// checkUpgrades validates a machine's version and upgrades against its steps.
func checkUpgrades(name string, version int, ups []Upgrade, steps map[string]bool) error {
	if version < 0 || version > maxVersion {
		return fmt.Errorf("machine %q: Version %d must be between 1 and %d (0 means 1)", name, version, maxVersion)
	}
	version = max(version, 1)
	seen := map[int]bool{}
	for _, u := range ups {
		if u.From < 1 || u.From >= version {
			return fmt.Errorf("machine %q: an Upgrade from version %d: versions 1 to %d can be brought forward to Version %d",
				name, u.From, version-1, version)
		}
		if seen[u.From] {
			return fmt.Errorf("machine %q: two Upgrades from version %d", name, u.From)
		}
		seen[u.From] = true
		for from, to := range u.Steps {
			if err := checkName("step name", from); err != nil {
				return fmt.Errorf("machine %q: Upgrade from version %d: %w", name, u.From, err)
			}
			if err := checkName("step name", to); err != nil {
				return fmt.Errorf("machine %q: Upgrade from version %d: %w", name, u.From, err)
			}
			// The last upgrade lands on this version: its targets must be steps of it.
			if u.From == version-1 && !steps[to] {
				return fmt.Errorf("machine %q: Upgrade from version %d maps step %q to %q, which is not in Steps",
					name, u.From, from, to)
			}
		}
	}
	return nil
}

// upgradeSteps returns, for each upgrade, the steps it renames (the node registry's manifest).
func upgradeSteps(ups []Upgrade) map[int]map[string]string {
	if len(ups) == 0 {
		return nil
	}
	out := make(map[int]map[string]string, len(ups))
	for _, u := range ups {
		out[u.From] = maps.Clone(u.Steps)
	}
	return out
}

// upgradeChain returns the function that brings a row of an older version forward to version
// through ups, one version at a time.
func upgradeChain(name string, version int, ups []Upgrade) func(from int, step string, state []byte) (string, []byte, error) {
	byFrom := map[int]Upgrade{}
	for _, u := range slices.Clone(ups) {
		byFrom[u.From] = u
	}
	return func(from int, step string, state []byte) (string, []byte, error) {
		for v := from; v < version; v++ {
			u, ok := byFrom[v]
			if !ok {
				return "", nil, fmt.Errorf("machine %q declares no Upgrade from version %d", name, v)
			}
			if u.State != nil {
				next, err := u.State(step, json.RawMessage(state))
				if err != nil {
					return "", nil, fmt.Errorf("Upgrade from version %d, State at step %q: %w", v, step, err)
				}
				if !json.Valid(next) {
					return "", nil, fmt.Errorf("Upgrade from version %d, State at step %q returned invalid JSON", v, step)
				}
				state = next
			}
			if to, ok := u.Steps[step]; ok {
				step = to
			}
		}
		return step, state, nil
	}
}
