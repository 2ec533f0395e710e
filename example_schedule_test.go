package gendurable_test

import (
	"context"
	"fmt"
	"time"

	"github.com/gendurable/gendurable"
)

// A Schedule fires an instance at the times of a cron expression (here 02:30 on weekdays, Berlin
// time) or at a fixed interval. Schedules declared in Config are written at Start; every node that
// runs the reaper fires them, one instance per fire time.
func ExampleSchedule() {
	ctx := context.Background()
	pool, schema, cleanup := examplePool("schedule")
	defer cleanup()
	// docs:begin schedules
	report := gendurable.Job[string]{Name: "report", Perform: func(ctx *gendurable.Ctx, kind string) error {
		return nil // build and send the report
	}}
	client, err := gendurable.NewClient(pool, &gendurable.Config{
		Schema:   schema,
		Service:  "reports",
		Machines: []gendurable.Machine{report},
		Queues:   map[string]gendurable.QueueConfig{gendurable.DefaultQueue: {}},
		Schedules: []gendurable.Schedule{
			{Name: "sales-report", Input: report.With("sales"), Cron: "30 2 * * MON-FRI", TimeZone: "Europe/Berlin"},
			{Name: "heartbeat", Input: report.With("ping"), Every: time.Second},
		},
	})
	// docs:end
	if err != nil {
		panic(err)
	}
	if err := client.Start(ctx); err != nil {
		panic(err)
	}
	defer func() { _ = client.Stop(ctx) }()
	sales, err := client.GetSchedule(ctx, "sales-report")
	if err != nil {
		panic(err)
	}
	berlin, _ := time.LoadLocation("Europe/Berlin")
	next := sales.NextFireAt.In(berlin)
	fmt.Printf("%s: next fire at %s on a weekday: %v\n", sales.Name, next.Format("15:04"),
		next.Weekday() != time.Saturday && next.Weekday() != time.Sunday)
	// The heartbeat's first fire, a second from now at most.
	for {
		hb, err := client.GetSchedule(ctx, "heartbeat")
		if err != nil {
			panic(err)
		}
		if hb.LastInstanceID != nil {
			a, err := client.Await(ctx, *hb.LastInstanceID, 10*time.Second, nil)
			if err != nil {
				panic(err)
			}
			fmt.Println("heartbeat fired:", a.Status)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Output:
	// sales-report: next fire at 02:30 on a weekday: true
	// heartbeat fired: done
}
