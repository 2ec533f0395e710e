package main

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/durablemigrate"
	"github.com/jackc/pgx/v5/pgxpool"
)

type noArgs struct{}

func main() {
	ctx := context.Background()
	cfg, _ := pgxpool.ParseConfig(os.Args[1])
	cfg.MaxConns = 20
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		panic(err)
	}
	schema := "probe"
	_ = durablemigrate.Drop(ctx, pool, schema)
	if err := durablemigrate.Migrate(ctx, pool, schema); err != nil {
		panic(err)
	}
	job := gendurable.Job[noArgs]{Name: "noop", Queue: "bench", Perform: func(*gendurable.Ctx, noArgs) error { return nil }}
	var done atomic.Int64
	cl, _ := gendurable.NewClient(pool, &gendurable.Config{Schema: schema, Machines: []gendurable.Machine{job},
		Queues: map[string]gendurable.QueueConfig{"bench": {Concurrency: 100}},
		Hooks: []func(gendurable.Event){func(ev gendurable.Event) {
			if ev.Name == gendurable.EventStepFinished {
				done.Add(1)
			}
		}}})
	n := 1000000
	params := make([]gendurable.InsertManyParams, 10000)
	for i := range params {
		params[i] = gendurable.InsertManyParams{Input: job.With(noArgs{})}
	}
	for i := 0; i < n; i += 10000 {
		if _, err := cl.InsertMany(ctx, params); err != nil {
			panic(err)
		}
	}
	fmt.Println("inserted")
	cl.Start(ctx)
	last := int64(0)
	for i := 0; i < 40; i++ {
		time.Sleep(time.Second)
		d := done.Load()
		fmt.Println(i, d-last)
		last = d
	}
	cl.Stop(ctx)
}
