package redispoke_test

import (
	"context"
	"log"
	"os"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/contrib/redispoke"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// Welcome is a job's arguments.
type Welcome struct {
	UserID int64 `json:"user_id"`
}

var sendWelcome = gendurable.Job[Welcome]{Name: "send-welcome", Queue: "email",
	Perform: func(*gendurable.Ctx, Welcome) error { return nil }}

// A worker node and a web node poke each other through Redis: the web node's inserts start on
// the worker at once, though the worker polls only every 10 s. (README.md quotes the part between
// the docs markers; TestREADMEQuotesTheExample keeps them identical. The example needs Redis and
// Postgres, so it is compiled, not run.)
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	// docs:begin usage
	// One transport value serves every client: each opens its own Redis connections at Start
	// (which fails if Redis cannot be reached) and closes them at Stop.
	poke := redispoke.New(&redis.Options{Addr: "127.0.0.1:6379"})

	// A worker node subscribes to the pokes of the queues it runs.
	worker, err := gendurable.NewClient(pool, &gendurable.Config{
		Name:         "worker",
		Machines:     []gendurable.Machine{sendWelcome},
		Queues:       map[string]gendurable.QueueConfig{"email": {Concurrency: 20}},
		PollInterval: 10 * time.Second, // the floor for rows no poke announces
		Poke:         poke,
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := worker.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer worker.Stop(ctx)

	// A web node runs no queue; its inserts publish a poke to the workers of the queue.
	web, err := gendurable.NewClient(pool, &gendurable.Config{
		Name:     "web",
		Machines: []gendurable.Machine{sendWelcome},
		Poke:     poke,
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := web.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer web.Stop(ctx)

	if _, err := web.Insert(ctx, sendWelcome.With(Welcome{UserID: 42}), nil); err != nil {
		log.Fatal(err)
	}
	// docs:end
}
