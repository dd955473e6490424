package plugin

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
)

// TestSupervisor: a service that fails (an error, or a service that must
// run returning on its own) stops every other service and is the daemon's
// error; an optional service's failure turns /healthz red and stops
// nothing; a task may finish; a stop with nothing failed is no error.
func TestSupervisor(t *testing.T) {
	errBoom := errors.New("netlink socket closed")
	untilStopped := func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }
	tests := []struct {
		name string
		// start adds the services under test next to one that runs until
		// stopped.
		start func(s *supervisor)
		// stopsAlone: the failure stops the daemon without a Stop.
		stopsAlone bool
		wantErr    error  // errors.Is the error Stop returns
		wantName   string // in that error
		healthRed  string // "" = /healthz green
	}{
		{
			name:       "failing service stops the daemon with its error",
			start:      func(s *supervisor) { s.Service("VXLAN", func(context.Context) error { return errBoom }) },
			stopsAlone: true, wantErr: errBoom, wantName: "VXLAN",
		},
		{
			name:       "service returning nil on its own is a failure",
			start:      func(s *supervisor) { s.Service("BGP routing", func(context.Context) error { return nil }) },
			stopsAlone: true, wantErr: ErrServiceStopped, wantName: "BGP routing",
		},
		{
			name:       "failing task stops the daemon",
			start:      func(s *supervisor) { s.Task("Docker engine ID", func(context.Context) error { return errBoom }) },
			stopsAlone: true, wantErr: errBoom, wantName: "Docker engine ID",
		},
		{
			name:  "finished task is no failure",
			start: func(s *supervisor) { s.Task("Docker engine ID", func(context.Context) error { return nil }) },
		},
		{
			name:      "failing optional service turns /healthz red",
			start:     func(s *supervisor) { s.Optional("VXLAN status socket", func(context.Context) error { return errBoom }) },
			healthRed: "VXLAN status socket: " + errBoom.Error(),
		},
		{
			name:  "clean stop",
			start: func(s *supervisor) { s.Service("network policy", untilStopped) },
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			log := logrus.New()
			log.SetOutput(io.Discard)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			sup := newSupervisor(ctx, log)
			h := NewHealth(func(context.Context) error { return nil })
			h.SetServing(nil)
			h.Require("daemon services", sup.Health)
			optionalDone := make(chan struct{})
			sup.Service("plugin socket", untilStopped)
			tc.start(sup)
			if tc.healthRed != "" {
				// Wait for the optional service to have failed: the
				// supervisor records it before its goroutine returns.
				sup.Task("observer", func(ctx context.Context) error {
					defer close(optionalDone)
					for sup.Health() == nil {
						select {
						case <-ctx.Done():
							return nil
						case <-time.After(time.Millisecond):
						}
					}
					return nil
				})
				select {
				case <-optionalDone:
				case <-time.After(10 * time.Second):
					t.Fatal("the optional service's failure was never recorded")
				}
			}
			if tc.stopsAlone {
				select {
				case <-sup.Done():
				case <-time.After(10 * time.Second):
					t.Fatal("a failed service did not stop the others")
				}
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
			if tc.healthRed != "" {
				if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), tc.healthRed) {
					t.Errorf("/healthz = %d %q, want 503 naming %q", rec.Code, rec.Body.String(), tc.healthRed)
				}
				select {
				case <-sup.Done():
					t.Error("an optional service's failure stopped the daemon")
				default:
				}
			} else if rec.Code != http.StatusOK {
				t.Errorf("/healthz = %d %q, want 200", rec.Code, rec.Body.String())
			}
			err := sup.Stop()
			if tc.wantErr == nil {
				if err != nil {
					t.Errorf("Stop = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, tc.wantErr) || !strings.Contains(err.Error(), tc.wantName) {
				t.Errorf("Stop = %v, want %v naming %q", err, tc.wantErr, tc.wantName)
			}
		})
	}
}

// TestTunnelUnderSupervisor: a tunnel manager (VXLAN, WireGuard) whose Run
// gives up stops the daemon with that error; its socket failing only turns
// /healthz red.
func TestTunnelUnderSupervisor(t *testing.T) {
	errGaveUp := errors.New("following /calico/nodes/: datastore refused")
	untilStopped := func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }
	fails := func(context.Context) error { return errGaveUp }
	log := logrus.New()
	log.SetOutput(io.Discard)

	t.Run("manager gives up", func(t *testing.T) {
		sup := newSupervisor(context.Background(), log)
		released := false
		tun := &tunnel[struct{}]{name: "VXLAN", run: fails, release: func() { released = true }}
		release := tun.start(sup)
		select {
		case <-sup.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("a tunnel manager that gave up did not stop the daemon")
		}
		if err := sup.Stop(); !errors.Is(err, errGaveUp) || !strings.Contains(err.Error(), "VXLAN") {
			t.Errorf("Stop = %v, want %v naming VXLAN", err, errGaveUp)
		}
		release()
		if !released {
			t.Error("start's release did not release the tunnel")
		}
	})
	t.Run("socket fails", func(t *testing.T) {
		sup := newSupervisor(context.Background(), log)
		tun := &tunnel[struct{}]{name: "WireGuard", run: untilStopped, socketName: "WireGuard socket", socket: fails, release: func() {}}
		defer tun.start(sup)()
		deadline := time.Now().Add(10 * time.Second)
		for sup.Health() == nil && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if err := sup.Health(); err == nil || !strings.Contains(err.Error(), "WireGuard socket") {
			t.Fatalf("Health = %v, want the socket's failure", err)
		}
		select {
		case <-sup.Done():
			t.Error("a failing tunnel socket stopped the daemon")
		default:
		}
		if err := sup.Stop(); err != nil {
			t.Errorf("Stop = %v, want nil", err)
		}
	})
}
