package datastore

import (
	"context"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
)

// warnRecorder keeps every entry logged at warning or above.
type warnRecorder struct {
	mu    sync.Mutex
	lines []string
}

func (r *warnRecorder) Levels() []logrus.Level {
	return []logrus.Level{logrus.PanicLevel, logrus.FatalLevel, logrus.ErrorLevel, logrus.WarnLevel}
}

func (r *warnRecorder) Fire(e *logrus.Entry) error {
	line, _ := e.String()
	r.mu.Lock()
	r.lines = append(r.lines, line)
	r.mu.Unlock()
	return nil
}

// take returns the lines recorded since the last take.
func (r *warnRecorder) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.lines
	r.lines = nil
	return out
}

// TestEmbeddedMemberLogsNoWarning: the embedded member, at the daemon's
// default log level, logs nothing at warning or above when it starts (fresh
// and again on its data), while it serves the requests an idle daemon makes
// (each request's log line is written before its reply), or when it stops
// cleanly.
func TestEmbeddedMemberLogsNoWarning(t *testing.T) {
	cfg, _ := embeddedOnSockets(t, "cnm-quiet")
	rec := &warnRecorder{}
	log := logrus.New()
	log.SetOutput(io.Discard)
	log.SetLevel(logrus.InfoLevel)
	log.AddHook(rec)
	expectQuiet := func(phase string) {
		t.Helper()
		for _, l := range rec.take() {
			t.Errorf("%s: logged %s", phase, l)
		}
	}
	for _, start := range []string{"fresh start", "restart on its data"} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		store, err := Open(ctx, cfg, log)
		if err != nil {
			cancel()
			t.Fatalf("%s: %v", start, err)
		}
		expectQuiet(start)
		for i := range 20 {
			if _, err := store.List(ctx, "endpoints/host-a/"); err != nil {
				t.Fatal(err)
			}
			if err := store.Txn(ctx, Put("probe", []byte{byte(i)})); err != nil {
				t.Fatal(err)
			}
			if _, err := store.Get(ctx, "probe"); err != nil {
				t.Fatal(err)
			}
		}
		expectQuiet(start + ", serving an idle daemon's requests")
		store.Close()
		cancel()
		expectQuiet(start + ", then a clean stop")
	}
}
