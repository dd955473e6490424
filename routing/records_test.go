package routing

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/datastore/etcdtest"
)

func TestPeerRecords(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an embedded etcd member")
	}
	store := etcdtest.Start(t).Store
	ctx := context.Background()
	good := datastore.BGPPeer{Name: "tor", PeerIP: "10.0.0.254", ASN: 65000, Password: "pw-Secret"}
	for _, c := range []struct {
		name string
		mod  func(p *datastore.BGPPeer)
		msg  string
	}{
		{"name with a slash", func(p *datastore.BGPPeer) { p.Name = "a/b" }, `peer name "a/b"`},
		{"IPv6 peer", func(p *datastore.BGPPeer) { p.PeerIP = "fd00::1" }, "not an IPv4 address"},
		{"no AS", func(p *datastore.BGPPeer) { p.ASN = 0 }, "no AS number"},
		{"node with a space", func(p *datastore.BGPPeer) { p.Node = "a b" }, `node name "a b"`},
		{"password and secret", func(p *datastore.BGPPeer) { p.PasswordSecret = "k" }, "not both"},
		{"password too long", func(p *datastore.BGPPeer) { p.Password = strings.Repeat("x", 81) }, "longer than 80"},
		{"secret is a path", func(p *datastore.BGPPeer) { p.Password, p.PasswordSecret = "", "../shadow" }, `secret name "../shadow"`},
		{"secret dot dot", func(p *datastore.BGPPeer) { p.Password, p.PasswordSecret = "", ".." }, "name a file in the secrets directory"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := good
			c.mod(&p)
			err := AddPeer(ctx, store, p)
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.msg) {
				t.Fatalf("AddPeer(%+v) = %v, want ErrInvalid with %q", p, err, c.msg)
			}
			if _, err := store.Get(ctx, datastore.BGPPeerKey(p.Name)); !errors.Is(err, datastore.ErrNotFound) && !strings.Contains(p.Name, "/") {
				t.Errorf("a refused peer was written (%v)", err)
			}
		})
	}
	if err := AddPeer(ctx, store, good); err != nil {
		t.Fatal(err)
	}
	if err := AddPeer(ctx, store, good); !errors.Is(err, ErrPeerExists) {
		t.Fatalf("second AddPeer = %v, want ErrPeerExists", err)
	}
	ref := datastore.BGPPeer{Name: "rr", PeerIP: "10.0.0.253", ASN: 65001, Node: "h1", PasswordSecret: "rr-key"}
	if err := AddPeer(ctx, store, ref); err != nil {
		t.Fatal(err)
	}
	peers, err := ListPeers(ctx, store)
	want := []PeerInfo{
		{Name: "rr", PeerIP: "10.0.0.253", ASN: 65001, Node: "h1", Password: true, PasswordSecret: "rr-key"},
		{Name: "tor", PeerIP: "10.0.0.254", ASN: 65000, Password: true},
	}
	if err != nil || len(peers) != len(want) || peers[0] != want[0] || peers[1] != want[1] {
		t.Fatalf("ListPeers = %+v, %v; want %+v", peers, err, want)
	}
	if err := DeletePeer(ctx, store, "tor"); err != nil {
		t.Fatal(err)
	}
	if err := DeletePeer(ctx, store, "tor"); !errors.Is(err, ErrPeerNotFound) {
		t.Fatalf("second DeletePeer = %v, want ErrPeerNotFound", err)
	}
	if peers, _ := ListPeers(ctx, store); len(peers) != 1 || peers[0].Name != "rr" {
		t.Fatalf("after delete: %+v", peers)
	}
}

func TestConfigRecords(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an embedded etcd member")
	}
	store := etcdtest.Start(t).Store
	ctx := context.Background()
	view := func(t *testing.T) ConfigView {
		t.Helper()
		v, err := GetConfig(ctx, store)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if v := view(t); v.ASN != DefaultASN || !v.NodeToNodeMesh || len(v.Nodes) != 0 {
		t.Fatalf("defaults: %+v", v)
	}
	off, on := false, true
	if err := SetClusterConfig(ctx, store, ClusterChange{Mesh: &off}); err != nil {
		t.Fatal(err)
	}
	if err := SetClusterConfig(ctx, store, ClusterChange{ASN: 65100}); err != nil {
		t.Fatal(err)
	}
	if v := view(t); v.ASN != 65100 || v.NodeToNodeMesh {
		t.Fatalf("after two cluster changes (each keeps the other): %+v", v)
	}
	// A node that has not started yet gets its record.
	if err := SetNodeConfig(ctx, store, "h1", NodeChange{RouteReflector: &on, ClusterID: "1.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	if err := SetNodeConfig(ctx, store, "h2", NodeChange{ASN: 65200}); err != nil {
		t.Fatal(err)
	}
	if err := SetNodeConfig(ctx, store, "h1", NodeChange{ASN: 65300}); err != nil {
		t.Fatal(err)
	}
	want := []NodeView{
		{Name: "h1", ASN: 65300, RouteReflector: true, ClusterID: "1.0.0.1"},
		{Name: "h2", ASN: 65200},
	}
	if v := view(t); len(v.Nodes) != 2 || v.Nodes[0] != want[0] || v.Nodes[1] != want[1] {
		t.Fatalf("nodes %+v, want %+v", v.Nodes, want)
	}
	for _, bad := range []struct {
		node string
		ch   NodeChange
	}{
		{"h/1", NodeChange{ASN: 1}},
		{"h1", NodeChange{ClusterID: "fd00::1"}},
	} {
		if err := SetNodeConfig(ctx, store, bad.node, bad.ch); !errors.Is(err, ErrInvalid) {
			t.Errorf("SetNodeConfig(%q, %+v) = %v, want ErrInvalid", bad.node, bad.ch, err)
		}
	}
	if v := view(t); v.Nodes[0] != want[0] {
		t.Errorf("a refused change was written: %+v", v.Nodes[0])
	}
}
