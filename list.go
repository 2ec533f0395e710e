package gendurable

import (
	"context"
	"fmt"
	"time"

	"github.com/gendurable/gendurable/durabletype"
	"github.com/gendurable/gendurable/internal/store"
)

// InstanceSummary is an instance as List shows it: no state or result documents.
type InstanceSummary = durabletype.InstanceSummary

// ListOpts filters and pages List. Every field is optional.
type ListOpts struct {
	Queue    string
	Machine  string
	Statuses []Status
	// CorrelationKey selects by key; with Machine it is an index lookup.
	CorrelationKey string
	// Since keeps instances inserted at or after this time (within Postgres's range: 4714 BC to
	// 294276 AD).
	Since time.Time
	// Paused keeps only the instances paused one by one (Client.Pause with an Instance), by an
	// index of their own.
	Paused bool
	// Before is the paging cursor: instances with a smaller id (ListPage.Next of the previous
	// page). 0 starts from the newest.
	Before int64
	// Limit is the page size: default 50, at most 1,000.
	Limit int
}

// List page sizes.
const (
	DefaultListLimit = 50
	MaxListLimit     = 1000
)

// ListPage is one page of List.
type ListPage struct {
	Instances []InstanceSummary
	// Next is the cursor of the following page (ListOpts.Before), or 0 after the last page.
	Next int64
}

// List reads a page of instances, newest first, by keyset paging (a page deep in a table of
// millions costs what the first does). Dense filters walk the primary key backwards; the sparse
// ones (failed or cancelled, awaiting or joining, executing, a machine's correlation key) have
// indexes. See docs/operations.md.
func (c *Client) List(ctx context.Context, opts *ListOpts) (*ListPage, error) {
	if opts == nil {
		opts = &ListOpts{}
	}
	bad := func(field, format string, args ...any) error {
		return &InputError{Index: -1, Field: field, Reason: fmt.Sprintf(format, args...)}
	}
	f := store.ListFilter{Queue: opts.Queue, Machine: opts.Machine, Statuses: opts.Statuses, Key: opts.CorrelationKey,
		Since: opts.Since, Paused: opts.Paused, Before: opts.Before, Limit: opts.Limit}
	if f.Limit == 0 {
		f.Limit = DefaultListLimit
	}
	if f.Limit < 0 || f.Limit > MaxListLimit {
		return nil, bad("Limit", "%d: must be 1 to %d, or 0 for %d", opts.Limit, MaxListLimit, DefaultListLimit)
	}
	if err := checkTimestamp(f.Since); err != nil {
		return nil, bad("Since", "%v", err)
	}
	if f.Before < 0 {
		return nil, bad("Before", "%d: a cursor is an instance id", f.Before)
	}
	for _, s := range f.Statuses {
		if !s.Valid() {
			return nil, bad("Statuses", "%q is not a status", s)
		}
	}
	if f.Queue != "" {
		if err := checkName("queue name", f.Queue); err != nil {
			return nil, bad("Queue", "%v", err)
		}
	}
	if f.Machine != "" {
		if err := checkName("machine name", f.Machine); err != nil {
			return nil, bad("Machine", "%v", err)
		}
	}
	if f.Key != "" {
		if err := checkKey(f.Key); err != nil {
			return nil, bad("CorrelationKey", "%v", err)
		}
	}
	rows, err := c.store.List(ctx, c.pool, f)
	if err != nil {
		return nil, fmt.Errorf("gendurable: list: %w", err)
	}
	page := &ListPage{Instances: rows}
	if len(rows) == f.Limit {
		page.Next = rows[len(rows)-1].ID
	}
	return page, nil
}
