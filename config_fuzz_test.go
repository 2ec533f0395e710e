package gendurable

import (
	"context"
	"errors"
	"math"
	"regexp"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// FuzzConfig: NewClient never panics; it returns a *ConfigError naming a field, or a client
// whose resolved configuration keeps every documented bound (what the engine's loops, timers and
// 32-bit columns rely on). No database: the pool points nowhere and must never be dialled.
//
//	go test -run '^$' -fuzz '^FuzzConfig$' -fuzztime 5m -parallel 1 .
func FuzzConfig(f *testing.F) {
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none?connect_timeout=1")
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(pool.Close)
	f.Add("", "", int64(0), int64(0), int64(0), int64(0), int64(0), int64(0), 0, 0, 0, "", 0, int64(0),
		"", 0, 0, "", 0, int64(0), 0, int64(0), "", "", "", 0, uint8(0))
	f.Add("web", "app", int64(time.Second), int64(100*time.Millisecond), int64(time.Millisecond), int64(time.Millisecond),
		int64(time.Millisecond), int64(time.Second), 1, 1, 1, "q", 10000, int64(time.Millisecond),
		"stripe", 5, 5, "mail", 100, int64(time.Minute), 100, int64(time.Millisecond), "m", "s", "q", 3, uint8(15))
	f.Fuzz(func(t *testing.T, name, schema string, lease, heartbeat, poll, reaper, gcInterval, gcRetention int64,
		gcBatch, maxPayload, maxChildren int, queue string, concurrency int, queuePoll int64,
		gate string, limit, shards int, rate string, allowed int, period int64, burst int, awaitTick int64,
		machine, step, machineQueue string, maxAttempts int, flags uint8) {
		cfg := &Config{
			Name: name, Schema: schema, Lease: time.Duration(lease), Heartbeat: time.Duration(heartbeat),
			PollInterval: time.Duration(poll), MaxPayloadBytes: maxPayload, MaxChildren: maxChildren,
			AwaitTick: time.Duration(awaitTick),
		}
		if flags&1 != 0 {
			cfg.Reaper = &ReaperConfig{Disabled: flags&2 != 0, Interval: time.Duration(reaper)}
		}
		if flags&4 != 0 {
			cfg.GC = &GCConfig{Disabled: flags&8 != 0, Interval: time.Duration(gcInterval),
				Retention: time.Duration(gcRetention), Batch: gcBatch}
		}
		if flags&16 != 0 {
			cfg.Queues = map[string]QueueConfig{queue: {Concurrency: concurrency, PollInterval: time.Duration(queuePoll)}}
		}
		if flags&32 != 0 {
			cfg.ConcurrencyLimits = map[string]ConcurrencyLimit{gate: {Limit: limit, Shards: shards}}
		}
		if flags&64 != 0 {
			cfg.RateLimits = map[string]Rate{rate: {Allowed: allowed, Period: time.Duration(period), Burst: burst}}
		}
		if flags&128 != 0 {
			cfg.Machines = []Machine{FSM[int]{Name: machine, Start: step, Queue: machineQueue, MaxAttempts: maxAttempts,
				Steps: map[string]StepFunc[int]{step: func(*Ctx, int) (Outcome, error) { return Done(nil), nil }}}}
		}
		cl, err := NewClient(pool, cfg)
		if err != nil {
			var ce *ConfigError
			if !errors.As(err, &ce) || ce.Field == "" || !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("not a *ConfigError naming a field: %T %v", err, err)
			}
			if cl != nil {
				t.Fatal("a client with an error")
			}
			return
		}
		if cl == nil {
			t.Fatal("no client and no error")
		}
		checkResolved(t, cfg)
		if n := pool.Stat().TotalConns(); n != 0 {
			t.Fatalf("NewClient connected (%d connections)", n)
		}
	})
}

var fuzzSchemaRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// checkResolved checks the bounds of a configuration NewClient accepted.
func checkResolved(t *testing.T, cfg *Config) {
	t.Helper()
	ec, schema, err := cfg.resolve()
	if err != nil {
		t.Fatalf("NewClient accepted what resolve refuses: %v", err)
	}
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("accepted config out of bounds: "+format, args...)
	}
	if !fuzzSchemaRE.MatchString(schema) || len(schema) > 3 && schema[:3] == "pg_" {
		fail("schema %q", schema)
	}
	if ec.Name == "" || len(ec.Name) > 64 {
		fail("name %q", ec.Name)
	}
	if ec.Lease < 100*time.Millisecond || ec.Heartbeat <= 0 || ec.Heartbeat > ec.Lease/3 {
		fail("lease %v heartbeat %v", ec.Lease, ec.Heartbeat)
	}
	if ec.ReaperInterval != 0 && ec.ReaperInterval < time.Millisecond || ec.ReaperInterval < 0 {
		fail("reaper interval %v", ec.ReaperInterval)
	}
	if ec.GCInterval != 0 && (ec.GCInterval < time.Millisecond || ec.GCRetention < ec.Lease || ec.GCBatch < 1 || ec.GCBatch > maxGCBatch) {
		fail("gc %v %v %d", ec.GCInterval, ec.GCRetention, ec.GCBatch)
	}
	if ec.MaxPayload < 1 || ec.MaxChildren < 1 || ec.AwaitTick < time.Millisecond {
		fail("payload %d children %d await tick %v", ec.MaxPayload, ec.MaxChildren, ec.AwaitTick)
	}
	for name, q := range ec.Queues {
		if checkName("queue", name) != nil || q.Concurrency < 1 || q.Concurrency > 10000 || q.PollInterval < time.Millisecond {
			fail("queue %q %+v", name, q)
		}
	}
	if g := ec.Gates; g != nil {
		for i := range g.Names {
			if g.Limits[i] < 1 || g.Shards[i] < 1 || g.Shards[i] > g.Limits[i] || g.Shards[i] > 1000 {
				fail("gate %q limit %d shards %d", g.Names[i], g.Limits[i], g.Shards[i])
			}
		}
	}
	if r := ec.Rates; r != nil {
		for i := range r.Names {
			if !(r.Rates[i] > 0) || math.IsInf(r.Rates[i], 0) || !(r.Bursts[i] >= 1) || math.IsInf(r.Bursts[i], 0) {
				fail("rate %q %v/s burst %v", r.Names[i], r.Rates[i], r.Bursts[i])
			}
		}
	}
	for name, m := range ec.Machines {
		if checkName("machine", name) != nil || m.MaxAttempts < 1 || m.MaxAttempts > maxCount || checkName("queue", m.Queue) != nil {
			fail("machine %q %+v", name, m)
		}
	}
}
