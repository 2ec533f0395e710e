package store

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Dial opens a connection of its own from pool's configuration, as the pool opens one of its
// connections: the pool's BeforeConnect and AfterConnect hooks run, so that what they do (a
// password or token fetched for each connection, a SET ROLE) holds on it too. name is its
// application_name. The pool's notification callback is left out: a caller that listens reads
// the notifications itself.
func Dial(ctx context.Context, pool *pgxpool.Pool, name string) (*pgx.Conn, error) {
	pc := pool.Config()
	cfg := pc.ConnConfig.Copy()
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	cfg.RuntimeParams["application_name"] = name
	cfg.OnNotification = nil
	if pc.BeforeConnect != nil {
		if err := pc.BeforeConnect(ctx, cfg); err != nil {
			return nil, fmt.Errorf("the pool's BeforeConnect: %w", err)
		}
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if pc.AfterConnect != nil {
		if err := pc.AfterConnect(ctx, conn); err != nil {
			_ = conn.Close(context.WithoutCancel(ctx))
			return nil, fmt.Errorf("the pool's AfterConnect: %w", err)
		}
	}
	return conn, nil
}
