# Triage — make help lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

GO        ?= go
BIN       := $(CURDIR)/.bin
export PATH := $(BIN):$(PATH)
export GOFLAGS ?= -buildvcs=false
# The binaries stamp the VCS revision for `triage version` when git can
# read this checkout (go build fails instead of skipping when it cannot).
BUILDVCS  := $(shell git status --porcelain >/dev/null 2>&1 && echo auto || echo false)

PROTOC_GEN_GO_VERSION      := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.6.2
GRPC_GATEWAY_VERSION       := v2.32.0
GRPCURL_VERSION            := v1.9.3
STATICCHECK_VERSION        := v0.8.2
GOOGLEAPIS_MODULE          := github.com/grpc-ecosystem/grpc-gateway@v1.16.0

.PHONY: help
help: ## List the targets.
	@grep -hE '^[a-zA-Z0-9/_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

.PHONY: deps
deps: ## Install what the bed needs (MariaDB; apt-get when root).
	@./.ci/ensure-mariadb

.PHONY: test-deps
test-deps: deps ## And what the tests need besides (Chromium for the console's browser test, Postgres for the bench's River rows).
	@./.ci/ensure-chromium
	@./.ci/ensure-postgres

.PHONY: build
build: ## Build the binaries into .bin/: triage (production) and triage-bed (bed, drills, bench).
	$(GO) build -buildvcs=$(BUILDVCS) -o $(BIN)/ ./cmd/triage ./cmd/triage-bed

.PHONY: up
up: deps build ## Run the local Triage bed in the foreground (Ctrl-C or make down stops it).
	$(BIN)/triage-bed up $(UP_FLAGS)

.PHONY: down
down: ## Stop a bed started by make up (by the PIDs in .triage/bed.json).
	@if [ -x $(BIN)/triage-bed ]; then $(BIN)/triage-bed down; else $(GO) run ./cmd/triage-bed down; fi

.PHONY: drill
drill: build ## Run a failover drill against the bed of make up: SCENARIO=primary-kill (DRILL_FLAGS=--region eu-west).
	@[ -n "$(SCENARIO)" ] || { echo "usage: make drill SCENARIO=primary-kill|region-down|partition|nats-kill|dequeuer-kill [DRILL_FLAGS=...]"; exit 2; }
	$(BIN)/triage-bed drill $(DRILL_FLAGS) $(SCENARIO)

.PHONY: chaos
chaos: deps build ## Start a three-region bed, run the nemesis on it, stop it: NEMESIS_FLAGS="--duration 30m --seed N" (--bed compose: against make compose-up).
	@mkdir -p .triage; dir=$(CURDIR)/.triage/chaos; rm -rf "$$dir"; \
	if [[ " $(NEMESIS_FLAGS) " == *" --bed compose"* ]]; then exec $(BIN)/triage-bed nemesis $(NEMESIS_FLAGS); fi; \
	echo "starting a three-region bed in $$dir (log: .triage/chaos.log)..."; \
	$(BIN)/triage-bed up --multi-region --free-ports --log-level warn --dir "$$dir" >.triage/chaos.log 2>&1 & pid=$$!; \
	trap '$(BIN)/triage-bed down --dir "'"$$dir"'" >/dev/null 2>&1; wait $$pid' EXIT; \
	for i in $$(seq 180); do [ -f "$$dir/bed.json" ] && break; kill -0 $$pid 2>/dev/null || { tail -30 .triage/chaos.log; exit 1; }; sleep 1; done; \
	$(BIN)/triage-bed nemesis --dir "$$dir" $(NEMESIS_FLAGS)

.PHONY: image
image: ## Build the production image triage:<hash>: the static triage binary alone, CA certificates, user 65532.
	@./deploy/image/build.sh

.PHONY: compose-images
compose-images: ## Build the compose bed's images (no registry; cached by content hash).
	@./deploy/compose/build-images.sh

.PHONY: compose-up
compose-up: ## Run the three-region docker-compose bed (deploy/compose), wait healthy, print the gateways (SPARE_SHARDS=1: and a spare shard).
	@SPARE_SHARDS=$(SPARE_SHARDS) ./deploy/compose/up.sh

.PHONY: compose-down
compose-down: ## Remove the compose bed's containers, networks and volumes.
	@./deploy/compose/down.sh

.PHONY: compose-drill
compose-drill: build ## Drill the compose bed: SCENARIO=primary-kill|region-down|partition|nats-kill|dequeuer-kill [REGION=us-east] [DRILL_FLAGS=...].
	$(BIN)/triage-bed drill --bed compose --project $(or $(COMPOSE_PROJECT_NAME),triage) --region $(or $(REGION),us-east) $(DRILL_FLAGS) \
	  $(or $(SCENARIO),$(error SCENARIO is required: primary-kill, region-down, partition, nats-kill or dequeuer-kill))

