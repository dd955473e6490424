#!/usr/bin/env bash
# Installs what calico-cnm's build, `make run` and the tests need on Debian.
set -euo pipefail
if [ "$(id -u)" != 0 ]; then
	echo "install-deps: run as root (sudo make deps)" >&2
	exit 1
fi
if ! command -v go >/dev/null && [ -x /usr/local/go/bin/go ]; then
	export PATH=$PATH:/usr/local/go/bin
fi
if ! command -v go >/dev/null; then
	echo "install-deps: Go 1.26 or newer is required (go.mod) (https://go.dev/doc/install); Debian's golang package is too old" >&2
	exit 1
fi
export DEBIAN_FRONTEND=noninteractive
# bird2 and gobgpd: the real BGP routers of the multi-host interop test (the
# tests run them in their own network namespaces; calico-cnm itself needs
# neither, its speaker is in process).
# etcd-client (etcdctl) and curl: the tests read etcd and /metrics with them.
# iptables (iptables-legacy): the daemon opens Docker's legacy FORWARD filter
# with it on hosts whose Docker uses that backend; a test builds one.
# util-linux (setpriv): a test checks an unprivileged user is kept out.
# docker-compose (v1) and docker-registry: the real clients of the compose
# and registry-install tests; tcpdump: proves what crosses a router netns;
# openssl: the cluster guide's certificates.
pkgs="docker.io busybox-static iproute2 iputils-ping nftables iptables util-linux etcd-server etcd-client curl iperf3 wrk make git ca-certificates bird2 gobgpd docker-compose docker-registry tcpdump openssl"
missing=""
for p in $pkgs; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
	apt-get update -qq
	# etcd-server's postinst would start a system etcd on 2379 where a
	# service manager runs; the tests start their own members on free ports.
	apt-get install -y -qq --no-install-recommends $missing
fi
# `make run` builds right after this, fetching what the build needs; only the
# tests want every module (test dependencies included) up front.
if [ "${1:-}" != "--system-only" ]; then
	go mod download
fi
echo "install-deps: ok"
