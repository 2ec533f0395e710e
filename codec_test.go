package gendurable_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// sentinel is what a codec must keep out of every column.
const sentinel = "SENTINEL-7f3c2a-do-not-store"

type vaultDoc struct {
	Secret string `json:"secret"`
	Seen   []string
}

func aesKeys(t *testing.T, current string, names ...string) *gendurable.AESGCM {
	t.Helper()
	keys := map[string][]byte{}
	for _, n := range names {
		k := sha256.Sum256([]byte(n)) // one key per name: every client built with a name holds the same key
		keys[n] = k[:]
	}
	c, err := gendurable.NewAESGCM(current, keys)
	require.NoError(t, err)
	return c
}

// vaultMachines: vault spawns two kid children (their states and results hold the secret), joins
// them, awaits "letter" (its payload holds the secret), fails its next step once with an error
// whose text holds the secret, then finishes with a result holding it. Every kind of document
// a codec seals passes through one instance.
func vaultMachines(failed *atomic.Int32) (gendurable.FSM[vaultDoc], gendurable.FSM[vaultDoc]) {
	kid := gendurable.FSM[vaultDoc]{Name: "kid", Start: "run", Queue: "vault", Steps: map[string]gendurable.StepFunc[vaultDoc]{
		"run": func(_ *gendurable.Ctx, d vaultDoc) (gendurable.Outcome, error) {
			return gendurable.Done(d.Secret + "/kid"), nil
		},
	}}
	vault := gendurable.FSM[vaultDoc]{Name: "vault", Start: "fan", Queue: "vault",
		Backoff: func(int) time.Duration { return 10 * time.Millisecond },
		Steps: map[string]gendurable.StepFunc[vaultDoc]{
			"fan": func(_ *gendurable.Ctx, d vaultDoc) (gendurable.Outcome, error) {
				return gendurable.Spawn([]gendurable.Child{{Input: kid.With(d)}, {Input: kid.With(d)}}, "joined", d), nil
			},
			"joined": func(ctx *gendurable.Ctx, d vaultDoc) (gendurable.Outcome, error) {
				for _, c := range ctx.Children {
					var r string
					if err := c.Decode(&r); err != nil {
						return gendurable.Outcome{}, err
					}
					d.Seen = append(d.Seen, r)
				}
				return gendurable.Await([]string{"letter"}, "read", d), nil
			},
			"read": func(ctx *gendurable.Ctx, d vaultDoc) (gendurable.Outcome, error) {
				var letter string
				if err := ctx.Awaited[0].Decode(&letter); err != nil {
					return gendurable.Outcome{}, err
				}
				if failed.Add(1) == 1 {
					return gendurable.Outcome{}, errors.New("the first read of " + letter + " fails")
				}
				d.Seen = append(d.Seen, letter)
				return gendurable.Done(d), nil
			},
		}}
	return vault, kid
}

// rowsHolding counts, over every table of the schema, the rows whose text form holds s.
func (e *env) rowsHolding(t *testing.T, s string) map[string]int {
	t.Helper()
	ctx := context.Background()
	rows, err := e.pool.Query(ctx, `SELECT table_name FROM information_schema.tables WHERE table_schema = $1 AND table_type = 'BASE TABLE'`, e.schema)
	require.NoError(t, err)
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Contains(t, tables, "instances")
	require.Contains(t, tables, "signals")
	require.Contains(t, tables, "schedules")
	out := map[string]int{}
	for _, tb := range tables {
		var n int
		q := `SELECT count(*) FROM ` + pgx.Identifier{e.schema, tb}.Sanitize() + ` AS x WHERE strpos(x::text, $1) > 0`
		require.NoError(t, e.pool.QueryRow(ctx, q, s).Scan(&n))
		if n > 0 {
			out[tb] = n
		}
	}
	return out
}

