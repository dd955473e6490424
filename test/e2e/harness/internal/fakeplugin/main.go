// Command fakeplugin is a do-nothing Docker network + IPAM remote driver used
// to test the e2e harness itself (plugin discovery through the host's
// /run/docker/plugins, Kill9, Restart) before and independently of the real
// daemon. It accepts the command line of calico-cnm serve and uses only
// --socket-dir; it answers network create/remove, not container attachment.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
)

func main() {
	if len(os.Args) < 2 || os.Args[1] != "serve" {
		fmt.Fprintln(os.Stderr, "usage: fakeplugin serve --socket-dir DIR [ignored flags]")
		os.Exit(2)
	}
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	socketDir := fs.String("socket-dir", "/run/docker/plugins", "")
	// Accept (and ignore) the rest of calico-cnm's serve flags.
	for _, f := range []string{"state-dir", "nodename", "log-level", "etcd-listen-client", "etcd-listen-peer"} {
		fs.String(f, "", "")
	}
	if err := fs.Parse(os.Args[2:]); err != nil {
		os.Exit(2)
	}
	log.SetFlags(log.LstdFlags | log.Lmicroseconds)
	log.Printf("fakeplugin pid %d, DOCKER_HOST=%s", os.Getpid(), os.Getenv("DOCKER_HOST"))

	var paths []string
	for name, impl := range map[string]string{"calico.sock": "NetworkDriver", "calico-ipam.sock": "IpamDriver"} {
		path := filepath.Join(*socketDir, name)
		_ = os.Remove(path) // stale socket of a killed predecessor
		l, err := net.Listen("unix", path)
		if err != nil {
			log.Fatalf("listen %s: %v", path, err)
		}
		paths = append(paths, path)
		go func() { log.Fatal(http.Serve(l, handler(impl))) }()
		log.Printf("listening on %s (%s)", path, impl)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	s := <-sig
	log.Printf("got %s, removing sockets", s)
	for _, p := range paths {
		_ = os.Remove(p)
	}
}

func handler(impl string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		log.Printf("%s %s %s", impl, r.URL.Path, strings.TrimSpace(string(body)))
		var req map[string]any
		_ = json.Unmarshal(body, &req)
		var resp any = map[string]any{}
		switch r.URL.Path {
		case "/Plugin.Activate":
			resp = map[string]any{"Implements": []string{impl}}
		case "/NetworkDriver.GetCapabilities":
			resp = map[string]any{"Scope": "local", "ConnectivityScope": "local"}
		case "/IpamDriver.GetCapabilities":
			resp = map[string]any{"RequiresMACAddress": false}
		case "/IpamDriver.GetDefaultAddressSpaces":
			resp = map[string]any{"LocalDefaultAddressSpace": "FakeLocal", "GlobalDefaultAddressSpace": "FakeGlobal"}
		case "/IpamDriver.RequestPool":
			pool, _ := req["Pool"].(string)
			if pool == "" {
				pool = "10.233.0.0/16"
			}
			resp = map[string]any{"PoolID": pool, "Pool": pool, "Data": map[string]string{}}
		case "/IpamDriver.RequestAddress":
			pool, _ := req["PoolID"].(string)
			ip, n, err := net.ParseCIDR(pool)
			if err != nil {
				w.WriteHeader(http.StatusBadRequest)
				resp = map[string]any{"Err": "bad pool " + pool}
				break
			}
			ip = ip.To4()
			ip[3]++
			ones, _ := n.Mask.Size()
			resp = map[string]any{"Address": fmt.Sprintf("%s/%d", ip, ones), "Data": map[string]string{}}
		}
		w.Header().Set("Content-Type", "application/vnd.docker.plugins.v1.2+json")
		_ = json.NewEncoder(w).Encode(resp)
	})
}
