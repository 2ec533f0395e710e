package durableotel_test

import (
	"context"
	"log"
	"os"

	"github.com/gendurable/gendurable"
	durableotel "github.com/gendurable/gendurable/contrib/otel"
	"github.com/jackc/pgx/v5/pgxpool"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// Wiring: spans and event metrics go in as a hook; the queue gauges read through the client
// whenever the meter provider collects.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	tp, mp := sdktrace.NewTracerProvider(), sdkmetric.NewMeterProvider() // with your exporters
	defer func() { _ = tp.Shutdown(ctx); _ = mp.Shutdown(ctx) }()
	// docs:begin otel
	tel, err := durableotel.New(&durableotel.Opts{TracerProvider: tp, MeterProvider: mp})
	if err != nil {
		log.Fatal(err)
	}
	client, err := gendurable.NewClient(pool, &gendurable.Config{
		Machines: []gendurable.Machine{mailJob},
		Queues:   map[string]gendurable.QueueConfig{"mail": {}},
		Hooks:    []func(gendurable.Event){tel.Hook},
	})
	if err != nil {
		log.Fatal(err)
	}
	gauges, err := durableotel.RegisterQueueMetrics(client, &durableotel.QueueMetricsOpts{MeterProvider: mp})
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = gauges.Unregister() }()
	// docs:end
	if err := client.Start(ctx); err != nil {
		log.Fatal(err)
	}
}