// With Config.Codec, states, children's results, signal payloads, step errors, results and a
// schedule's input reach Postgres sealed: the sentinel is in no column of any table (read from
// the raw rows), while the client reads every one of them back in the clear.
func TestCodecKeepsPayloadsOutOfEveryColumn(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	var failed atomic.Int32
	vault, kid := vaultMachines(&failed)
	codec := aesKeys(t, "k1", "k1")
	cl := e.client(t, &gendurable.Config{Codec: codec, Machines: []gendurable.Machine{vault, kid},
		Queues: map[string]gendurable.QueueConfig{"vault": {PollInterval: 20 * time.Millisecond}}})
	start(t, cl)

	r, err := cl.Insert(ctx, vault.With(vaultDoc{Secret: sentinel}), nil)
	require.NoError(t, err)
	require.NoError(t, cl.SetSchedule(ctx, gendurable.Schedule{Name: "nightly", Input: kid.With(vaultDoc{Secret: sentinel}), Every: time.Hour}))
	fired, err := cl.TriggerSchedule(ctx, "nightly")
	require.NoError(t, err)
	eventually(t, 10*time.Second, "the vault parks on its letter", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE id = $1 AND status = 'awaiting'`, r.ID) == 1
	})
	// Mid-run: the parked vault's inbox holds a postcard it does not await.
	_, err = cl.Signal(ctx, gendurable.ByID(r.ID), "postcard", map[string]string{"from": sentinel})
	require.NoError(t, err)
	require.Empty(t, e.rowsHolding(t, sentinel), "tables whose rows hold the sentinel, mid-run")
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM {schema}.signals WHERE payload #>> '{}' LIKE 'gdc1:k1:%'`))
	d, err := cl.Inspect(ctx, r.ID, nil)
	require.NoError(t, err)
	require.Len(t, d.Inbox, 1)
	require.JSONEq(t, `{"from":"`+sentinel+`"}`, string(d.Inbox[0].Payload))

	_, err = cl.Signal(ctx, gendurable.ByID(r.ID), "letter", sentinel+"/letter")
	require.NoError(t, err)
	res, err := cl.Await(ctx, r.ID, 10*time.Second, nil)
	require.NoError(t, err)
	require.Equal(t, gendurable.StatusDone, res.Instance.Status)
	var out vaultDoc
	require.NoError(t, res.Decode(&out))
	require.Equal(t, vaultDoc{Secret: sentinel, Seen: []string{sentinel + "/kid", sentinel + "/kid", sentinel + "/letter"}}, out)
	fr, err := cl.Await(ctx, fired, 10*time.Second, nil)
	require.NoError(t, err)
	require.Equal(t, gendurable.StatusDone, fr.Instance.Status)

	// The client reads everything in the clear, the error history included.
	in, err := cl.Get(ctx, r.ID)
	require.NoError(t, err)
	require.Empty(t, in.CodecError)
	require.Contains(t, string(in.State), sentinel)
	var stepErr string
	for _, x := range in.Errors {
		if x.Kind == "error" {
			stepErr = x.Error
		}
	}
	require.Equal(t, "the first read of "+sentinel+"/letter fails", stepErr)
	page, err := cl.List(ctx, &gendurable.ListOpts{Machine: "vault"})
	require.NoError(t, err)
	require.Len(t, page.Instances, 1)
	require.Equal(t, stepErr, page.Instances[0].LastError)

	// The rows hold sealed frames, and the sentinel nowhere.
	require.Empty(t, e.rowsHolding(t, sentinel), "tables whose rows hold the sentinel")
	require.Equal(t, 4, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE state #>> '{}' LIKE 'gdc1:k1:%' AND result #>> '{}' LIKE 'gdc1:k1:%'`),
		"the vault, its two kids and the fired kid: state and result sealed")
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE errors -> -1 ->> 'error' LIKE 'gdc1:k1:%' AND id = $1`, r.ID))
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM {schema}.schedules WHERE input -> 'state' #>> '{}' LIKE 'gdc1:k1:%'`))
}

