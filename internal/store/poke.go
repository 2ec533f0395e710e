package store

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// maxChannel is the longest channel name Postgres accepts (NAMEDATALEN - 1 bytes).
const maxChannel = 63

// PokeChannel is the LISTEN/NOTIFY channel of one queue of this store's schema:
// "gd.<schema>.<queue>", or, when that is longer than Postgres allows, "gd.<schema>." followed
// by a hash of the queue name (queue names are up to 128 bytes).
func (s *Store) PokeChannel(queue string) string {
	name := "gd." + s.Schema + "." + queue
	if len(name) <= maxChannel {
		return name
	}
	sum := sha256.Sum256([]byte(s.Schema + "\x00" + queue))
	prefix := "gd." + s.Schema
	if len(prefix) > maxChannel-34 {
		prefix = prefix[:maxChannel-34] // schema names are ASCII
	}
	return prefix + "#" + hex.EncodeToString(sum[:16])
}

// Notify sends one poke per channel, tagged with origin. On a caller's transaction the pokes
// leave when it commits.
func (s *Store) Notify(ctx context.Context, db DB, channels []string, origin string) error {
	_, err := db.Exec(ctx, s.sql("poke_notify"), channels, origin)
	return err
}

// NotifyBelow is Notify unless the share of the server's NOTIFY queue in use (usage, 0 to 1) is
// at least below: then it sends none and sent is false. With no channel it sends nothing and
// reads nothing.
func (s *Store) NotifyBelow(ctx context.Context, db DB, channels []string, origin string, below float64) (sent bool, usage float64, err error) {
	if len(channels) == 0 {
		return false, 0, nil
	}
	var n int64
	if err := db.QueryRow(ctx, s.sql("poke_notify_below"), channels, origin, below).Scan(&usage, &n); err != nil {
		return false, 0, err
	}
	return n > 0, usage, nil
}

// NotifyQueueUsage returns the share of the server's NOTIFY queue in use, 0 to 1.
func (s *Store) NotifyQueueUsage(ctx context.Context, db DB) (float64, error) {
	var u float64
	err := db.QueryRow(ctx, s.sql("poke_queue_usage")).Scan(&u)
	return u, err
}

// NotifyAlone sends one poke per channel, tagged with origin, in a transaction of its own on db
// (a pool or a connection outside any transaction) that commits without waiting for its flush:
// see poke_notify_alone.
func (s *Store) NotifyAlone(ctx context.Context, db DB, channels []string, origin string) error {
	_, err := db.Exec(ctx, s.sql("poke_notify_alone"), channels, origin)
	return err
}

// Listen subscribes conn to channels. LISTEN takes an identifier, not a parameter: each channel
// is quoted.
func (s *Store) Listen(ctx context.Context, conn *pgx.Conn, channels []string) error {
	var b strings.Builder
	for _, ch := range channels {
		b.WriteString("LISTEN ")
		b.WriteString(pgx.Identifier{ch}.Sanitize())
		b.WriteString(";")
	}
	_, err := conn.Exec(ctx, b.String())
	return err
}

// IdleSessionTimeout returns the session's idle_session_timeout (0: none; see
// poke_idle_timeout).
func (s *Store) IdleSessionTimeout(ctx context.Context, db DB) (time.Duration, error) {
	var ms int64
	if err := db.QueryRow(ctx, s.sql("poke_idle_timeout")).Scan(&ms); err != nil {
		return 0, err
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// Committed returns which of ids are visible now: their inserting transaction has committed
// (rows that were rolled back, or deleted since, are not).
func (s *Store) Committed(ctx context.Context, db DB, ids []int64) ([]int64, error) {
	rows, err := db.Query(ctx, s.sql("poke_committed"), ids)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int64])
}
