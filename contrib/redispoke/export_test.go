package redispoke

import (
	"time"

	"github.com/gendurable/gendurable"
	"github.com/redis/go-redis/v9"
)

// NewPinging is New with a subscription pinged after d of silence (instead of 15 s), so that a
// test can make a connection go silent and see it replaced.
func NewPinging(opts *redis.Options, d time.Duration) gendurable.PokeTransport {
	t := New(opts).(transport)
	t.pingAfter = d
	return t
}
