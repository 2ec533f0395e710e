package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gendurable/gendurable/durabletype"
	"github.com/jackc/pgx/v5"
)

// UpgradeRow is a row a bulk upgrade locked: what the machine's upgrade needs.
type UpgradeRow struct {
	ID      int64
	Step    string
	State   []byte
	Version int
	// CodecErr says why its sealed state could not be opened: it cannot be upgraded here.
	CodecErr error
}

// UpgradeBatch locks a batch of machine's unclaimed live rows below version with ids above after
// (upgrade_batch); tx must be a transaction, which the batch's UpgradeApply commits in.
func (s *Store) UpgradeBatch(ctx context.Context, tx pgx.Tx, machine string, version int, after int64, batch int) ([]UpgradeRow, error) {
	rows, err := tx.Query(ctx, s.sql("upgrade_batch"), pgx.NamedArgs{"machine": machine, "version": version,
		"after": after, "batch": batch})
	if err != nil {
		return nil, err
	}
	var out []UpgradeRow
	var r UpgradeRow
	var v int32
	_, err = pgx.ForEachRow(rows, []any{&r.ID, &r.Step, &r.State, &v}, func() error {
		r.Version = int(v)
		st, cerr := s.openDoc(append([]byte(nil), r.State...))
		out = append(out, UpgradeRow{ID: r.ID, Step: r.Step, State: st, Version: r.Version, CodecErr: cerr})
		return nil
	})
	return out, err
}

// Upgraded is a row a bulk upgrade brought forward: its queue, and whether it is runnable now
// (available and due).
type Upgraded struct {
	ID    int64
	Queue string
	Due   bool
}

// UpgradeApply writes the upgrades of rows UpgradeBatch locked in tx (upgrade_apply): each to
// steps[i] with states[i] at version, recorded as by.
func (s *Store) UpgradeApply(ctx context.Context, tx pgx.Tx, ids []int64, steps []string, states [][]byte, version int, by string) ([]Upgraded, error) {
	text := make([]string, len(states))
	for i, st := range states {
		sealed, err := s.sealDoc(st)
		if err != nil {
			return nil, err
		}
		text[i] = string(sealed)
	}
	rows, err := tx.Query(ctx, s.sql("upgrade_apply"), pgx.NamedArgs{"ids": ids, "steps": steps, "states": text,
		"version": version, "by": by})
	if err != nil {
		return nil, err
	}
	var out []Upgraded
	var u Upgraded
	_, err = pgx.ForEachRow(rows, []any{&u.ID, &u.Queue, &u.Due}, func() error {
		out = append(out, u)
		return nil
	})
	return out, err
}

// RequestUpgrade records an operator's request for a bulk upgrade of machine (upgrade_request).
func (s *Store) RequestUpgrade(ctx context.Context, db DB, machine string) (int64, error) {
	var id int64
	err := db.QueryRow(ctx, s.sql("upgrade_request"), pgx.NamedArgs{"machine": machine}).Scan(&id)
	return id, err
}

// TakeUpgrade takes the oldest open request for one of the machines (names at versions) that no
// node holds and no running node (seen within live) knows a newer version of, for lease
// (upgrade_take). ok is false if there is none.
func (s *Store) TakeUpgrade(ctx context.Context, db DB, by string, v *Versions, lease, live time.Duration) (id int64, machine string, ok bool, err error) {
	if v == nil || len(v.Names) == 0 {
		return 0, "", false, nil
	}
	err = db.QueryRow(ctx, s.sql("upgrade_take"), pgx.NamedArgs{"by": by, "names": v.Names, "versions": v.Versions,
		"lease_ms": lease.Milliseconds(), "live_ms": live.Milliseconds()}).Scan(&id, &machine)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, "", false, nil
	}
	if err != nil {
		return 0, "", false, err
	}
	return id, machine, true, nil
}

// ProgressUpgrade extends a taken request's lease and records its counts (upgrade_progress).
func (s *Store) ProgressUpgrade(ctx context.Context, db DB, id int64, by string, lease time.Duration, upgraded, blocked int64) error {
	_, err := db.Exec(ctx, s.sql("upgrade_progress"), pgx.NamedArgs{"id": id, "by": by, "lease_ms": lease.Milliseconds(),
		"upgraded": upgraded, "blocked": blocked})
	return err
}

// FinishUpgrade finishes a taken request (upgrade_finish).
func (s *Store) FinishUpgrade(ctx context.Context, db DB, id int64, by string, upgraded, blocked int64, errMsg string) error {
	_, err := db.Exec(ctx, s.sql("upgrade_finish"), pgx.NamedArgs{"id": id, "by": by, "upgraded": upgraded,
		"blocked": blocked, "error": errMsg})
	return err
}

// UpgradeRequest is an operator's bulk-upgrade request as recorded.
type UpgradeRequest = durabletype.UpgradeRequest

// UpgradeStatus reads a request (upgrade_status).
func (s *Store) UpgradeStatus(ctx context.Context, db DB, id int64) (*UpgradeRequest, error) {
	var r UpgradeRequest
	var v int32
	err := db.QueryRow(ctx, s.sql("upgrade_status"), pgx.NamedArgs{"id": id}).Scan(&r.ID, &r.Machine, &r.RequestedAt,
		&r.TakenBy, &r.FinishedAt, &v, &r.Upgraded, &r.Blocked, &r.Error)
	if err != nil {
		return nil, fmt.Errorf("upgrade request %d: %w", id, err)
	}
	r.Version = int(v)
	return &r, nil
}
