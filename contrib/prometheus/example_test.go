package durableprom_test

import (
	"context"
	"log"
	"net/http"
	"os"

	"github.com/gendurable/gendurable"
	durableprom "github.com/gendurable/gendurable/contrib/prometheus"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Wiring: the event metrics go in as a hook, the queue collector reads through the client, and
// both are registered on the application's own registry.
func Example() {
	pool, err := pgxpool.New(context.Background(), os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	// docs:begin prometheus
	metrics := durableprom.NewMetrics(nil)
	client, err := gendurable.NewClient(pool, &gendurable.Config{
		Machines: []gendurable.Machine{mailJob},
		Queues:   map[string]gendurable.QueueConfig{"mail": {}},
		Hooks:    []func(gendurable.Event){metrics.Hook},
	})
	if err != nil {
		log.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics, durableprom.NewQueueCollector(client, nil))
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	// docs:end
	log.Fatal(http.ListenAndServe("localhost:9090", mux))
}
