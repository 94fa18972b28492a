package coordinator

import (
	"bytes"
	"io"
	"regexp"
)

// scanOverlap is how much already-scanned output a scan looks at again, so that a match that began
// before the new bytes is still found. A match longer than this that began earlier can be missed.
const scanOverlap = 64 << 10

// scanner matches a pattern against a job's growing output without rescanning all of it: each step
// reads the new bytes plus an overlap that starts at a line boundary, so the work stays linear in
// the output's size.
type scanner struct {
	re      *regexp.Regexp
	scanned int64
	// tty: the output is a terminal's, matched without its escape sequences (the offset is still
	// the raw output's).
	tty bool
}

// match is where a pattern matched a job's output: the matched bytes (cut to MaxMatchBytes) and the
// offset of their first byte in the output.
type match struct {
	text   []byte
	offset int64
}

// MaxMatchBytes bounds the matched text a wait returns; the offset locates the rest.
const MaxMatchBytes = 4096

// advance scans output up to size and returns the first match in what it had not scanned, or nil.
func (sc *scanner) advance(out OutputStore, id string, size int64) (*match, error) {
	if size <= sc.scanned && sc.scanned > 0 {
		return nil, nil
	}
	from := max(0, sc.scanned-scanOverlap)
	rc, err := out.Open(id, from, size-from)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	buf, err := io.ReadAll(rc)
	if err != nil {
		return nil, err
	}
	if from > 0 {
		// Start at a line boundary so that ^ anchors mean what they say.
		if i := bytes.IndexByte(buf, '\n'); i >= 0 && int64(i) < sc.scanned-from {
			buf = buf[i+1:]
			from += int64(i + 1)
		}
	}
	sc.scanned = size
	var pos []int
	rawLen := len(buf)
	if sc.tty {
		buf, pos = screenLines(buf)
	}
	loc := sc.re.FindIndex(buf)
	if loc == nil {
		return nil, nil
	}
	text := buf[loc[0]:loc[1]]
	if pos != nil {
		if loc[0] < len(pos) {
			loc[0] = pos[loc[0]]
		} else {
			loc[0] = rawLen // an empty match at the end
		}
	}
	if len(text) > MaxMatchBytes {
		text = text[:MaxMatchBytes]
	}
	return &match{text: bytes.Clone(text), offset: from + int64(loc[0])}, nil
}

// screenLines is a terminal's output as text to match: without escape sequences (stripANSI), and
// with its line ends "\r\n" made "\n" so that $ matches at them. pos maps each byte back to b.
func screenLines(b []byte) ([]byte, []int) {
	out, pos := stripANSI(b, true)
	n := 0
	for k := range out {
		if out[k] == '\r' && k+1 < len(out) && out[k+1] == '\n' {
			continue
		}
		out[n], pos[n] = out[k], pos[k]
		n++
	}
	return out[:n], pos[:n]
}
