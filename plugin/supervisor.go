package plugin

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/sirupsen/logrus"
	"golang.org/x/sync/errgroup"
)

// ErrServiceStopped: a service that must run until the daemon stops
// returned on its own, without an error. A manager that quietly gives up
// would leave its part of the host unmanaged while the daemon looks fine.
var ErrServiceStopped = errors.New("stopped on its own while the daemon runs")

// supervisor runs the daemon's services in one errgroup, in the order Run
// starts them (see Run). The first service that fails cancels the context
// of all the others and becomes the daemon's error; an optional service's
// failure only turns /healthz red (Health). Stopping cancels them all at
// once and waits for each to return; the resources they used are released
// afterwards, in the reverse of the order they were made (Run's defers).
type supervisor struct {
	g      *errgroup.Group
	ctx    context.Context
	cancel context.CancelFunc
	log    logrus.FieldLogger

	mu     sync.Mutex
	failed map[string]error // optional services that failed
}

// newSupervisor returns a supervisor whose services run until ctx ends,
// stop is called or one of them fails.
func newSupervisor(ctx context.Context, log logrus.FieldLogger) *supervisor {
	ctx, cancel := context.WithCancel(ctx)
	g, ctx := errgroup.WithContext(ctx)
	return &supervisor{g: g, ctx: ctx, cancel: cancel, log: log, failed: map[string]error{}}
}

// outcome is what a service's return means: nil when the daemon is
// stopping (ctx ended) and the service returned for that reason, else the
// service's failure, named.
func (s *supervisor) outcome(name string, err error, mustRun bool) error {
	if s.ctx.Err() != nil && (err == nil || errors.Is(err, context.Canceled)) {
		return nil
	}
	if err == nil {
		if !mustRun {
			return nil
		}
		err = ErrServiceStopped
	}
	return fmt.Errorf("%s: %w", name, err)
}

// Service runs a service that must run until the daemon stops: an error,
// or returning at all before the stop, stops the daemon with that error.
func (s *supervisor) Service(name string, run func(ctx context.Context) error) {
	s.goStopping(name, run, true)
}

// Task runs a job that may finish (learning Docker's engine ID): only its
// error stops the daemon.
func (s *supervisor) Task(name string, run func(ctx context.Context) error) {
	s.goStopping(name, run, false)
}

// goStopping runs a service whose failure stops the daemon.
func (s *supervisor) goStopping(name string, run func(ctx context.Context) error, mustRun bool) {
	s.g.Go(func() error {
		err := s.outcome(name, run(s.ctx), mustRun)
		if err != nil {
			s.log.WithError(err).WithField("service", name).Error("service failed: stopping the daemon")
		}
		return err
	})
}

// Optional runs a service the daemon can serve without (the VXLAN status
// socket): its failure is logged and turns /healthz red until the daemon
// restarts.
func (s *supervisor) Optional(name string, run func(ctx context.Context) error) {
	s.g.Go(func() error {
		if err := s.outcome(name, run(s.ctx), true); err != nil {
			s.log.WithError(err).WithField("service", name).Error("optional service failed: /healthz reports it")
			s.mu.Lock()
			s.failed[name] = err
			s.mu.Unlock()
		}
		return nil
	})
}

// Health is nil while no optional service has failed (for Health.Require).
func (s *supervisor) Health() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.failed) == 0 {
		return nil
	}
	var why []string
	for _, name := range slices.Sorted(maps.Keys(s.failed)) {
		why = append(why, s.failed[name].Error())
	}
	return errors.New(strings.Join(why, "; "))
}

// Done is closed when the daemon stops or a service failed.
func (s *supervisor) Done() <-chan struct{} { return s.ctx.Done() }

// Stop cancels every service and waits for them: the first failure, nil
// when every service returned because of the stop.
func (s *supervisor) Stop() error {
	s.cancel()
	return s.g.Wait()
}
