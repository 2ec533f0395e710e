// Package races holds no code, only tests: gendurable's race and stress tests of the
// reliability plan (issue #11), run against a real Postgres through the public API.
//
// Without build tags (every `go test ./...`): the stress tests, sized for CI, or for the full
// plan with GD_CHAOS=full. With `-tags chaos`: also the deterministic race tests, which hold
// workers at the engine's named fault points (internal/fault) to force each interleaving of a
// race window. Every randomized test logs seed=N and replays with GD_SEED=N; each ends with the
// oracle's invariant check and a summary line (oracle.Report).
//
// The tests live in a package of their own so that their worker processes (the test binary
// re-executed) and their sizes stay apart from the root package's tests.
package races
