package coordinator

import (
	"bytes"
	"io"
	"regexp"
	"sync"
)

// Bounds of output matching for waits.
const (
	// scanOverlap is the carry-over: how much already-scanned output a scan looks at again, so that a
	// match that began before the new bytes (a multiline pattern, a line split over two chunks) is
	// still found. A match that began more than this before the new bytes can be missed.
	scanOverlap = 64 << 10
	// scanWindow is the most output one step reads into memory; a longer stretch is scanned window
	// by window, each ending at a line boundary when it can and overlapping the previous one by
	// scanOverlap.
	scanWindow = 1 << 20
	// maxScans is the most scan states kept (one per job and pattern, see scans); past it an
	// arbitrary one is forgotten, and a later wait for it scans again from the start.
	maxScans = 1024
)

// scanner matches a pattern against a job's growing output without rescanning it: each step reads
// the new bytes plus the carry-over (scanOverlap, from a line boundary), so that the work stays
// linear in the output's size. A scanner is shared by every wait for the same job and pattern,
// one after another (mu): a wait carries on where the previous one stopped, and once the pattern
// matched, the match is kept.
type scanner struct {
	re *regexp.Regexp
	// tty: the output is a terminal's, matched without its escape sequences (the offset is still
	// the raw output's).
	tty bool

	mu      sync.Mutex
	scanned int64  // the output up to here was scanned
	found   *match // the first match, once there is one
}

// match is where a pattern matched a job's output: the matched bytes (cut to MaxMatchBytes) and the
// offset of their first byte in the output.
type match struct {
	text   []byte
	offset int64
}

// MaxMatchBytes bounds the matched text a wait returns; the offset locates the rest.
const MaxMatchBytes = 4096

// scanKey names a scanner: the job and the pattern's source.
type scanKey struct{ job, pattern string }

// scanner returns the scanner of a job and pattern, made when there is none; tty says whether the
// job's output is a terminal's.
func (s *Service) scanner(job string, re *regexp.Regexp, tty bool) *scanner {
	key := scanKey{job, re.String()}
	s.scanMu.Lock()
	defer s.scanMu.Unlock()
	if sc, ok := s.scans[key]; ok {
		return sc
	}
	if len(s.scans) >= maxScans {
		for k := range s.scans {
			delete(s.scans, k) // a wait that holds it goes on with it; it is no longer shared
			break
		}
	}
	sc := &scanner{re: re, tty: tty}
	s.scans[key] = sc
	return sc
}

// advance scans output up to size and returns the first match, or nil. scanned counts the bytes it
// read.
func (sc *scanner) advance(out OutputStore, id string, size int64, scanned func(int64)) (*match, error) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	for sc.found == nil && (size > sc.scanned || size == 0 && sc.scanned == 0) {
		if err := sc.step(out, id, size, scanned); err != nil {
			return nil, err
		}
		if size == 0 {
			break
		}
	}
	return sc.found, nil
}

// step scans one window from the carry-over before sc.scanned towards size. sc.mu is held.
func (sc *scanner) step(out OutputStore, id string, size int64, scanned func(int64)) error {
	from := max(0, sc.scanned-scanOverlap)
	end := min(size, from+scanWindow)
	rc, err := out.Open(id, from, end-from)
	if err != nil {
		return err
	}
	buf, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		return err
	}
	scanned(int64(len(buf)))
	if from > 0 {
		// Start at a line boundary so that ^ anchors mean what they say.
		if i := bytes.IndexByte(buf, '\n'); i >= 0 && int64(i) < sc.scanned-from {
			buf = buf[i+1:]
			from += int64(i + 1)
		}
	}
	if end < size {
		// End at a line boundary past the carry-over, so that $ does not match where the window
		// cuts a line; the rest of the line is in the next window.
		if i := bytes.LastIndexByte(buf, '\n'); i >= 0 && from+int64(i+1) > sc.scanned {
			buf = buf[:i+1]
			end = from + int64(i+1)
		}
	}
	sc.scanned = end
	var pos []int
	rawLen := len(buf)
	if sc.tty {
		buf, pos = screenLines(buf)
	}
	loc := sc.re.FindIndex(buf)
	if loc == nil {
		return nil
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
	sc.found = &match{text: bytes.Clone(text), offset: from + int64(loc[0])}
	return nil
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
