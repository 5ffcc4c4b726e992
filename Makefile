# Tests talk to real databases: PostgreSQL on 127.0.0.1:5432 and MariaDB/MySQL on
# 127.0.0.1:3306 (override with OUTBOX_POSTGRES_DSN / OUTBOX_MYSQL_DSN), and brokers on their
# usual ports (see README, Testing). A test whose server is unreachable fails, saying which and
# how to start it, unless OUTBOX_TEST_SKIP names it; OUTBOX_TEST_REQUIRE=all overrides any skip.
export GOTOOLCHAIN := local
GO ?= go
GOOSE_VERSION := v3.29.0
STATICCHECK_VERSION := v0.8.2

# Every Go module of the repository: the core, then the nested modules (transports,
# examples, telemetry and its tests against the transports, the shared test support, the web
# view's browser test), each with its own go.mod so the core never pulls
# in a broker client or a browser driver. go.work
# ties them together for development.
MODULES := . cmd/outbox cmd/outbox-bench cmd/outbox-bench-transports deploy examples/bun examples/customdialect examples/ent examples/gorm examples/libpq examples/pgx examples/sqlc examples/sqlcpgx examples/sqlx logrepl/mysqlbinlog logrepl/pglog otel otel/integration outboxtest pgxv5 outboxui/browsertest transport/amqp transport/kafka transport/nats transport/redis transport/webhook
# The packages of every module, for one go test over all of them: go.work makes the nested
# modules' packages resolvable from here, and one invocation lets go test run the test binaries
# of different modules side by side instead of one module after another.
PACKAGES := ./... $(patsubst %,./%/...,$(filter-out .,$(MODULES)))
# How many test binaries run at once, and how many parallel tests each runs at once (go
# test's default is one per core). The tests mostly wait on the servers (a commit's fsync,
# a lease running out), so more than the two cores of a small machine pays; each test has
# a database of its own. TEST_PARALLEL × TEST_P tests at once keep well inside PostgreSQL's
# default 100 connections.
TEST_P ?= 3
TEST_PARALLEL ?= 4
# Tests whose verdict depends on the machine's speed (rates, latency, deadlines of the mutation
# kit's children) live in files tagged timing: make test leaves them out, make test-timing runs
# them without the race detector. The list is read from those files, never kept by hand.
TIMING_FILES := $(wildcard *timing_test.go */*timing_test.go)
TIMING_TESTS := ^($(shell sed -n 's/^func \(Test[A-Za-z0-9_]*\)(t \*testing.T).*/\1/p' $(TIMING_FILES) | paste -sd'|'))$$
TIMING_PACKAGES := $(sort $(patsubst %/,./%/...,$(filter-out ./,$(dir $(TIMING_FILES)))) $(if $(filter-out %/%,$(TIMING_FILES)),.))

.DEFAULT_GOAL := help

.PHONY: help
help: ## Show this help
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[36m%-17s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: demo
demo: ## Run the demo: an order service and a publisher on embedded SQLite
	$(GO) run ./cmd/outbox-demo

.PHONY: test
test: ## Run every test of every module under the race detector, on every backend and broker (all required; see README)
	$(GO) test -race -count=1 -p $(TEST_P) -parallel $(TEST_PARALLEL) -timeout 20m $(TESTFLAGS) $(PACKAGES)

.PHONY: test-timing
test-timing: ## The tests that measure rates, latency or deadlines (files tagged timing), without the race detector
	$(GO) test -tags timing -count=1 -run '$(TIMING_TESTS)' $(TESTFLAGS) $(TIMING_PACKAGES)

.PHONY: test-norace
test-norace: ## Every test without the race detector: quicker to build, for a local loop
	$(GO) test -count=1 -p $(TEST_P) -parallel $(TEST_PARALLEL) -timeout 30m $(TESTFLAGS) $(PACKAGES)

.PHONY: test-race
test-race: test ## The same as make test, which always runs the race detector

.PHONY: bench
bench: ## Full benchmarks against raw SQL on every backend (writes BENCHMARKS data)
	$(GO) run ./cmd/outbox-bench -mode full

.PHONY: bench-quick
bench-quick: ## The headline benchmark metrics on every backend in a few minutes (full mode or -only for the rest)
	$(GO) run ./cmd/outbox-bench -mode quick

.PHONY: bench-transports
bench-transports: ## NATS, Kafka (in-process), Redis, RabbitMQ and webhook transports against their clients alone, PostgreSQL burn-down included
	mkdir -p bench-results && cd cmd/outbox-bench-transports && $(GO) run . -out ../../bench-results/transports.jsonl

.PHONY: bench-micro
bench-micro: ## In-process micro-benchmarks (validation, hashing, SQL rendering), benchstat-ready
	$(GO) test -run '^$$' -bench . -skip SQLiteClaimAnatomy -benchmem -count 6 .

.PHONY: bench-anatomy
bench-anatomy: ## The SQLite claim and ack taken apart statement by statement (about 4 minutes)
	$(GO) test -run '^$$' -bench SQLiteClaimAnatomy -count 3 .

# Fuzz targets of the root package; make fuzz runs each for FUZZTIME. go test fuzzes one
# target a run, so the instrumented test binary is built once (go test -c -fuzz) and run
# for each target, as go test would run it, instead of linked again for each.
FUZZ_TARGETS := FuzzEnqueue FuzzHeaders FuzzNewTable FuzzValidJSON
FUZZTIME ?= 20s

.PHONY: fuzz
fuzz: ## Fuzz message validation and enqueue, headers, table names and JSON checks (FUZZTIME each, default 20s)
	@set -e; bin=$$(mktemp -d); trap 'rm -rf "$$bin"' EXIT; \
	$(GO) test -c -fuzz '^$$' -o "$$bin/fuzz.test" .; \
	cache="$$($(GO) env GOCACHE)/fuzz/$$($(GO) list .)"; \
	for f in $(FUZZ_TARGETS); do echo "== $$f"; \
		"$$bin/fuzz.test" -test.run '^$$' -test.fuzz "^$$f$$" -test.fuzztime $(FUZZTIME) -test.fuzzcachedir "$$cache"; done
	@echo "== FuzzResolve (cmd/outbox)"; $(GO) test -run '^$$' -fuzz '^FuzzResolve$$' -fuzztime $(FUZZTIME) ./cmd/outbox

.PHONY: screenshots
screenshots: ## Drive the web view in headless chromium and write the README's screenshots into docs/
	cd outboxui/browsertest && OUTBOX_SCREENSHOTS=$(CURDIR)/docs $(GO) test -count=1 -run '^TestBrowser$$' .

# The three parts of make test-faults mostly wait (servers starting, leases and outages
# running out), each on servers of its own, so they run side by side; each one's output is
# printed whole when it ends.
.PHONY: test-faults
test-faults: ## Database restarts, killed connections, lease reclaim, a PostgreSQL failover, a Galera cluster, a NATS JetStream cluster, and each transport's broker hung at default options (about 2 minutes)
	@$(MAKE) --no-print-directory -j3 --output-sync=target test-faults-db test-faults-natscluster test-faults-outages

.PHONY: test-faults-db test-faults-natscluster test-faults-outages
test-faults-db:
	OUTBOX_FAULTS=1 $(GO) test -count=1 -v -timeout 15m -skip '^TestSoak$$' ./internal/faults
test-faults-natscluster:
	OUTBOX_FAULTS=1 $(GO) test -count=1 -v -timeout 5m -tags natscluster -run '^TestJetStreamCluster$$' ./transport/nats
test-faults-outages:
	$(GO) test -count=1 -v -p 5 -timeout 5m -tags acceptance -run '^TestDefaultsOutage$$' ./transport/nats ./transport/kafka ./transport/amqp ./transport/redis ./transport/webhook

SOAK_DURATION ?= 10m

.PHONY: soak
soak: ## Producers and 4 publishers with 5% transport failures on PostgreSQL for SOAK_DURATION (default 10m)
	OUTBOX_FAULTS=1 OUTBOX_SOAK=1 SOAK_DURATION=$(SOAK_DURATION) $(GO) test -count=1 -v -timeout 0 -run '^TestSoak$$' ./internal/faults

.PHONY: lint
lint: ## gofmt, go vet and staticcheck
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PACKAGES)
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) $(PACKAGES)

.PHONY: goose
goose: ## Install the goose command line used to check the migration files
	$(GO) install -tags 'no_clickhouse no_libsql no_mssql no_vertica no_ydb no_duckdb no_spanner no_starrocks' github.com/pressly/goose/v3/cmd/goose@$(GOOSE_VERSION)

.PHONY: ci
ci: ## What CI runs: servers up, all backends required, tests, goose CLI migrations, lint
	bash .ci/run
