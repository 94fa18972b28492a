package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sbx-dev/sbx/coordinator"
)

// headerLines is the number of lines of a terminal file's header, the two "---" lines included.
// Every value in it is on one line (strings are JSON-quoted), so the body starts after the 9th newline.
const headerLines = 9

// maxPadded is the largest number a padded field shows: 9 digits.
const maxPadded = 999_999_999

// timeLayout is the header's and footer's time format: UTC, milliseconds.
const timeLayout = "2006-01-02T15:04:05.000Z"

// Terminals keeps each job's output in <dir>/<id>.txt: a header, the raw output, a footer (see docs/api.md).
// Files of running jobs stay open.
type Terminals struct {
	dir string

	mu   sync.Mutex
	open map[string]*terminal
}

type terminal struct {
	f      *os.File
	header int64 // header length: the body starts here
}

// OpenTerminals returns the store of terminal files in dir, creating it. Output is private to the
// coordinator's user: the directory is 0700 and each file 0600. A directory an older sbx made more
// open is tightened, and its files with it.
func OpenTerminals(dir string) (*Terminals, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create terminals dir: %w", err)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return nil, fmt.Errorf("terminals dir: %w", err)
	}
	if fi.Mode().Perm() != 0o700 {
		if err := tighten(dir); err != nil {
			return nil, err
		}
	}
	return &Terminals{dir: dir, open: map[string]*terminal{}}, nil
}

// tighten makes dir 0700 and its terminal files 0600. It runs once per install, the first time
// a directory made by an older sbx is opened.
func tighten(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("read terminals dir: %w", err)
	}
	for _, e := range entries {
		if e.Type().IsRegular() && strings.HasSuffix(e.Name(), ".txt") {
			if err := os.Chmod(filepath.Join(dir, e.Name()), 0o600); err != nil {
				return fmt.Errorf("tighten terminal file: %w", err)
			}
		}
	}
	// Last: a failure above leaves the directory as it was, so the next start tries again.
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("tighten terminals dir: %w", err)
	}
	return nil
}

// Close closes every open file.
func (t *Terminals) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	var errs []error
	for id, term := range t.open {
		errs = append(errs, term.f.Close())
		delete(t.open, id)
	}
	return errors.Join(errs...)
}

// Path is the job's terminal file.
func (t *Terminals) Path(id string) string { return filepath.Join(t.dir, id+".txt") }

func pad(s string) string {
	if len(s) >= 9 {
		return s
	}
	return s + strings.Repeat(" ", 9-len(s))
}

func quoted(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// header renders the header of job with running_for_ms = 0 (or the elapsed time once ended).
func header(job *coordinator.Job) []byte {
	started := job.CreatedAt
	if job.StartedAt != nil {
		started = *job.StartedAt
	}
	var b strings.Builder
	b.WriteString("---\n")
	fmt.Fprintf(&b, "pid: %d\n", job.Pid)
	fmt.Fprintf(&b, "cwd: %s\n", quoted(job.Cwd))
	command := job.Command
	if job.Source != nil {
		command = job.Source.WS // what the job runs: its source
	}
	fmt.Fprintf(&b, "command: %s\n", quoted(command))
	fmt.Fprintf(&b, "title: %s\n", quoted(job.Title))
	fmt.Fprintf(&b, "status: %s\n", pad(string(job.Status)))
	fmt.Fprintf(&b, "started_at: %s\n", started.UTC().Format(timeLayout))
	fmt.Fprintf(&b, "running_for_ms: %s\n", pad(strconv.FormatInt(min(job.ElapsedMS(started), maxPadded), 10)))
	b.WriteString("---\n")
	return []byte(b.String())
}

// Offsets of the rewritable fields, counted back from the end of the header.
var (
	runningForFromEnd = int64(len("running_for_ms: ") - len("running_for_ms: 123456789\n---\n"))
	statusFromEnd     = runningForFromEnd - int64(len("status: 123456789\nstarted_at: 2026-11-29T18:00:00.000Z\nrunning_for_ms: ")) + int64(len("status: "))
)

// Begin writes the header of a started job, truncating whatever body the file had only when the
// header changes size (a rewrite of the same job keeps its output).
func (t *Terminals) Begin(job *coordinator.Job) error {
	h := header(job)
	t.mu.Lock()
	defer t.mu.Unlock()
	term, err := t.get(job.ID, true)
	if err != nil {
		return err
	}
	if term.header != 0 && term.header != int64(len(h)) {
		if err := term.f.Truncate(0); err != nil {
			return fmt.Errorf("truncate terminal %s: %w", job.ID, err)
		}
	}
	if _, err := term.f.WriteAt(h, 0); err != nil {
		return fmt.Errorf("write header %s: %w", job.ID, err)
	}
	term.header = int64(len(h))
	return nil
}

// get returns the open terminal of a job, opening the file (and reading its header length) when
// needed. t.mu is held.
func (t *Terminals) get(id string, create bool) (*terminal, error) {
	if term, ok := t.open[id]; ok {
		return term, nil
	}
	flags := os.O_RDWR
	if create {
		flags |= os.O_CREATE
	}
	f, err := os.OpenFile(t.Path(id), flags, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open terminal %s: %w", id, err)
	}
	n, err := headerLen(f)
	if err != nil {
		f.Close()
		return nil, err
	}
	term := &terminal{f: f, header: n}
	t.open[id] = term
	return term, nil
}

// headerLen reads the length of a file's header; 0 when the file is empty.
func headerLen(r io.ReaderAt) (int64, error) {
	buf := make([]byte, 4096)
	var off int64
	lines := 0
	for {
		n, err := r.ReadAt(buf, off)
		for i := 0; i < n; i++ {
			if buf[i] == '\n' {
				lines++
				if lines == headerLines {
					return off + int64(i) + 1, nil
				}
			}
		}
		off += int64(n)
		if err == io.EOF {
			if off == 0 {
				return 0, nil
			}
			return 0, fmt.Errorf("terminal file has a truncated header")
		}
		if err != nil {
			return 0, err
		}
	}
}

// Write puts output bytes at their offset in the body.
func (t *Terminals) Write(id string, offset int64, p []byte) error {
	t.mu.Lock()
	term, err := t.get(id, false)
	t.mu.Unlock()
	if err != nil {
		return err
	}
	if term.header == 0 {
		return fmt.Errorf("write output %s: no header yet", id)
	}
	if _, err := term.f.WriteAt(p, term.header+offset); err != nil {
		return fmt.Errorf("write output %s: %w", id, err)
	}
	return nil
}

// Touch rewrites running_for_ms in place.
func (t *Terminals) Touch(job *coordinator.Job, runningFor time.Duration) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	term, err := t.get(job.ID, false)
	if err != nil {
		return err
	}
	v := pad(strconv.FormatInt(min(runningFor.Milliseconds(), maxPadded), 10))
	if _, err := term.f.WriteAt([]byte(v), term.header+runningForFromEnd); err != nil {
		return fmt.Errorf("rewrite header %s: %w", job.ID, err)
	}
	return nil
}

