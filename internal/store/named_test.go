package store

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// Store.named gives exactly what pgx.NamedArgs gives, text and arguments, for every statement
// the Store holds and for the awkward cases: names in comments, literals and dollar quotes,
// repeated names, a name that is the prefix of another, a name with no value.
func TestNamedArgumentsMatchPgx(t *testing.T) {
	ctx := context.Background()
	s, err := New("t_named")
	require.NoError(t, err)
	same := func(t *testing.T, sql string, args pgx.NamedArgs) {
		t.Helper()
		wantSQL, wantArgs, err := args.RewriteQuery(ctx, nil, sql, nil)
		require.NoError(t, err)
		for range 2 { // the first call fills the cache, the second reads it
			gotSQL, gotArgs, err := s.named(args).RewriteQuery(ctx, nil, sql, nil)
			require.NoError(t, err)
			require.Equal(t, wantSQL, gotSQL)
			require.Equal(t, wantArgs, gotArgs)
		}
	}
	t.Run("awkward", func(t *testing.T) {
		sql := `-- @ghost in a comment
SELECT @id, @ids, '@lit', "@quoted", $q$ @dollar $q$, @id::bigint /* @block */, e'@esc', @missing`
		same(t, sql, pgx.NamedArgs{"id": 1, "ids": []int64{2, 3}, "ghost": 4, "lit": 5, "dollar": 6, "block": 7})
		rw, err := s.rewrites.get(ctx, nil, sql)
		require.NoError(t, err)
		require.Equal(t, []string{"id", "ids", "missing"}, rw.names)
	})
	t.Run("statements", func(t *testing.T) {
		for name, sql := range s.stmts {
			args := pgx.NamedArgs{}
			for i, c := range argName.FindAllString(sql, -1) {
				args[c[1:]] = fmt.Sprint(name, i)
			}
			same(t, sql, args)
		}
	})
}
