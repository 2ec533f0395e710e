package store

import (
	"context"
	"errors"
	"strconv"

	"github.com/gendurable/gendurable/internal/fault"
	"github.com/jackc/pgx/v5"
)

// Delivered is the result of a delivered signal.
type Delivered struct {
	SignalID   int64
	InstanceID int64
	Woke       bool
	Queue      string
}

// DeliverSignal stores a signal for a live instance (by id, or by machine and correlation key
// when id is 0) and wakes it if it awaits that name. found is false when the target is finished
// or does not exist; then nothing was stored.
func (s *Store) DeliverSignal(ctx context.Context, db DB, id int64, machine, key, name string, payload *string) (Delivered, bool, error) {
	var idArg *int64
	if id != 0 {
		idArg = &id
	}
	if fault.Enabled {
		subject := machine + "/" + key
		if id != 0 {
			subject = strconv.FormatInt(id, 10)
		}
		if err := fault.PointFor(fault.DeliverBeforeWake, subject); err != nil {
			return Delivered{}, false, err
		}
	}
	if payload != nil && s.Codec != nil {
		sealed, err := s.sealDocText(*payload)
		if err != nil {
			return Delivered{}, false, err
		}
		payload = &sealed
	}
	var d Delivered
	err := db.QueryRow(ctx, s.sql("deliver_signal"), idArg, machine, key, name, payload).Scan(&d.SignalID, &d.InstanceID, &d.Woke, &d.Queue)
	if errors.Is(err, pgx.ErrNoRows) {
		return Delivered{}, false, nil
	}
	if err != nil {
		return Delivered{}, false, err
	}
	return d, true, nil
}
