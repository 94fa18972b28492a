package httpapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strconv"
	"strings"

	"github.com/sbx-dev/sbx/coordinator"
	"github.com/sbx-dev/sbx/proto"
)

// decodeBody decodes the request's JSON body into v: one object, no unknown fields. readBody has
// already read it, within MaxBodyBytes and the body timeout. An empty body is an error unless
// optional. Errors name the problem the way a client can fix it: "body: unknown field "foo"",
// "limits.pids must be a number".
func decodeBody(r *http.Request, v any, optional bool) error {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		if _, err := dec.Token(); !errors.Is(err, io.EOF) {
			return invalid("body: trailing data after the JSON object.")
		}
		return nil
	}
	var (
		syntax *json.SyntaxError
		typ    *json.UnmarshalTypeError
	)
	switch {
	case errors.Is(err, io.EOF):
		if optional {
			return nil
		}
		return invalid("body is empty: send a JSON object.")
	case errors.As(err, &syntax):
		return invalid("body: invalid JSON at byte %d: %s.", syntax.Offset, syntax.Error())
	case errors.Is(err, io.ErrUnexpectedEOF):
		return invalid("body: the JSON object is truncated.")
	case errors.As(err, &typ):
		if typ.Field == "" {
			return invalid("body must be a JSON object.")
		}
		return invalid("%s must be %s.", typ.Field, kindName(typ))
	default:
		// The remaining decoder errors are unknown fields and the like: their text is the message.
		return invalid("body: %s.", trimJSONPrefix(err.Error()))
	}
}

func tooLarge(err error) bool {
	var mbe *http.MaxBytesError
	return errors.As(err, &mbe)
}

func bodyTooLarge() error {
	return coordinator.Errorf(coordinator.ETOOLARGE, "body is larger than %d bytes.", MaxBodyBytes)
}

func trimJSONPrefix(s string) string { return strings.TrimPrefix(s, "json: ") }

// kindName says what JSON a Go type expects, for messages.
func kindName(e *json.UnmarshalTypeError) string {
	switch e.Type.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		if v, ok := strings.CutPrefix(e.Value, "number "); ok {
			return fmt.Sprintf("an integer in range, not %s", v)
		}
		return "a number"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Map, reflect.Struct:
		return "an object"
	case reflect.Slice, reflect.Array:
		return "an array"
	}
	return "of type " + e.Type.String()
}

// queryInt parses an optional integer query parameter within [lo, hi]; def when absent.
func queryInt(r *http.Request, name string, def, lo, hi int64) (int64, error) {
	s := r.URL.Query().Get(name)
	if s == "" {
		return def, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, invalid("%s %q is not an integer.", name, s)
	}
	if n < lo || n > hi {
		return 0, invalid("%s must be between %d and %d.", name, lo, hi)
	}
	return n, nil
}

// queryBool parses an optional boolean query parameter.
func queryBool(r *http.Request, name string) (bool, error) {
	s := r.URL.Query().Get(name)
	if s == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(s)
	if err != nil {
		return false, invalid("%s %q must be true or false.", name, s)
	}
	return b, nil
}

// pathID returns the request's {id}, a job's or a session's (what says which). Ids are tokens
// (proto.ValidToken); anything else names nothing, and is refused before it reaches a lookup or a
// file name.
func pathID(r *http.Request, what string) (string, error) {
	id := r.PathValue("id")
	if !proto.ValidToken(id) {
		return "", invalid("%s id %q must be 1-64 characters of letters, digits, '_' and '-'.", what, id)
	}
	return id, nil
}
