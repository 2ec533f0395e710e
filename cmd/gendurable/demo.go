package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/durablemigrate"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The demo: an order-processing saga. Each order is validated, its stock reserved, its card
// charged (the payment provider fails now and then, so the step retries with backoff), shipped
// and confirmed. Out-of-stock orders are cancelled; orders whose card is declined for good have
// their reservation released (a compensating step) before they fail.

// Order is the demo's state: everything the workflow knows about one order.
type Order struct {
	ID         int    `json:"id"`
	Customer   string `json:"customer"`
	Items      int    `json:"items"`
	CentsTotal int    `json:"cents_total"`
	Reserved   bool   `json:"reserved"`
	ChargeID   string `json:"charge_id,omitempty"`
	Tracking   string `json:"tracking,omitempty"`
	Cancelled  string `json:"cancelled,omitempty"`
}

// Receipt is a finished order's result.
type Receipt struct {
	OrderID  int    `json:"order_id"`
	ChargeID string `json:"charge_id"`
	Tracking string `json:"tracking"`
}

var errDeclined = errors.New("card declined for good")

// latency simulates a call to another service.
func latency(ctx context.Context, lo, hi time.Duration) error {
	d := lo + time.Duration(rand.Int64N(int64(hi-lo)+1))
	select {
	case <-time.After(d):
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

func orderMachine() gendurable.FSM[Order] {
	return gendurable.FSM[Order]{
		Name:        "order",
		Start:       "validate",
		Queue:       "orders",
		MaxAttempts: 6,
		Backoff:     func(attempt int) time.Duration { return time.Duration(attempt) * 40 * time.Millisecond },
		Steps: map[string]gendurable.StepFunc[Order]{
			"validate": func(ctx *gendurable.Ctx, o Order) (gendurable.Outcome, error) {
				if o.Items <= 0 || o.CentsTotal <= 0 {
					return gendurable.Stop(errors.New("order has no items")), nil
				}
				return gendurable.Next("reserve_inventory", o), nil
			},
			"reserve_inventory": func(ctx *gendurable.Ctx, o Order) (gendurable.Outcome, error) {
				if err := latency(ctx, time.Millisecond, 4*time.Millisecond); err != nil {
					return gendurable.Outcome{}, err
				}
				if rand.IntN(100) < 3 {
					o.Cancelled = "out of stock"
					return gendurable.Next("cancel", o), nil
				}
				o.Reserved = true
				return gendurable.Next("charge_payment", o), nil
			},
			"charge_payment": func(ctx *gendurable.Ctx, o Order) (gendurable.Outcome, error) {
				if err := latency(ctx, 2*time.Millisecond, 8*time.Millisecond); err != nil {
					return gendurable.Outcome{}, err
				}
				switch n := rand.IntN(100); {
				case n < 2:
					o.Cancelled = "payment declined"
					return gendurable.Next("release_inventory", o), nil
				case n < 17:
					return gendurable.Outcome{}, errors.New("payment provider timed out")
				}
				o.ChargeID = fmt.Sprintf("ch_%d_%d", o.ID, ctx.Attempt)
				return gendurable.Next("ship", o), nil
			},
			"ship": func(ctx *gendurable.Ctx, o Order) (gendurable.Outcome, error) {
				if err := latency(ctx, time.Millisecond, 5*time.Millisecond); err != nil {
					return gendurable.Outcome{}, err
				}
				o.Tracking = fmt.Sprintf("1Z%08d", o.ID)
				return gendurable.Next("notify", o), nil
			},
			"notify": func(ctx *gendurable.Ctx, o Order) (gendurable.Outcome, error) {
				if err := latency(ctx, 0, 2*time.Millisecond); err != nil {
					return gendurable.Outcome{}, err
				}
				return gendurable.Done(Receipt{OrderID: o.ID, ChargeID: o.ChargeID, Tracking: o.Tracking}), nil
			},
			"release_inventory": func(ctx *gendurable.Ctx, o Order) (gendurable.Outcome, error) {
				if err := latency(ctx, time.Millisecond, 3*time.Millisecond); err != nil {
					return gendurable.Outcome{}, err
				}
				o.Reserved = false
				return gendurable.Stop(errDeclined), nil
			},
			"cancel": func(ctx *gendurable.Ctx, o Order) (gendurable.Outcome, error) {
				return gendurable.Stop(fmt.Errorf("cancelled: %s", o.Cancelled)), nil
			},
		},
	}
}

const demoSchema = "gendurable_demo"

func runDemo(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	var db dbFlags
	db.register(fs, demoSchema)
	n := fs.Int("n", 3000, "orders to process")
	conc := fs.Int("concurrency", 50, "steps run at once")
	keep := fs.Bool("keep", false, "keep the demo schema afterwards (to inspect it)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *n < 1 {
		return fmt.Errorf("--n %d: must be at least 1", *n)
	}
	pool, closeDB, err := db.open(ctx, true, os.Stderr)
	if err != nil {
		return err
	}
	defer closeDB()

	// A fresh schema for every run.
	if err := durablemigrate.Drop(ctx, pool, db.schema); err != nil {
		return err
	}
	if err := durablemigrate.Migrate(ctx, pool, db.schema); err != nil {
		return err
	}
	if !*keep {
		defer func() { _ = durablemigrate.Drop(context.WithoutCancel(ctx), pool, db.schema) }()
	}
	return demo(ctx, pool, db.schema, *n, *conc, out)
}

func demo(ctx context.Context, pool *pgxpool.Pool, schema string, n, conc int, out io.Writer) error {
	machine := orderMachine()
	var steps, errs atomic.Int64
	client, err := gendurable.NewClient(pool, &gendurable.Config{
		Name:     "demo",
		Schema:   schema,
		Machines: []gendurable.Machine{machine},
		Queues:   map[string]gendurable.QueueConfig{"orders": {Concurrency: conc}},
		Logger:   quietLogger(),
		Hooks: []func(gendurable.Event){func(ev gendurable.Event) {
			switch ev.Name {
			case gendurable.EventStepFinished:
				steps.Add(1)
			case gendurable.EventStepError:
				errs.Add(1)
			}
		}},
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "gendurable demo: %d orders through validate → reserve_inventory → charge_payment → ship → notify\n", n)
	fmt.Fprintf(out, "(3%% are out of stock, 15%% of charges time out and retry with backoff, 2%% are declined and compensated)\n\n")

	params := make([]gendurable.InsertManyParams, n)
	for i := range params {
		o := Order{ID: i + 1, Customer: fmt.Sprintf("customer-%d", rand.IntN(500)), Items: 1 + rand.IntN(5), CentsTotal: 500 + rand.IntN(20000)}
		if rand.IntN(100) < 1 {
			o.Items = 0 // a few invalid orders
		}
		params[i] = gendurable.InsertManyParams{Input: machine.With(o),
			Opts: &gendurable.InsertOpts{CorrelationKey: fmt.Sprintf("order-%d", o.ID)}}
	}
	begin := time.Now()
	if _, err := client.InsertMany(ctx, params); err != nil {
		return err
	}
	inserted := time.Since(begin)
	if err := client.Start(ctx); err != nil {
		return err
	}
	started := time.Now()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	var counts map[gendurable.Status]int64
	for {
		counts, err = countByStatus(ctx, pool, schema)
		if err != nil {
			break
		}
		finished := counts[gendurable.StatusDone] + counts[gendurable.StatusFailed]
		progress(out, finished, int64(n), steps.Load(), time.Since(started))
		if finished == int64(n) {
			break
		}
		select {
		case <-ctx.Done():
			err = ctx.Err()
		case <-tick.C:
		}
		if err != nil {
			break
		}
	}
	elapsed := time.Since(started)
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if serr := client.Stop(stopCtx); err == nil {
		err = serr
	}
	fmt.Fprintln(out)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "\ninserted %d orders in one statement in %v\n", n, inserted.Round(time.Millisecond))
	fmt.Fprintf(out, "worked them in %v: %d steps (%.0f steps/s), %d step errors retried or handled\n\n",
		elapsed.Round(time.Millisecond), steps.Load(), float64(steps.Load())/elapsed.Seconds(), errs.Load())
	fmt.Fprintln(out, "instances by status:")
	var statuses []string
	for s := range counts {
		statuses = append(statuses, string(s))
	}
	sort.Strings(statuses)
	for _, s := range statuses {
		fmt.Fprintf(out, "  %-10s %6d\n", s, counts[gendurable.Status(s)])
	}
	reasons, err := failureReasons(ctx, pool, schema)
	if err != nil {
		return err
	}
	if len(reasons) > 0 {
		fmt.Fprintln(out, "\nwhy orders failed:")
		for _, r := range reasons {
			fmt.Fprintf(out, "  %-40s %6d\n", r.reason, r.n)
		}
	}
	return nil
}

func progress(w io.Writer, done, total, steps int64, elapsed time.Duration) {
	const width = 40
	filled := int(width * done / total)
	rate := 0.0
	if s := elapsed.Seconds(); s > 0 {
		rate = float64(steps) / s
	}
	fmt.Fprintf(w, "\r[%s%s] %d/%d orders finished  %6.0f steps/s", strings.Repeat("#", filled), strings.Repeat(".", width-filled), done, total, rate)
}
