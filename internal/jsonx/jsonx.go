// Package jsonx encodes and decodes the JSON documents gendurable stores (state, results,
// payloads), with the checks Postgres's jsonb would otherwise make late and obscurely.
package jsonx

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/gendurable/gendurable/durabletype"
)

// Encode marshals v and checks it can be stored: at most max bytes (when max > 0) and no NUL
// character in any string (jsonb rejects \u0000). Errors match ErrPayloadTooLarge or
// ErrInvalidPayload.
func Encode(v any, max int) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", durabletype.ErrInvalidPayload, err)
	}
	if err := Check(b, max); err != nil {
		return nil, err
	}
	return b, nil
}

// Check applies Encode's checks to an already encoded document.
func Check(b []byte, max int) error {
	if max > 0 && len(b) > max {
		return fmt.Errorf("%w: %d bytes encoded, the limit is %d", durabletype.ErrPayloadTooLarge, len(b), max)
	}
	if HasNUL(b) {
		return fmt.Errorf("%w: a string holds a NUL character (\\u0000), which Postgres cannot store in jsonb", durabletype.ErrInvalidPayload)
	}
	return nil
}

// HasNUL reports whether the JSON text b contains the escape \u0000 (an escaped backslash
// followed by "u0000" is not one).
func HasNUL(b []byte) bool {
	for i := 0; ; {
		j := bytes.Index(b[i:], []byte(`u0000`))
		if j < 0 {
			return false
		}
		j += i
		// Count the backslashes right before "u0000": an odd number means an escape.
		n := 0
		for k := j - 1; k >= 0 && b[k] == '\\'; k-- {
			n++
		}
		if n%2 == 1 {
			return true
		}
		i = j + 5
	}
}

// Decode unmarshals a stored document into v. A document stored as a JSON string that itself
// holds a JSON object or array (the double encoding of early versions) is unwrapped, but only
// when the string does not decode into v as it is: a string state that happens to read as JSON
// (a Job[string] carrying a request body, say) stays the string it was.
func Decode(b []byte, v any) error {
	b = bytes.TrimSpace(b)
	err := json.Unmarshal(b, v)
	if err == nil || len(b) == 0 || b[0] != '"' {
		return err
	}
	var inner string
	if json.Unmarshal(b, &inner) != nil {
		return err
	}
	ib := bytes.TrimSpace([]byte(inner))
	if len(ib) == 0 || (ib[0] != '{' && ib[0] != '[') || !json.Valid(ib) {
		return err
	}
	return json.Unmarshal(ib, v)
}
