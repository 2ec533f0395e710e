package durabletest_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/durablemigrate"
	"github.com/gendurable/gendurable/durabletest"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Trial is a free trial that ends after thirty days, with a reminder three days before.
type Trial struct {
	User     string `json:"user"`
	Reminded bool   `json:"reminded"`
	Ended    bool   `json:"ended"`
}

// Drain runs everything runnable in the test's goroutine, through the production statements,
// until nothing is: the 27 and 3 days of this machine's delays collapse, so the test runs the
// whole trial at once. Inside the test's transaction, nothing escapes the test.
func ExampleKit_Drain() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	schema := fmt.Sprintf("example_kit_drain_%d", os.Getpid())
	if err := gendurable.Migrate(ctx, pool, &gendurable.MigrateOpts{Schema: schema}); err != nil {
		panic(err)
	}
	defer func() { _ = durablemigrate.Drop(ctx, pool, schema) }()

	trial := gendurable.FSM[Trial]{
		Name:  "trial",
		Start: "wait",
		Steps: map[string]gendurable.StepFunc[Trial]{
			"wait": func(ctx *gendurable.Ctx, tr Trial) (gendurable.Outcome, error) {
				return gendurable.Next("remind", tr, gendurable.After(27*24*time.Hour)), nil
			},
			"remind": func(ctx *gendurable.Ctx, tr Trial) (gendurable.Outcome, error) {
				tr.Reminded = true // send the reminder here
				return gendurable.Next("end", tr, gendurable.After(3*24*time.Hour)), nil
			},
			"end": func(ctx *gendurable.Ctx, tr Trial) (gendurable.Outcome, error) {
				tr.Ended = true
				return gendurable.Done(tr), nil
			},
		},
	}
	// In a test, t is the test's *testing.T: the kit's helpers fail the test with what they found.
	t := &testing.T{}

	client, err := gendurable.NewClient(pool, &gendurable.Config{Schema: schema, Machines: []gendurable.Machine{trial}})
	if err != nil {
		panic(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		panic(err)
	}
	defer func() { _ = tx.Rollback(ctx) }() // nothing the test did survives it
	kit := durabletest.New(t, client, &durabletest.Opts{Tx: tx})
	res, err := client.InsertTx(ctx, tx, trial.With(Trial{User: "ada"}), nil)
	if err != nil {
		panic(err)
	}

	r := kit.Drain(ctx)
	var got Trial
	in := kit.RequireDone(ctx, res.ID, &got)
	fmt.Println(r.Steps, "steps:", in.Path)
	fmt.Printf("%+v\n", got)
	// Output:
	// 3 steps: [wait remind end]
	// {User:ada Reminded:true Ended:true}
}
