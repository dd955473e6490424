#!/usr/bin/env bash
# `make plugin`: builds the static calico-cnm binary, lays out the managed
# plugin (rootfs/ + config.json) and registers it with the Docker engine
# that DOCKER_HOST (or the default socket) points at:
#
#     docker plugin create $PLUGIN_NAME $PLUGIN_DIR
#
# Both drivers of a managed plugin are named after the plugin, so with the
# default PLUGIN_NAME=calico:
#
#     docker plugin enable calico
#     docker network create --driver calico --ipam-driver calico:latest net1
#
# The rootfs needs no `docker build` (and so no registry and no BuildKit):
# the binary is static, so the rootfs is just /calico-cnm. With
# USE_DOCKER_BUILD=1 the rootfs is instead exported from an image built from
# ./Dockerfile (the same content; useful to check the Dockerfile).
#
# Environment:
#   PLUGIN_NAME     plugin (and driver) name, default calico (Docker adds :latest)
#   PLUGIN_DIR      where rootfs/ and config.json are written, default bin/plugin
#   BIN             the binary, default bin/calico-cnm
#   VERSION         version stamped into the binary, default git describe
#   NO_CREATE=1     only build PLUGIN_DIR, do not talk to Docker
#   REPLACE=1       remove an existing plugin of the same name first (docker plugin rm -f)
#   USE_DOCKER_BUILD=1  make the rootfs with docker build from ./Dockerfile
#   GO, DOCKER      the go and docker commands (default: from PATH)
#   DOCKER_HOST     the Docker engine to register the plugin with
set -euo pipefail

cd "$(dirname "$0")/.."
PLUGIN_NAME=${PLUGIN_NAME:-calico}
PLUGIN_DIR=${PLUGIN_DIR:-bin/plugin}
BIN=${BIN:-bin/calico-cnm}
GO=${GO:-go}
DOCKER=${DOCKER:-docker}
VERSION=${VERSION:-$(git describe --always --dirty 2>/dev/null || echo dev)}

log() { echo "build-plugin: $*" >&2; }
die() { log "$*"; exit 1; }

log "building $BIN ($VERSION, static)"
mkdir -p "$(dirname "$BIN")"
CGO_ENABLED=0 "$GO" build -trimpath -ldflags "-s -w -X main.Version=$VERSION" -o "$BIN" ./cmd/calico-cnm

# The rootfs has nothing but the binary: a dynamically linked one would not
# start in it. CGO_ENABLED=0 guarantees that; check anyway, since a
# toolchain override (GOFLAGS, a cgo-only dependency) would otherwise only
# show as "no such file or directory" from `docker plugin enable`.
if command -v readelf >/dev/null && readelf -l "$BIN" 2>/dev/null | grep -q 'Requesting program interpreter'; then
	die "$BIN is dynamically linked; the plugin rootfs has no libc"
fi

rm -rf "$PLUGIN_DIR"
mkdir -p "$PLUGIN_DIR/rootfs"
if [ "${USE_DOCKER_BUILD:-0}" = 1 ]; then
	# A small context: only the Dockerfile and the binary, not the repository.
	ctx=$(mktemp -d)
	cid=""
	image="calico-cnm-rootfs:build-$$"
	cleanup() {
		[ -n "$cid" ] && "$DOCKER" rm -f "$cid" >/dev/null 2>&1 || true
		"$DOCKER" rmi -f "$image" >/dev/null 2>&1 || true
		rm -rf "$ctx"
	}
	trap cleanup EXIT
	mkdir -p "$ctx/bin"
	cp Dockerfile "$ctx/Dockerfile"
	cp "$BIN" "$ctx/bin/calico-cnm"
	log "building the rootfs image from Dockerfile"
	DOCKER_BUILDKIT=0 "$DOCKER" build -q -t "$image" "$ctx" >/dev/null
	cid=$("$DOCKER" create "$image" /calico-cnm)
	"$DOCKER" export "$cid" | tar -x -C "$PLUGIN_DIR/rootfs"
else
	install -m 0755 "$BIN" "$PLUGIN_DIR/rootfs/calico-cnm"
fi
cp config.json "$PLUGIN_DIR/config.json"
log "plugin directory $PLUGIN_DIR ready"

if [ "${NO_CREATE:-0}" = 1 ]; then
	exit 0
fi
if "$DOCKER" plugin inspect "$PLUGIN_NAME" >/dev/null 2>&1; then
	if [ "${REPLACE:-0}" != 1 ]; then
		die "plugin $PLUGIN_NAME already exists: remove it (docker plugin rm -f $PLUGIN_NAME) or run with REPLACE=1"
	fi
	log "removing the existing plugin $PLUGIN_NAME"
	"$DOCKER" plugin rm -f "$PLUGIN_NAME" >/dev/null
fi
"$DOCKER" plugin create "$PLUGIN_NAME" "$PLUGIN_DIR" >/dev/null
log "created plugin $PLUGIN_NAME (disabled). Next:"
log "  docker plugin set $PLUGIN_NAME NODENAME=\$(hostname)   # optional; see docs/managed-plugin.md"
log "  docker plugin enable $PLUGIN_NAME"
