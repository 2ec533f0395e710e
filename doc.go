// Package gendurable runs durable state machines on Postgres.
//
// A workflow is a finite-state machine of plain Go steps (FSM). Every instance is a row; each
// step's outcome and the new state commit atomically before the next step runs, so a crash of
// any worker loses nothing: the step runs again (at least once, whole-step re-execution) on
// whichever worker claims the row next. Any number of worker processes coordinate through one
// Postgres; there is no other server.
//
// The pieces:
//
//   - FSM[S] is a machine whose state is the JSON-encoded S; Job[A] is a one-step machine with
//     retries built in.
//   - A step returns an Outcome: Next, Retry, Done or Stop. Errors and panics route to the
//     machine's Handle (by default: retry with exponential backoff, then fail).
//   - Client inserts instances (Insert, InsertTx, InsertMany) and, once started, works the queues
//     in Config.Queues.
//   - Migrate creates the schema; the durabletest package runs machines inline in tests.
//
// See the README and docs/ for guides.
package gendurable
