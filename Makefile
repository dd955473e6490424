# calico-cnm: see README.md. All targets that touch the network need root.
GO        ?= go
BIN       := bin/calico-cnm
VERSION   ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -s -w -X main.Version=$(VERSION)
PKGS      := ./...
TEST_TIMEOUT ?= 50m

.PHONY: all build test unit bench lint run deps clean

all: build

build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/calico-cnm

# Every test: unit, netns integration and end-to-end with a real dockerd
# (the e2e tests start their own dockerd in throw-away network namespaces).
test:
	$(GO) vet $(PKGS)
	$(GO) test -count=1 -timeout $(TEST_TIMEOUT) $(PKGS)

# Tests that need neither root nor dockerd.
unit:
	$(GO) test -count=1 -short ./datastore/... ./ipam/... ./driver/... ./plugin/... ./cmd/...

bench:
	$(GO) test -run '^$$' -bench . -benchtime 2s -benchmem ./ipam/

lint:
	$(GO) vet $(PKGS)
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo 'gofmt needed'; exit 1; }

# The main job: the plugin on its embedded datastore, wired into the local
# Docker engine through /run/docker/plugins.
run: build
	./scripts/run-local.sh $(BIN)

# Debian packages the tests and `make run` need.
deps:
	./scripts/install-deps.sh

clean:
	rm -rf bin
