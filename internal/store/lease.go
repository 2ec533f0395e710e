package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Lease is a gate lease: a block of one shard's slots of a gated key that one runner (Owner, its
// worker id) debited at once and admits its own claims of the key against (see lease.sql).
type Lease struct {
	Key   string
	Shard int16
	Owner string
}

// LeaseGate leases want slots of key's emptiest shard for owner, for ttl, if that shard has at
// least want*roomy free slots; ok is false if no shard has. limit and shards are the key's gate.
func (s *Store) LeaseGate(ctx context.Context, db DB, key string, limit, shards int32, owner string, want, roomy int, ttl time.Duration) (shard int16, ok bool, err error) {
	err = db.QueryRow(ctx, s.sql("gate_lease"), pgx.NamedArgs{"key": key, "lim": limit, "shards": shards, "owner": owner,
		"want": want, "roomy": roomy, "ttl": ttl.Milliseconds()}).Scan(&shard)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("lease slots of gate key %q: %w", key, err)
	}
	return shard, true, nil
}

// GrowLease adds want slots to a gate lease, if it is still there and its shard has at least
// want*roomy free slots; ok is false otherwise.
func (s *Store) GrowLease(ctx context.Context, db DB, l Lease, want, roomy int) (ok bool, err error) {
	var slots int32
	err = db.QueryRow(ctx, s.sql("gate_lease_grow"), pgx.NamedArgs{"key": l.Key, "shard": l.Shard, "owner": l.Owner,
		"want": want, "roomy": roomy}).Scan(&slots)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("grow the lease of gate key %q shard %d: %w", l.Key, l.Shard, err)
	}
	return true, nil
}

// RenewLeases extends the given gate leases to ttl from now and returns those it renewed; one it
// does not return is gone (the reconciler removed it once it expired).
func (s *Store) RenewLeases(ctx context.Context, db DB, leases []Lease, ttl time.Duration) ([]Lease, error) {
	keys, shards, owners := make([]string, len(leases)), make([]int16, len(leases)), make([]string, len(leases))
	for i, l := range leases {
		keys[i], shards[i], owners[i] = l.Key, l.Shard, l.Owner
	}
	rows, err := db.Query(ctx, s.sql("gate_lease_renew"), keys, shards, owners, ttl.Milliseconds())
	if err != nil {
		return nil, fmt.Errorf("renew gate leases: %w", err)
	}
	renewed, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Lease, error) {
		var l Lease
		err := r.Scan(&l.Key, &l.Shard, &l.Owner)
		return l, err
	})
	if err != nil {
		return nil, fmt.Errorf("renew gate leases: %w", err)
	}
	return renewed, nil
}

// ReleaseLease ends a gate lease: its row goes, and its unused slots go back to the counter if
// the row was still there.
func (s *Store) ReleaseLease(ctx context.Context, db DB, l Lease, unused int) error {
	if _, err := db.Exec(ctx, s.sql("gate_lease_release"), l.Key, l.Shard, l.Owner, unused); err != nil {
		return fmt.Errorf("release the lease of gate key %q shard %d: %w", l.Key, l.Shard, err)
	}
	return nil
}

// Heartbeat extends the leases of the given claims and returns the ids of those no longer held
// (lost), and of those held for an instance paused on its own (paused).
func (s *Store) Heartbeat(ctx context.Context, db DB, ids []int64, owners []string, lease time.Duration) (lost, paused []int64, err error) {
	rows, err := db.Query(ctx, s.sql("heartbeat"), ids, owners, lease.Milliseconds())
	if err != nil {
		return nil, nil, err
	}
	var id int64
	var gone bool
	_, err = pgx.ForEachRow(rows, []any{&id, &gone}, func() error {
		if gone {
			lost = append(lost, id)
		} else {
			paused = append(paused, id)
		}
		return nil
	})
	return lost, paused, err
}

// ConfirmLost backs a heartbeat's verdict that claims are lost before the caller acts on it: it
// writes node's registry row (seen_at) on db's server, a commit that waits for that server's
// synchronous standbys as the claims' own writes did. On a server outside the synchronous set it
// waits until ctx ends or the server does.
func (s *Store) ConfirmLost(ctx context.Context, db DB, node string) error {
	if _, err := db.Exec(ctx, s.sql("heartbeat_confirm"), node); err != nil {
		return fmt.Errorf("confirm lost claims: %w", err)
	}
	return nil
}
