package plugin_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/calico-cnm/calico-cnm/plugin"
)

// /healthz goes red while a required condition (network policy, learned
// routes) fails, and green again when it holds.
func TestHealthRequire(t *testing.T) {
	var failing atomic.Bool
	h := plugin.NewHealth(func(context.Context) error { return nil })
	h.SetServing(nil)
	h.Require("network policy", func() error {
		if failing.Load() {
			return errors.New("programming nftables failed: injected")
		}
		return nil
	})
	get := func() (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
		return rec.Code, rec.Body.String()
	}
	if code, body := get(); code != http.StatusOK {
		t.Fatalf("healthy: %d %s", code, body)
	}
	failing.Store(true)
	if code, body := get(); code != http.StatusServiceUnavailable || !strings.Contains(body, "network policy: programming nftables failed") {
		t.Errorf("failing policy: %d %q", code, body)
	}
	failing.Store(false)
	if code, _ := get(); code != http.StatusOK {
		t.Errorf("recovered: %d", code)
	}
}
