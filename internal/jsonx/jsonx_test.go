package jsonx

import (
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/gendurable/gendurable/durabletype"
	"github.com/stretchr/testify/require"
)

func TestCheckNUL(t *testing.T) {
	for text, want := range map[string]bool{
		`"a\u0000b"`:   true,
		`"\\u0000"`:    false, // an escaped backslash, then the letters u0000
		`"\\\u0000"`:   true,
		`{"u0000": 1}`: false,
		`"\u00001"`:    true,
		`"plain"`:      false,
	} {
		err := Check([]byte(text), 0)
		if want {
			require.ErrorIs(t, err, durabletype.ErrInvalidPayload, text)
			require.ErrorContains(t, err, "NUL", text)
		} else {
			require.NoError(t, err, text)
		}
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

// FuzzDecodeState: Decode never panics on stored bytes; what it decodes re-encodes and decodes
// to the same value (Decode(Encode(Decode(x))) = Decode(x)); an object stored in the legacy
// double encoding decodes, into a map, equal to the object form; any text, as a Go string, comes
// back as the string encoding/json round-trips; and Check never panics. Seeds: testdata/fuzz.
//
//	go test -run '^$' -fuzz '^FuzzDecodeState$' -fuzztime 5m -parallel 1 ./internal/jsonx
func FuzzDecodeState(f *testing.F) {
	for _, seed := range []string{`{"n":1}`, `"{\"n\":1}"`, `[1,2]`, `"x"`, `null`, `{"a":"\u0000"}`} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		_ = Check(b, 1<<20)
		var v any
		if err := Decode(b, &v); err == nil {
			enc, err := json.Marshal(v)
			if err != nil {
				t.Fatalf("decoded value does not re-encode: %v", err)
			}
			var w any
			if err := Decode(enc, &w); err != nil {
				t.Fatalf("re-encoded value does not decode: %v", err)
			}
			if !reflect.DeepEqual(v, w) {
				t.Fatalf("Decode(Encode(Decode(x))) = %#v, Decode(x) = %#v", w, v)
			}
		}
		var obj map[string]any
		if json.Unmarshal(b, &obj) == nil && obj != nil {
			legacy, _ := json.Marshal(string(b))
			var fromLegacy map[string]any
			if err := Decode(legacy, &fromLegacy); err != nil {
				t.Fatalf("the legacy form of %q does not decode: %v", b, err)
			}
			if !reflect.DeepEqual(obj, fromLegacy) {
				t.Fatalf("legacy form decodes to %#v, the object to %#v", fromLegacy, obj)
			}
		}
		// Any text as a Go string: Encode then Decode gives what encoding/json round-trips (a
		// string that reads as JSON stays a string).
		enc, err := Encode(string(b), 0)
		if err != nil {
			if !errors.Is(err, durabletype.ErrInvalidPayload) {
				t.Fatalf("Encode of a string: %v", err)
			}
			return
		}
		var want, got string
		if err := json.Unmarshal(enc, &want); err != nil {
			t.Fatal(err)
		}
		if err := Decode(enc, &got); err != nil || got != want {
			t.Fatalf("string %q came back as %q (%v)", want, got, err)
		}
	})
}

// nest returns a Go value n arrays deep.
func nest(n int) any {
	var v any = 1
	for range n {
		v = []any{v}
	}
	return v
}

