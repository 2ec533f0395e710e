package store

// Payloads at rest: with a Codec, the documents that come from users and their steps (states,
// results, signal payloads, a schedule's input) and the error texts steps return are sealed
// before they reach a statement and opened after a read. A sealed document is stored as a JSON
// string, so the columns keep their type and no migration is needed; a sealed error text is the
// same frame without the quotes. Values without the frame (written before a codec was set, or
// by the engine itself: lease and cancel errors) pass through as they are.

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"strings"

	"github.com/gendurable/gendurable/durabletype"
)

// Codec seals and opens payloads (gendurable.Codec).
type Codec interface {
	Encode(plain []byte) (key string, sealed []byte, err error)
	Decode(key string, sealed []byte) ([]byte, error)
}

// ErrKindCodec is the error kind of a claim handed back because a value its step would read
// could not be opened. Its text names keys, never a payload, and is stored in the clear.
const ErrKindCodec = "codec"

// sealPrefix starts every sealed value: "gdc1:<key>:<base64url of the sealed bytes>".
const sealPrefix = "gdc1:"

// seal returns the frame of plain, sealed by the store's codec; with no codec, or for a value
// that is sealed already (a schedule's stored input, copied into the rows it inserts), plain.
func (s *Store) seal(plain string) (string, error) {
	if s.Codec == nil || strings.HasPrefix(plain, sealPrefix) {
		return plain, nil
	}
	key, sealed, err := s.Codec.Encode([]byte(plain))
	if err != nil {
		return "", fmt.Errorf("%w: encode: %w", durabletype.ErrCodec, err)
	}
	if !ValidKeyName(key) {
		return "", fmt.Errorf("%w: encode: key name %q: use 1 to 64 letters, digits, '.', '_' or '-'", durabletype.ErrCodec, key)
	}
	return sealPrefix + key + ":" + base64.RawURLEncoding.EncodeToString(sealed), nil
}

// sealDoc seals a JSON document into a JSON string holding its frame. A nil or JSON null
// document stays as it is (a missing result is not a secret).
func (s *Store) sealDoc(doc []byte) ([]byte, error) {
	if s.Codec == nil || doc == nil || string(doc) == "null" || isSealedDoc(doc) {
		return doc, nil
	}
	f, err := s.seal(string(doc))
	if err != nil {
		return nil, err
	}
	return []byte(`"` + f + `"`), nil
}

// sealDocText is sealDoc for a document held as a string.
func (s *Store) sealDocText(doc string) (string, error) {
	if s.Codec == nil {
		return doc, nil
	}
	b, err := s.sealDoc([]byte(doc))
	return string(b), err
}

// isSealedDoc reports whether doc is a JSON string holding a frame.
func isSealedDoc(doc []byte) bool {
	return len(doc) > len(sealPrefix)+2 && doc[0] == '"' && bytes.HasPrefix(doc[1:], []byte(sealPrefix))
}

// open returns the plaintext of a frame; a value that is not a frame is returned as it is.
func (s *Store) open(stored string) (string, error) {
	if !strings.HasPrefix(stored, sealPrefix) {
		return stored, nil
	}
	key, body, ok := strings.Cut(stored[len(sealPrefix):], ":")
	if !ok || !ValidKeyName(key) {
		return stored, fmt.Errorf("%w: a sealed value has no key name", durabletype.ErrCodec)
	}
	if s.Codec == nil {
		return stored, fmt.Errorf("%w: sealed with key %q, and this client has no Config.Codec", durabletype.ErrCodec, key)
	}
	sealed, err := base64.RawURLEncoding.DecodeString(body)
	if err != nil {
		return stored, fmt.Errorf("%w: sealed with key %q: %w", durabletype.ErrCodec, key, err)
	}
	plain, err := s.Codec.Decode(key, sealed)
	if err != nil {
		return stored, fmt.Errorf("%w: sealed with key %q: %w", durabletype.ErrCodec, key, err)
	}
	return string(plain), nil
}

// openDoc returns the JSON document a sealed document holds; any other document is returned as
// it is. On error the stored document is returned with it.
func (s *Store) openDoc(stored []byte) ([]byte, error) {
	if !isSealedDoc(stored) || stored[len(stored)-1] != '"' {
		return stored, nil
	}
	plain, err := s.open(string(stored[1 : len(stored)-1]))
	if err != nil {
		return stored, err
	}
	return []byte(plain), nil
}

// opener opens documents and texts in place, keeping the first error: a read that cannot open
// one value still returns the others (the unopened one as stored).
type opener struct {
	s   *Store
	err error
}

func (o *opener) doc(p *[]byte) {
	if len(*p) == 0 || o.s == nil {
		return
	}
	b, err := o.s.openDoc(*p)
	*p = b
	o.keep(err)
}

func (o *opener) text(p *string) {
	if o.s == nil || !strings.HasPrefix(*p, sealPrefix) {
		return
	}
	t, err := o.s.open(*p)
	*p = t
	o.keep(err)
}

func (o *opener) keep(err error) {
	if err != nil && o.err == nil {
		o.err = err
	}
}

// message is the error's text for Instance.CodecError ("" for none).
func (o *opener) message() string {
	if o.err == nil {
		return ""
	}
	return o.err.Error()
}

// openInstance opens an instance's state, result and error texts; what cannot be opened stays
// as stored and in.CodecError says why.
func (s *Store) openInstance(in *durabletype.Instance) {
	o := opener{s: s}
	o.doc(&in.State)
	o.doc(&in.Result)
	for i := range in.Errors {
		o.text(&in.Errors[i].Error)
	}
	in.CodecError = o.message()
}

// openClaim opens what a claimed step reads: its state, its inbox's payloads, its children's
// results and errors. What cannot be opened is reported in c.CodecErr: the step must not run.
func (s *Store) openClaim(c *Claimed) {
	if s.Codec == nil && !isSealedDoc(c.State) && !anySealed(c) {
		return // the common case: nothing sealed, nothing to open with
	}
	o := opener{s: s}
	o.doc(&c.State)
	for i := range c.Inbox {
		o.doc((*[]byte)(&c.Inbox[i].Payload))
	}
	for i := range c.Children {
		o.doc((*[]byte)(&c.Children[i].Result))
		o.text(&c.Children[i].Error)
	}
	c.CodecErr = o.err
}

// openRest opens the signals and children LoadRest appended to a claim, keeping the first error
// the claim met.
func (s *Store) openRest(c *Claimed, inbox []SignalRow, children []ChildRow) {
	o := opener{s: s}
	for i := range inbox {
		o.doc((*[]byte)(&inbox[i].Payload))
	}
	for i := range children {
		o.doc((*[]byte)(&children[i].Result))
		o.text(&children[i].Error)
	}
	if c.CodecErr == nil {
		c.CodecErr = o.err
	}
}

// anySealed reports whether a claim's inbox or children hold a sealed value.
func anySealed(c *Claimed) bool {
	for _, sg := range c.Inbox {
		if isSealedDoc(sg.Payload) {
			return true
		}
	}
	for _, ch := range c.Children {
		if isSealedDoc(ch.Result) || strings.HasPrefix(ch.Error, sealPrefix) {
			return true
		}
	}
	return false
}

// ValidKeyName reports whether a codec's key name can be stored in a frame.
func ValidKeyName(k string) bool {
	if k == "" || len(k) > 64 {
		return false
	}
	return strings.IndexFunc(k, func(r rune) bool {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-'
		return !ok
	}) < 0
}
