package jsonx

import (
	"encoding/json"
	"math"
	"strings"
	"testing"

	"github.com/gendurable/gendurable/durabletype"
	"github.com/stretchr/testify/require"
)

func TestHasNUL(t *testing.T) {
	for text, want := range map[string]bool{
		`"a\u0000b"`:   true,
		`"\\u0000"`:    false, // an escaped backslash, then the letters u0000
		`"\\\u0000"`:   true,
		`{"u0000": 1}`: false,
		`"\u00001"`:    true,
		`"plain"`:      false,
	} {
		require.Equal(t, want, HasNUL([]byte(text)), text)
	}
}

func TestEncodeChecks(t *testing.T) {
	_, err := Encode(math.NaN(), 0)
	require.ErrorIs(t, err, durabletype.ErrInvalidPayload)
	_, err = Encode("a\x00", 0)
	require.ErrorIs(t, err, durabletype.ErrInvalidPayload)
	_, err = Encode(strings.Repeat("x", 100), 50)
	require.ErrorIs(t, err, durabletype.ErrPayloadTooLarge)
	b, err := Encode(`\u0000 as text`, 0)
	require.NoError(t, err)
	var s string
	require.NoError(t, json.Unmarshal(b, &s))
	require.Equal(t, `\u0000 as text`, s)
}

func TestDecodeLegacyDoubleEncoding(t *testing.T) {
	type st struct {
		N int `json:"n"`
	}
	var a, b st
	require.NoError(t, Decode([]byte(`{"n": 3}`), &a))
	require.NoError(t, Decode([]byte(`"{\"n\": 3}"`), &b))
	require.Equal(t, a, b)
	// A plain string state stays a string.
	var s string
	require.NoError(t, Decode([]byte(`"hello"`), &s))
	require.Equal(t, "hello", s)
}

// A string whose text reads as JSON is a string, not a legacy document: it round-trips into a
// string (regression: it was unwrapped and then failed to decode, so a Job[string] given a
// request body could never run), and into any it stays a string.
func TestDecodeStringThatReadsAsJSON(t *testing.T) {
	for _, text := range []string{`{"a":1}`, `[1,2]`, ` {"n": 3} `, `[]`} {
		b, err := Encode(text, 0)
		require.NoError(t, err)
		var s string
		require.NoError(t, Decode(b, &s), text)
		require.Equal(t, text, s)
		var v any
		require.NoError(t, Decode(b, &v), text)
		require.Equal(t, text, v)
		var list []string
		b, err = Encode([]string{text}, 0)
		require.NoError(t, err)
		require.NoError(t, Decode(b, &list))
		require.Equal(t, []string{text}, list)
	}
	// A target that a string cannot fill still reads the legacy form.
	var m map[string]int
	require.NoError(t, Decode([]byte(`"{\"a\": 1}"`), &m))
	require.Equal(t, map[string]int{"a": 1}, m)
	var xs []int
	require.NoError(t, Decode([]byte(`"[1, 2]"`), &xs))
	require.Equal(t, []int{1, 2}, xs)
	// A string that is not a legacy document keeps its decode error.
	require.Error(t, Decode([]byte(`"nope"`), &m))
	require.Error(t, Decode([]byte(`"{broken"`), &m))
}

func FuzzDecodeState(f *testing.F) {
	for _, seed := range []string{`{"n":1}`, `"{\"n\":1}"`, `[1,2]`, `"x"`, `null`, `{"a":"\u0000"}`} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var v any
		if err := Decode(b, &v); err != nil {
			return
		}
		enc, err := json.Marshal(v)
		if err != nil {
			t.Fatalf("decoded value does not re-encode: %v", err)
		}
		var w any
		if err := Decode(enc, &w); err != nil {
			t.Fatalf("re-encoded value does not decode: %v", err)
		}
	})
}
