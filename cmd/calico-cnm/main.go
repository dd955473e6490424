// Command calico-cnm is the Docker network and IPAM plugin daemon
// (`calico-cnm serve`) and the operator CLI for its datastore.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/sirupsen/logrus"
	"github.com/spf13/cobra"

	// Before the other packages' initialisers allocate: see the package.
	_ "github.com/calico-cnm/calico-cnm/internal/memprofileoff"
)

// Version is set at build time with -ldflags "-X main.Version=...".
var Version = "dev"

// Exit codes: scripts can tell a usage mistake from a failed operation.
const (
	exitOK      = 0
	exitFailed  = 1
	exitUsage   = 2
	exitProblem = 3 // `ipam check` found problems
)

// usageError marks mistakes in the command line itself.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, a ...any) error { return usageError{fmt.Sprintf(format, a...)} }

// problemsFound is returned by `ipam check` when it found something to fix.
type problemsFound struct{ n int }

func (p problemsFound) Error() string { return fmt.Sprintf("%d problem(s) found", p.n) }

// runError marks an error returned by a command's own work (exit 1), as
// opposed to one cobra raised while parsing the command line (exit 2).
type runError struct{ err error }

func (e runError) Error() string { return e.err.Error() }
func (e runError) Unwrap() error { return e.err }

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr, os.Getenv))
}

// run executes one command line; stdout, stderr and getenv are the only
// ways it sees the outside, so tests call it in process.
func run(args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	root := newRootCmd(&app{stdout: stdout, stderr: stderr, getenv: getenv})
	root.SetArgs(args)
	cmd, err := root.ExecuteContextC(ctx)
	return exitCode(err, cmd, stderr)
}

func exitCode(err error, cmd *cobra.Command, stderr io.Writer) int {
	if err == nil {
		return exitOK
	}
	fmt.Fprintf(stderr, "calico-cnm: %s\n", err)
	var ue usageError
	var pe problemsFound
	var re runError
	switch {
	case errors.As(err, &ue) || !errors.As(err, &re):
		// Everything cobra itself refuses (unknown flags, bad values,
		// wrong argument counts) is a usage mistake too.
		if cmd != nil {
			fmt.Fprintf(stderr, "Run '%s --help' for usage.\n", cmd.CommandPath())
		}
		return exitUsage
	case errors.As(err, &pe):
		return exitProblem
	}
	return exitFailed
}

// app is what every command shares: where it writes, its environment, and
// the global flags.
type app struct {
	stdout, stderr io.Writer
	getenv         func(string) string
	global         globalFlags
	// host is what diags reads of the host; nil: the real one.
	host hostAccess
}

func newLogger(w io.Writer) *logrus.Logger {
	l := logrus.New()
	l.SetOutput(w)
	l.SetFormatter(&logrus.TextFormatter{FullTimestamp: true})
	return l
}
