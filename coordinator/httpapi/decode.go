package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/sbx-dev/sbx/coordinator"
	"github.com/sbx-dev/sbx/proto"
)

// decodeBody decodes the request's JSON body into v: one object, no unknown fields. readBody has
// already read it, within MaxBodyBytes and the body timeout, and checked it (checkJSON). An empty body is an error unless
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
		return invalid("%s must be %s.", bodyPath(v, typ.Field), kindName(typ))
	default:
		// The remaining decoder errors are unknown fields and the like: their text is the message.
		return invalid("body: %s.", trimJSONPrefix(err.Error()))
	}
}

// bodyPath is field, a decoder error's path in v, as the body has it: encoding/json names a field
// an embedded struct promotes with that struct's type first (StartRequest.limits.pids), a level
// the body does not have.
func bodyPath(v any, field string) string {
	for t := reflect.TypeOf(v); ; {
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		name, rest, ok := strings.Cut(field, ".")
		if !ok || t.Kind() != reflect.Struct {
			return field
		}
		f, found := t.FieldByName(name)
		if !found || !f.Anonymous {
			return field
		}
		field, t = rest, f.Type
	}
}

// checkJSON refuses what encoding/json accepts silently: a field given twice (the last would win,
// so that a proxy or a log that reads the first sees another request than the one run), and a
// string that is not valid UTF-8 or holds a lone UTF-16 surrogate escape (each would become
// U+FFFD: a command would run rewritten). Errors name the field ("env.PATH", "args[2]"). Syntax
// errors are left to the decoder, which says them better.
func checkJSON(body []byte) error {
	type frame struct {
		object  bool
		keys    map[string]bool
		key     string // the current member's name (object)
		index   int    // the current element's index (array)
		wantKey bool
	}
	var stack []*frame
	path := func() string {
		var b strings.Builder
		for i, f := range stack {
			switch {
			case f.object && i == 0:
				b.WriteString(f.key)
			case f.object:
				b.WriteString("." + f.key)
			default:
				fmt.Fprintf(&b, "[%d]", f.index)
			}
		}
		if b.Len() == 0 {
			return "body"
		}
		return b.String()
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	for {
		start := dec.InputOffset()
		tok, err := dec.Token()
		if err != nil {
			return nil // the end, or a syntax error for Decode to report
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if str, ok := tok.(string); ok {
			raw := body[start:dec.InputOffset()]
			raw = raw[bytes.IndexByte(raw, '"'):]
			if top != nil && top.object && top.wantKey {
				top.key, top.wantKey = str, false
				if !validJSONString(raw) {
					return invalid("%s: a field name is not valid UTF-8.", path())
				}
				if top.keys[str] {
					return invalid("%s is given twice: each field must appear once.", path())
				}
				top.keys[str] = true
				continue
			}
			if !validJSONString(raw) {
				return invalid("%s is not valid UTF-8 (or holds a lone \\u surrogate escape).", path())
			}
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, &frame{object: true, keys: map[string]bool{}, wantKey: true})
			continue
		case json.Delim('['):
			stack = append(stack, &frame{})
			continue
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
			if len(stack) > 0 {
				top = stack[len(stack)-1]
			} else {
				top = nil
			}
		}
		// A value ended: the next token of an object is a name, of an array the next element.
		if top != nil {
			if top.object {
				top.wantKey = true
			} else {
				top.index++
			}
		}
	}
}

// validJSONString reports whether raw, a JSON string with its quotes as it was sent, is valid
// UTF-8 and every \u escape of a UTF-16 surrogate is one half of a pair.
func validJSONString(raw []byte) bool {
	if !utf8.Valid(raw) {
		return false
	}
	for i := 0; i < len(raw); i++ {
		if raw[i] != '\\' {
			continue
		}
		i++
		if i >= len(raw) || raw[i] != 'u' {
			continue // a one-letter escape, \\ included
		}
		r, ok := hex4(raw[i+1:])
		if !ok {
			return true // the decoder refuses it
		}
		i += 4
		switch {
		case utf16.IsSurrogate(r) && r < 0xdc00: // a high half: a low half must follow
			lo, ok := hex4(raw[min(i+3, len(raw)):])
			if i+2 >= len(raw) || raw[i+1] != '\\' || raw[i+2] != 'u' || !ok || lo < 0xdc00 || lo > 0xdfff {
				return false
			}
			i += 6
		case utf16.IsSurrogate(r): // a low half alone
			return false
		}
	}
	return true
}

// hex4 parses the four hex digits a \u escape starts with.
func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	n, err := strconv.ParseUint(string(b[:4]), 16, 32)
	return rune(n), err == nil
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
	if what == "session" {
		return id, coordinator.CheckSession("session id", id)
	}
	if !proto.ValidToken(id) {
		return "", invalid("%s id %q must be 1-64 characters of letters, digits, '_' and '-'.", what, id)
	}
	return id, nil
}
