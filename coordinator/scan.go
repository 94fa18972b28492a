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
}

// advance scans output up to size and reports whether the pattern matched.
func (sc *scanner) advance(out OutputStore, id string, size int64) (bool, error) {
	if size <= sc.scanned && sc.scanned > 0 {
		return false, nil
	}
	from := max(0, sc.scanned-scanOverlap)
	rc, err := out.Open(id, from, size-from)
	if err != nil {
		return false, err
	}
	defer rc.Close()
	buf, err := io.ReadAll(rc)
	if err != nil {
		return false, err
	}
	if from > 0 {
		// Start at a line boundary so that ^ anchors mean what they say.
		if i := bytes.IndexByte(buf, '\n'); i >= 0 && int64(i) < sc.scanned-from {
			buf = buf[i+1:]
		}
	}
	sc.scanned = size
	return sc.re.Match(buf), nil
}