# Tests keep their artifacts (the console's screenshots) here unless the
# environment names another directory.
test test/e2e: export TRIAGE_ARTIFACTS ?= $(CURDIR)/.triage/artifacts

.PHONY: test
test: test-deps ## Run every test (unit, integration on real MariaDB + NATS, e2e and the compose bed) with -race.
	@# -p 1 below also compiles one package at a time: build every test
	@# binary on all cores first (a fresh cache: 2m44s against 4m08s on 2
	@# cores); the run then only links. Output shows only on failure.
	@mkdir -p "$$TRIAGE_ARTIFACTS"
	@echo "compiling the test binaries (-race) on every core..."
	@$(GO) test -race -exec /bin/true ./... >"$$TRIAGE_ARTIFACTS/test-compile.log" 2>&1 || { cat "$$TRIAGE_ARTIFACTS/test-compile.log"; exit 1; }
	GO=$(GO) .ci/gotest -race -count=1 -p 1 -timeout 30m ./...

.PHONY: test/e2e
test/e2e: test-deps ## Run only the end-to-end tests: the whole-queue suite, killed processes, drills, the compose bed.
	$(GO) test -race -count=1 -timeout 30m ./e2e/...

.PHONY: lint
lint: ## gofmt, go vet, staticcheck (default checks), a doc.go with a package comment in every package, the serve binary without the bed, and no function over 80 lines.
	@out=$$(gofmt -l $$(git ls-files '*.go' | grep -v '\.pb\.')); if [ -n "$$out" ]; then echo "gofmt needed: $$out"; exit 1; fi
	$(GO) vet ./...
	@[ -x $(BIN)/staticcheck ] && $(BIN)/staticcheck -version | grep -qF '($(STATICCHECK_VERSION:v%=%))' || GOBIN=$(BIN) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	$(BIN)/staticcheck ./...
	$(GO) test -count=1 -run 'TestEveryPackageHasADocComment|TestServeDoesNotLinkTheBed|TestNoLongFunctions' ./cmd/triage/

.PHONY: check-alerts
check-alerts: ## Check the Prometheus alert rules (deploy/prometheus): promtool check rules, then their unit tests.
	@./.ci/ensure-promtool
	@promtool check rules deploy/prometheus/alerts.yml
	@promtool test rules deploy/prometheus/alerts_test.yml

.PHONY: tools
tools: gen-tools ## Install code generators and grpcurl into .bin/.
	GOBIN=$(BIN) $(GO) install github.com/fullstorydev/grpcurl/cmd/grpcurl@$(GRPCURL_VERSION)

.PHONY: gen-tools
gen-tools: # protoc (Debian) and the protoc plugins, pinned.
	@command -v protoc >/dev/null || { [ "$$(id -u)" = 0 ] && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq protobuf-compiler libprotobuf-dev >/dev/null; } || { echo "protoc missing: install protobuf-compiler"; exit 1; }
	GOBIN=$(BIN) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
	GOBIN=$(BIN) $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)
	GOBIN=$(BIN) $(GO) install github.com/grpc-ecosystem/grpc-gateway/v2/protoc-gen-grpc-gateway@$(GRPC_GATEWAY_VERSION)
	GOBIN=$(BIN) $(GO) install github.com/grpc-ecosystem/grpc-gateway/v2/protoc-gen-openapiv2@$(GRPC_GATEWAY_VERSION)

.PHONY: generate
generate: gen-tools ## Regenerate Go, gateway and OpenAPI code from proto/.
	@gapis=$$($(GO) mod download -json $(GOOGLEAPIS_MODULE) | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')/third_party/googleapis; \
	wkt=$$(dirname $$(dirname $$(command -v protoc)))/include; \
	protoc -I proto -I $$gapis -I $$wkt \
	  --go_out=proto --go_opt=paths=source_relative \
	  --go-grpc_out=proto --go-grpc_opt=paths=source_relative \
	  --grpc-gateway_out=proto --grpc-gateway_opt=paths=source_relative \
	  $$(find proto -name '*.proto' | sort); \
	protoc -I proto -I $$gapis -I $$wkt --openapiv2_out=proto proto/triage/v1/triage.proto

.PHONY: bench
bench: deps build ## Benchmarks side by side with baselines and River on Postgres (BENCH_QUICK=1 for a short run).
	@./.ci/ensure-postgres
	$(BIN)/triage-bed bench $(if $(BENCH_QUICK),--quick,)

comma := ,

.PHONY: scale
scale: deps build ## The control plane at many shards, measured (SHARDS=10,100,1000; SCALE_FLAGS=--failover ...): writes .triage/scale.json.
	$(BIN)/triage-bed scale --shards $(or $(SHARDS),10$(comma)100$(comma)1000) $(SCALE_FLAGS)

.PHONY: clean
clean: ## Remove build output and bed state.
	rm -rf $(BIN) .triage
