package durableui_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"

	"github.com/gendurable/gendurable"
	"github.com/stretchr/testify/require"
)

// With Config.Codec, the dashboard of a client holding the key shows the instance's state and
// inbox in the clear; the dashboard of a client without it shows them as stored, says why, and
// never the plaintext.
func TestSealedValuesAreOpenedOrFlagged(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	codec, err := gendurable.NewAESGCM("k1", map[string][]byte{"k1": make([]byte, 32)})
	require.NoError(t, err)
	sealing, err := gendurable.NewClient(e.pool, &gendurable.Config{Schema: e.schema, Codec: codec,
		Machines: []gendurable.Machine{orderFSM}})
	require.NoError(t, err)
	const secret = "card-4242-secret"
	res, err := sealing.Insert(ctx, orderFSM.With(order{Item: secret}), nil)
	require.NoError(t, err)
	_, err = sealing.Signal(ctx, gendurable.ByID(res.ID), "note", map[string]string{"text": secret + "-note"})
	require.NoError(t, err)
	page := fmt.Sprintf("/instances/%d", res.ID)

	e.client = sealing
	code, body := e.serve(t, nil).get(t, page)
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, secret)
	require.Contains(t, body, secret+"-note")
	require.NotContains(t, body, `id="sealed"`)

	plain, err := gendurable.NewClient(e.pool, &gendurable.Config{Schema: e.schema, Machines: []gendurable.Machine{orderFSM}})
	require.NoError(t, err)
	e.client = plain
	code, body = e.serve(t, nil).get(t, page)
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `id="sealed"`)
	require.Contains(t, body, `sealed with key &#34;k1&#34;, and this client has no Config.Codec`)
	require.Contains(t, body, `gdc1:k1:`, "the state as stored")
	require.NotContains(t, body, secret)
}
