package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/gendurable/gendurable/internal/store"
	"github.com/jackc/pgx/v5"
	"time"
)

// MachineDef is a machine with its types erased: what the engine needs to run any step of it.
// The root package builds one from each FSM[S] and Job[A].
type MachineDef struct {
	Name  string
	Start string
	// Steps is the set of step names.
	Steps map[string]bool
	// Queue and MaxAttempts are the defaults for inserts of this machine.
	Queue       string
	MaxAttempts int
	// Version is the machine's version (1 unless the machine says otherwise). Rows of a later
	// version are never claimed; rows of an earlier one are brought forward (Upgrade) before
	// their step runs.
	Version int
	// Upgrade brings a row of an older version forward to Version: the step it continues at and
	// its state. An error (no way forward from that version or step, or an upgrade function's
	// error) leaves the row as it is: no node of this version can run it.
	Upgrade func(from int, step string, state []byte) (newStep string, newState []byte, err error)
	// Upgrades are, for each older version Upgrade can start from, the steps it renames: what the
	// node registry publishes, so that operators' tools can tell what no running node can run.
	Upgrades map[int]map[string]string
	// Retention is how long finished instances of the machine are kept (0: the GC's).
	Retention time.Duration
	// Run runs one step of a claimed row and returns its outcome (the executor fences it with
	// the claim). It recovers the step's panics and routes errors to the machine's handler
	// itself; the engine only adds a last safety net.
	Run func(call *Call) store.Outcome
	// Fail returns the outcome the machine's error handling gives err as the error of the step
	// call ran, as if the step had returned it: for a failure found only when the step's
	// transaction was committed, after the step returned.
	Fail func(call *Call, err error) store.Outcome
}

// Call is one execution of one step: what the machine's Run gets.
type Call struct {
	Ctx   context.Context
	Row   *store.Claimed
	Queue string
	// MaxPayload is the largest encoded state or result allowed, in bytes.
	MaxPayload int
	// MaxChildren is the most children one spawn may start.
	MaxChildren int
	// Machine looks up a registered machine by name (nil if this node does not know it).
	Machine func(name string) *MachineDef

	client string
	log    *slog.Logger

	begin func(ctx context.Context) (pgx.Tx, error)
	tx    pgx.Tx
	// nested: the step's transaction is a savepoint of a caller's (the test kit's Drain in a
	// transaction), which goes on after the step's commit.
	nested bool
}

// Logger returns the engine's logger with the client, queue, machine, step and instance id
// attached. It is built on first use: steps that do not log pay nothing.
func (c *Call) Logger() *slog.Logger {
	return c.log.With("client", c.client, "queue", c.Queue, "machine", c.Row.Machine, "step", c.Row.Step, "id", c.Row.ID)
}

// Tx returns the step's transaction, beginning it on first use. The outcome of the step commits
// in this transaction, so whatever the step writes through it commits exactly when its progress
// does, or not at all.
func (c *Call) Tx() (pgx.Tx, error) {
	if c.tx != nil {
		return c.tx, nil
	}
	if c.begin == nil {
		return nil, errors.New("gendurable: no database to begin a transaction on")
	}
	tx, err := c.begin(c.Ctx)
	if err != nil {
		return nil, fmt.Errorf("gendurable: begin step transaction: %w", err)
	}
	c.tx = tx
	return tx, nil
}

// RollbackTx discards the step's transaction, if it began one. Run calls it before routing an
// error to the handler: a failed step's writes never commit.
func (c *Call) RollbackTx() {
	if c.tx != nil {
		_ = c.tx.Rollback(context.WithoutCancel(c.Ctx))
		c.tx = nil
	}
}