// The JSON edges of docs/reliability.md T13, each with its documented result, as Go values and as raw
// documents (json.RawMessage, json.Number: what reaches Postgres unchanged). "" is accepted;
// otherwise the sentinel the error matches. stored is what an accepted value is stored as, when
// that differs from what went in.
func TestJSONEdges(t *testing.T) {
	const limit = 1 << 20
	huge := strings.Repeat("x", 10<<20)
	cases := []struct {
		name   string
		value  any
		want   error
		stored string
	}{
		{"NUL in a Go string", "a\x00b", durabletype.ErrInvalidPayload, ""},
		{"NUL escape in a raw document", json.RawMessage(`{"k":"\u0000"}`), durabletype.ErrInvalidPayload, ""},
		{"escaped backslash then u0000 is text", json.RawMessage(`"\\u0000"`), nil, ""},
		{"lone high surrogate escape", json.RawMessage(`"\ud800"`), durabletype.ErrInvalidPayload, ""},
		{"lone low surrogate escape", json.RawMessage(`"x\udc00"`), durabletype.ErrInvalidPayload, ""},
		{"high surrogate then a non-surrogate escape", json.RawMessage(`"\ud800\u0041"`), durabletype.ErrInvalidPayload, ""},
		{"surrogate pair", json.RawMessage(`"\ud83d\ude00"`), nil, ""},
		{"surrogate code point in a Go string is invalid UTF-8, replaced", "\xed\xa0\x80", nil, `"\ufffd\ufffd\ufffd"`},
		{"invalid UTF-8 in a Go string is replaced", "a\xffb", nil, `"a\ufffdb"`},
		{"invalid UTF-8 in a raw document", json.RawMessage("\"a\xffb\""), durabletype.ErrInvalidPayload, ""},
		{"NaN", math.NaN(), durabletype.ErrInvalidPayload, ""},
		{"+Inf", math.Inf(1), durabletype.ErrInvalidPayload, ""},
		{"NaN in a raw document is not JSON", json.RawMessage(`NaN`), durabletype.ErrInvalidPayload, ""},
		{"1e400 fits numeric", json.Number("1e400"), nil, ""},
		{"largest numeric exponent", json.RawMessage(`9.9e131071`), nil, ""},
		{"past numeric's exponent", json.RawMessage(`1e131072`), durabletype.ErrInvalidPayload, ""},
		{"past numeric's scale", json.RawMessage(`[1e-16384]`), durabletype.ErrInvalidPayload, ""},
		{"numeric's scale", json.RawMessage(`1e-16383`), nil, ""},
		{"zero with a huge exponent", json.RawMessage(`0e999999`), nil, ""},
		{"exponent past numeric's input", json.RawMessage(`0e1073741823`), durabletype.ErrInvalidPayload, ""},
		{"2^63", uint64(1) << 63, nil, `9223372036854775808`},
		{"duplicate keys: accepted, the last wins", json.RawMessage(`{"a":1,"a":2}`), nil, ""},
		{"nesting 10,000", nest(10000), nil, ""},
		{"nesting 10,001", nest(10001), durabletype.ErrInvalidPayload, ""},
		{"raw nesting 10,001", json.RawMessage(strings.Repeat("[", 10001) + strings.Repeat("]", 10001)), durabletype.ErrInvalidPayload, ""},
		{"a 10 MiB string", huge, durabletype.ErrPayloadTooLarge, ""},
		{"a 1 MiB document", strings.Repeat("x", limit-2), nil, ""},
		{"one byte more", strings.Repeat("x", limit-1), durabletype.ErrPayloadTooLarge, ""},
	}
	for _, c := range cases {
		b, err := Encode(c.value, limit)
		if c.want != nil {
			require.ErrorIs(t, err, c.want, c.name)
			continue
		}
		require.NoError(t, err, c.name)
		if c.stored != "" {
			require.Equal(t, c.stored, string(b), c.name)
		}
	}

	// What an accepted edge decodes to.
	var n uint64
	require.NoError(t, Decode([]byte(`9223372036854775808`), &n))
	require.Equal(t, uint64(1)<<63, n, "exact into an integer type")
	var f any
	require.NoError(t, Decode([]byte(`9223372036854775808`), &f))
	require.Equal(t, float64(1<<63), f, "into any it is a float64: exact up to 2^53 only")
	var x float64
	require.Error(t, Decode([]byte(`1e400`), &x), "1e400 does not fit a float64")
	var num json.Number
	require.NoError(t, Decode([]byte(`1e400`), &num))
	var m map[string]int
	require.NoError(t, Decode([]byte(`{"a":1,"a":2}`), &m))
	require.Equal(t, map[string]int{"a": 2}, m, "duplicate keys: the last wins, as in jsonb")
}

// Check never panics, whatever bytes it gets, and says where the problem is, never what.
func TestCheckToleratesAnyBytes(t *testing.T) {
	for _, b := range []string{`"`, `"\`, `"\u`, `"\ud800`, `"\ud800\`, `"\ud800\u`, `"\ud800\udc`, `-`, `1e`, `1e+`,
		`1.`, `-e5`, `}}}`, `"\uZZZZ"`, `1e99999999999999999999`, `--1`, `1e-`, "\xff"} {
		err := Check([]byte(b), 0)
		if err != nil {
			require.ErrorIs(t, err, durabletype.ErrInvalidPayload, b)
		}
	}
	err := Check([]byte(`{"password":"hunter2\ud800"}`), 0)
	require.ErrorIs(t, err, durabletype.ErrInvalidPayload)
	require.NotContains(t, err.Error(), "hunter2")
}
