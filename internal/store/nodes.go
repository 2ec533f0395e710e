package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Node is a running client as the node registry records it.
type Node struct {
	ID        string
	Client    string
	Host      string
	Queues    []string
	Machines  map[string]MachineManifest
	StartedAt time.Time
	SeenAt    time.Time
}

// MachineManifest is what a node can run of one machine: its version, its steps, and, for each
// older version it can bring forward (by number), the steps that upgrade renames.
type MachineManifest struct {
	Version  int                        `json:"version"`
	Steps    []string                   `json:"steps"`
	Upgrades map[string]UpgradeManifest `json:"upgrades,omitempty"`
}

// UpgradeManifest is one upgrade of a machine manifest: the steps it renames.
type UpgradeManifest struct {
	Steps map[string]string `json:"steps,omitempty"`
}

// UpsertNode writes or refreshes a node's row (node_upsert), and returns the schema's version
// and readers as they stand.
func (s *Store) UpsertNode(ctx context.Context, db DB, n *Node) (version, readers int, err error) {
	machines, err := json.Marshal(n.Machines)
	if err != nil {
		return 0, 0, fmt.Errorf("encode the node's machines: %w", err)
	}
	queues := n.Queues
	if queues == nil {
		queues = []string{}
	}
	var v, r *int
	err = db.QueryRow(ctx, s.sql("node_upsert"), pgx.NamedArgs{"id": n.ID, "client": n.Client, "host": n.Host,
		"queues": queues, "machines": string(machines)}).Scan(&v, &r)
	if err != nil {
		return 0, 0, err
	}
	if v != nil {
		version = *v
	}
	readers = 1 // a schema that records none, as the migrator reads it
	if r != nil {
		readers = *r
	}
	return version, readers, nil
}

// DeleteNode removes a node's row (node_delete).
func (s *Store) DeleteNode(ctx context.Context, db DB, id string) error {
	_, err := db.Exec(ctx, s.sql("node_delete"), pgx.NamedArgs{"id": id})
	return err
}

// ForgetNodes removes the rows of nodes not seen for gone (node_forget).
func (s *Store) ForgetNodes(ctx context.Context, db DB, gone time.Duration) error {
	_, err := db.Exec(ctx, s.sql("node_forget"), pgx.NamedArgs{"gone_ms": gone.Milliseconds()})
	return err
}

// LiveNodes lists the nodes seen within live (nodes_live).
func (s *Store) LiveNodes(ctx context.Context, db DB, live time.Duration) ([]Node, error) {
	rows, err := db.Query(ctx, s.sql("nodes_live"), pgx.NamedArgs{"live_ms": live.Milliseconds()})
	if err != nil {
		return nil, err
	}
	var out []Node
	var n Node
	var machines []byte
	_, err = pgx.ForEachRow(rows, []any{&n.ID, &n.Client, &n.Host, &n.Queues, &machines, &n.StartedAt, &n.SeenAt}, func() error {
		node := n
		if err := json.Unmarshal(machines, &node.Machines); err != nil {
			return fmt.Errorf("decode the machines of node %q: %w", n.ID, err)
		}
		out = append(out, node)
		return nil
	})
	return out, err
}

// LiveGroup is a group of live rows (available, awaiting, joining) that need the same of a node:
// queue, machine, machine version and step.
type LiveGroup struct {
	Queue   string
	Machine string
	Version int
	Step    string
	Count   int64
	Oldest  time.Time
	FirstID int64
}

// LiveGroups groups the live rows by queue, machine, version and step (live_groups).
func (s *Store) LiveGroups(ctx context.Context, db DB) ([]LiveGroup, error) {
	rows, err := db.Query(ctx, s.sql("live_groups"))
	if err != nil {
		return nil, err
	}
	var out []LiveGroup
	var g LiveGroup
	var version int32
	_, err = pgx.ForEachRow(rows, []any{&g.Queue, &g.Machine, &version, &g.Step, &g.Count, &g.Oldest, &g.FirstID}, func() error {
		g.Version = int(version)
		out = append(out, g)
		return nil
	})
	return out, err
}
