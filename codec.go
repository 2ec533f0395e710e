package gendurable

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/gendurable/gendurable/internal/store"
)

// Codec seals what steps and callers store before it reaches Postgres, and opens it after a
// read: states (also a schedule's input), results, signal payloads and the error texts steps
// return. Set it with Config.Codec; NewAESGCM is a ready one. Everything else in a row (ids,
// machine and step names, keys, times, the errors the engine itself records) stays readable,
// since the engine's statements work on it.
//
// A sealed value is stored as the JSON string "gdc1:<key>:<sealed bytes in base64url>", so the
// columns keep their type and a client without the key still reads the rest of the row. Values
// stored before a codec was set stay readable as they are.
type Codec interface {
	// Encode seals plain and names the key it used: 1 to 64 letters, digits, '.', '_' or '-'.
	// The name is stored in the clear beside the sealed bytes.
	Encode(plain []byte) (key string, sealed []byte, err error)
	// Decode opens sealed, which Encode sealed with the key named key.
	Decode(key string, sealed []byte) ([]byte, error)
}

// AESGCM is a Codec sealing with AES-GCM under one of several named keys: Encode uses the
// current key, Decode any key it holds. Rotate by adding a new key to every node, then making it
// current; drop the old key once no row holds it (see docs/encryption.md). Safe for concurrent
// use.
type AESGCM struct {
	current string
	aeads   map[string]cipher.AEAD
}

// NewAESGCM builds an AESGCM codec from keys (name → 16, 24 or 32 bytes: AES-128, -192 or -256)
// that seals with keys[current].
func NewAESGCM(current string, keys map[string][]byte) (*AESGCM, error) {
	c := &AESGCM{current: current, aeads: make(map[string]cipher.AEAD, len(keys))}
	for name, key := range keys {
		if !store.ValidKeyName(name) {
			return nil, fmt.Errorf("gendurable: NewAESGCM: key name %q: use 1 to 64 letters, digits, '.', '_' or '-'", name)
		}
		block, err := aes.NewCipher(key)
		if err != nil {
			return nil, fmt.Errorf("gendurable: NewAESGCM: key %q is %d bytes: an AES key is 16, 24 or 32", name, len(key))
		}
		aead, err := cipher.NewGCM(block)
		if err != nil {
			return nil, fmt.Errorf("gendurable: NewAESGCM: key %q: %w", name, err)
		}
		c.aeads[name] = aead
	}
	if c.aeads[current] == nil {
		return nil, fmt.Errorf("gendurable: NewAESGCM: the current key %q is not among the keys (%s)", current, c.names())
	}
	return c, nil
}

// Encode seals plain with the current key: a fresh random nonce, then the ciphertext and its
// tag. The key's name is authenticated with it, so a value cannot pass for another key's.
func (c *AESGCM) Encode(plain []byte) (string, []byte, error) {
	aead := c.aeads[c.current]
	out := make([]byte, aead.NonceSize(), aead.NonceSize()+len(plain)+aead.Overhead())
	if _, err := rand.Read(out); err != nil {
		return "", nil, fmt.Errorf("nonce: %w", err)
	}
	return c.current, aead.Seal(out, out, plain, []byte(c.current)), nil
}

// Decode opens a value Encode sealed with the key named key.
func (c *AESGCM) Decode(key string, sealed []byte) ([]byte, error) {
	aead := c.aeads[key]
	if aead == nil {
		return nil, fmt.Errorf("no key %q in this codec (it has %s)", key, c.names())
	}
	if len(sealed) < aead.NonceSize()+aead.Overhead() {
		return nil, errors.New("sealed value too short")
	}
	n := aead.NonceSize()
	plain, err := aead.Open(nil, sealed[:n], sealed[n:], []byte(key))
	if err != nil {
		return nil, fmt.Errorf("key %q does not open it (altered, or another key of that name): %w", key, err)
	}
	return plain, nil
}

func (c *AESGCM) names() string {
	names := make([]string, 0, len(c.aeads))
	for n := range c.aeads {
		names = append(names, fmt.Sprintf("%q", n))
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}
