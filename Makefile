# gendurable's tasks. `make help` lists them.
GO       ?= go
ROOT     := $(CURDIR)
LINT     := $(GO) tool -modfile=$(ROOT)/tools/go.mod golangci-lint
# The contrib modules (adapters with heavy dependencies) and e2e (the dashboard's browser tests,
# which need Chromium), each with its own go.mod: every target that vets, tests, lints or tidies
# the root module does the same in each of them.
CONTRIB  := $(patsubst %/go.mod,%,$(wildcard contrib/*/go.mod)) e2e
# The tests' Postgres: DATABASE_URL, else 127.0.0.1:5432, else a throwaway cluster (see README).
TESTFLAGS ?=
# make test runs in three steps. First the latency-bound tests, alone (one package at a time,
# nothing else on the cores): they measure milliseconds or seconds (the await bridge's p95, poke
# and poll-floor latencies, contrib/redispoke's trips through Redis and its pings' answers, a
# partitioned worker's takeover, the bad-input canary, a fair queue's slot occupancy, which its
# picks' latency under load lowers), or need the machine's full throughput for
# their fault to land (connection resets during commits). Then, at once, vet and lint, each
# contrib module's tests, and the tests that run a Postgres cluster of their own (the soaks, the
# session kills, the clock skew, the full disks and the read-only server together, then the failover's pg_auto_failover formation and the full NOTIFY queue, one at a time): each of those offers a fixed load well under what
# its cluster can do (a soak offers 40% of the capacity it measured) and judges its cluster
# against itself (the clock skew's time bounds are its cluster's clock, with seconds of slack),
# so neighbours slow nothing it measures, and they leave most of the cores idle: beside them also
# run the tests of the packages in SIDE, the deterministic race tests (-tags chaos) and the other
# packages' tests, one after another (test/more), which fill the cores the cluster tests leave
# idle. Then the root package's tests, then internal/chaos's fault tests at their CI size, one
# after the other: each keeps both cores busy, and the two at once took longer than one after
# the other. Within a package, tests run as many at once as there are cores, each in a schema (or
# database) of its own; more at once would slow each other down (the cores are busy, the
# server's too) and run out of the server's 100 connections. LATENCY and CLUSTER are go test -run
# regexps over the root package's and internal/chaos's tests; every other run skips them.
LATENCY := ^(TestAwait.*|TestFairShareBurstDoesNotStarveSmallTenants|TestFairKeyAloneUsesEverySlot|TestSecurity.*|TestSaturatedKeyDoesNotStarveTheWorkBehindIt|TestRateLimitConservesTokensAcrossEightClients|TestPoke.*|TestLostPokesCostAtMostAPoll|TestSignalPokesTheParkedInstancesNode|TestFanOutRoundTripWithoutPolling|TestBadInput|TestPostgresRestartMidRun|TestSmokeSuite.*|TestPartitionedWorkerIsFencedOut|TestConnectionResetsLoseCommitAcks)$$
CLUSTER := ^(TestBloatSoak|TestLongSnapshotDuringSoak|TestSessionKills|TestStatementCancelsLoseNothing|TestWorkersOffTheDatabaseClockKeepLeasesHonest|TestDatabaseClockJumpsAheadLosesNothing|TestDatabaseClockStepsBackLosesNothing|TestDiskFullLosesNothing|TestWALDiskFullLosesNothing|TestConnectionsRunOutLosesNothing|TestRestoredBackupLosesNothing|TestReadOnlyServerLosesNothing|TestTableLockedPastTheLeaseLosesNothing|TestFailoverLosesNothing|TestNotifyQueueFullLosesNothing)$$
# FAILOVER: the cluster tests that are no light neighbours (a pg_auto_failover formation of three
# servers and three busy workers; gigabytes of notifications written to fill the server's NOTIFY
# queue); test/cluster runs them after the others, one at a time, not beside them.
FAILOVER := ^(TestFailoverLosesNothing|TestNotifyQueueFullLosesNothing)$$
# contrib/redispoke's tests measure a poke's trip between processes through Redis, and its
# pings' answers within 100ms: test/latency runs them, with the others; test/contrib vets it.
# SIDE: the packages whose tests test/side runs (in test/more, beside the cluster tests).
SIDE     := ./cmd/gendurable ./internal/store ./internal/maintenance
SIDE_RE  := /(cmd/gendurable|internal/store|internal/maintenance)
# test/contrib's jobs: one per contrib module (and e2e).
CONTRIB_JOBS := $(CONTRIB:%=test/contrib/%)
# make chaos: RUN picks the tests (a go test -run regexp; default all), CHAOSFLAGS how they run
# (default one package and one test at a time, so that no fault test's figures are another's
# load), CHAOSLOG where the verbose output goes. See docs/reliability.md.
RUN        ?= .
CHAOSFLAGS ?= -p 1 -parallel 1 -timeout 90m
CHAOSLOG   ?= chaos.log

.PHONY: help demo test test/latency test/root test/packages test/side test/faults test/cluster test/tagged test/contrib $(CONTRIB_JOBS) test/more test/race vet lint bench chaos chaos/random fuzz tidy

help: ## list the targets
	@grep -E '^[a-zA-Z/_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  %-12s %s\n", $$1, $$2}'

demo: ## run the demo: an order-processing workflow over a few thousand instances
	$(GO) run ./cmd/gendurable demo

test: ## vet, lint and every test (contrib modules included) against a real Postgres
	@$(MAKE) --no-print-directory test/latency
	@$(MAKE) --no-print-directory -j6 --output-sync=target vet test/cluster test/contrib test/more
	@$(MAKE) --no-print-directory test/root
	@$(MAKE) --no-print-directory test/faults

vet: ## go vet with -tags chaos (lint vets the rest), then lint
	$(GO) vet -tags chaos ./...
	@$(MAKE) --no-print-directory lint

test/latency: ## the latency-bound tests, alone
	$(GO) test -p 1 -count=1 -timeout 5m -run '$(LATENCY)' $(TESTFLAGS) . ./internal/chaos/
	cd contrib/redispoke && $(GO) test -count=1 -timeout 5m $(TESTFLAGS) ./...

test/root: ## the root package's tests but the latency-bound ones
	$(GO) test -count=1 -timeout 10m -skip '$(LATENCY)' $(TESTFLAGS) .

test/packages: ## the tests of every package but the root, internal/chaos and SIDE, one package at a time
	$(GO) test -p 1 -count=1 -timeout 10m $(TESTFLAGS) $$($(GO) list ./... | grep -v -x -E '$(shell $(GO) list .)|.*/internal/chaos|.*$(SIDE_RE)')

test/side: ## the tests of the packages in SIDE, one package at a time
	$(GO) test -p 1 -count=1 -timeout 10m $(TESTFLAGS) $(SIDE)

test/faults: ## internal/chaos's fault tests at their CI size, but the latency-bound and own-cluster ones
	$(GO) test -count=1 -timeout 10m -skip '$(LATENCY)|$(CLUSTER)' $(TESTFLAGS) ./internal/chaos/

test/tagged: ## the deterministic race tests, which drive the engine's fault points (-tags chaos)
	$(GO) test -count=1 -tags chaos -run '^TestChaos' -timeout 10m $(TESTFLAGS) ./internal/fault/ ./internal/chaos/

test/cluster: ## the fault tests that run a Postgres cluster of their own (soaks, session kills, clock skew) together, then the failover and the full NOTIFY queue
	$(GO) test -count=1 -parallel 3 -timeout 10m -run '$(CLUSTER)' -skip '$(FAILOVER)' $(TESTFLAGS) ./internal/chaos/
	$(GO) test -count=1 -parallel 1 -timeout 10m -run '$(FAILOVER)' $(TESTFLAGS) ./internal/chaos/

test/contrib: $(CONTRIB_JOBS) ## vet and test the contrib modules and e2e (contrib/redispoke's tests are test/latency's)

$(CONTRIB_JOBS): test/contrib/%:
	cd $* && $(GO) vet ./...
	$(if $(filter contrib/redispoke,$*),,cd $* && $(GO) test -count=1 -timeout 10m $(TESTFLAGS) ./...)

test/more: ## test/side, test/tagged and test/packages, one after another
	@$(MAKE) --no-print-directory test/side
	@$(MAKE) --no-print-directory test/tagged
	@$(MAKE) --no-print-directory test/packages

test/race: ## the tests under the race detector
	$(GO) test -count=1 -race -timeout 20m $(TESTFLAGS) ./...
	@set -e; for dir in $(CONTRIB); do \
		echo "cd $$dir && $(GO) test -count=1 -race ./..."; \
		(cd $$dir && $(GO) test -count=1 -race -timeout 10m $(TESTFLAGS) ./...); \
	done

lint: ## gofmt, go vet and golangci-lint (pinned in tools/go.mod)
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || (gofmt -l $$(git ls-files '*.go'); echo 'gofmt needed'; exit 1)
	$(LINT) run ./...
	@set -e; for dir in $(CONTRIB); do \
		echo "cd $$dir && golangci-lint run ./..."; \
		(cd $$dir && $(LINT) run ./...); \
	done

chaos: ## the reliability suite at full size (GD_CHAOS=full), then its summary table; RUN=regexp narrows it
	@rm -f $(CHAOSLOG).status
	@{ GD_CHAOS=full $(if $(GD_FAULT_P),GD_FAULT_P=$(GD_FAULT_P)) $(GO) test -count=1 -v $(CHAOSFLAGS) -run '$(RUN)' $(TESTFLAGS) ./...; \
	   echo $$? > $(CHAOSLOG).status; } 2>&1 | tee $(CHAOSLOG)
	@echo; echo "== chaos summary ($(CHAOSLOG))"
	@status=$$(cat $(CHAOSLOG).status); rm -f $(CHAOSLOG).status; \
	$(GO) run ./internal/chaos/chaosreport $(CHAOSLOG) && exit $$status

# make chaos/random: the same run with the engine's fault points built in (-tags chaos) and
# switched on at random for the whole run: each point reached fires with probability FAULT_P,
# as a delay of up to 20ms, or, where its caller recovers by itself (a heartbeat, a reaper or GC
# sweep, an inbox purge after a committed outcome), as an injected error half the time. Every
# test, worker processes included, still ends with the oracle; CHAOSLOG defaults to
# chaos-random.log. GD_FAULT_SEED replays a run's draws (each process prints its seed).
FAULT_P ?= 0.01

chaos/random: ## make chaos with the random fault points on (FAULT_P, default 0.01); RUN=regexp narrows it
	@$(MAKE) --no-print-directory chaos CHAOSLOG=$(if $(filter command line,$(origin CHAOSLOG)),$(CHAOSLOG),chaos-random.log) \
		TESTFLAGS='-tags chaos $(TESTFLAGS)' GD_FAULT_P=$(FAULT_P)

# make fuzz: every fuzz target for FUZZTIME each, one after the other (go test takes one -fuzz
# target per package and run); scripts/fuzz says why a bare deadline error is not a failure.
FUZZTIME ?= 5m
FUZZ     := .:FuzzInsertValidate .:FuzzSignal .:FuzzConfig .:FuzzOutcome ./durablemigrate:FuzzIdentifier ./internal/jsonx:FuzzDecodeState

fuzz: ## run every fuzz target for FUZZTIME (default 5m) each, then a summary
	FUZZTIME=$(FUZZTIME) GO=$(GO) ./scripts/fuzz $(FUZZ)

bench: ## run the benchmark suite (gendurable bench) on the resolved Postgres
	$(GO) run ./cmd/gendurable bench

tidy: ## tidy every module: the root, the tools and the contrib modules
	$(GO) mod tidy
	cd tools && $(GO) mod tidy
	@set -e; for dir in $(CONTRIB); do echo "cd $$dir && $(GO) mod tidy"; (cd $$dir && $(GO) mod tidy); done
