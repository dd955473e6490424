package datastore

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"sync"
	"time"

	"go.etcd.io/etcd/client/v3/credentials"
	"google.golang.org/grpc"
	grpccredentials "google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// connDiag remembers why connections to etcd failed before etcd said a
// word (TLS handshake refused, client certificate rejected, a TLS server
// hanging up on a plain-text client). The etcd client retries such failures
// silently until the request deadline, so without this the user would only
// learn that etcd did not answer, not why.
type connDiag struct {
	mu  sync.Mutex
	err error
	at  time.Time
}

func (d *connDiag) record(err error) {
	d.mu.Lock()
	d.err, d.at = err, time.Now()
	d.mu.Unlock()
}

// recent is the last connection failure if it happened within d ago.
func (d *connDiag) recent(within time.Duration) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.err == nil || time.Since(d.at) > within {
		return nil
	}
	return d.err
}

// dialOption installs transport credentials that report connection
// failures to d. They are the ones the etcd client would pick for the
// first endpoint (its balancer uses those for all): plain text for http://
// and unix://, TLS for https:// and unixs:// (tlsCfg, else system roots),
// and tlsCfg if set for an endpoint without a scheme.
func (d *connDiag) dialOption(firstEndpoint string, tlsCfg *tls.Config) grpc.DialOption {
	scheme := ""
	if u, err := url.Parse(firstEndpoint); err == nil {
		scheme = u.Scheme
	}
	useTLS := tlsCfg != nil
	switch scheme {
	case "http", "unix":
		useTLS = false
	case "https", "unixs":
		useTLS = true
	}
	var inner grpccredentials.TransportCredentials
	if useTLS {
		if tlsCfg == nil {
			tlsCfg = &tls.Config{}
		}
		inner = credentials.NewTransportCredential(tlsCfg)
	} else {
		inner = insecure.NewCredentials()
	}
	return grpc.WithTransportCredentials(&diagCreds{TransportCredentials: inner, d: d, tls: useTLS})
}

type diagCreds struct {
	grpccredentials.TransportCredentials
	d   *connDiag
	tls bool
}

func (c *diagCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, grpccredentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ClientHandshake(ctx, authority, raw)
	if err != nil {
		if ctx.Err() == nil {
			c.d.record(fmt.Errorf("TLS handshake with etcd at %s failed: %v", authority, err))
		}
		return nil, nil, err
	}
	return &diagConn{Conn: conn, d: c.d, authority: authority, tls: c.tls}, info, nil
}

func (c *diagCreds) Clone() grpccredentials.TransportCredentials {
	return &diagCreds{TransportCredentials: c.TransportCredentials.Clone(), d: c.d, tls: c.tls}
}

// diagConn watches the first read of a connection: an error before any
// byte arrived is the server refusing us.
type diagConn struct {
	net.Conn
	d         *connDiag
	authority string
	tls       bool
	mu        sync.Mutex
	gotBytes  bool
}

func (c *diagConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.mu.Lock()
	first := !c.gotBytes
	if n > 0 {
		c.gotBytes = true
	}
	c.mu.Unlock()
	if err == nil || !first || n > 0 || errors.Is(err, net.ErrClosed) {
		return n, err
	}
	switch {
	case c.tls && !errors.Is(err, io.EOF):
		// TLS 1.3 delivers a rejected client certificate as an alert on
		// the first read, after the handshake looked fine.
		c.d.record(fmt.Errorf("etcd at %s refused the TLS connection: %v (check ETCD_CERT_FILE / ETCD_KEY_FILE: etcd may require a client certificate signed by its CA)", c.authority, err))
	case !c.tls && errors.Is(err, io.EOF):
		c.d.record(fmt.Errorf("etcd at %s closed the connection without answering: it probably requires TLS (use an https:// endpoint with ETCD_CA_CERT_FILE, ETCD_CERT_FILE and ETCD_KEY_FILE)", c.authority))
	}
	return n, err
}
