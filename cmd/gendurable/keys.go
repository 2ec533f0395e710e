package main

import (
	"encoding/base64"
	"fmt"
	"os"
	"strings"

	"github.com/gendurable/gendurable"
)

// keysEnv names the environment variable that gives the commands the AES-GCM keys of a schema
// whose clients seal their payloads (Config.Codec): "name:base64key,name:base64key", the first
// one current. Without it, sealed values are shown as stored, with the reason.
const keysEnv = "GENDURABLE_KEYS"

// codecFromEnv builds the codec keysEnv describes; nil when it is not set.
func codecFromEnv() (gendurable.Codec, error) {
	spec := strings.TrimSpace(os.Getenv(keysEnv))
	if spec == "" {
		return nil, nil
	}
	keys := map[string][]byte{}
	var current string
	for i, part := range strings.Split(spec, ",") {
		name, b64, ok := strings.Cut(strings.TrimSpace(part), ":")
		if !ok {
			return nil, fmt.Errorf("%s: entry %d: want name:base64key", keysEnv, i+1)
		}
		key, err := base64.StdEncoding.DecodeString(b64)
		if err != nil {
			return nil, fmt.Errorf("%s: key %q: not standard base64: %w", keysEnv, name, err)
		}
		if _, dup := keys[name]; dup {
			return nil, fmt.Errorf("%s: key %q given twice", keysEnv, name)
		}
		keys[name] = key
		if i == 0 {
			current = name
		}
	}
	c, err := gendurable.NewAESGCM(current, keys)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", keysEnv, err)
	}
	return c, nil
}
