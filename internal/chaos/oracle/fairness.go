package oracle

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// LogClaims installs, in schema, a log of every claim (t_claims: the row's id, fairness key and
// fair tag, the claim token, the claiming pick's transaction and its time), kept by a trigger of
// the test's.
func LogClaims(ctx context.Context, db *pgxpool.Pool, schema string) error {
	s := q(schema)
	_, err := db.Exec(ctx, fmt.Sprintf(`CREATE TABLE %[1]s.t_claims (seq bigserial, id bigint, fair_key text, owner text, tag double precision,
			xact xid8 NOT NULL DEFAULT pg_current_xact_id(), at timestamptz NOT NULL DEFAULT now());
		CREATE FUNCTION %[1]s.t_log_claim() RETURNS trigger LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
		BEGIN INSERT INTO %[1]s.t_claims (id, fair_key, owner, tag) VALUES (NEW.id, NEW.fair_key, NEW.locked_by, OLD.fair_tag); RETURN NULL; END $fn$;
		CREATE TRIGGER t_log_claim AFTER UPDATE ON %[1]s.instances FOR EACH ROW
		WHEN (OLD.status = 'available' AND NEW.status = 'executing')
		EXECUTE FUNCTION %[1]s.t_log_claim()`, s))
	return err
}

// ClaimShares reads the log of LogClaims in windows of window from the first claim, up to the
// last whole window before the first key to run out of rows claimed its last: per window, the
// claims of each fairness key.
func ClaimShares(ctx context.Context, db *pgxpool.Pool, schema string, window time.Duration) (map[int]map[string]int, error) {
	return claimShares(ctx, db, schema, `floor(extract(epoch FROM c.at - (SELECT min(at) FROM %[1]s.t_claims)) * 1000 / $1)::int`,
		window.Milliseconds())
}

// ClaimSharesByCount is ClaimShares with windows of n consecutive claims (in the order of the
// claiming transactions' times): every window holds the same number of claims however fast the
// machine worked.
func ClaimSharesByCount(ctx context.Context, db *pgxpool.Pool, schema string, n int) (map[int]map[string]int, error) {
	return claimShares(ctx, db, schema, `((row_number() OVER (ORDER BY c.at, c.seq) - 1) / $1)::int`, n)
}

// claimShares counts the claims of each key per window, win being the SQL of a claim c's window
// (%[1]s the schema, $1 the window's size).
func claimShares(ctx context.Context, db *pgxpool.Pool, schema, win string, size any) (map[int]map[string]int, error) {
	rows, err := db.Query(ctx, fmt.Sprintf(`
		WITH w AS (SELECT `+win+` AS win, c.fair_key FROM %[1]s.t_claims AS c),
		     ends AS (SELECT min(last) AS first_out FROM (SELECT max(win) AS last FROM w GROUP BY fair_key) AS k)
		SELECT w.win, w.fair_key, count(*) FROM w, ends WHERE w.win < ends.first_out
		GROUP BY w.win, w.fair_key`, q(schema)), size)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[int]map[string]int{}
	for rows.Next() {
		var w, n int
		var key string
		if err := rows.Scan(&w, &key, &n); err != nil {
			return nil, err
		}
		if out[w] == nil {
			out[w] = map[string]int{}
		}
		out[w][key] = n
	}
	return out, rows.Err()
}
