package coordinator

// StripANSI returns b without terminal escape sequences — CSI (ESC [ … final byte: colours, cursor
// moves, erases), OSC (ESC ] … BEL or ESC \: titles, hyperlinks), the string sequences DCS, SOS, PM
// and APC (ESC P, X, ^, _ … ESC \), and two- and three-byte escapes (ESC ( B, ESC =) — and without
// the C0 control characters other than tab, newline and carriage return. It is what a tty job's
// output is matched and quoted as; the stored output keeps every byte. A sequence cut off at the
// end of b is dropped. The 8-bit C1 forms are left alone: in UTF-8 those bytes are parts of
// characters.
func StripANSI(b []byte) []byte {
	out, _ := stripANSI(b, false)
	return out
}

// stripANSI is StripANSI; with where, it also returns, for each byte of the result, its index in b.
func stripANSI(b []byte, where bool) ([]byte, []int) {
	out := make([]byte, 0, len(b))
	var pos []int
	if where {
		pos = make([]int, 0, len(b))
	}
	for i := 0; i < len(b); {
		c := b[i]
		if c != 0x1b {
			if c >= 0x20 || c == '\t' || c == '\n' || c == '\r' {
				out = append(out, c)
				if where {
					pos = append(pos, i)
				}
			}
			i++
			continue
		}
		i = skipEscape(b, i)
	}
	return out, pos
}

// skipEscape returns the index after the escape sequence that starts at b[i] (an ESC).
func skipEscape(b []byte, i int) int {
	i++ // ESC
	if i >= len(b) {
		return i
	}
	switch c := b[i]; {
	case c == '[': // CSI: parameter bytes 0x30-0x3F, intermediate bytes 0x20-0x2F, a final byte 0x40-0x7E
		for i++; i < len(b); i++ {
			if b[i] >= 0x40 && b[i] <= 0x7e {
				return i + 1
			}
			if b[i] < 0x20 || b[i] > 0x7e {
				return i // malformed: the sequence ends before the stray byte
			}
		}
		return i
	case c == ']' || c == 'P' || c == 'X' || c == '^' || c == '_': // strings, to ST (ESC \); OSC also to BEL
		for i++; i < len(b); i++ {
			if c == ']' && b[i] == 0x07 {
				return i + 1
			}
			if b[i] == 0x1b {
				if i+1 < len(b) && b[i+1] == '\\' {
					return i + 2
				}
				return i // an ESC that does not end it starts the next sequence
			}
		}
		return i
	case c >= 0x20 && c <= 0x2f: // intermediate bytes, then one final byte (ESC ( B)
		for ; i < len(b) && b[i] >= 0x20 && b[i] <= 0x2f; i++ {
		}
		if i < len(b) {
			i++
		}
		return i
	default: // ESC and one byte (ESC =, ESC 7, ESC M)
		return i + 1
	}
}
