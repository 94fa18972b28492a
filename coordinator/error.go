// Package coordinator is sbx's domain: jobs and their state machine, runners, the ports to storage and
// to the runners, and the operations the API offers. Adapters live in its sub-packages.
package coordinator

import (
	"errors"
	"fmt"
)

// Error codes. The HTTP adapter is the one place that maps them to statuses.
const (
	ECONFLICT = "conflict"
	// EIDEMPOTENCY: an Idempotency-Key already used for another request, or for one still starting.
	EIDEMPOTENCY         = "idempotency_conflict"
	EINTERNAL            = "internal"
	EINVALID             = "invalid"
	ENOTFOUND            = "not_found"
	EUNAUTHORIZED        = "unauthorized"
	EUNAVAILABLE         = "unavailable"
	EREADONLYUNAVAILABLE = "readonly_unavailable"
	ETOOLARGE            = "too_large"
	// EOUTPUTBUDGET: the output stored for all jobs reached Config.OutputBudget; EDISKLOW: the
	// data disk has less free space than Config.MinFreeBytes. Both refuse new jobs.
	EOUTPUTBUDGET = "output_budget_exhausted"
	EDISKLOW      = "disk_low"
)

// Error is a domain error meant for the caller: a code and one clear sentence.
type Error struct {
	Code    string
	Message string
}

func (e *Error) Error() string { return fmt.Sprintf("coordinator: %s: %s", e.Code, e.Message) }

// Errorf returns an *Error with the code and a formatted message.
func Errorf(code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// ErrorCode returns the code of the first *Error in err's chain, EINTERNAL for any other error, "" for nil.
func ErrorCode(err error) string {
	var e *Error
	switch {
	case err == nil:
		return ""
	case errors.As(err, &e):
		return e.Code
	default:
		return EINTERNAL
	}
}

// ErrorMessage returns the message of the first *Error in err's chain, or a generic sentence that hides
// internal details.
func ErrorMessage(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Message
	}
	return "Internal error."
}
