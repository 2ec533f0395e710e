package gendurable_test

import (
	"context"
	"testing"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/durabledbtest"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// Start refuses a pool whose sessions default to repeatable read or serializable, naming the
// setting and the level; at read committed, given explicitly or by the server's default, it
// starts.
func TestStartRefusesSessionsNotAtReadCommitted(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	for _, iso := range []string{"serializable", "repeatable read", "read committed"} {
		pool := durabledbtest.Pool(t, 4, func(cfg *pgxpool.Config) {
			cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = iso
		})
		cl, err := gendurable.NewClient(pool, &gendurable.Config{Schema: e.schema,
			Queues: map[string]gendurable.QueueConfig{gendurable.DefaultQueue: {Concurrency: 1}}})
		require.NoError(t, err)
		err = cl.Start(ctx)
		if iso == "read committed" {
			require.NoError(t, err)
			require.NoError(t, cl.Stop(ctx))
			continue
		}
		require.Error(t, err, iso)
		require.ErrorContains(t, err, "default_transaction_isolation")
		require.ErrorContains(t, err, iso)
		require.Equal(t, 0, e.count(t, `SELECT count(*) FROM {schema}.nodes`), "a refused client registers no node")
	}
}
