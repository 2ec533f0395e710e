package engine

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// PokeConn is an open poke transport: it tells the other nodes that queues have due rows.
type PokeConn interface {
	// Publish announces due rows in queues. It must not block on the network: pokes are best
	// effort, and a lost one costs at most a poll interval.
	Publish(queues []string)
	// Close stops listening and publishing.
	Close() error
}

// TxPoker is a PokeConn that can send pokes inside a transaction, so that they leave with its
// commit (LISTEN/NOTIFY). PublishTx reports whether it did: it may decline (sent false, no
// error) when sending would put the transaction's commit at risk.
type TxPoker interface {
	PublishTx(ctx context.Context, tx pgx.Tx, queues []string) (sent bool, err error)
}

// OpenPoke opens a transport for this client: origin tags its publishes, queues are the queues
// it runs (the pokes it wants to hear), and wake nudges the local scheduler of one.
type OpenPoke func(ctx context.Context, origin string, queues []string, wake func(queue string)) (PokeConn, error)

// Origin tags this client's pokes, so that its own transport never pokes it a second time.
func (e *Engine) Origin() string { return e.cfg.Name + "@" + e.host + "-" + e.uniq }

// Poke makes rows of queues runnable known at once: to the local schedulers, and, through the
// transport once the client has started, to every other node.
func (e *Engine) Poke(queues ...string) {
	for _, q := range queues {
		e.Wake(q)
	}
	if p := e.poker.Load(); p != nil && len(queues) > 0 {
		(*p).Publish(queues)
	}
}

// PokeTx sends pokes for queues inside tx when the transport can (they leave with its commit)
// and reports whether it did; otherwise (a transport that cannot, or one that declined: the
// server's NOTIFY queue is filling up) it does nothing and the queues' poll finds the rows (or
// WatchCommit, for new rows). Nothing is sent before tx commits in any case.
func (e *Engine) PokeTx(ctx context.Context, tx pgx.Tx, queues []string) (bool, error) {
	p := e.poker.Load()
	if p == nil || len(queues) == 0 {
		return false, nil
	}
	if tp, ok := (*p).(TxPoker); ok {
		return tp.PublishTx(ctx, tx, queues)
	}
	return false, nil
}

// WatchCommit has this node start the rows ids (inserted due now in a caller's transaction, in
// queues, one per id) once that transaction commits, looking for them (commitWatch): for
// transports that cannot send with the commit. Rows of queues this node does not run are left
// to the nodes that do (and their poll); so is everything while the client is not running.
func (e *Engine) WatchCommit(ids []int64, queues []string) {
	if len(ids) == 0 || len(e.runners) == 0 || !e.Running() {
		return
	}
	e.commits.add(ids, queues)
}

func (e *Engine) queueNames() []string {
	out := make([]string, 0, len(e.runners))
	for q := range e.runners {
		out = append(out, q)
	}
	return out
}
