# gendurable's tasks. `make help` lists them.
GO       ?= go
LINT     := $(GO) tool -modfile=tools/go.mod golangci-lint
# The tests' Postgres: DATABASE_URL, else 127.0.0.1:5432, else a throwaway cluster (see README).
TESTFLAGS ?=

.PHONY: help demo test test/race lint bench chaos tidy

help: ## list the targets
	@grep -E '^[a-zA-Z/_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  %-12s %s\n", $$1, $$2}'

demo: ## run the demo: an order-processing workflow over a few thousand instances
	$(GO) run ./cmd/gendurable demo

test: ## vet and run every test against a real Postgres
	$(GO) vet ./...
	$(GO) test -count=1 -timeout 15m $(TESTFLAGS) ./...

test/race: ## the tests under the race detector
	$(GO) test -count=1 -race -timeout 20m $(TESTFLAGS) ./...

lint: ## gofmt, go vet and golangci-lint (pinned in tools/go.mod)
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || (gofmt -l $$(git ls-files '*.go'); echo 'gofmt needed'; exit 1)
	$(LINT) run ./...

bench: ## run the benchmark suite (gendurable bench) on the resolved Postgres
	$(GO) run ./cmd/gendurable bench

tidy: ## tidy both modules
	$(GO) mod tidy
	cd tools && $(GO) mod tidy
