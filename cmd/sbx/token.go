package main

import (
	"fmt"
	"io"

	"github.com/sbx-dev/sbx/coordinator/httpapi"
)

const tokenUsage = `usage: sbx token create --sessions PREFIX [--token-file F]

  create   print a token that grants only the sessions whose id starts with PREFIX (their jobs,
           notifications, acks, streams, ends; MCP included). It is derived from the coordinator's
           token (--token-file, else SBX_TOKEN): every coordinator sharing that token accepts it,
           and rotating that token revokes it. See docs/security.md.`

// cmdToken makes scoped tokens: `sbx token create`.
func cmdToken(args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "create" {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
			fmt.Fprintln(stdout, tokenUsage)
			return nil
		}
		fmt.Fprintln(stderr, tokenUsage)
		return &exitError{code: 2}
	}
	fs := newFlags("token create", stderr)
	prefix := fs.String("sessions", "", "the prefix of the session ids the token grants (end it with a separator: agent1- does not grant agent10)")
	tokenFile := fs.String("token-file", "", "the coordinator's token file (default: SBX_TOKEN)")
	if pos, err := parseArgs(fs, args[1:]); err != nil {
		return err
	} else if len(pos) > 0 {
		return usageError("token create takes no arguments")
	}
	if *prefix == "" {
		return usageError("token create needs --sessions PREFIX")
	}
	token := getenv("SBX_TOKEN")
	if *tokenFile != "" {
		var err error
		if token, err = readToken(*tokenFile); err != nil {
			return err
		}
	}
	if token == "" {
		return usageError("token create needs the coordinator's token: --token-file F or SBX_TOKEN")
	}
	scoped, err := httpapi.ScopedToken(token, *prefix)
	if err != nil {
		return usageError("--sessions %q must be 1-64 characters of letters, digits, '_' and '-'", *prefix)
	}
	fmt.Fprintln(stdout, scoped)
	return nil
}
