package harness

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"

	"github.com/vishvananda/netns"

	"github.com/calico-cnm/calico-cnm/internal/nsthread"
)

// DialContext connects to addr from inside the host's network namespace,
// from the test process itself: a daemon's loopback-only listener (its
// /healthz, the embedded etcd member) is then reached without spawning a
// process per request, which would load the machine being measured.
func (h *Host) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	target, err := netns.GetFromPath(h.NetnsPath)
	if err != nil {
		return nil, fmt.Errorf("harness: %s: %w", h.NetnsPath, err)
	}
	defer target.Close()
	// A socket belongs to the namespace of the thread that creates it and
	// stays there: a thread that could not leave the namespace afterwards
	// is lost, the connection is not.
	var c net.Conn
	err = nsthread.Do(target, func() error {
		var d net.Dialer
		var derr error
		c, derr = d.DialContext(ctx, network, addr)
		return derr
	})
	if c != nil {
		return c, nil
	}
	return nil, fmt.Errorf("harness: dialing %s from %s: %w", addr, h.NetnsPath, err)
}

// Forward listens on a loopback port of the test process's namespace and
// relays every connection to addr inside the host's namespace (see
// DialContext): a client library that dials by itself (an etcd client)
// reaches the host's loopback-only listener through the returned
// "127.0.0.1:port". The listener and its connections close when t ends.
func (h *Host) Forward(t testing.TB, addr string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("harness: forwarding to %s on %s: %v", addr, h.Name, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var mu sync.Mutex
	open := map[net.Conn]bool{}
	track := func(cs ...net.Conn) bool {
		mu.Lock()
		defer mu.Unlock()
		if ctx.Err() != nil {
			return false
		}
		for _, c := range cs {
			open[c] = true
		}
		return true
	}
	t.Cleanup(func() {
		cancel()
		l.Close()
		mu.Lock()
		for c := range open {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			out, err := h.DialContext(ctx, "tcp", addr)
			if err != nil {
				in.Close()
				continue
			}
			if !track(in, out) {
				in.Close()
				out.Close()
				return
			}
			wg.Add(2)
			relay := func(dst, src net.Conn) {
				defer wg.Done()
				// Either side closing ends the pair.
				_, _ = io.Copy(dst, src)
				dst.Close()
				src.Close()
				mu.Lock()
				delete(open, dst)
				delete(open, src)
				mu.Unlock()
			}
			go relay(out, in)
			go relay(in, out)
		}
	}()
	return l.Addr().String()
}
