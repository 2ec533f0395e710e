// Package chaos holds no code, only tests: gendurable's reliability suite (docs/reliability.md),
// run against a real Postgres through the public API. Its sub-packages are the suite's judge
// (oracle) and the tool that tabulates a run (chaosreport).
//
// The tests inject faults and races: worker processes killed, paused, drained and restarted;
// Postgres restarted, its sessions terminated, its connections reset, blackholed or routed
// through PgBouncer; a long soak; and, with `-tags chaos`, the deterministic race tests, which
// hold workers at the engine's named fault points (internal/fault) to force each interleaving of
// a race window. Every test that needs another process uses one harness (worker_test.go): the test
// binary re-executed as a worker, configured by one workerCfg and reporting one workerReport.
//
// Every test runs at its CI size by default and at the full size with GD_CHAOS=full (`make
// chaos`). Every randomized test logs seed=N and replays with GD_SEED=N; each fault test ends with
// the oracle's invariant check and a summary line (oracle.Report).
package chaos
