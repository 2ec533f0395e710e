package oracle

import (
	"context"
	"fmt"
	"math"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// LogGrants installs, in schema, a log of every grant of a rate-limited row (t_grants: the row's
// id and its pick's transaction time, now(), the clock the bucket counts in; a step's own start
// can lag its grant by a loaded machine's scheduling delay), kept by a trigger of the test's.
func LogGrants(ctx context.Context, db *pgxpool.Pool, schema string) error {
	_, err := db.Exec(ctx, fmt.Sprintf(`CREATE TABLE %[1]s.t_grants (id bigint, tx_at timestamptz NOT NULL DEFAULT now());
		CREATE FUNCTION %[1]s.t_log_grant() RETURNS trigger LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
		BEGIN INSERT INTO %[1]s.t_grants (id) VALUES (NEW.id); RETURN NULL; END $fn$;
		CREATE TRIGGER t_log_grant AFTER UPDATE ON %[1]s.instances FOR EACH ROW
		WHEN (OLD.status = 'available' AND NEW.status = 'executing' AND NEW.rate_limit IS NOT NULL)
		EXECUTE FUNCTION %[1]s.t_log_grant()`, q(schema)))
	return err
}

// GrantTimes returns the times of the grants LogGrants logged that match where (SQL on
// t_grants, with args), in order, in whole microseconds since the first of them (the database's
// resolution), so that RateExcess computes its bound exactly: in float seconds since the epoch,
// rate × time carries a rounding of about 1e-5 tokens, as large as the excess it must find.
func GrantTimes(ctx context.Context, db *pgxpool.Pool, schema, where string, args ...any) ([]int64, error) {
	rows, err := db.Query(ctx, fmt.Sprintf(`SELECT ((extract(epoch FROM tx_at - min(tx_at) OVER ()) * 1000000))::bigint
		FROM %s.t_grants WHERE `+where+` ORDER BY tx_at`, q(schema)), args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int64])
}

// RateExcess checks grants at times at (GrantTimes) against a bucket of allowed tokens a period
// of periodMS and burst: every window [at[i], at[j]] may hold at most burst + allowed × its
// length / period grants. It returns the worst window's excess in tokens (above 0: the bucket was
// overdrawn) and the index of the grant that ends that window; for no grants, 0 and -1.
func RateExcess(at []int64, allowed, periodMS, burst int) (excess float64, end int) {
	if len(at) == 0 {
		return 0, -1
	}
	// With P the period in microseconds: j - i + 1 ≤ burst + allowed × (at[j] - at[i]) / P; in
	// integers: (j + 1 - burst)·P - allowed·at[j] ≤ i·P - allowed·at[i]. The worst window ending at
	// j starts where the right side is smallest: a running minimum. (Grants of one pick share
	// its time; the window over all of them is the one that counts.)
	p := int64(periodMS) * 1000
	least, worst := int64(math.MaxInt64), int64(math.MinInt64)
	for j := range at {
		least = min(least, int64(j)*p-int64(allowed)*at[j])
		if x := (int64(j+1)-int64(burst))*p - int64(allowed)*at[j] - least; x > worst {
			worst, end = x, j
		}
	}
	return float64(worst) / float64(p), end
}
