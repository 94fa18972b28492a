package natsbus

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/sbx-dev/sbx/coordinator"
	"github.com/sbx-dev/sbx/proto"
)

// TestTranslate: every field of a message crosses between the domain's type and the wire's, each to
// the field of the same name, and neither side has a field the other does not carry except the
// ones listed as the wire's own. Every field of the source is filled by reflection with a value of
// its own, so that a field added to one side only, or forgotten by the translation, fails here.
func TestTranslate(t *testing.T) {
	// The wire's own fields: its version, Work's NotAfter (stamped by Dispatch) and a heartbeat's
	// time by the runner's clock, which the domain does not use.
	wireOnly := map[string]bool{
		"Work.V": true, "Work.NotAfter": true, "Control.V": true, "ControlReply.V": true,
		"Event.V": true, "Heartbeat.V": true, "Heartbeat.Time": true,
	}
	t.Run("Work", func(t *testing.T) {
		var w coordinator.Work
		fill(reflect.ValueOf(&w).Elem(), new(int))
		wire := wireWork(&w)
		same(t, "Work", reflect.ValueOf(w), reflect.ValueOf(*wire), wireOnly)
		if wire.V != proto.Version || wire.NotAfter != 0 {
			t.Errorf("wire work: v %d, not_after %d", wire.V, wire.NotAfter)
		}
	})
	t.Run("Control", func(t *testing.T) {
		var c coordinator.Control
		fill(reflect.ValueOf(&c).Elem(), new(int))
		wire := wireControl(&c)
		same(t, "Control", reflect.ValueOf(c), reflect.ValueOf(*wire), wireOnly)
		if wire.V != proto.Version {
			t.Errorf("wire control: v %d", wire.V)
		}
	})
	t.Run("ControlReply", func(t *testing.T) {
		var r proto.ControlReply
		fill(reflect.ValueOf(&r).Elem(), new(int))
		same(t, "ControlReply", reflect.ValueOf(r), reflect.ValueOf(*domainControlReply(&r)), wireOnly)
	})
	t.Run("Event", func(t *testing.T) {
		var e proto.Event
		fill(reflect.ValueOf(&e).Elem(), new(int))
		same(t, "Event", reflect.ValueOf(e), reflect.ValueOf(*domainEvent(&e)), wireOnly)
	})
	t.Run("Chunk", func(t *testing.T) {
		var c proto.Chunk
		fill(reflect.ValueOf(&c).Elem(), new(int))
		same(t, "Chunk", reflect.ValueOf(c), reflect.ValueOf(*domainChunk(&c)), wireOnly)
	})
	t.Run("Heartbeat", func(t *testing.T) {
		var h proto.Heartbeat
		fill(reflect.ValueOf(&h).Elem(), new(int))
		same(t, "Heartbeat", reflect.ValueOf(h), reflect.ValueOf(*domainHeartbeat(&h)), wireOnly)
	})
	// Nil stays nil: an absent usage, source or size is not made an empty one.
	if e := domainEvent(&proto.Event{}); e.Usage != nil || e.Ports != nil || e.Stages != nil {
		t.Errorf("empty event translates to %+v", e)
	}
	if w := wireWork(&coordinator.Work{}); w.Source != nil || w.TTYSize != nil {
		t.Errorf("empty work translates to %+v", w)
	}
}

// fill sets every exported field under v to a value that is not zero and, but for booleans, not
// any other field's: n counts the values given.
func fill(v reflect.Value, n *int) {
	*n++
	switch v.Kind() {
	case reflect.Struct:
		if v.Type() == reflect.TypeFor[time.Time]() {
			v.Set(reflect.ValueOf(time.Unix(int64(*n), 0).UTC()))
			return
		}
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fill(v.Field(i), n)
			}
		}
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(v.Elem(), n)
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 1, 1))
		fill(v.Index(0), n)
	case reflect.Map:
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fill(k, n)
		fill(e, n)
		v.Set(reflect.MakeMap(v.Type()))
		v.SetMapIndex(k, e)
	case reflect.String:
		v.SetString(fmt.Sprint("s", *n))
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int64:
		v.SetInt(int64(*n))
	case reflect.Uint8, reflect.Uint64:
		v.SetUint(uint64(*n))
	default:
		panic(fmt.Sprintf("fill: a field of kind %s: teach fill its values", v.Kind()))
	}
}

// same reports, under path, every field of a with no field of the same name in b or a different
// value there, and every field of b that a does not have; wireOnly names (Type.Field) the fields
// either may have alone.
func same(t *testing.T, path string, a, b reflect.Value, wireOnly map[string]bool) {
	t.Helper()
	if a.Kind() != b.Kind() {
		t.Errorf("%s: %s here, %s there", path, a.Type(), b.Type())
		return
	}
	switch a.Kind() {
	case reflect.Struct:
		if a.Type() == reflect.TypeFor[time.Time]() {
			if !a.Interface().(time.Time).Equal(b.Interface().(time.Time)) {
				t.Errorf("%s: %v became %v", path, a, b)
			}
			return
		}
		for _, pair := range [][2]reflect.Value{{a, b}, {b, a}} {
			for i := range pair[0].NumField() {
				f := pair[0].Type().Field(i)
				if !f.IsExported() || wireOnly[pair[0].Type().Name()+"."+f.Name] {
					continue
				}
				if _, ok := pair[1].Type().FieldByName(f.Name); !ok {
					t.Errorf("%s.%s: %s has it, %s does not", path, f.Name, pair[0].Type(), pair[1].Type())
				}
			}
		}
		for i := range a.NumField() {
			f := a.Type().Field(i)
			if _, ok := b.Type().FieldByName(f.Name); ok && f.IsExported() {
				same(t, path+"."+f.Name, a.Field(i), b.FieldByName(f.Name), wireOnly)
			}
		}
	case reflect.Pointer:
		if a.IsNil() != b.IsNil() {
			t.Errorf("%s: nil %v became nil %v", path, a.IsNil(), b.IsNil())
			return
		}
		if !a.IsNil() {
			same(t, path, a.Elem(), b.Elem(), wireOnly)
		}
	case reflect.Slice:
		if a.Len() != b.Len() {
			t.Errorf("%s: %d elements became %d", path, a.Len(), b.Len())
			return
		}
		for i := range a.Len() {
			same(t, fmt.Sprintf("%s[%d]", path, i), a.Index(i), b.Index(i), wireOnly)
		}
	default:
		if !reflect.DeepEqual(a.Interface(), b.Interface()) {
			t.Errorf("%s: %v became %v", path, a, b)
		}
	}
}
