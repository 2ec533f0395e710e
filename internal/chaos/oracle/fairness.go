package oracle

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// LogClaims installs, in schema, a log of every claim (t_claims: the row's id and fairness key,
// the claim token, the claiming pick's transaction time), kept by a trigger of the test's.
func LogClaims(ctx context.Context, db *pgxpool.Pool, schema string) error {
	s := q(schema)
	_, err := db.Exec(ctx, fmt.Sprintf(`CREATE TABLE %[1]s.t_claims (seq bigserial, id bigint, fair_key text, owner text, at timestamptz NOT NULL DEFAULT now());
		CREATE FUNCTION %[1]s.t_log_claim() RETURNS trigger LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
		BEGIN INSERT INTO %[1]s.t_claims (id, fair_key, owner) VALUES (NEW.id, NEW.fair_key, NEW.locked_by); RETURN NULL; END $fn$;
		CREATE TRIGGER t_log_claim AFTER UPDATE ON %[1]s.instances FOR EACH ROW
		WHEN (OLD.status = 'available' AND NEW.status = 'executing')
		EXECUTE FUNCTION %[1]s.t_log_claim()`, s))
	return err
}

// ClaimShares reads the log of LogClaims in windows of window from the first claim, up to the
// last whole window before the first key to run out of rows claimed its last: per window, the
// claims of each fairness key.
func ClaimShares(ctx context.Context, db *pgxpool.Pool, schema string, window time.Duration) (map[int]map[string]int, error) {
	s := q(schema)
	rows, err := db.Query(ctx, fmt.Sprintf(`
		WITH w AS (SELECT floor(extract(epoch FROM c.at - (SELECT min(at) FROM %[1]s.t_claims)) * 1000 / $1)::int AS win,
		                  c.fair_key
		           FROM %[1]s.t_claims AS c),
		     ends AS (SELECT min(last) AS first_out FROM (SELECT max(win) AS last FROM w GROUP BY fair_key) AS k)
		SELECT w.win, w.fair_key, count(*) FROM w, ends WHERE w.win < ends.first_out
		GROUP BY w.win, w.fair_key`, s), window.Milliseconds())
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[int]map[string]int{}
	for rows.Next() {
		var win, n int
		var key string
		if err := rows.Scan(&win, &key, &n); err != nil {
			return nil, err
		}
		if out[win] == nil {
			out[win] = map[string]int{}
		}
		out[win][key] = n
	}
	return out, rows.Err()
}

// ClaimSharesByCount reads the log of LogClaims in windows of n consecutive claims (in the order
// of the claiming transactions' times), up to the last whole window before the first key to run
// out of rows claimed its last: per window, the claims of each fairness key. Unlike windows of
// time, every window holds the same number of claims however fast the machine worked.
func ClaimSharesByCount(ctx context.Context, db *pgxpool.Pool, schema string, n int) (map[int]map[string]int, error) {
	s := q(schema)
	rows, err := db.Query(ctx, fmt.Sprintf(`
		WITH w AS (SELECT ((row_number() OVER (ORDER BY c.at, c.seq) - 1) / $1)::int AS win, c.fair_key
		           FROM %[1]s.t_claims AS c),
		     ends AS (SELECT min(last) AS first_out FROM (SELECT max(win) AS last FROM w GROUP BY fair_key) AS k)
		SELECT w.win, w.fair_key, count(*) FROM w, ends WHERE w.win < ends.first_out
		GROUP BY w.win, w.fair_key`, s), n)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[int]map[string]int{}
	for rows.Next() {
		var win, k int
		var key string
		if err := rows.Scan(&win, &key, &k); err != nil {
			return nil, err
		}
		if out[win] == nil {
			out[win] = map[string]int{}
		}
		out[win][key] = k
	}
	return out, rows.Err()
}
