//go:build !chaos

package fault

// Enabled is false in a normal build: every `if fault.Enabled { … }` block is dead code, and the
// compiler removes it.
const Enabled = false

// Point does nothing in a normal build.
func Point(string) error { return nil }

// PointFor does nothing in a normal build.
func PointFor(string, string) error { return nil }
