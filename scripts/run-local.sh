#!/usr/bin/env bash
# `make run`: the plugin on its embedded etcd, wired into this host's Docker
# engine through /run/docker/plugins. Runs in the foreground; Ctrl-C stops it
# and removes its sockets.
set -euo pipefail
bin=${1:-bin/calico-cnm}
if [ "$(id -u)" != 0 ]; then
	echo "run: the plugin creates interfaces and routes: run as root (sudo make run)" >&2
	exit 1
fi
./scripts/install-deps.sh --system-only >/dev/null
if ! docker version >/dev/null 2>&1; then
	if command -v systemctl >/dev/null && systemctl is-system-running >/dev/null 2>&1; then
		echo "run: starting docker.service"
		systemctl start docker
	else
		# No service manager (a container or a minimal VM): start dockerd
		# ourselves so the quick start works as written.
		echo "run: no Docker engine answering; starting dockerd (log: /var/log/calico-cnm-dockerd.log)"
		nohup dockerd >/var/log/calico-cnm-dockerd.log 2>&1 &
	fi
	for _ in $(seq 1 60); do docker version >/dev/null 2>&1 && break; sleep 0.5; done
	docker version >/dev/null 2>&1 || { echo "run: dockerd did not start; see /var/log/calico-cnm-dockerd.log" >&2; exit 1; }
fi
echo "run: calico-cnm serving /run/docker/plugins/calico.sock and calico-ipam.sock (Ctrl-C to stop)"
exec "$bin" serve "${@:2}"
