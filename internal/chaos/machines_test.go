package chaos

// The machines the tests run, in their own processes and in worker processes.

import (
	"context"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"os"
	"sync"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/chaos/oracle"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// path is linear5's state: a counter (oracle I3) and the steps it went through (I5). By names
// the client that ran the last step (a test of stale outcomes tells owners apart with it).
type path struct {
	I    int      `json:"i"`
	Path []string `json:"path"`
	By   string   `json:"by,omitempty"`
}

// linearPath is the path every finished linear5 instance takes (I5).
var linearPath = []string{"s0", "s1", "s2", "s3", "s4"}

// linear is a five-step machine (queue "work") whose state records the path it took: each step
// runs onStep (nil: nothing), sleeps delay, and moves on.
func linear(name string, delay time.Duration, onStep func(ctx *gendurable.Ctx)) gendurable.FSM[path] {
	steps := map[string]gendurable.StepFunc[path]{}
	for i, s := range linearPath {
		steps[s] = func(ctx *gendurable.Ctx, p path) (gendurable.Outcome, error) {
			if onStep != nil {
				onStep(ctx)
			}
			if delay > 0 {
				select {
				case <-time.After(delay):
				case <-ctx.Done():
					return gendurable.Outcome{}, context.Cause(ctx)
				}
			}
			p.I++
			p.Path = append(p.Path, s)
			if i == len(linearPath)-1 {
				return gendurable.Done(p), nil
			}
			return gendurable.Next(linearPath[i+1], p), nil
		}
	}
	return gendurable.FSM[path]{Name: name, Start: "s0", Steps: steps, Queue: "work"}
}

// effectRecorder returns a step hook that records the step's external effect in t_effects
// (autocommit, on pool, outside the outcome's transaction).
func effectRecorder(pool *pgxpool.Pool, schema string, pid int) func(ctx *gendurable.Ctx) {
	return func(ctx *gendurable.Ctx) {
		_, err := pool.Exec(ctx, expand(`INSERT INTO {schema}.t_effects (id, step, attempt, pid) VALUES ($1, $2, $3, $4)`, schema),
			ctx.ID, ctx.Step, ctx.Attempt, pid)
		if err != nil && ctx.Err() == nil {
			panic(err)
		}
	}
}

// fanState is the fan-out parent's state: the plan (waves of perWave children over queues) set
// at insert, and what the join steps saw.
type fanState struct {
	I       int      `json:"i"`
	Path    []string `json:"path"`
	Waves   int      `json:"waves"`
	PerWave int      `json:"per_wave"`
	Queues  []string `json:"queues"`
	Wave    int      `json:"wave"`
	// Seen counts the children the join steps saw done.
	Seen int `json:"seen"`
}

// fanMachine is the fan-out parent ("fan", queue "crash"): step spawn starts perWave linear5
// children spread over the plan's queues and parks until they finish; step join counts those
// done and spawns the next wave, or finishes after the last. onStep (may be nil) records the
// step's effect.
func fanMachine(onStep func(ctx *gendurable.Ctx)) gendurable.FSM[fanState] {
	child := linear("linear5", 0, nil)
	return gendurable.FSM[fanState]{Name: "fan", Start: "spawn", Queue: "crash", Steps: map[string]gendurable.StepFunc[fanState]{
		"spawn": func(ctx *gendurable.Ctx, s fanState) (gendurable.Outcome, error) {
			if onStep != nil {
				onStep(ctx)
			}
			kids := make([]gendurable.Child, s.PerWave)
			for i := range kids {
				kids[i] = gendurable.Child{Input: child.With(path{}), Opts: &gendurable.InsertOpts{Queue: s.Queues[i%len(s.Queues)]}}
			}
			s.I++
			s.Path = append(s.Path, "spawn")
			return gendurable.Spawn(kids, "join", s), nil
		},
		"join": func(ctx *gendurable.Ctx, s fanState) (gendurable.Outcome, error) {
			if onStep != nil {
				onStep(ctx)
			}
			for _, c := range ctx.Children {
				if c.Status == gendurable.StatusDone {
					s.Seen++
				}
			}
			s.Wave++
			s.I++
			s.Path = append(s.Path, "join")
			if s.Wave < s.Waves {
				return gendurable.Next("spawn", s), nil
			}
			return gendurable.Done(s), nil
		},
	}}
}

// chaosMachine is linear5 for fault tests: each step records its external effect on fx (a pool
// of its own, in autocommit, retried until it lands, so a step never moves on without its
// effect), then sleeps U(0, maxDelay) (a function of the seed and the step's coordinates), then
// moves on. A failed try is retried at once and often: faults, not the machine, are under test.
func chaosMachine(fx *pgxpool.Pool, schema string, pid int, seed uint64, maxDelay time.Duration) gendurable.FSM[path] {
	insert := expand(`INSERT INTO {schema}.t_effects (id, step, attempt, pid) VALUES ($1, $2, $3, $4)`, schema)
	steps := map[string]gendurable.StepFunc[path]{}
	for i, s := range linearPath {
		steps[s] = func(ctx *gendurable.Ctx, p path) (gendurable.Outcome, error) {
			if fx != nil {
				for {
					_, err := fx.Exec(ctx, insert, ctx.ID, ctx.Step, ctx.Attempt, pid)
					if err == nil {
						break
					}
					if ctx.Err() != nil {
						return gendurable.Outcome{}, fmt.Errorf("effect of %d/%s: %w", ctx.ID, ctx.Step, err)
					}
					select {
					case <-time.After(50 * time.Millisecond):
					case <-ctx.Done():
					}
				}
			}
			if maxDelay > 0 {
				h := fnv.New64a()
				fmt.Fprintf(h, "%d/%d/%s/%d", seed, ctx.ID, ctx.Step, ctx.Attempt)
				select {
				case <-time.After(time.Duration(h.Sum64() % uint64(maxDelay))):
				case <-ctx.Done():
					return gendurable.Outcome{}, context.Cause(ctx)
				}
			}
			p.I++
			p.Path = append(p.Path, s)
			if i == len(linearPath)-1 {
				return gendurable.Done(p), nil
			}
			return gendurable.Next(linearPath[i+1], p), nil
		}
	}
	return gendurable.FSM[path]{Name: "linear5", Start: "s0", Steps: steps, Queue: "chaos",
		MaxAttempts: 1000, Backoff: func(int) time.Duration { return 20 * time.Millisecond }}
}

// racesWorker runs the races set's machines, in a worker process or in the test's own.
type racesWorker struct {
	cfg    workerCfg
	queue  string
	side   *pgxpool.Pool
	schema string
	mu     sync.Mutex
	rng    *rand.Rand
}

func (w *racesWorker) sleep(ctx *gendurable.Ctx) {
	w.mu.Lock()
	d := w.cfg.StepMinMS
	if span := w.cfg.StepMaxMS - w.cfg.StepMinMS; span > 0 {
		d += w.rng.IntN(span + 1)
	}
	w.mu.Unlock()
	select {
	case <-time.After(time.Duration(d) * time.Millisecond):
	case <-ctx.Done():
	}
}

func (w *racesWorker) intn(n int) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.rng.IntN(n)
}

