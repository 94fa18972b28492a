package coordinator

import (
	"bytes"
	"testing"
)

func TestStripANSI(t *testing.T) {
	tests := []struct{ name, in, want string }{
		{"plain", "hello, wörld\n", "hello, wörld\n"},
		{"colour", "\x1b[1;32mPASS\x1b[0m src/a.test.ts\r\n", "PASS src/a.test.ts\r\n"},
		{"cursor and erase", "\x1b[2K\x1b[1G50%\x1b[?25l", "50%"},
		{"private mode", "\x1b[?2004hname? \x1b[?2004l", "name? "},
		{"OSC title by BEL", "\x1b]0;vim README\x07text", "text"},
		{"OSC hyperlink by ST", "\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\!", "link!"},
		{"DCS", "a\x1bPq#0;2;0;0;0\x1b\\b", "ab"},
		{"charset", "\x1b(Bdone\x1b)0", "done"},
		{"keypad and save", "\x1b=\x1b7x\x1b8", "x"},
		{"C0 controls", "a\x07b\x00c\x0ed\te\r\n", "abcd\te\r\n"},
		{"cut off CSI", "ok\x1b[1;3", "ok"},
		{"cut off OSC", "ok\x1b]0;tit", "ok"},
		{"lone ESC", "ok\x1b", "ok"},
		{"ESC inside OSC starts the next", "\x1b]0;t\x1b[31mred", "red"},
		{"C1 bytes of UTF-8 stay", "\xe2\x9b\x94 ok", "\xe2\x9b\x94 ok"},
		{"malformed CSI stops at a control", "\x1b[12\nnext", "\nnext"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := string(StripANSI([]byte(tt.in))); got != tt.want {
				t.Fatalf("StripANSI(%q) = %q, want %q", tt.in, got, tt.want)
			}
			out, pos := stripANSI([]byte(tt.in), true)
			if len(pos) != len(out) {
				t.Fatalf("%d positions for %d bytes", len(pos), len(out))
			}
			for k, p := range pos {
				if tt.in[p] != out[k] {
					t.Fatalf("byte %d (%q) maps to %d (%q)", k, out[k], p, tt.in[p])
				}
			}
		})
	}
}

func FuzzStripANSI(f *testing.F) {
	f.Add([]byte("\x1b[1;32mok\x1b[0m\x1b]0;t\x07\r\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		out, pos := stripANSI(b, true)
		if bytes.IndexByte(out, 0x1b) >= 0 {
			t.Fatalf("ESC left in %q", out)
		}
		for k := range pos {
			if k > 0 && pos[k] <= pos[k-1] || b[pos[k]] != out[k] {
				t.Fatalf("bad position map %v for %q", pos, b)
			}
		}
	})
}