// Rotating keys needs no migration: a client holding the old and the new key (the new one
// current) runs on instances sealed with the old one and seals what it writes with the new one.
// A client missing the old key cannot open those rows: its pick hands them back with the reason
// in their error history (no attempt spent), and its reads say why; a client without a codec
// reads the rest of the row. Once a client with the key runs, nothing was lost.
func TestCodecKeyRotationAndMissingKeys(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	var failed atomic.Int32
	vault, kid := vaultMachines(&failed)
	machines := []gendurable.Machine{vault, kid}
	queues := map[string]gendurable.QueueConfig{"vault": {PollInterval: 20 * time.Millisecond}}

	old := e.client(t, &gendurable.Config{Name: "old", Codec: aesKeys(t, "k1", "k1"), Machines: machines, Queues: queues})
	require.NoError(t, old.Start(ctx))
	r, err := old.Insert(ctx, vault.With(vaultDoc{Secret: sentinel}), nil)
	require.NoError(t, err)
	eventually(t, 10*time.Second, "the vault parks on its letter", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE id = $1 AND status = 'awaiting'`, r.ID) == 1
	})
	require.NoError(t, old.Stop(ctx))

	// A client with only the new key: the parked vault is readable but for its sealed parts.
	k2only := e.client(t, &gendurable.Config{Name: "k2only", Codec: aesKeys(t, "k2", "k2"), Machines: machines, Queues: queues})
	in, err := k2only.Get(ctx, r.ID)
	require.NoError(t, err)
	require.Equal(t, gendurable.StatusAwaiting, in.Status)
	require.Contains(t, in.CodecError, `no key "k1"`)
	require.True(t, strings.HasPrefix(string(in.State), `"gdc1:k1:`), "the state is shown as stored: %s", in.State)
	plain := e.client(t, nil)
	in, err = plain.Get(ctx, r.ID)
	require.NoError(t, err)
	require.ErrorContains(t, errors.New(in.CodecError), "no Config.Codec")
	require.Equal(t, "joined", in.Path[len(in.Path)-1])

	// Woken, the vault is claimed by the k2-only client, which cannot open its state.
	start(t, k2only)
	_, err = k2only.Signal(ctx, gendurable.ByID(r.ID), "letter", sentinel+"/letter")
	require.NoError(t, err)
	eventually(t, 10*time.Second, "the k2-only client hands the vault back, saying why", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE id = $1 AND errors -> -1 ->> 'kind' = 'codec'`, r.ID) == 1
	})
	require.NoError(t, k2only.Stop(ctx))
	in, err = plain.Get(ctx, r.ID)
	require.NoError(t, err)
	require.Equal(t, gendurable.StatusAvailable, in.Status, "handed back, not failed")
	require.Equal(t, 0, in.Attempt, "no attempt spent")
	require.Contains(t, in.Errors[len(in.Errors)-1].Error, `no key "k1"`)
	require.Equal(t, int32(0), failed.Load(), "no step ran")
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM {schema}.signals WHERE instance_id = $1 AND payload #>> '{}' LIKE 'gdc1:k2:%'`, r.ID),
		"the letter, sealed by the k2-only client, waits in the inbox")

	// The rotated client (k1 and k2, k2 current) runs it to the end; what it writes is sealed
	// with k2, and what k1 sealed still opens.
	both := e.client(t, &gendurable.Config{Name: "both", Codec: aesKeys(t, "k2", "k1", "k2"), Machines: machines, Queues: queues})
	start(t, both)
	res, err := both.Await(ctx, r.ID, 10*time.Second, nil)
	require.NoError(t, err)
	require.Equal(t, gendurable.StatusDone, res.Instance.Status)
	require.Empty(t, res.Instance.CodecError)
	var out vaultDoc
	require.NoError(t, res.Decode(&out))
	require.Equal(t, []string{sentinel + "/kid", sentinel + "/kid", sentinel + "/letter"}, out.Seen)
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE id = $1 AND state #>> '{}' LIKE 'gdc1:k1:%' AND result #>> '{}' LIKE 'gdc1:k2:%'`, r.ID),
		"the state as the old client wrote it (Done keeps it), the result sealed with the current key")
	require.Equal(t, 2, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE parent_id = $1 AND result #>> '{}' LIKE 'gdc1:k1:%'`, r.ID),
		"the kids' results, sealed with k1 before the rotation, were opened by the join")
	require.Empty(t, e.rowsHolding(t, sentinel))
}

// NewAESGCM refuses bad keys by name, and a value sealed under one key name does not open under
// another key of the same name.
func TestNewAESGCMValidatesItsKeys(t *testing.T) {
	_, err := gendurable.NewAESGCM("k1", map[string][]byte{"k1": make([]byte, 10)})
	require.ErrorContains(t, err, `key "k1" is 10 bytes`)
	_, err = gendurable.NewAESGCM("k3", map[string][]byte{"k1": make([]byte, 16)})
	require.ErrorContains(t, err, `the current key "k3" is not among the keys ("k1")`)
	_, err = gendurable.NewAESGCM("a b", map[string][]byte{"a b": make([]byte, 16)})
	require.ErrorContains(t, err, `key name "a b"`)

	a := aesKeys(t, "k", "k")
	name, sealed, err := a.Encode([]byte(`{"x":1}`))
	require.NoError(t, err)
	require.Equal(t, "k", name)
	plain, err := a.Decode("k", sealed)
	require.NoError(t, err)
	require.Equal(t, `{"x":1}`, string(plain))
	other, err := gendurable.NewAESGCM("k", map[string][]byte{"k": make([]byte, 32)})
	require.NoError(t, err)
	_, err = other.Decode("k", sealed)
	require.ErrorContains(t, err, `key "k" does not open it`)
	sealed[len(sealed)-1] ^= 1
	_, err = a.Decode("k", sealed)
	require.ErrorContains(t, err, "does not open it")
}