// End rewrites the header's status and running time, writes the footer after job.OutputBytes of body
// and closes the file.
func (t *Terminals) End(job *coordinator.Job) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	term, err := t.get(job.ID, false)
	if err != nil {
		return err
	}
	f, h := term.f, term.header
	elapsed := pad(strconv.FormatInt(min(job.ElapsedMS(*job.EndedAt), maxPadded), 10))
	if _, err := f.WriteAt([]byte(pad(string(job.Status))), h+statusFromEnd); err != nil {
		return fmt.Errorf("rewrite status %s: %w", job.ID, err)
	}
	if _, err := f.WriteAt([]byte(elapsed), h+runningForFromEnd); err != nil {
		return fmt.Errorf("rewrite header %s: %w", job.ID, err)
	}
	var foot strings.Builder
	if job.OutputBytes > 0 {
		last := make([]byte, 1)
		if _, err := f.ReadAt(last, h+job.OutputBytes-1); err != nil || last[0] != '\n' {
			foot.WriteString("\n")
		}
	}
	exit := "null"
	if job.ExitCode != nil {
		exit = strconv.Itoa(*job.ExitCode)
	}
	fmt.Fprintf(&foot, "---\nexit_code: %s\nelapsed_ms: %d\nended_at: %s\n---\n",
		exit, job.ElapsedMS(*job.EndedAt), job.EndedAt.UTC().Format(timeLayout))
	end := h + job.OutputBytes
	if _, err := f.WriteAt([]byte(foot.String()), end); err != nil {
		return fmt.Errorf("write footer %s: %w", job.ID, err)
	}
	if err := f.Truncate(end + int64(foot.Len())); err != nil {
		return fmt.Errorf("truncate terminal %s: %w", job.ID, err)
	}
	delete(t.open, job.ID)
	return f.Close()
}

// Remove deletes an ended job's terminal file; one that does not exist is not an error.
func (t *Terminals) Remove(id string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if term, ok := t.open[id]; ok {
		term.f.Close()
		delete(t.open, id)
	}
	if err := os.Remove(t.Path(id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove terminal %s: %w", id, err)
	}
	return nil
}

// Size is the number of body bytes on disk of a job that has not ended; 0 when there is no file.
func (t *Terminals) Size(id string) (int64, error) {
	f, err := os.Open(t.Path(id))
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	defer f.Close()
	h, err := headerLen(f)
	if err != nil {
		return 0, err
	}
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	return max(0, fi.Size()-h), nil
}

// Open returns a reader of limit body bytes from offset (limit < 0: to the end of the file, footer
// excluded only for ended jobs when the caller bounds limit by the output size). A job without a file
// reads as empty.
func (t *Terminals) Open(id string, offset, limit int64) (io.ReadCloser, error) {
	f, err := os.Open(t.Path(id))
	if errors.Is(err, os.ErrNotExist) {
		return io.NopCloser(strings.NewReader("")), nil
	}
	if err != nil {
		return nil, fmt.Errorf("open terminal %s: %w", id, err)
	}
	h, err := headerLen(f)
	if err != nil {
		f.Close()
		return nil, err
	}
	if limit < 0 {
		limit = 1<<63 - 1 - h - offset
	}
	return readCloser{io.NewSectionReader(f, h+offset, limit), f}, nil
}

type readCloser struct {
	io.Reader
	io.Closer
}

// FreeBytes is the space left on the file system of the terminal files, as an unprivileged
// process sees it (root's reserve not counted): what the coordinator's output can still use.
func (t *Terminals) FreeBytes() (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(t.dir, &st); err != nil {
		return 0, fmt.Errorf("statfs %s: %w", t.dir, err)
	}
	return int64(st.Bavail) * int64(st.Bsize), nil
}
