package datastore

import (
	"bytes"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/sirupsen/logrus"
	"go.uber.org/zap"
)

// TestEtcdLogger: etcd's zap entries come out as logrus lines (one
// format), tagged component=etcd with their fields; info is debug; the
// listener-closed "errors" are debug only while the member stops.
func TestEtcdLogger(t *testing.T) {
	tests := []struct {
		name     string
		logLevel logrus.Level
		stopping bool
		log      func(*zap.Logger)
		want     string // "" = nothing logged
	}{
		{"info is debug", logrus.DebugLevel, false, func(l *zap.Logger) { l.Info("raft ready", zap.String("member", "m1")) }, `level=debug msg="raft ready" component=etcd member=m1`},
		{"info hidden at info", logrus.InfoLevel, false, func(l *zap.Logger) { l.Info("raft ready") }, ""},
		{"warn stays warn", logrus.InfoLevel, false, func(l *zap.Logger) { l.Warn("slow fdatasync", zap.Int("ms", 1200)) }, `level=warning msg="slow fdatasync" component=etcd ms=1200`},
		{"fields of With", logrus.InfoLevel, false, func(l *zap.Logger) { l.With(zap.String("local-member-id", "8e9e")).Warn("w") }, `level=warning msg=w component=etcd local-member-id=8e9e`},
		{"serving failure is an error while running", logrus.InfoLevel, false, func(l *zap.Logger) { l.Error(etcdServeFailed, zap.String("error", "bind failed")) }, `level=error msg="` + etcdServeFailed + `"`},
		{"serving failure while stopping is debug", logrus.InfoLevel, true, func(l *zap.Logger) { l.Error(etcdServeFailed, zap.String("error", "use of closed network connection")) }, ""},
		{"single port is debug", logrus.InfoLevel, false, func(l *zap.Logger) { l.Warn(etcdSinglePort) }, ""},
		{"grpc listener closed while stopping is debug", logrus.InfoLevel, true, func(l *zap.Logger) { l.Warn("stopped insecure grpc server due to error") }, ""},
		{"grpc listener closed while running stays warning", logrus.InfoLevel, false, func(l *zap.Logger) { l.Warn("stopped insecure grpc server due to error") }, `level=warning msg="stopped insecure grpc server due to error"`},
		{"schema race at start is debug", logrus.InfoLevel, false, func(l *zap.Logger) {
			l.Warn("Failed to detect schema version", zap.Error(errors.New("missing term information")))
			l.Error("failed to update storage version", zap.String("cluster-version", "3.6.0"), zap.Error(errors.New("cannot detect storage schema version: missing term information")))
		}, ""},
		{"other storage version failures stay errors", logrus.InfoLevel, false, func(l *zap.Logger) {
			l.Error("failed to update storage version", zap.Error(errors.New("cannot create migration plan")))
		}, `level=error msg="failed to update storage version" component=etcd error="cannot create migration plan"`},
		{"other errors while stopping stay errors", logrus.InfoLevel, true, func(l *zap.Logger) { l.Error("failed to purge snap db file") }, `level=error msg="failed to purge snap db file" component=etcd`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			lr := logrus.New()
			lr.SetOutput(&buf)
			lr.SetLevel(tc.logLevel)
			lr.SetFormatter(&logrus.TextFormatter{DisableTimestamp: true})
			stopping := &atomic.Bool{}
			stopping.Store(tc.stopping)
			zl, err := newEtcdLogger(lr, "", stopping)
			if err != nil {
				t.Fatal(err)
			}
			tc.log(zl)
			got := strings.TrimSpace(buf.String())
			if tc.want == "" {
				if got != "" {
					t.Errorf("logged %q, want nothing", got)
				}
				return
			}
			if !strings.Contains(got, tc.want) || strings.Count(got, "\n") != 0 {
				t.Errorf("logged %q, want one line containing %q", got, tc.want)
			}
		})
	}
}
