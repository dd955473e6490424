# calico-cnm: see README.md. All targets that touch the network need root.
GO        ?= go
BIN       := bin/calico-cnm
VERSION   ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -s -w -X main.Version=$(VERSION)
# How calico-cnm is compiled: static, without build paths. The tests
# compile with the same (see test), and so do the e2e harness's builds
# (test/e2e/harness/harness.go goBuild) and scripts/build-plugin.sh.
BUILD_ENV   := CGO_ENABLED=0
BUILD_FLAGS := -trimpath
PKGS      := ./...
TEST_TIMEOUT ?= 50m

.PHONY: all build test unit bench fuzz lint run plugin deps clean

all: build

build:
	$(BUILD_ENV) $(GO) build $(BUILD_FLAGS) -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/calico-cnm

# Every test: unit, netns integration and end-to-end with a real dockerd
# (the e2e tests start their own dockerd in throw-away network namespaces).
# The output is plain go test's (failures and skips shown, passes quiet), the
# ten slowest tests, then each package's ok/FAIL line; the exit status is go
# test's. TEST_PARALLEL bounds the e2e tests that run at once (they mostly
# wait on dockerd and the network, so more than the cores pays off; at 3 a
# whole run kept the 2 cores only half busy; with the harness talking to
# dockerd through the API, a run at 4 used about 70% of them, and 5 took
# 14m16s against 14m36s-15m24s at 4). The packages run in ./...
# order: with the e2e package first (its run starts minutes sooner) the unit
# packages' timing tests ran beside its busiest part, and three of them
# failed in two full runs.
# TEST_PACKAGES bounds the packages whose tests run at once (go test -p;
# its default is the number of cores): the unit packages mostly wait on
# their etcd members and timers, so at 2 they kept the cores about half
# busy for the two minutes before the e2e package's turn came.
# -vet=off: the go vet above already ran every analyzer go test's own vet
# step would (a subset), on the same packages and test files.
# TESTREPORT_FLAGS="-json FILE" keeps go test's -json stream (every test's
# start and end) for a timeline of the run.
# The tests compile with BUILD_ENV and BUILD_FLAGS, as `make build`, so
# the packages they compile are the ones the e2e tests' builds of
# calico-cnm (make build, the plugin, the versioned binaries) reuse from
# the build cache: with other flags the tree was compiled twice in every
# run, on a machine whose cores the e2e package keeps busy.
TEST_PARALLEL ?= 5
TEST_PACKAGES ?= 4
test:
	$(BUILD_ENV) $(GO) vet $(BUILD_FLAGS) $(PKGS)
	$(BUILD_ENV) $(GO) run ./test/testreport $(TESTREPORT_FLAGS) -- $(GO) test $(BUILD_FLAGS) -json -count=1 -vet=off -p $(TEST_PACKAGES) -parallel $(TEST_PARALLEL) -timeout $(TEST_TIMEOUT) $(PKGS)

# Tests that need neither root nor dockerd: every package but the e2e suite;
# under -short the tests that need root or a netns skip, saying so.
unit:
	$(GO) test -count=1 -short $$($(GO) list ./... | grep -v '/test/e2e$$')

# Side-by-side performance report: bench/report.md + bench/report.png (needs
# root and dockerd, like the e2e tests; about 45 minutes). The IPAM
# micro-benchmark runs first on its own; the multi-host benchmarks (BGP
# convergence, throughput) next, their output kept for the report. The BGP
# scale row (bench/scale.md: daemons in netns against gobgpd, mesh and 2
# reflectors, at each of BENCH_SCALE_NODES nodes; the rows with a target run
# 3 times each, about 10 minutes) comes before the report, which shows its
# rows with a target (32 hosts in a mesh, 64 with reflectors) in its targets
# panel; BENCH_SCALE_NODES=8,16 for a quick run (no such row then).
BENCH_TIMEOUT ?= 45m
BENCH_MULTIHOST := bench/multihost-bench.txt
BENCH_SCALE := bench/scale-bench.txt
BENCH_SCALE_NODES ?= 8,16,32,64
bench:
	$(GO) test -run '^$$' -bench . -benchtime 2s -benchmem ./ipam/
	$(GO) test -count=1 -timeout $(BENCH_TIMEOUT) -run '^$$' -bench BenchmarkMultiHost -benchtime 1x ./test/e2e/ > $(BENCH_MULTIHOST); \
		rc=$$?; cat $(BENCH_MULTIHOST); exit $$rc
	rm -f $(BENCH_SCALE)
	CNM_BGP_SCALE_NODES=$(BENCH_SCALE_NODES) CNM_BGP_SCALE_REPORT=$(CURDIR)/bench/scale.md CNM_BGP_SCALE_TARGETS=$(CURDIR)/$(BENCH_SCALE) $(GO) test -count=1 -timeout $(BENCH_TIMEOUT) -run '^$$' -bench '^BenchmarkBGPScale$$' -benchtime 1x ./test/e2e/
	CALICO_CNM_BENCH=1 CALICO_CNM_BENCH_MULTIHOST=$(CURDIR)/$(BENCH_MULTIHOST) CALICO_CNM_BENCH_SCALE=$(CURDIR)/$(BENCH_SCALE) $(GO) test -count=1 -timeout $(BENCH_TIMEOUT) -run '^TestBenchReport$$' -v ./bench/

# Each fuzz target for FUZZTIME (plain `go test` already runs the committed
# corpus in testdata/fuzz as regression tests).
FUZZTIME ?= 20s
FUZZ_TARGETS := ./plugin/:FuzzPluginHandler ./ipam/:FuzzNormalizePool ./ipam/:FuzzAddPool \
	./driver/:FuzzRequestPool ./driver/:FuzzRequestAddress ./driver/:FuzzReleaseAddress
fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; fn=$${t##*:}; \
		echo "== $$fn ($$pkg) for $(FUZZTIME)"; \
		$(GO) test -run '^$$' -fuzz "^$$fn\$$" -fuzztime $(FUZZTIME) -fuzzminimizetime 5s $$pkg; \
	done

lint:
	$(GO) vet $(PKGS)
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo 'gofmt needed'; exit 1; }

# The main job: the plugin on its embedded datastore, wired into the local
# Docker engine through /run/docker/plugins.
run:
	./scripts/install-deps.sh --system-only
	$(MAKE) build
	./scripts/run-local.sh $(BIN)

# The managed Docker plugin: static binary, rootfs + config.json in
# bin/plugin, then `docker plugin create $(PLUGIN_NAME) bin/plugin` on the
# engine DOCKER_HOST points at. Drivers: --driver $(PLUGIN_NAME):latest
# --ipam-driver $(PLUGIN_NAME):latest. REPLACE=1 replaces an existing plugin,
# NO_CREATE=1 only builds bin/plugin; see docs/managed-plugin.md.
PLUGIN_NAME ?= calico
plugin:
	PLUGIN_NAME=$(PLUGIN_NAME) BIN=$(BIN) VERSION=$(VERSION) GO=$(GO) ./scripts/build-plugin.sh

# Debian packages the tests and `make run` need.
deps:
	./scripts/install-deps.sh

clean:
	rm -rf bin
