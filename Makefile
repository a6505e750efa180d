# Triage — make help lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

GO        ?= go
BIN       := $(CURDIR)/.bin
export PATH := $(BIN):$(PATH)
export GOFLAGS ?= -buildvcs=false

PROTOC_GEN_GO_VERSION      := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.6.2
GRPC_GATEWAY_VERSION       := v2.32.0
GRPCURL_VERSION            := v1.9.3
GOOGLEAPIS_MODULE          := github.com/grpc-ecosystem/grpc-gateway@v1.16.0

.PHONY: help
help: ## List the targets.
	@grep -hE '^[a-zA-Z0-9/_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

.PHONY: deps
deps: ## Install what the bed and tests need (MariaDB; apt-get when root).
	@./.ci/ensure-mariadb

.PHONY: build
build: ## Build the triage binary into .bin/.
	$(GO) build -o $(BIN)/triage ./cmd/triage

.PHONY: up
up: deps build ## Run the local Triage bed in the foreground (Ctrl-C or make down stops it).
	$(BIN)/triage up $(UP_FLAGS)

.PHONY: down
down: ## Stop a bed started by make up (by the PIDs in .triage/bed.json).
	@if [ -x $(BIN)/triage ]; then $(BIN)/triage down; else $(GO) run ./cmd/triage down; fi

.PHONY: compose-images
compose-images: ## Build the compose bed's images (no registry; cached by content hash).
	@./deploy/compose/build-images.sh

.PHONY: compose-up
compose-up: ## Run the three-region docker-compose bed (deploy/compose), wait healthy, print the gateways.
	@./deploy/compose/up.sh

.PHONY: compose-down
compose-down: ## Remove the compose bed's containers, networks and volumes.
	@./deploy/compose/down.sh

.PHONY: compose-drill
compose-drill: build ## Drill the compose bed: SCENARIO=primary-kill|region-down|partition|nats-kill|dequeuer-kill [REGION=us-east] [DRILL_FLAGS=...].
	$(BIN)/triage drill --bed compose --project $(or $(COMPOSE_PROJECT_NAME),triage) --region $(or $(REGION),us-east) $(DRILL_FLAGS) \
	  $(or $(SCENARIO),$(error SCENARIO is required: primary-kill, region-down, partition, nats-kill or dequeuer-kill))

.PHONY: test
test: deps ## Run every test (unit, integration on real MariaDB + NATS, e2e and the compose bed) with -race.
	$(GO) test -race -count=1 -p 1 -timeout 30m ./...

.PHONY: test/e2e
test/e2e: deps ## Run only the end-to-end tests against the built binary.
	$(GO) test -race -count=1 -timeout 15m ./e2e/...

.PHONY: lint
lint: ## gofmt, go vet, and a doc.go in every package.
	@out=$$(gofmt -l $$(git ls-files '*.go' | grep -v '\.pb\.')); if [ -n "$$out" ]; then echo "gofmt needed: $$out"; exit 1; fi
	$(GO) vet ./...
	@missing=$$(for d in $$($(GO) list -f '{{.Dir}}' ./...); do [ -f $$d/doc.go ] || echo $${d#$(CURDIR)/}; done); if [ -n "$$missing" ]; then echo "packages without a doc.go: $$missing"; exit 1; fi

.PHONY: tools
tools: gen-tools ## Install code generators and grpcurl into .bin/.
	GOBIN=$(BIN) $(GO) install github.com/fullstorydev/grpcurl/cmd/grpcurl@$(GRPCURL_VERSION)

.PHONY: gen-tools
gen-tools: # protoc (Debian) and the protoc plugins, pinned.
	@command -v protoc >/dev/null || { [ "$$(id -u)" = 0 ] && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq protobuf-compiler libprotobuf-dev >/dev/null; } || { echo "protoc missing: install protobuf-compiler"; exit 1; }
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
bench: deps build ## Benchmarks side by side with baselines (BENCH_QUICK=1 for a short run).
	$(BIN)/triage bench $(if $(BENCH_QUICK),--quick,)

.PHONY: clean
clean: ## Remove build output and bed state.
	rm -rf $(BIN) .triage
