package durabletest_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/durabledbtest"
	"github.com/gendurable/gendurable/durabletest"
	"github.com/stretchr/testify/require"
)

// docs:begin testmain
func TestMain(m *testing.M) { durabledbtest.Main(m) }

// docs:end

type Cart struct {
	Items   int    `json:"items"`
	Charged bool   `json:"charged"`
	Receipt string `json:"receipt,omitempty"`
}

var errFlaky = errors.New("payment provider timed out")

var checkout = gendurable.FSM[Cart]{
	Name:  "checkout",
	Start: "charge",
	Steps: map[string]gendurable.StepFunc[Cart]{
		"charge": func(ctx *gendurable.Ctx, c Cart) (gendurable.Outcome, error) {
			if ctx.Attempt == 1 {
				return gendurable.Outcome{}, errFlaky // the first try fails; the retry succeeds
			}
			c.Charged = true
			return gendurable.Next("receipt", c, gendurable.After(24*time.Hour)), nil
		},
		"receipt": func(ctx *gendurable.Ctx, c Cart) (gendurable.Outcome, error) {
			c.Receipt = "R-1"
			return gendurable.Done(c), nil
		},
	},
}

// The guide docs/testing.md quotes this test between its docs markers.
func TestCheckout(t *testing.T) {
	pool := durabledbtest.Pool(t, 4)
	schema := durabledbtest.Schema(t, pool)
	// docs:begin kit
	ctx := context.Background()
	client, err := gendurable.NewClient(pool, &gendurable.Config{
		Schema:   schema,
		Machines: []gendurable.Machine{checkout},
	})
	require.NoError(t, err)

	// Run the test in a transaction that is rolled back: nothing escapes it.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	kit := durabletest.New(t, client, &durabletest.Opts{Tx: tx})

	res, err := client.InsertTx(ctx, tx, checkout.With(Cart{Items: 2}), nil)
	require.NoError(t, err)

	// Drain runs every runnable step here, in this goroutine, through the production code path.
	// The retry's backoff and the 24-hour delay collapse: no sleeping.
	r := kit.Drain(ctx)
	require.Equal(t, 3, r.Steps)

	var cart Cart
	in := kit.RequireDone(ctx, res.ID, &cart)
	require.Equal(t, Cart{Items: 2, Charged: true, Receipt: "R-1"}, cart)
	require.Len(t, in.Errors, 1) // the failed first charge is in the history
	// docs:end
}

func TestRequireHelpersReportMismatches(t *testing.T) {
	pool := durabledbtest.Pool(t, 4)
	schema := durabledbtest.Schema(t, pool)
	ctx := context.Background()
	client, err := gendurable.NewClient(pool, &gendurable.Config{Schema: schema, Machines: []gendurable.Machine{checkout}})
	require.NoError(t, err)
	res, err := client.Insert(ctx, checkout.With(Cart{}), nil)
	require.NoError(t, err)
	rec := &recorder{TB: t}
	kit := durabletest.New(rec, client, nil)
	kit.RequireDone(ctx, res.ID, nil)
	require.True(t, rec.failed, "RequireDone on an available instance fails the test")
	require.Contains(t, rec.msg, "is available")
	require.Nil(t, kit.Get(ctx, 1<<40))
}

// recorder is a testing.TB whose Fatalf records instead of stopping the test.
type recorder struct {
	testing.TB
	failed bool
	msg    string
}

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(format string, args ...any) {
	r.failed = true
	r.msg = fmt.Sprintf(format, args...)
}

// A step that writes through Ctx.Tx, drained in the caller's transaction: its transaction is a
// savepoint of the caller's, and the settings its outcome batch runs under in a transaction of
// its own (the engine's statement timeout, the planner's) must not outlive it into the caller's.
func TestDrainInATransactionLeavesItsSettingsAlone(t *testing.T) {
	pool := durabledbtest.Pool(t, 4)
	schema := durabledbtest.Schema(t, pool)
	ctx := context.Background()
	writer := gendurable.Job[int]{Name: "writer", Perform: func(c *gendurable.Ctx, _ int) error {
		tx, err := c.Tx()
		if err != nil {
			return err
		}
		_, err = tx.Exec(c, `SELECT 1`)
		return err
	}}
	client, err := gendurable.NewClient(pool, &gendurable.Config{Schema: schema, Machines: []gendurable.Machine{writer}})
	require.NoError(t, err)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	settings := func() (s [3]string) {
		require.NoError(t, tx.QueryRow(ctx, `SELECT current_setting('statement_timeout'), current_setting('enable_seqscan'),
			current_setting('plan_cache_mode')`).Scan(&s[0], &s[1], &s[2]))
		return s
	}
	_, err = tx.Exec(ctx, `SET LOCAL statement_timeout = '5s'`)
	require.NoError(t, err)
	before := settings()
	kit := durabletest.New(t, client, &durabletest.Opts{Tx: tx})
	res, err := client.InsertTx(ctx, tx, writer.With(1), nil)
	require.NoError(t, err)
	require.Equal(t, 1, kit.Drain(ctx).Steps)
	kit.RequireDone(ctx, res.ID, nil)
	require.Equal(t, before, settings())
}
