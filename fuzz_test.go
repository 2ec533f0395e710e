package gendurable_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/durabledbtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The fuzz targets of docs/reliability.md T13 that need the database. `go test` runs their seed
// corpora (testdata/fuzz/<Target>); the full size runs each for five minutes:
//
//	go test -run '^$' -fuzz '^FuzzInsertValidate$' -fuzztime 5m -parallel 1 .
//	go test -run '^$' -fuzz '^FuzzSignal$' -fuzztime 5m -parallel 1 .

// fuzzInput builds the input the fuzzer asked for: raw JSON (a json.RawMessage, which reaches
// Postgres as written) or a Go string.
func fuzzInput(machine string, doc []byte, raw bool) gendurable.Input {
	if raw {
		return gendurable.Job[json.RawMessage]{Name: machine}.With(json.RawMessage(doc))
	}
	return gendurable.Job[string]{Name: machine}.With(string(doc))
}

// fuzzEncoded is what a valid input's state or payload is stored as: what encoding/json writes.
func fuzzEncoded(doc []byte, raw bool) string {
	var b []byte
	if raw {
		b, _ = json.Marshal(json.RawMessage(doc))
	} else {
		b, _ = json.Marshal(string(doc))
	}
	return string(b)
}

// requireValidationError fails unless err is the API's own validation error (and no error the
// database raised): what validation accepts, Postgres must accept.
func requireValidationError(t *testing.T, err error, also ...error) {
	t.Helper()
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		t.Fatalf("validation passed, then Postgres refused (SQLSTATE %s): %v", pgErr.Code, err)
	}
	if errors.Is(err, gendurable.ErrInvalidInput) {
		return
	}
	for _, a := range also {
		if errors.Is(err, a) {
			return
		}
	}
	t.Fatalf("not a validation error: %T %v", err, err)
}

var fuzzStatuses = []gendurable.Status{gendurable.StatusAvailable, gendurable.StatusDone, gendurable.StatusFailed,
	gendurable.StatusCancelled, "bogus"}

// FuzzInsertValidate: validation accepts ⇒ Postgres accepts. Every insert either fails with an
// *InputError before the database is asked, or stores exactly what was given: no raw SQLSTATE
// (22P02, 22P05, 23514, 22021, 22003, 22008, …) after validation passed, and nothing truncated
// or wrapped on the way (32-bit columns, timestamps).
func FuzzInsertValidate(f *testing.F) {
	pool := durabledbtest.Pool(f, 4)
	schema := durabledbtest.Schema(f, pool)
	cl, err := gendurable.NewClient(pool, &gendurable.Config{Schema: schema})
	if err != nil {
		f.Fatal(err)
	}
	f.Add("m", "default", "", "", "", 0, 0, 0, int64(0), int64(0), []byte(`{"a":1}`), true, uint8(0))
	f.Add("m", "q", "k", "c", "r", 9, 3, 2, int64(1893456000), int64(0), []byte(`"x"`), false, uint8(3))
	f.Add("m", "q", "k", "", "", 1, math.MaxInt32, 0, int64(0), int64(time.Hour), []byte(`[1e400]`), true, uint8(2))
	f.Fuzz(func(t *testing.T, machine, queue, key, ckey, rate string, prio, maxAtt, weight int, sched, in int64,
		doc []byte, raw bool, scope uint8) {
		opts := &gendurable.InsertOpts{Queue: queue, Priority: prio, MaxAttempts: maxAtt, CorrelationKey: key,
			ConcurrencyKey: ckey, RateLimit: rate, Weight: weight, In: time.Duration(in)}
		if sched != 0 {
			opts.ScheduledAt = time.Unix(sched, 0)
		}
		for i, s := range fuzzStatuses {
			if scope&(1<<i) != 0 {
				opts.CorrelationScope = append(opts.CorrelationScope, s)
			}
		}
		ctx := context.Background()
		res, err := cl.Insert(ctx, fuzzInput(machine, doc, raw), opts)
		if err != nil {
			requireValidationError(t, err)
			return
		}
		defer func() {
			if _, err := pool.Exec(ctx, expand(`DELETE FROM {schema}.instances WHERE id = $1`, schema), res.ID); err != nil {
				t.Fatal(err)
			}
		}()
		if res.Duplicate {
			return
		}
		var got struct {
			machine, queue, key, ckey, rate string
			prio, maxAtt, weight            int
			stateSame                       bool
			at                              time.Time
		}
		err = pool.QueryRow(ctx, expand(`SELECT machine, queue, coalesce(correlation_key, ''), coalesce(concurrency_key, ''),
			coalesce(rate_limit, ''), priority, max_attempts, weight, state = $2::text::jsonb, scheduled_at
			FROM {schema}.instances WHERE id = $1`, schema), res.ID, fuzzEncoded(doc, raw)).Scan(
			&got.machine, &got.queue, &got.key, &got.ckey, &got.rate, &got.prio, &got.maxAtt, &got.weight, &got.stateSame, &got.at)
		if err != nil {
			t.Fatalf("read back instance %d: %v", res.ID, err)
		}
		want := fmt.Sprint(machine, "|", orDefault(queue, "default"), "|", key, "|", ckey, "|", rate, "|", orDefaultInt(prio, 5),
			"|", orDefaultInt(maxAtt, gendurable.DefaultMaxAttempts), "|", max(weight, 1), "|", true)
		have := fmt.Sprint(got.machine, "|", got.queue, "|", got.key, "|", got.ckey, "|", got.rate, "|", got.prio,
			"|", got.maxAtt, "|", got.weight, "|", got.stateSame)
		if want != have {
			t.Fatalf("stored something else than was inserted:\n want %q\n have %q", want, have)
		}
		if sched != 0 && !got.at.Equal(opts.ScheduledAt) {
			t.Fatalf("ScheduledAt %v stored as %v", opts.ScheduledAt, got.at)
		}
	})
}

