package gendurable_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/durablemigrate"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Thumbnail is the arguments of a job that resizes an image.
type Thumbnail struct {
	Image string `json:"image"`
	Width int    `json:"width"`
}

// Every process that shares a schema is a node, and its Config says what it runs: workers (its
// Queues), the reaper and GC. Here a web node inserts and awaits, a worker-only node runs the
// steps and a maintenance-only node sweeps; in production each is a process (or a fleet) of its
// own.
func ExampleConfig_topologies() {
	ctx := context.Background()
	pool, schema, cleanup := examplePool("topologies")
	defer cleanup()
	thumbnail := gendurable.Job[Thumbnail]{
		Name:    "thumbnail",
		Queue:   "images",
		Perform: func(ctx *gendurable.Ctx, t Thumbnail) error { return nil }, // resize here
	}
	limits := map[string]gendurable.ConcurrencyLimit{"storage": {Limit: 50}}
	rates := map[string]gendurable.Rate{"cdn": {Allowed: 100, Period: time.Second}}

	// docs:begin topology-worker
	worker := &gendurable.Config{
		Name:              "worker",
		Schema:            schema,
		Machines:          []gendurable.Machine{thumbnail},
		Queues:            map[string]gendurable.QueueConfig{"images": {Concurrency: 20}},
		ConcurrencyLimits: limits,
		RateLimits:        rates,
		Poke:              gendurable.PokePostgres(), // hears the inserts of other nodes at once
		Reaper:            &gendurable.ReaperConfig{Disabled: true},
		GC:                &gendurable.GCConfig{Disabled: true},
	}
	// docs:end
	// docs:begin topology-web
	web := &gendurable.Config{
		Name:   "web",
		Schema: schema,
		Poke:   gendurable.PokePostgres(), // its inserts wake the workers on other nodes
		Reaper: &gendurable.ReaperConfig{Disabled: true},
		GC:     &gendurable.GCConfig{Disabled: true},
	}
	// docs:end
	// docs:begin topology-maintenance
	maintenance := &gendurable.Config{
		Name:              "maintenance",
		Schema:            schema,
		ConcurrencyLimits: limits, // the same gates and rate limits as the workers
		RateLimits:        rates,
		Reaper:            &gendurable.ReaperConfig{Interval: 5 * time.Second},
		GC:                &gendurable.GCConfig{Interval: time.Minute, Retention: 7 * 24 * time.Hour},
	}
	// docs:end

	nodes := map[string]*gendurable.Client{}
	for _, cfg := range []*gendurable.Config{worker, web, maintenance} {
		client, err := gendurable.NewClient(pool, cfg)
		if err != nil {
			panic(err)
		}
		if err := client.Start(ctx); err != nil {
			panic(err)
		}
		defer func() { _ = client.Stop(ctx) }()
		nodes[cfg.Name] = client
	}

	// The web node needs no machines: With carries what an insert needs.
	res, err := nodes["web"].Insert(ctx, thumbnail.With(Thumbnail{Image: "cat.png", Width: 128}), nil)
	if err != nil {
		panic(err)
	}
	a, err := nodes["web"].Await(ctx, res.ID, 10*time.Second, &gendurable.AwaitOpts{UntilTerminal: true})
	if err != nil {
		panic(err)
	}
	fmt.Println(a.Instance.Machine, "in queue", a.Instance.Queue+":", a.Status)
	// Output: thumbnail in queue images: done
}

// Behind a transaction-pooling proxy (PgBouncer in transaction mode), give the client a pool that
// prepares no named statements.
func Example_transactionPooler() {
	ctx := context.Background()
	url := os.Getenv("DATABASE_URL")
	schema := fmt.Sprintf("example_pooler_%d", os.Getpid())

	// docs:begin pgbouncer
	cfg, err := pgxpool.ParseConfig(url) // the pooler's address
	if err != nil {
		panic(err)
	}
	// No named prepared statements: PgBouncer before 1.21 cannot route them.
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	// docs:end
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if err := gendurable.Migrate(ctx, pool, &gendurable.MigrateOpts{Schema: schema}); err != nil {
		panic(err)
	}
	defer func() { _ = durablemigrate.Drop(ctx, pool, schema) }()

	ping := gendurable.Job[string]{Name: "ping", Perform: func(ctx *gendurable.Ctx, s string) error { return nil }}
	client, err := gendurable.NewClient(pool, &gendurable.Config{
		Schema:   schema,
		Machines: []gendurable.Machine{ping},
		Queues:   map[string]gendurable.QueueConfig{gendurable.DefaultQueue: {}},
	})
	if err != nil {
		panic(err)
	}
	if err := client.Start(ctx); err != nil {
		panic(err)
	}
	defer func() { _ = client.Stop(ctx) }()
	res, err := client.Insert(ctx, ping.With("hello"), nil)
	if err != nil {
		panic(err)
	}
	a, err := client.Await(ctx, res.ID, 10*time.Second, &gendurable.AwaitOpts{UntilTerminal: true})
	if err != nil {
		panic(err)
	}
	fmt.Println(a.Status)
	// Output: done
}

// On a highly available Postgres (a primary and standbys behind a failover tool), give the
// client every node: pgx connects to the one that accepts writes.
func Example_highAvailability() {
	ctx := context.Background()
	// docs:begin ha
	// pgx tries the hosts in turn and keeps the first that accepts writes; every connection the
	// client opens later (its pool's, the heartbeat's, the poke listener's) does the same.
	cfg, err := pgxpool.ParseConfig("postgres://app@db1:5432,db2:5432/app?target_session_attrs=read-write")
	if err != nil {
		panic(err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	// docs:end
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	fmt.Println(cfg.ConnConfig.Host, "then", cfg.ConnConfig.Fallbacks[len(cfg.ConnConfig.Fallbacks)-1].Host)
	// Output: db1 then db2
}

// docs:begin checkup-health
// checkupHandler answers a monitor's probe with the checkup's problems: 503 while there is one
// (autovacuum off, no reaper, a due queue nobody works, …), 200 otherwise. The warnings are
// for dashboards (durableprom's and durableotel's Checkup option export them all).
func checkupHandler(client *gendurable.Client) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		findings, err := client.Checkup(r.Context(), nil)
		if err != nil {
			http.Error(w, "checkup: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		var problems []string
		for _, f := range findings {
			if f.Severity == gendurable.SeverityProblem {
				problems = append(problems, f.Check+": "+f.Summary+"\n  fix: "+f.Fix)
			}
		}
		if len(problems) > 0 {
			http.Error(w, strings.Join(problems, "\n"), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	}
}

// docs:end

// The checkup as a monitor's endpoint: an image is due and no node works its queue.
func ExampleClient_Checkup() {
	ctx := context.Background()
	pool, schema, cleanup := examplePool("checkup")
	defer cleanup()
	thumbnail := gendurable.Job[Thumbnail]{Name: "thumbnail", Queue: "images",
		Perform: func(ctx *gendurable.Ctx, t Thumbnail) error { return nil }}
	client, err := gendurable.NewClient(pool, &gendurable.Config{Schema: schema, Machines: []gendurable.Machine{thumbnail}})
	if err != nil {
		panic(err)
	}
	if _, err := client.Insert(ctx, thumbnail.With(Thumbnail{Image: "cat.png", Width: 128}), nil); err != nil {
		panic(err)
	}
	rec := httptest.NewRecorder()
	checkupHandler(client)(rec, httptest.NewRequest(http.MethodGet, "/health/gendurable", nil))
	fmt.Println(rec.Code, strings.Contains(rec.Body.String(), "workers: rows are due in queues no live node works: images"))
	// Output: 503 true
}
