package durabletype

import (
	"errors"
	"strconv"
)

// Sentinel errors. Callers branch on them with errors.Is; the engine wraps them with context.
var (
	// ErrNotFound: no instance has that id (or that correlation key).
	ErrNotFound = errors.New("gendurable: instance not found")
	// ErrNoTarget: a signal's target is finished or does not exist; nothing was stored.
	ErrNoTarget = errors.New("gendurable: signal target is finished or does not exist")
	// ErrPayloadTooLarge: an encoded state, result or payload is over Config.MaxPayloadBytes.
	ErrPayloadTooLarge = errors.New("gendurable: payload too large")
	// ErrInvalidPayload: a value cannot be stored as JSON: it does not encode, or jsonb would
	// refuse it (a NUL character, invalid UTF-8, a lone UTF-16 surrogate escape, a number outside
	// numeric's range), or it nests deeper than 10,000 levels.
	ErrInvalidPayload = errors.New("gendurable: invalid payload")
	// ErrCodec: Config.Codec could not seal a payload, or a sealed payload could not be opened
	// (this client has no codec, or not the key it was sealed with).
	ErrCodec = errors.New("gendurable: payload codec")
	// ErrUnknownMachine: no registered machine has that name.
	ErrUnknownMachine = errors.New("gendurable: unknown machine")
	// ErrUnknownQueue: no client of the schema works or inserts into a queue of that name (as
	// far as this client and the node registry know).
	ErrUnknownQueue = errors.New("gendurable: unknown queue")
	// ErrUnknownSchedule: no schedule has that name.
	ErrUnknownSchedule = errors.New("gendurable: unknown schedule")
	// ErrScheduleOwned: the schedule is declared by a service's Config (Config.Service), and
	// only that service's declaration changes it.
	ErrScheduleOwned = errors.New("gendurable: schedule declared by a service")
	// ErrUnknownStep: the machine has no step of that name.
	ErrUnknownStep = errors.New("gendurable: unknown step")
	// ErrUnknownVersion: a row is at a version of its machine newer than the one registered on
	// this client (a rolling deploy that is not done yet).
	ErrUnknownVersion = errors.New("gendurable: unknown machine version")
	// ErrUpgrade: a row of an older version of its machine cannot be brought forward: the machine
	// declares no upgrade from that version, maps its step nowhere, or its upgrade function failed.
	ErrUpgrade = errors.New("gendurable: cannot upgrade the instance")
	// ErrInvalidIdentifier: a schema name is not a plain lower-case SQL identifier.
	ErrInvalidIdentifier = errors.New("gendurable: invalid identifier")
	// ErrInvalidInput: an argument of an API call is out of its documented range.
	ErrInvalidInput = errors.New("gendurable: invalid input")
	// ErrInvalidConfig: a Config field is invalid; the error names the field.
	ErrInvalidConfig = errors.New("gendurable: invalid config")
	// ErrSchemaMismatch: the schema exists but was built from another version of the DDL.
	ErrSchemaMismatch = errors.New("gendurable: schema was built by a different version")
	// ErrNotMigrated: the schema does not exist or has no gendurable tables.
	ErrNotMigrated = errors.New("gendurable: schema is not migrated")
	// ErrClientStopped: the client was stopped, or never started where starting is required.
	ErrClientStopped = errors.New("gendurable: client is not running")
	// ErrLeaseLost: the worker no longer owns the instance it was running (its lease ran out
	// and another worker reclaimed it). A step's context is cancelled with this cause.
	ErrLeaseLost = errors.New("gendurable: lease lost")
	// ErrCancelled: an operator cancelled the instance. A running step's context is cancelled
	// with this cause when the cancel happens on its own client.
	ErrCancelled = errors.New("gendurable: instance cancelled")
	// ErrWrongStatus: the instance's status does not allow the operation (cancelling a
	// finished instance, retrying a live one).
	ErrWrongStatus = errors.New("gendurable: the instance's status does not allow this")
	// ErrTxIdleTimeout: the server ended the session of a step's transaction (Ctx.Tx) because
	// it sat idle longer than idle_in_transaction_session_timeout, and the transaction's writes
	// were rolled back. The step's error handling gets it as the step's error.
	ErrTxIdleTimeout = errors.New("gendurable: the step's transaction sat idle past idle_in_transaction_session_timeout")
)

// ConfigError says which Config field is invalid and why. It matches ErrInvalidConfig and,
// through Err, the more precise sentinel (ErrInvalidIdentifier for a bad Schema).
type ConfigError struct {
	// Field is the path of the offending field, such as "Queues[mail].Concurrency".
	Field string
	// Reason says what is wrong with it.
	Reason string
	// Err is the precise sentinel, if any.
	Err error
}

func (e *ConfigError) Error() string {
	return "gendurable: invalid config: " + e.Field + ": " + e.Reason
}

// Is makes errors.Is(err, ErrInvalidConfig) true.
func (e *ConfigError) Is(target error) bool { return target == ErrInvalidConfig }

// Unwrap returns the precise sentinel, if any.
func (e *ConfigError) Unwrap() error { return e.Err }

// InputError says which argument of a call is invalid and why. Index is the position in a batch
// (InsertMany) or -1. It matches ErrInvalidInput and, through Err, the more precise sentinel
// (ErrPayloadTooLarge, ErrUnknownStep, …).
type InputError struct {
	Index  int
	Field  string
	Reason string
	Err    error
}

func (e *InputError) Error() string {
	s := "gendurable: "
	if e.Index >= 0 {
		s += "row " + strconv.Itoa(e.Index) + ": "
	}
	s += e.Field + ": " + e.Reason
	return s
}

// Is makes errors.Is(err, ErrInvalidInput) true.
func (e *InputError) Is(target error) bool { return target == ErrInvalidInput }

// Unwrap returns the precise sentinel, if any.
func (e *InputError) Unwrap() error { return e.Err }