// FuzzSignal: a signal with any name and payload is refused with a typed error, or stored as
// given in a live instance's inbox; a signal by key reaches that instance or nothing
// (ErrNoTarget).
func FuzzSignal(f *testing.F) {
	pool := durabledbtest.Pool(f, 4)
	schema := durabledbtest.Schema(f, pool)
	cl, err := gendurable.NewClient(pool, &gendurable.Config{Schema: schema})
	if err != nil {
		f.Fatal(err)
	}
	ctx := context.Background()
	target, err := cl.Insert(ctx, gendurable.Job[int]{Name: "target"}.With(1), &gendurable.InsertOpts{CorrelationKey: "live"})
	if err != nil {
		f.Fatal(err)
	}
	f.Add("go", []byte(`{"by":"ada"}`), true, false, "")
	f.Add("note", []byte("plain text"), false, false, "")
	f.Add("x", []byte(nil), true, true, "live")
	f.Add("x", []byte(`"\ud800"`), true, false, "other")
	f.Fuzz(func(t *testing.T, name string, doc []byte, raw, nilPayload bool, key string) {
		var payload any = json.RawMessage(doc)
		if !raw {
			payload = string(doc)
		}
		if nilPayload {
			payload = nil
		}
		to := gendurable.ByID(target.ID)
		if key != "" {
			to = gendurable.ByKey("target", key)
		}
		res, err := cl.Signal(ctx, to, name, payload)
		if err != nil {
			if key != "live" && errors.Is(err, gendurable.ErrNoTarget) {
				return
			}
			requireValidationError(t, err)
			return
		}
		if res.InstanceID != target.ID {
			t.Fatalf("signal for %q went to instance %d, not %d", key, res.InstanceID, target.ID)
		}
		var gotName string
		var same bool
		want := pgx.NamedArgs{"id": res.SignalID, "payload": nil}
		if payload != nil {
			want["payload"] = fuzzEncoded(doc, raw)
		}
		err = pool.QueryRow(ctx, expand(`DELETE FROM {schema}.signals WHERE id = @id
			RETURNING name, payload IS NOT DISTINCT FROM @payload::text::jsonb`, schema), want).Scan(&gotName, &same)
		if err != nil {
			t.Fatalf("read back signal %d: %v", res.SignalID, err)
		}
		if gotName != name || !same {
			t.Fatalf("stored signal %q (payload as given: %v), sent %q", gotName, same, name)
		}
	})
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func orDefaultInt(n, def int) int {
	if n == 0 {
		return def
	}
	return n
}
