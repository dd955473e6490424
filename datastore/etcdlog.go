package datastore

import (
	"fmt"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/sirupsen/logrus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// logrusCore hands the embedded etcd member's zap entries to logrus, so the
// daemon writes one log format at one level setting. etcd is chatty at
// info, so its info lines are logrus debug lines.
type logrusCore struct {
	log    logrus.FieldLogger
	fields logrus.Fields
	level  zapcore.LevelEnabler
	// stopping is set just before the member is closed: etcd then reports
	// each listener it closes as a serving error (errHandler logs every
	// Serve return), which is routine for us and logged at debug.
	stopping *atomic.Bool
}

// etcdServeFailed is what etcd logs when a listener's Serve returns.
const etcdServeFailed = "setting up serving from embedded etcd failed."

// etcdStopNoise are the messages etcd logs at warning or above for a
// listener it closes itself: routine while the member stops, and then
// logged at debug.
var etcdStopNoise = [...]string{
	etcdServeFailed,
	"stopping insecure grpc server due to error",
	"stopped insecure grpc server due to error",
}

// etcdSinglePort is etcd's warning that gRPC and HTTP share one listener.
// That is how the lone embedded member is meant to serve (one root-only
// socket, nothing else to open), so the line is logged at debug.
const etcdSinglePort = "Running http and grpc server on single port. This is not recommended for production."

// etcdSchemaRace are the lines etcd's storage-version monitor logs when
// it reads the backend before the member's first commit wrote the raft
// term (or membership) there: a race of a member's first seconds, the
// more likely on a busy host, which the monitor's next round (a few
// seconds on) gets past. Logged at debug when the error is that one.
var etcdSchemaRace = [...]string{
	"Failed to detect schema version",
	"failed to update storage version",
}

// etcdSchemaRaceErrors are the errors of that race.
var etcdSchemaRaceErrors = [...]string{"missing term information", "missing confstate information"}

// demoted tells an etcd warning or error that is routine for the embedded
// member (see etcdStopNoise, etcdSinglePort, etcdSchemaRace); fields are
// the entry's.
func (c *logrusCore) demoted(msg string, fields logrus.Fields) bool {
	if msg == etcdSinglePort {
		return true
	}
	if slices.Contains(etcdSchemaRace[:], msg) {
		err := fmt.Sprint(fields[logrus.ErrorKey])
		for _, e := range etcdSchemaRaceErrors {
			if strings.Contains(err, e) {
				return true
			}
		}
	}
	if !c.stopping.Load() {
		return false
	}
	for _, m := range etcdStopNoise {
		if msg == m {
			return true
		}
	}
	return false
}

// newEtcdLogger builds the zap logger the embedded member logs through, at
// the etcd level that maps to log's level (or level, when set).
func newEtcdLogger(log logrus.FieldLogger, level string, stopping *atomic.Bool) (*zap.Logger, error) {
	zl := zapcore.InfoLevel
	if level != "" {
		l, err := zapcore.ParseLevel(level)
		if err != nil {
			return nil, err
		}
		zl = l
	} else if logrusLevel(log) < logrus.DebugLevel {
		zl = zapcore.WarnLevel
	}
	return zap.New(&logrusCore{log: log.WithField("component", "etcd"), fields: logrus.Fields{}, level: zl, stopping: stopping}), nil
}

// logrusLevel is log's level where log tells it, else info.
func logrusLevel(log logrus.FieldLogger) logrus.Level {
	switch l := log.(type) {
	case *logrus.Entry:
		return l.Logger.GetLevel()
	case *logrus.Logger:
		return l.GetLevel()
	}
	return logrus.InfoLevel
}

func (c *logrusCore) Enabled(l zapcore.Level) bool { return c.level.Enabled(l) }

func (c *logrusCore) With(fields []zapcore.Field) zapcore.Core {
	clone := *c
	clone.fields = make(logrus.Fields, len(c.fields)+len(fields))
	for k, v := range c.fields {
		clone.fields[k] = v
	}
	addZapFields(clone.fields, fields)
	return &clone
}

func (c *logrusCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *logrusCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	all := make(logrus.Fields, len(c.fields)+len(fields))
	for k, v := range c.fields {
		all[k] = v
	}
	addZapFields(all, fields)
	entry := c.log.WithFields(all)
	switch {
	case c.demoted(e.Message, all):
		entry.Debug(e.Message)
	case e.Level >= zapcore.ErrorLevel:
		// Panic and fatal levels stay errors here: zap itself panics or
		// exits after Write, logrus must not do it a second time.
		entry.Error(e.Message)
	case e.Level == zapcore.WarnLevel:
		entry.Warn(e.Message)
	case e.Level == zapcore.InfoLevel:
		entry.Debug(e.Message)
	default:
		entry.Trace(e.Message)
	}
	return nil
}

func (c *logrusCore) Sync() error { return nil }

func addZapFields(into logrus.Fields, fields []zapcore.Field) {
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range fields {
		f.AddTo(enc)
	}
	for k, v := range enc.Fields {
		into[k] = v
	}
}
