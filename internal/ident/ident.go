// Package ident validates and quotes the one identifier that comes from configuration: the
// schema name. It is validated once (a plain lower-case identifier, so it reads the same in
// every syntactic position) and quoted at every use.
package ident

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/gendurable/gendurable/durabletype"
	"github.com/jackc/pgx/v5"
)

// DefaultSchema is the schema used when none is configured.
const DefaultSchema = "gendurable"

var schemaRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// Schema returns the schema name to use (DefaultSchema for ""), or an error matching
// durabletype.ErrInvalidIdentifier.
func Schema(name string) (string, error) {
	if name == "" {
		return DefaultSchema, nil
	}
	if !schemaRE.MatchString(name) {
		return "", fmt.Errorf("%w: schema %q: use 1 to 63 characters of a-z, 0-9 and _, not starting with a digit",
			durabletype.ErrInvalidIdentifier, name)
	}
	if strings.HasPrefix(name, "pg_") {
		return "", fmt.Errorf("%w: schema %q: names starting with pg_ are reserved by Postgres",
			durabletype.ErrInvalidIdentifier, name)
	}
	return name, nil
}

// Quote returns the schema name as a quoted SQL identifier.
func Quote(schema string) string {
	return pgx.Identifier{schema}.Sanitize()
}

// Expand replaces every {schema} in a statement template with the quoted schema name.
func Expand(template, schema string) string {
	return strings.ReplaceAll(template, "{schema}", Quote(schema))
}
