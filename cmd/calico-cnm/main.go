// Command calico-cnm is the Docker network and IPAM plugin daemon
// (`calico-cnm serve`) and the operator CLI for its datastore.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/sirupsen/logrus"
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

const topUsage = `calico-cnm: Calico networking and IPAM for Docker (libnetwork remote drivers)

Usage:
  calico-cnm serve [flags]                 run the plugin daemon
  calico-cnm pool add|list|set|delete|disable|enable ...
  calico-cnm ipam show|check|release ...
  calico-cnm network list
  calico-cnm bgp peer add|list|delete ... | bgp config ...
  calico-cnm node status|list|delete ...
  calico-cnm version

Run 'calico-cnm <command> -h' for the flags of a command.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr, os.Getenv))
}

func run(args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, topUsage)
		return exitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	cli := &cli{stdout: stdout, stderr: stderr, getenv: getenv}
	var err error
	switch args[0] {
	case "serve":
		err = cli.serve(ctx, args[1:])
	case "pool":
		err = cli.pool(ctx, args[1:])
	case "ipam":
		err = cli.ipam(ctx, args[1:])
	case "network":
		err = cli.network(ctx, args[1:])
	case "bgp":
		err = cli.bgp(ctx, args[1:])
	case "node":
		err = cli.node(ctx, args[1:])
	case "version", "--version", "-v":
		fmt.Fprintf(stdout, "calico-cnm %s\n", Version)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, topUsage)
	default:
		err = usagef("unknown command %q (try 'calico-cnm help')", args[0])
	}
	return exitCode(err, stderr)
}

func exitCode(err error, stderr io.Writer) int {
	if err == nil {
		return exitOK
	}
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	var ue usageError
	if errors.As(err, &ue) {
		fmt.Fprintf(stderr, "calico-cnm: %s\n", ue.msg)
		return exitUsage
	}
	var pe problemsFound
	if errors.As(err, &pe) {
		fmt.Fprintf(stderr, "calico-cnm: %s\n", pe.Error())
		return exitProblem
	}
	fmt.Fprintf(stderr, "calico-cnm: %s\n", err)
	return exitFailed
}

type cli struct {
	stdout, stderr io.Writer
	getenv         func(string) string
}

func newLogger(w io.Writer) *logrus.Logger {
	l := logrus.New()
	l.SetOutput(w)
	l.SetFormatter(&logrus.TextFormatter{FullTimestamp: true})
	return l
}
