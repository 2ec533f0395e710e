package gendurable

import (
	"context"
	"log/slog"

	"github.com/gendurable/gendurable/internal/engine"
	"github.com/gendurable/gendurable/internal/poke"
	"github.com/gendurable/gendurable/internal/store"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A poke tells the schedulers of a queue that it has rows due now, so that they pick at once
// instead of at their next poll. Inserts poke the queues that received due rows, and the engine
// pokes every wake it causes: a signal that flips a parked instance, spawned children in their
// queues, a parent whose join the last child completed. Pokes are best effort: a lost one costs
// at most a poll interval, never correctness.

// PokeTransport carries pokes between the nodes of a cluster. Config.Poke picks one:
// PokeLocal (the default), PokePostgres, or a transport of another module (the Redis one is
// github.com/gendurable/gendurable/contrib/redispoke). A transport value is configuration: Open
// is called once per client, at Start.
type PokeTransport interface {
	// Open connects the transport for one client. It returns once the client hears the pokes
	// of node.Queues (an error fails Client.Start), and keeps hearing them until Close,
	// reconnecting on its own after failures.
	Open(ctx context.Context, node PokeNode) (PokeConn, error)
}

// PokeNode is what a transport is opened for: one client.
type PokeNode struct {
	// Client is the client's Config.Name (for logs).
	Client string
	// Origin tags this client's publishes: a poke carrying it must not wake this client again
	// (it woke its own schedulers directly).
	Origin string
	// Schema is the client's schema: pokes of the same queue name in another schema are
	// another channel.
	Schema string
	// Queues are the queues this client runs: the pokes it listens for.
	Queues []string
	// Wake nudges this client's scheduler of a queue. Cheap and non-blocking; bursts coalesce.
	Wake func(queue string)
	// Pool is the client's pool.
	Pool *pgxpool.Pool
	// Logger is the client's logger.
	Logger *slog.Logger
}

// PokeConn is a transport opened for one client.
type PokeConn interface {
	// Publish announces due rows in queues to the other nodes. It must not block on the
	// network; failures are the transport's to log.
	Publish(queues []string)
	// Close stops listening and publishing.
	Close() error
}

// PokeLocal pokes this client's own schedulers only (the default). Rows inserted on other nodes
// are found by polling.
func PokeLocal() PokeTransport { return localPoke{} }

type localPoke struct{}

func (localPoke) Open(context.Context, PokeNode) (PokeConn, error) { return nil, nil }

// PokePostgres pokes every node over LISTEN/NOTIFY, on one channel per queue
// ("gd.<schema>.<queue>"), so only the nodes running a queue hear it. Each client listens on a
// connection of its own (opened from its pool's configuration, outside the pool) and sends through
// its pool. Pokes of InsertTx and SignalTx ride the caller's transaction and leave with its
// commit, unless the server's NOTIFY queue is half full or more (once it is full, every
// transaction that notified fails at its commit): then the caller's transaction commits without
// them. A lost listening connection is reopened with backoff; meanwhile queues are polled.
func PokePostgres() PokeTransport { return pgPoke{} }

type pgPoke struct{}

func (pgPoke) Open(ctx context.Context, node PokeNode) (PokeConn, error) {
	st, err := store.New(node.Schema)
	if err != nil {
		return nil, err
	}
	return poke.Open(ctx, st, node.Pool, node.Client, node.Origin, node.Queues, node.Wake, node.Logger)
}

// openPoke builds the engine's hook that opens t at Start (nil: local pokes only).
func openPoke(t PokeTransport, pool *pgxpool.Pool, schema, name string, log *slog.Logger) engine.OpenPoke {
	if _, local := t.(localPoke); local || t == nil {
		return nil
	}
	return func(ctx context.Context, origin string, queues []string, wake func(string)) (engine.PokeConn, error) {
		pc, err := t.Open(ctx, PokeNode{Client: name, Origin: origin, Schema: schema, Queues: queues,
			Wake: wake, Pool: pool, Logger: log})
		if err != nil || pc == nil {
			return nil, err
		}
		return pc, nil
	}
}
