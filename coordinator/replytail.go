package coordinator

import (
	"bytes"
	"context"
	"io"
	"unicode/utf8"
)

// replyTail is the output a start's reply carries: the last MaxReplyOutput bytes at most, from the
// first line that starts inside them, as the MCP tools show it, and the counts of the note a text
// rendering writes above a cut ("[showing the last N of M lines; the full output is in P]", the
// background shell tool's).
type replyTail struct {
	data []byte
	// size is the whole output's size; truncated says data is only its end.
	size      int64
	truncated bool
	// lines counts data's lines, total the whole output's; a last line without a newline counts.
	lines, total int
}

// tail returns the end of a job's output for a start's reply.
func (s *Service) tail(id string) (*replyTail, error) {
	_, size, _, err := s.current(context.Background(), id)
	if err != nil {
		return nil, err
	}
	t := &replyTail{size: size}
	// One byte before the window tells whether the window starts a line.
	off := max(0, size-MaxReplyOutput-1)
	rc, err := s.out.Open(id, off, size-off)
	if err != nil {
		return nil, err
	}
	data, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		return nil, err
	}
	if off == 0 && size <= MaxReplyOutput {
		t.data = data
		t.lines = countLines(data)
		t.total = t.lines
		return t, nil
	}
	t.truncated = true
	if i := bytes.IndexByte(data[:len(data)-1], '\n'); i >= 0 {
		data = data[i+1:]
	} else {
		// One line longer than the window: cut at a character's first byte.
		data = data[1:]
		for skip := 0; skip < utf8.UTFMax && len(data) > 0 && !utf8.RuneStart(data[0]); skip++ {
			data = data[1:]
		}
	}
	t.data, t.lines = data, countLines(data)
	// The lines before the window are counted from the file: a start's reply is once per job.
	rc, err = s.out.Open(id, 0, size-int64(len(data)))
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	before, err := countNewlines(rc)
	if err != nil {
		return nil, err
	}
	t.total = before + t.lines
	return t, nil
}

// countLines counts the lines of p: its newlines, and a last line without one.
func countLines(p []byte) int {
	n := bytes.Count(p, []byte{'\n'})
	if len(p) > 0 && p[len(p)-1] != '\n' {
		n++
	}
	return n
}

func countNewlines(r io.Reader) (int, error) {
	buf := make([]byte, 64<<10)
	n := 0
	for {
		k, err := r.Read(buf)
		n += bytes.Count(buf[:k], []byte{'\n'})
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}
