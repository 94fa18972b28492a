//go:build cgo && linux

package sandbox

import (
	"fmt"
	"io"

	libseccomp "github.com/seccomp/libseccomp-golang"
)

// compileSeccomp turns f into a classic BPF program for the native architecture, in the form
// bwrap's --seccomp reads: struct sock_filter entries, native byte order.
func compileSeccomp(f seccompFilter) ([]byte, error) {
	filter, err := libseccomp.NewFilter(libseccomp.ActAllow)
	if err != nil {
		return nil, fmt.Errorf("seccomp: new filter: %w", err)
	}
	defer filter.Release()
	// A filter starts with the native architecture only; a call from any other ABI is a bad arch.
	if err := filter.SetBadArchAction(libseccomp.ActKillProcess); err != nil {
		return nil, fmt.Errorf("seccomp: set bad-arch action: %w", err)
	}
	for _, r := range f.Rules {
		nr, err := libseccomp.GetSyscallFromName(r.Syscall)
		if err != nil {
			return nil, fmt.Errorf("seccomp: syscall %s: %w", r.Syscall, err)
		}
		action := libseccomp.ActErrno.SetReturnCode(int16(r.Errno))
		if len(r.Args) == 0 {
			if err := filter.AddRule(nr, action); err != nil {
				return nil, fmt.Errorf("seccomp: add rule %s: %w", r.Syscall, err)
			}
			continue
		}
		conds := make([]libseccomp.ScmpCondition, 0, len(r.Args))
		for _, a := range r.Args {
			c, err := libseccomp.MakeCondition(a.Index, libseccomp.CompareMaskedEqual, a.Mask, a.Value)
			if err != nil {
				return nil, fmt.Errorf("seccomp: condition on %s arg %d: %w", r.Syscall, a.Index, err)
			}
			conds = append(conds, c)
		}
		if err := filter.AddRuleConditional(nr, action, conds); err != nil {
			return nil, fmt.Errorf("seccomp: add rule %s: %w", r.Syscall, err)
		}
	}
	// ExportBPF writes to a descriptor; a memfd keeps the program off the file system.
	mf, err := memfd("sbx-seccomp-export")
	if err != nil {
		return nil, err
	}
	defer mf.Close()
	if err := filter.ExportBPF(mf); err != nil {
		return nil, fmt.Errorf("seccomp: export bpf: %w", err)
	}
	if _, err := mf.Seek(0, io.SeekStart); err != nil {
		return nil, fmt.Errorf("seccomp: rewind bpf: %w", err)
	}
	prog, err := io.ReadAll(mf)
	if err != nil {
		return nil, fmt.Errorf("seccomp: read bpf: %w", err)
	}
	return prog, nil
}
