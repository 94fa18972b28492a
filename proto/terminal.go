package proto

import (
	"net/netip"
	"time"
)

// Bounds of a terminal's size, in character cells.
const (
	MaxTTYRows = 1000
	MaxTTYCols = 1000
	// DefaultTTYRows and DefaultTTYCols are a terminal's size when the request gives none.
	DefaultTTYRows = 24
	DefaultTTYCols = 80
)

// TTYSize is the size of a job's pseudo-terminal.
type TTYSize struct {
	Rows int `json:"rows"`
	Cols int `json:"cols"`
}

// Validate reports a size out of range, naming the field (within name, e.g. "tty_size").
func (s TTYSize) Validate(name string) error {
	if s.Rows < 1 || s.Rows > MaxTTYRows {
		return invalid("%s.rows %d out of range [1, %d]", name, s.Rows, MaxTTYRows)
	}
	if s.Cols < 1 || s.Cols > MaxTTYCols {
		return invalid("%s.cols %d out of range [1, %d]", name, s.Cols, MaxTTYCols)
	}
	return nil
}

// OpResize sets the size of a job's terminal (Control.Size); the job gets SIGWINCH.
const OpResize = "resize"

// EventActivity reports what the runner sees of a running job's processes in /proc: whether they
// wait for input, and the TCP ports they listen on. It is sent when that changes; each one says
// the whole state (the latest, by Seq, is what holds).
const EventActivity = "activity"

// MaxPorts bounds the listening ports one activity event lists.
const MaxPorts = 64

// Port is a TCP address a job's process listens on.
type Port struct {
	Address string `json:"address"`
	Port    int    `json:"port"`
}

// validateActivity checks the fields of an activity event.
func (e *Event) validateActivity() error {
	if e.Seq < 1 {
		return invalid("activity event has seq %d", e.Seq)
	}
	if e.InputSince != nil && e.InputSince.IsZero() {
		return invalid("input_since is the zero time")
	}
	if len(e.Ports) > MaxPorts {
		return invalid("ports lists %d, at most %d", len(e.Ports), MaxPorts)
	}
	for _, p := range e.Ports {
		if p.Port < 1 || p.Port > 65535 {
			return invalid("port %d out of range", p.Port)
		}
		if _, err := netip.ParseAddr(p.Address); err != nil {
			return invalid("port address %q is not an IP address", p.Address)
		}
	}
	return nil
}

// InputFor reports how long the job has been waiting for input by the event's own clock (0 when
// it is not): the runner's and the coordinator's clocks need not agree.
func (e *Event) InputFor() time.Duration {
	if e.InputSince == nil {
		return 0
	}
	return max(0, e.Time.Sub(*e.InputSince))
}
