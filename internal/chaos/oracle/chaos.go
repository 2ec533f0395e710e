package oracle

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// ChaosEnv names the environment variable that selects the reliability tests' size:
// GD_CHAOS=full runs the full sizes (`make chaos` sets it); unset, they run at their CI size.
const ChaosEnv = "GD_CHAOS"

// SeedEnv names the environment variable that replays a seed: GD_SEED=N.
const SeedEnv = "GD_SEED"

// Full reports whether the full sizes run (GD_CHAOS=full).
func Full() bool { return os.Getenv(ChaosEnv) == "full" }

// Size returns ci at the CI size and full at the full size.
func Size[T any](ci, full T) T {
	if Full() {
		return full
	}
	return ci
}

// Seed returns the test's seed, GD_SEED if it is set, else one from the clock, and a PRNG that
// draws from it alone. It logs seed=N at once and again if the test fails, so that every failing
// run can be replayed.
func Seed(t testing.TB) (uint64, *rand.Rand) {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv(SeedEnv); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("oracle: %s=%q: %v", SeedEnv, s, err)
		}
		seed = v
	}
	t.Logf("seed=%d", seed)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("seed=%d (replay with %s=%d)", seed, SeedEnv, seed)
		}
	})
	return seed, rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
}

// Tally is what the logs say about a run, for its Summary.
type Tally struct {
	// Instances is how many instances the outcome log has seen.
	Instances int
	// Finished is how many of them are terminal now (done, failed or cancelled).
	Finished int
	// DuplicateTerminal counts terminal transitions beyond the first of each instance.
	DuplicateTerminal int
}

// Count reads the tally from the outcome log and the instances table.
func Count(ctx context.Context, pool *pgxpool.Pool, schema string) (Tally, error) {
	s := q(schema)
	var c Tally
	err := pool.QueryRow(ctx, `SELECT
		(SELECT count(DISTINCT id) FROM `+s+`.t_outcome_log),
		(SELECT count(*) FROM `+s+`.instances WHERE status IN ('done', 'failed', 'cancelled')),
		(SELECT coalesce(sum(n - 1), 0) FROM (
			SELECT count(*) AS n FROM `+s+`.t_outcome_log
			WHERE new_status IN ('done', 'failed', 'cancelled') AND old_status IS DISTINCT FROM new_status
			GROUP BY id) t)`).Scan(&c.Instances, &c.Finished, &c.DuplicateTerminal)
	if err != nil {
		return c, fmt.Errorf("oracle: count: %w", err)
	}
	return c, nil
}

// Steps counts the step outcomes committed in [from, to): transitions out of executing that
// moved an instance on (a new step, finished, parked). Releases of lost claims do not count.
// Divided by the window's length it is the throughput a Summary reports.
func Steps(ctx context.Context, pool *pgxpool.Pool, schema string, from, to time.Time) (int, error) {
	var n int
	err := pool.QueryRow(ctx, `SELECT count(*) FROM `+q(schema)+`.t_outcome_log
		WHERE old_status = 'executing' AND (new_step <> old_step OR new_status IN ('done', 'failed', 'awaiting', 'joining'))
		  AND at >= $1 AND at < $2`, from, to).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("oracle: steps: %w", err)
	}
	return n, nil
}
