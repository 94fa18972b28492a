package httpapi

import (
	"bytes"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"sync"

	"github.com/sbx-dev/sbx/coordinator"
)

// codeCounter counts the API's replies by status code.
type codeCounter struct {
	mu    sync.Mutex
	codes map[int]int64
}

func (c *codeCounter) add(code int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.codes == nil {
		c.codes = map[int]int64{}
	}
	c.codes[code]++
}

func (c *codeCounter) snapshot() map[int]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[int]int64, len(c.codes))
	for k, v := range c.codes {
		out[k] = v
	}
	return out
}

// statusWriter remembers the status a handler sent. Unwrap lets http.ResponseController reach the
// connection's Flush and deadlines.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(p)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// countCodes counts every reply for sbx_http_requests_total.
func (s *Server) countCodes(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := &statusWriter{ResponseWriter: w}
		defer func() {
			if sw.code == 0 {
				sw.code = http.StatusOK
			}
			s.codes.add(sw.code)
		}()
		next.ServeHTTP(sw, r)
	})
}

// endedStatuses are listed even at zero so that rates work from the first scrape.
var endedStatuses = []coordinator.Status{coordinator.StatusSucceeded, coordinator.StatusFailed, coordinator.StatusAborted}

// handleMetrics writes the counters in the Prometheus text format 0.0.4.
func (s *Server) handleMetrics(w http.ResponseWriter, r *http.Request) {
	st := s.svc.Stats()
	var b bytes.Buffer
	metric := func(name, typ, help string) {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
	}
	metric("sbx_jobs_started_total", "counter", "Jobs started since the coordinator started.")
	fmt.Fprintf(&b, "sbx_jobs_started_total %d\n", st.JobsStarted)
	metric("sbx_jobs_ended_total", "counter", "Jobs ended since the coordinator started, by final status.")
	for _, status := range endedStatuses {
		fmt.Fprintf(&b, "sbx_jobs_ended_total{status=%q} %d\n", status, st.JobsEnded[status])
	}
	metric("sbx_jobs_live", "gauge", "Jobs queued or running.")
	fmt.Fprintf(&b, "sbx_jobs_live %d\n", st.JobsLive)
	metric("sbx_runners", "gauge", "Runners sending heartbeats.")
	fmt.Fprintf(&b, "sbx_runners %d\n", st.Runners)
	metric("sbx_events_total", "counter", "Runner events applied.")
	fmt.Fprintf(&b, "sbx_events_total %d\n", st.Events)
	metric("sbx_forged_events_total", "counter", "Runner messages dropped as forged (wrong runner or claim), by kind.")
	for _, kind := range coordinator.ForgedKinds {
		fmt.Fprintf(&b, "sbx_forged_events_total{kind=%q} %d\n", kind, st.Forged[kind])
	}
	metric("sbx_jobs_removed_total", "counter", "Ended jobs removed by retention since the coordinator started.")
	fmt.Fprintf(&b, "sbx_jobs_removed_total %d\n", st.JobsRemoved)
	metric("sbx_notifications_removed_total", "counter", "Notifications removed by retention since the coordinator started.")
	fmt.Fprintf(&b, "sbx_notifications_removed_total %d\n", st.NotificationsRemoved)
	metric("sbx_output_stored_bytes", "gauge", "Output of the ended jobs kept (bounded by --retain-bytes).")
	fmt.Fprintf(&b, "sbx_output_stored_bytes %d\n", st.OutputStored)
	metric("sbx_output_bytes_total", "counter", "Output bytes written to terminal files.")
	fmt.Fprintf(&b, "sbx_output_bytes_total %d\n", st.OutputBytes)
	metric("sbx_output_live_bytes", "gauge", "Output of the jobs not ended; with sbx_output_stored_bytes, held to --output-budget.")
	fmt.Fprintf(&b, "sbx_output_live_bytes %d\n", st.OutputLive)
	metric("sbx_wait_scanned_bytes_total", "counter", "Output bytes read to match waits' patterns.")
	fmt.Fprintf(&b, "sbx_wait_scanned_bytes_total %d\n", st.ScannedBytes)

	metric("sbx_coordinator_leader", "gauge", "1 while this coordinator leads: it runs the duties that must happen once (lost runners, timeouts, retention).")
	leader := 0
	if leading, _ := s.role(); leading {
		leader = 1
	}
	fmt.Fprintf(&b, "sbx_coordinator_leader %d\n", leader)

	codes := s.codes.snapshot()
	keys := make([]int, 0, len(codes))
	for k := range codes {
		keys = append(keys, k)
	}
	sort.Ints(keys)
	metric("sbx_http_requests_total", "counter", "HTTP requests answered, by status code.")
	for _, k := range keys {
		fmt.Fprintf(&b, "sbx_http_requests_total{code=\"%s\"} %d\n", strconv.Itoa(k), codes[k])
	}

	s.mu.Lock()
	conns := s.conns
	s.mu.Unlock()
	if conns != nil {
		open, refused := conns.counts()
		metric("sbx_http_connections", "gauge", "HTTP connections open.")
		fmt.Fprintf(&b, "sbx_http_connections %d\n", open)
		metric("sbx_http_connections_refused_total", "counter", "HTTP connections closed on accept: past --max-conns or --max-conns-per-client.")
		fmt.Fprintf(&b, "sbx_http_connections_refused_total %d\n", refused)
	}

	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	_, _ = w.Write(b.Bytes())
}