// newRacesWorker makes the races set's machines for cfg (its first queue, schema, step sleeps
// and seed), recording effects on side.
func newRacesWorker(cfg workerCfg, side *pgxpool.Pool) *racesWorker {
	return &racesWorker{cfg: cfg, queue: cfg.Queues[0], side: side, schema: pgx.Identifier{cfg.Schema}.Sanitize(),
		rng: rand.New(rand.NewPCG(cfg.Seed, uint64(os.Getpid())))}
}

// t6FanState is t6fan's state: the correlation keys of the children it spawns.
type t6FanState struct {
	Keys []string `json:"keys"`
}

// walkState is gatewalk's state: linear5's counter and path, and the concurrency key the
// instance holds now (the step records its effect under it).
type walkState struct {
	I    int      `json:"i"`
	Path []string `json:"path"`
	Key  string   `json:"key,omitempty"`
	// Keys are the keys a step may switch to.
	Keys []string `json:"keys,omitempty"`
}

// machines are the races set's machines (workerCfg.Machines machinesRaces):
//   - gatewalk (T3): five steps; each records its effect and its presence in t_inflight under
//     its concurrency key for its whole run; 10 % of transitions switch the key, 5 % release it.
//   - t6job (T6): one rate-limited step.
//   - t6fan (T6): spawns children whose correlation keys collide with the inserters' keys.
//   - stamp (T12): one step that records its effect.
//   - timed (T12): parks on a signal that never comes, with a 1 s timeout, then finishes.
func (w *racesWorker) machines() []gendurable.Machine {
	pid := os.Getpid()
	walkSteps := map[string]gendurable.StepFunc[walkState]{}
	for i, s := range linearPath {
		walkSteps[s] = func(ctx *gendurable.Ctx, st walkState) (gendurable.Outcome, error) {
			if err := oracle.Effect(ctx, w.side, w.cfg.Schema, ctx.ID, ctx.Step, ctx.Attempt, pid); err != nil {
				return gendurable.Outcome{}, err
			}
			if st.Key != "" {
				if _, err := w.side.Exec(ctx, `INSERT INTO `+w.schema+`.t_inflight (key, id, pid) VALUES ($1, $2, $3)`, st.Key, ctx.ID, pid); err != nil {
					return gendurable.Outcome{}, err
				}
			}
			w.sleep(ctx)
			if st.Key != "" {
				if _, err := w.side.Exec(context.WithoutCancel(ctx), `DELETE FROM `+w.schema+`.t_inflight WHERE id = $1 AND pid = $2`, ctx.ID, pid); err != nil {
					return gendurable.Outcome{}, err
				}
			}
			st.I++
			st.Path = append(st.Path, s)
			if i == len(linearPath)-1 {
				return gendurable.Done(st), nil
			}
			switch r := w.intn(100); {
			case r < 10 && len(st.Keys) > 0:
				st.Key = st.Keys[w.intn(len(st.Keys))]
				return gendurable.Next(linearPath[i+1], st, gendurable.ConcurrencyKey(st.Key)), nil
			case r < 15:
				st.Key = ""
				return gendurable.Next(linearPath[i+1], st, gendurable.ReleaseConcurrencyKey()), nil
			}
			return gendurable.Next(linearPath[i+1], st), nil
		}
	}
	walk := gendurable.FSM[walkState]{Name: "gatewalk", Start: "s0", Queue: w.queue, Steps: walkSteps}
	job := gendurable.Job[string]{Name: "t6job", Queue: w.queue, Perform: func(ctx *gendurable.Ctx, _ string) error {
		w.sleep(ctx)
		return nil
	}}
	fan := gendurable.FSM[t6FanState]{Name: "t6fan", Start: "spawn", Queue: w.queue, Steps: map[string]gendurable.StepFunc[t6FanState]{
		"spawn": func(ctx *gendurable.Ctx, f t6FanState) (gendurable.Outcome, error) {
			kids := make([]gendurable.Child, len(f.Keys))
			for i, k := range f.Keys {
				kids[i] = gendurable.Child{Input: job.With(k), Opts: &gendurable.InsertOpts{CorrelationKey: k, RateLimit: "api:" + k[len(k)-1:]}}
			}
			return gendurable.Spawn(kids, "join", f), nil
		},
		"join": func(ctx *gendurable.Ctx, f t6FanState) (gendurable.Outcome, error) { return gendurable.Done(nil), nil },
	}}
	stamp := gendurable.Job[string]{Name: "stamp", Queue: w.queue, Perform: func(ctx *gendurable.Ctx, _ string) error {
		return oracle.Effect(ctx, w.side, w.cfg.Schema, ctx.ID, ctx.Step, ctx.Attempt, pid)
	}}
	timed := gendurable.FSM[walkState]{Name: "timed", Start: "s0", Queue: w.queue, Steps: map[string]gendurable.StepFunc[walkState]{
		"s0": func(ctx *gendurable.Ctx, st walkState) (gendurable.Outcome, error) {
			if err := oracle.Effect(ctx, w.side, w.cfg.Schema, ctx.ID, ctx.Step, ctx.Attempt, pid); err != nil {
				return gendurable.Outcome{}, err
			}
			return gendurable.Await([]string{"never"}, "s1", st, gendurable.Timeout(time.Second)), nil
		},
		"s1": func(ctx *gendurable.Ctx, st walkState) (gendurable.Outcome, error) {
			if err := oracle.Effect(ctx, w.side, w.cfg.Schema, ctx.ID, ctx.Step, ctx.Attempt, pid); err != nil {
				return gendurable.Outcome{}, err
			}
			return gendurable.Done(st), nil
		},
	}}
	return []gendurable.Machine{walk, job, fan, stamp, timed}
}
