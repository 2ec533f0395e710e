package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/gendurable/gendurable/internal/store"
	"github.com/jackc/pgx/v5"
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
	// Run runs one step of a claimed row and returns its encoded outcome. It recovers the step's
	// panics and routes errors to the machine's handler itself; the engine only adds a last
	// safety net.
	Run func(call *Call) Outcome
}

// Outcome is an encoded outcome, ready for the outcome statement.
type Outcome struct {
	Kind   store.OutcomeKind
	Step   string // next: the step to run next
	State  []byte // JSON; nil keeps the stored state
	Delay  time.Duration
	Result []byte // done: JSON, nil for no result
	// AwaitNames and AwaitTimeout (0: none) park the instance (await).
	AwaitNames   []string
	AwaitTimeout time.Duration
	// Children are the instances a spawn starts.
	Children []store.InsertRow
	// KeyMode sets (1, to Key) or releases (2) the concurrency key; 0 keeps it.
	KeyMode int16
	Key     string
	// RateLimit ("" for none) and Weight are the rate limit the next step runs under (next).
	RateLimit string
	Weight    int
	// ErrKind and ErrMsg, when ErrKind is not empty, are recorded in the row's error history.
	ErrKind string
	ErrMsg  string
	// Routed is the error (or recovered panic) that was routed to the handler, for events.
	Routed error
	Panic  bool
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
