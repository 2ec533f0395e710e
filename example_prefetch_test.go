package gendurable_test

import (
	"context"
	"fmt"
	"time"

	"github.com/gendurable/gendurable"
)

// A queue of short steps with a backlog claims ahead of its executors: Prefetch rows wait in the
// client for one of the Concurrency executors, so each pick claims a larger batch.
func ExampleQueueConfig_prefetch() {
	ctx := context.Background()
	pool, schema, cleanup := examplePool("prefetch")
	defer cleanup()
	thumbnail := gendurable.Job[Thumbnail]{Name: "thumbnail", Queue: "thumbnails",
		Perform: func(ctx *gendurable.Ctx, t Thumbnail) error { return nil }}

	// docs:begin prefetch
	client, err := gendurable.NewClient(pool, &gendurable.Config{
		Schema:   schema,
		Machines: []gendurable.Machine{thumbnail},
		// At most 10 thumbnails at once; each pick may claim up to 30 more, which wait here.
		Queues: map[string]gendurable.QueueConfig{"thumbnails": {Concurrency: 10, Prefetch: 30}},
	})
	// docs:end
	if err != nil {
		panic(err)
	}
	params := make([]gendurable.InsertManyParams, 200)
	for i := range params {
		params[i] = gendurable.InsertManyParams{Input: thumbnail.With(Thumbnail{Image: fmt.Sprintf("img-%d.png", i), Width: 128})}
	}
	res, err := client.InsertMany(ctx, params)
	if err != nil {
		panic(err)
	}
	if err := client.Start(ctx); err != nil {
		panic(err)
	}
	defer func() { _ = client.Stop(ctx) }()
	done := 0
	for _, r := range res {
		a, err := client.Await(ctx, r.ID, 10*time.Second, &gendurable.AwaitOpts{UntilTerminal: true})
		if err != nil {
			panic(err)
		}
		if a.Status == gendurable.AwaitDone {
			done++
		}
	}
	fmt.Printf("%d thumbnails done\n", done)
	// Output:
	// 200 thumbnails done
}
