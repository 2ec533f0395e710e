// Package jsonx encodes and decodes the JSON documents gendurable stores (state, results,
// payloads), with the checks Postgres's jsonb would otherwise make late and obscurely.
package jsonx

import (
	"bytes"
	"encoding/json"
	"fmt"
	"unicode/utf8"

	"github.com/gendurable/gendurable/durabletype"
)

// Encode marshals v and checks that Postgres's jsonb can store it as it is (see Check). Errors
// match ErrPayloadTooLarge or ErrInvalidPayload.
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

// MaxDepth is the deepest nesting of arrays and objects a stored document may have:
// encoding/json refuses to decode a deeper one (so a step could never read it back), and
// Postgres's jsonb parser runs out of stack not far past it.
const MaxDepth = 10000

// The limits of Postgres's numeric type, which stores every jsonb number: at most 16,383 digits
// after the decimal point, the leading digit at most 10^131071, and an exponent whose magnitude
// stays below 2^30 - 1 whatever the digits.
const (
	maxNumericScale    = 16383
	maxNumericExponent = 131071
	maxNumericExpInput = 1<<30 - 1
)

// Check applies Encode's checks to an already encoded document: at most max bytes (when
// max > 0), and nothing Postgres's jsonb would refuse once it is sent: invalid UTF-8, the escape
// \u0000, a lone UTF-16 surrogate escape (\ud800 without its pair), a number outside the range
// of Postgres's numeric, or nesting deeper than MaxDepth. Go's encoder never writes the last
// three from Go strings and floats; json.RawMessage, json.Number and custom marshalers can. The
// errors say where, never what: payloads may hold secrets.
func Check(b []byte, max int) error {
	if max > 0 && len(b) > max {
		return fmt.Errorf("%w: %d bytes encoded, the limit is %d", durabletype.ErrPayloadTooLarge, len(b), max)
	}
	if !utf8.Valid(b) {
		return fmt.Errorf("%w: the document is not valid UTF-8", durabletype.ErrInvalidPayload)
	}
	if at, why := scan(b); why != "" {
		return fmt.Errorf("%w: at byte %d: %s", durabletype.ErrInvalidPayload, at, why)
	}
	return nil
}

const whyNUL = "a string holds a NUL character (\\u0000), which Postgres cannot store in jsonb"

// scan walks a JSON text (as json.Marshal writes it; it tolerates anything without panicking)
// and returns the offset and the reason of the first thing jsonb would refuse, or "".
func scan(b []byte) (int, string) {
	depth := 0
	for i := 0; i < len(b); {
		c := b[i]
		switch {
		case c == '"':
			j, why := scanString(b, i+1)
			if why != "" {
				return j, why
			}
			i = j
		case c == '[' || c == '{':
			depth++
			if depth > MaxDepth {
				return i, fmt.Sprintf("nested deeper than %d levels, which cannot be decoded", MaxDepth)
			}
			i++
		case c == ']' || c == '}':
			depth--
			i++
		case c == '-' || (c >= '0' && c <= '9'):
			j, exp := i+1, false
			for ; j < len(b) && isNumberByte(b[j]); j++ {
				exp = exp || b[j] == 'e' || b[j] == 'E'
			}
			// Without an exponent, a number shorter than numeric's scale limit always fits.
			if (exp || j-i > maxNumericScale) && !numericFits(b[i:j]) {
				return i, "a number is outside the range of Postgres's numeric, which jsonb stores numbers in"
			}
			i = j
		default:
			i++
		}
	}
	return 0, ""
}

func isNumberByte(c byte) bool {
	return (c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-'
}

// scanString checks the string whose contents start at b[i] and returns the offset just past its
// closing quote.
func scanString(b []byte, i int) (int, string) {
	for i < len(b) {
		end := bytes.IndexByte(b[i:], '"')
		if end < 0 {
			end = len(b) - i
		}
		k := bytes.IndexByte(b[i:i+end], '\\')
		if k < 0 {
			return i + end + 1, "" // no escape before the closing quote
		}
		i += k
		// A backslash escape.
		if i+1 >= len(b) || b[i+1] != 'u' {
			i += 2
			continue
		}
		r, ok := hex4(b, i+2)
		if !ok {
			i += 2
			continue
		}
		switch {
		case r == 0:
			return i, whyNUL
		case r >= 0xDC00 && r <= 0xDFFF:
			return i, "a string holds a lone UTF-16 low surrogate escape, which jsonb refuses"
		case r >= 0xD800 && r <= 0xDBFF:
			lo, ok := rune(0), false
			if i+7 < len(b) && b[i+6] == '\\' && b[i+7] == 'u' {
				lo, ok = hex4(b, i+8)
			}
			if !ok || lo < 0xDC00 || lo > 0xDFFF {
				return i, "a string holds a lone UTF-16 high surrogate escape, which jsonb refuses"
			}
			i += 12
		default:
			i += 6
		}
	}
	return len(b), ""
}

func hex4(b []byte, i int) (rune, bool) {
	if i+4 > len(b) {
		return 0, false
	}
	var r rune
	for _, c := range b[i : i+4] {
		var d byte
		switch {
		case c >= '0' && c <= '9':
			d = c - '0'
		case c >= 'a' && c <= 'f':
			d = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			d = c - 'A' + 10
		default:
			return 0, false
		}
		r = r<<4 | rune(d)
	}
	return r, true
}

// numericFits reports whether the JSON number tok fits Postgres's numeric (see the limits
// above). A token that is not a well-formed number passes: it is not this check's business.
func numericFits(tok []byte) bool {
	if len(tok) > 0 && tok[0] == '-' {
		tok = tok[1:]
	}
	mant, exp := tok, []byte(nil)
	if k := bytes.IndexAny(tok, "eE"); k >= 0 {
		mant, exp = tok[:k], tok[k+1:]
	}
	intPart, frac := mant, []byte(nil)
	if k := bytes.IndexByte(mant, '.'); k >= 0 {
		intPart, frac = mant[:k], mant[k+1:]
	}
	var e int64
	if exp != nil {
		neg := len(exp) > 0 && exp[0] == '-'
		if len(exp) > 0 && (exp[0] == '-' || exp[0] == '+') {
			exp = exp[1:]
		}
		exp = bytes.TrimLeft(exp, "0")
		if len(exp) > 10 {
			return false
		}
		for _, c := range exp {
			if c < '0' || c > '9' {
				return true
			}
			e = e*10 + int64(c-'0')
		}
		if neg {
			e = -e
		}
		if e >= maxNumericExpInput || e <= -maxNumericExpInput {
			return false
		}
	}
	if int64(len(frac))-e > maxNumericScale {
		return false
	}
	lead := -1
	for k, c := range intPart {
		if c != '0' {
			lead = k
			break
		}
	}
	if lead < 0 {
		for k, c := range frac {
			if c != '0' {
				lead = len(intPart) + k
				break
			}
		}
	}
	if lead < 0 {
		return true // zero
	}
	return int64(len(intPart)-1-lead)+e <= maxNumericExponent
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
