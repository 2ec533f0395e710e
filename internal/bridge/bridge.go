// Package bridge lets the test kit (durabletest) reach a Client's engine without widening the
// public API. The root package sets Engine once, in its init function; nothing writes it after.
package bridge

import "github.com/gendurable/gendurable/internal/engine"

// Engine returns the engine behind a *gendurable.Client (passed as any to avoid an import
// cycle), and the database the client was built on.
var Engine func(client any) (*engine.Engine, engine.Pool)
