package harness

import (
	"context"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// TestDialAndForwardReachTheHostsLoopback: a listener on the host's own
// loopback (busybox httpd on 127.0.0.1 inside its namespace) answers
// through DialContext and through Forward's port in the test's namespace,
// where that address is not served.
func TestDialAndForwardReachTheHostsLoopback(t *testing.T) {
	RequireRoot(t)
	RequireFile(t, "/usr/bin/busybox", "package busybox")
	h := NewHost(t, "", HostOptions{NoDockerd: true})
	const addr = "127.0.0.1:18080"
	ready := func(ctx context.Context) error {
		c, err := h.DialContext(ctx, "tcp", addr)
		if err != nil {
			return err
		}
		return c.Close()
	}
	h.StartProcess(t, "httpd", nil, ready, "/usr/bin/busybox", "httpd", "-f", "-p", addr, "-h", h.Dir)

	// The test's own namespace does not serve the address: what answers
	// below comes from the host's.
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Skipf("%s is served in the test's own namespace too: the test would prove nothing", addr)
	}
	get := func(client *http.Client, url string) int {
		t.Helper()
		resp, err := client.Get(url)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode
	}
	direct := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: h.DialContext, DisableKeepAlives: true}}
	// httpd serves h.Dir, which has no index: 404 from httpd is the answer.
	if code := get(direct, "http://"+addr+"/none"); code != http.StatusNotFound {
		t.Errorf("through DialContext: HTTP %d, want httpd's 404", code)
	}
	fwd := h.Forward(t, addr)
	plain := &http.Client{Timeout: 5 * time.Second}
	for i := 0; i < 3; i++ { // several connections through the one forward
		if code := get(plain, "http://"+fwd+"/none"); code != http.StatusNotFound {
			t.Errorf("through Forward (%s), request %d: HTTP %d, want httpd's 404", fwd, i, code)
		}
	}
}
