//go:build !cgo || !linux

package sandbox

// compileSeccomp fails: libseccomp needs cgo. Readonly jobs are refused, never run without the filter.
func compileSeccomp(seccompFilter) ([]byte, error) { return nil, ErrNoSeccomp }
