package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/gendurable/gendurable/internal/fault"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
	idArg, payload, err := s.deliveryArgs(id, machine, key, payload)
	if err != nil {
		return Delivered{}, false, err
	}
	var d Delivered
	err = db.QueryRow(ctx, s.sql("deliver_signal"), idArg, machine, key, name, payload).Scan(&d.SignalID, &d.InstanceID, &d.Woke, &d.Queue)
	if errors.Is(err, pgx.ErrNoRows) {
		return Delivered{}, false, nil
	}
	if err != nil {
		return Delivered{}, false, err
	}
	return d, true, nil
}

// deliveryArgs passes a delivery's fault point (fault.DeliverBeforeWake, its subject the target's
// id, or machine/key) and returns the target id as the statements take it (NULL: by key) and the
// payload as stored (sealed with the Store's codec).
func (s *Store) deliveryArgs(id int64, machine, key string, payload *string) (*int64, *string, error) {
	if fault.Enabled {
		subject := machine + "/" + key
		if id != 0 {
			subject = strconv.FormatInt(id, 10)
		}
		if err := fault.PointFor(fault.DeliverBeforeWake, subject); err != nil {
			return nil, nil, err
		}
	}
	if payload != nil && s.Codec != nil {
		sealed, err := s.sealDocText(*payload)
		if err != nil {
			return nil, nil, err
		}
		payload = &sealed
	}
	if id == 0 {
		return nil, payload, nil
	}
	return &id, payload, nil
}

// WakeSlots are the executor slots a client reserved for a signal's wake, one per queue it works
// (parallel slices), and the machines it can run: DeliverSignalClaim claims the woken row if it
// is in one of these queues (see deliver_signal_claim).
type WakeSlots struct {
	Queues, Owners []string
	// Machines and Versions are the machines the client registered and the version of each;
	// Paused those it last saw paused.
	Machines []string
	Versions []int32
	Paused   []string
	Lease    time.Duration
}

// ErrDeliverPlainly is DeliverSignalClaim's answer when it stored nothing and the signal should
// go by DeliverSignal: the target's row stayed locked by another transaction past the claim's
// lock timeout (a reservation of the caller's executor slots must not wait on it), or its
// inbox's first signals did not fit one jsonb value (payloads larger than this client's
// MaxPayloadBytes, from another client).
var ErrDeliverPlainly = errors.New("deliver the signal without claiming its target")

// DeliverSignalClaim is DeliverSignal for a client with slots reserved in slots: a signal that
// wakes its target, in one of those queues with nothing more urgent due ahead of it, also claims
// it, and the claim comes back in c (its Owner one of slots.Owners), ready to run; otherwise c is
// nil and the delivery is DeliverSignal's. It waits at most WakeLockTimeout for the target's row
// lock (then ErrDeliverPlainly, nothing stored); the caller runs it where its own cancellation
// cannot separate a committed claim from its reply (the row would wait out its lease).
func (s *Store) DeliverSignalClaim(ctx context.Context, db DB, id int64, machine, key, name string, payload *string, slots *WakeSlots) (d Delivered, c *Claimed, found bool, err error) {
	idArg, payload, err := s.deliveryArgs(id, machine, key, payload)
	if err != nil {
		return Delivered{}, nil, false, err
	}
	paused := slots.Paused
	if paused == nil {
		paused = []string{}
	}
	lockTimeout := pickLockTimeout
	if s.WakeLockTimeout > 0 {
		lockTimeout = strconv.FormatInt(s.WakeLockTimeout.Milliseconds(), 10) + "ms"
	}
	claimRows := s.claimRows()
	var claimed bool
	var cl Claimed
	var attempt, maxAttempts, version, recoveries int32
	var priority int16
	var owner *string // the row's claim token: NULL, or another's, when it was not claimed
	var inbox, stored []byte
	var signalAt time.Time
	// One round trip, one implicit transaction: the lock wait's bound, then the delivery.
	b := &pgx.Batch{}
	b.Queue(s.sql("deliver_signal_claim_settings"), lockTimeout)
	b.Queue(s.sql("deliver_signal_claim"), idArg, machine, key, name, payload,
		slots.Queues, slots.Owners, slots.Machines, slots.Versions, paused, slots.Lease.Milliseconds(), int32(claimRows))
	br := db.SendBatch(ctx, b)
	_, err = br.Exec()
	if err == nil {
		err = br.QueryRow().Scan(
			&d.SignalID, &d.InstanceID, &d.Woke, &d.Queue, &claimed,
			&cl.Machine, &cl.Step, &cl.State, &attempt, &maxAttempts, &priority, &cl.CorrelationKey, &cl.InsertedAt,
			&cl.AwaitNames, &cl.Child, &version, &recoveries, &owner, &inbox, &stored, &signalAt)
	}
	if cerr := br.Close(); err == nil || errors.Is(err, pgx.ErrNoRows) && cerr != nil {
		err = cerr
	}
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Delivered{}, nil, false, nil
	case ValueTooLarge(err), errors.As(err, &pgErr) && pgErr.Code == pgLockNotAvailable:
		return Delivered{}, nil, false, fmt.Errorf("%w: %w", ErrDeliverPlainly, err)
	case err != nil:
		return Delivered{}, nil, false, err
	case !claimed:
		return d, nil, true, nil
	}
	cl.ID, cl.Queue, cl.Owner, cl.Signalled = d.InstanceID, d.Queue, *owner, true
	cl.Attempt, cl.MaxAttempts, cl.Priority = int(attempt), int(maxAttempts), int(priority)
	cl.MachineVersion, cl.Recoveries = int(version), int(recoveries)
	switch derr := cl.decodeInbox(inbox, claimRows); {
	case derr != nil:
		// The row is claimed: it goes to the executor, which fails the step with this.
		cl.Inbox, cl.CodecErr = nil, derr
	case cl.inboxMore:
		// An inbox longer than the statement returns is left to LoadRest, this signal among it
		// (committed by then).
		s.openClaim(&cl)
	default:
		// The payload as stored (jsonb's text, sealed with a codec), as a pick would return it.
		p := json.RawMessage("null")
		if stored != nil {
			p = json.RawMessage(stored)
		}
		cl.Inbox = append(cl.Inbox, SignalRow{ID: d.SignalID, Name: name, Payload: p, At: signalAt})
		s.openClaim(&cl)
	}
	return d, &cl, true, nil
}
