package gendurable

import "time"

// SetOwnTxIdleTimeout shortens the idle bound of the client's own transactions (inOwnTx) for a
// test, which need not wait the default 10 s. Call it before the client is used.
func SetOwnTxIdleTimeout(c *Client, d time.Duration) { c.store.OwnTxIdleTimeout = d }

// SetNodeRefresh shortens the period of the client's registry refreshes for a test. Call it
// before Start.
func SetNodeRefresh(c *Client, d time.Duration) { c.eng.Config().NodeRefresh = d }
