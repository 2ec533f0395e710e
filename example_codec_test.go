package gendurable_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"strings"
	"time"

	"github.com/gendurable/gendurable"
)

// keyFromYourSecretStore stands for wherever the application keeps its keys.
func keyFromYourSecretStore(name string) []byte {
	k := sha256.Sum256([]byte("example key " + name))
	return k[:]
}

// With Config.Codec, a card number in the state reaches Postgres sealed: the row holds a frame
// naming the key, and the client reads the state back in the clear.
func ExampleNewAESGCM() {
	ctx := context.Background()
	pool, schema, cleanup := examplePool("codec")
	defer cleanup()
	type payment struct{ Card string }
	checkout := gendurable.Job[payment]{Name: "checkout", Perform: func(*gendurable.Ctx, payment) error { return nil }}
	// docs:begin codec
	codec, err := gendurable.NewAESGCM("2026-12", map[string][]byte{
		"2026-12": keyFromYourSecretStore("2026-12"), // 32 bytes: AES-256
	})
	if err != nil {
		panic(err)
	}
	client, err := gendurable.NewClient(pool, &gendurable.Config{
		Schema:   schema,
		Codec:    codec,
		Machines: []gendurable.Machine{checkout},
		Queues:   map[string]gendurable.QueueConfig{gendurable.DefaultQueue: {}},
	})
	// docs:end
	if err != nil {
		panic(err)
	}
	if err := client.Start(ctx); err != nil {
		panic(err)
	}
	defer func() { _ = client.Stop(ctx) }()
	res, err := client.Insert(ctx, checkout.With(payment{Card: "4242 4242 4242 4242"}), nil)
	if err != nil {
		panic(err)
	}
	if _, err := client.Await(ctx, res.ID, 10*time.Second, nil); err != nil {
		panic(err)
	}
	var stored string
	if err := pool.QueryRow(ctx, "SELECT state #>> '{}' FROM instances WHERE id = $1", res.ID).Scan(&stored); err != nil {
		panic(err)
	}
	in, err := client.Get(ctx, res.ID)
	if err != nil {
		panic(err)
	}
	fmt.Println("stored sealed:", strings.HasPrefix(stored, "gdc1:2026-12:"), strings.Contains(stored, "4242"))
	fmt.Println("read back:", string(in.State))
	// Output:
	// stored sealed: true false
	// read back: {"Card":"4242 4242 4242 4242"}
}
