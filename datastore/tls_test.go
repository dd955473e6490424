package datastore_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/datastore/etcdtest"
)

// certAuthority is a throw-away CA for one test.
type certAuthority struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	dir  string
}

func newCA(t *testing.T, dir, name string) *certAuthority {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	ca := &certAuthority{cert: cert, key: key, dir: dir}
	writePEM(t, ca.path(name+".crt"), "CERTIFICATE", der)
	return ca
}

func (ca *certAuthority) path(name string) string { return filepath.Join(ca.dir, name) }

// issue writes name.crt and name.key signed by the CA.
func (ca *certAuthority) issue(t *testing.T, name string, serial int64, usage []x509.ExtKeyUsage, ips ...net.IP) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  usage,
		IPAddresses:  ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = ca.path(name+".crt"), ca.path(name+".key")
	writePEM(t, certFile, "CERTIFICATE", der)
	writePEM(t, keyFile, "EC PRIVATE KEY", kder)
	return certFile, keyFile
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// startTLSEtcd runs an embedded etcd member whose client port speaks only
// TLS and requires a client certificate signed by caFile.
func startTLSEtcd(t *testing.T, certFile, keyFile, caFile string) string {
	t.Helper()
	clientURL, _ := url.Parse(fmt.Sprintf("https://127.0.0.1:%d", etcdtest.FreePort(t)))
	peerURL, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", etcdtest.FreePort(t)))
	cfg := embed.NewConfig()
	cfg.Name = "tls-test"
	cfg.Dir = t.TempDir()
	cfg.ListenClientUrls = []url.URL{*clientURL}
	cfg.AdvertiseClientUrls = []url.URL{*clientURL}
	cfg.ListenPeerUrls = []url.URL{*peerURL}
	cfg.AdvertisePeerUrls = []url.URL{*peerURL}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.LogLevel = "fatal"
	cfg.ClientTLSInfo = transport.TLSInfo{
		CertFile:       certFile,
		KeyFile:        keyFile,
		TrustedCAFile:  caFile,
		ClientCertAuth: true,
	}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatalf("starting etcd with client TLS: %v", err)
	}
	t.Cleanup(e.Close)
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(60 * time.Second):
		t.Fatal("etcd with client TLS not ready after 60s")
	}
	return clientURL.String()
}

// TestEtcdOverTLSWithClientCerts: with an etcd that requires client
// certificates, the datastore works when given the CA, a certificate and a
// key, and every other way of connecting is refused with an error that says
// what is wrong, within the configured timeout.
func TestEtcdOverTLSWithClientCerts(t *testing.T) {
	dir := t.TempDir()
	ca := newCA(t, dir, "calico-cnm-test-ca")
	caFile := ca.path("calico-cnm-test-ca.crt")
	loopback := net.ParseIP("127.0.0.1")
	srvCert, srvKey := ca.issue(t, "etcd-server", 2, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, loopback)
	cliCert, cliKey := ca.issue(t, "calico-cnm-client", 3, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth})
	rogue := newCA(t, dir, "rogue-ca")
	rogueCert, rogueKey := rogue.issue(t, "rogue-client", 4, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth})

	endpoint := startTLSEtcd(t, srvCert, srvKey, caFile)
	plainEndpoint := "http://" + strings.TrimPrefix(endpoint, "https://")

	const timeout = 3 * time.Second
	base := datastore.Config{RequestTimeout: timeout, DialTimeout: timeout, Prefix: "/tls-test/"}

	t.Run("client certificate works", func(t *testing.T) {
		cfg := base
		cfg.Endpoints = []string{endpoint}
		cfg.CACertFile, cfg.CertFile, cfg.KeyFile = caFile, cliCert, cliKey
		s, err := datastore.Open(context.Background(), cfg, nil)
		if err != nil {
			t.Fatalf("Open with the client certificate: %v", err)
		}
		defer s.Close()
		ctx := context.Background()
		if err := s.Ping(ctx); err != nil {
			t.Fatalf("Ping over TLS: %v", err)
		}
		if err := s.Txn(ctx, datastore.Create("k", []byte("v"))); err != nil {
			t.Fatalf("write over TLS: %v", err)
		}
		kv, err := s.Get(ctx, "k")
		if err != nil || string(kv.Value) != "v" {
			t.Fatalf("read over TLS: %q %v", kv.Value, err)
		}
	})

	// refused is what every failed case must show: an error, in bounded
	// time, that names the reason.
	refused := func(t *testing.T, cfg datastore.Config, wantOpen string, wantUse ...string) {
		t.Helper()
		start := time.Now()
		s, err := datastore.Open(context.Background(), cfg, nil)
		if wantOpen != "" {
			if err == nil {
				s.Close()
				t.Fatalf("Open succeeded, want an error containing %q", wantOpen)
			}
			if !strings.Contains(err.Error(), wantOpen) {
				t.Fatalf("Open error %q does not say %q", err, wantOpen)
			}
			t.Logf("refused at Open: %v", err)
			return
		}
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		defer s.Close()
		err = s.Txn(context.Background(), datastore.Put("refused", []byte("x")))
		elapsed := time.Since(start)
		if err == nil {
			t.Fatal("a write went through without proper TLS credentials")
		}
		if !errors.Is(err, datastore.ErrUnavailable) {
			t.Errorf("error %q is not ErrUnavailable", err)
		}
		matched := false
		for _, w := range wantUse {
			matched = matched || strings.Contains(strings.ToLower(err.Error()), w)
		}
		if !matched {
			t.Errorf("error %q names none of %q", err, wantUse)
		}
		if elapsed > timeout+2*time.Second {
			t.Errorf("refusal took %s, want within the %s request timeout", elapsed.Round(time.Millisecond), timeout)
		}
		t.Logf("refused after %s: %v", elapsed.Round(time.Millisecond), err)
	}

	t.Run("plain http endpoint with TLS configured", func(t *testing.T) {
		cfg := base
		cfg.Endpoints = []string{plainEndpoint}
		cfg.CACertFile, cfg.CertFile, cfg.KeyFile = caFile, cliCert, cliKey
		refused(t, cfg, "plain http but TLS files are configured")
	})
	t.Run("plain http client to the TLS port", func(t *testing.T) {
		cfg := base
		cfg.Endpoints = []string{plainEndpoint}
		refused(t, cfg, "", "requires tls")
	})
	t.Run("no client certificate", func(t *testing.T) {
		cfg := base
		cfg.Endpoints = []string{endpoint}
		cfg.CACertFile = caFile
		refused(t, cfg, "", "certificate required", "bad certificate")
	})
	t.Run("client certificate from another CA", func(t *testing.T) {
		cfg := base
		cfg.Endpoints = []string{endpoint}
		cfg.CACertFile, cfg.CertFile, cfg.KeyFile = caFile, rogueCert, rogueKey
		refused(t, cfg, "", "unknown certificate authority", "bad certificate")
	})
	t.Run("server not trusted", func(t *testing.T) {
		cfg := base
		cfg.Endpoints = []string{endpoint}
		cfg.CACertFile, cfg.CertFile, cfg.KeyFile = rogue.path("rogue-ca.crt"), cliCert, cliKey
		refused(t, cfg, "", "signed by unknown authority")
	})
	t.Run("missing key file", func(t *testing.T) {
		cfg := base
		cfg.Endpoints = []string{endpoint}
		cfg.CACertFile, cfg.CertFile, cfg.KeyFile = caFile, cliCert, filepath.Join(dir, "absent.key")
		refused(t, cfg, "loading etcd TLS files")
	})
}
