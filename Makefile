# The two commands a newcomer needs: `make run` and `make test`. Both install their system packages
# (Debian) when they are missing.
export PATH := /usr/local/go/bin:$(PATH)
GO ?= go
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
PKGS := bubblewrap libseccomp-dev gcc libc6-dev pkg-config python3 git
# JOB_USER is the unprivileged user sbx run by root runs a job as when root owns the job's cwd
# (runner.JobUser; docs/security.md): jobs never run as root unless --allow-root-jobs says so.
JOB_USER := sbx-job

.PHONY: run test test-v2 bench build deps vet fmt-check tidy-check images fleet

# COMPOSE is the Compose CLI this machine has: the docker plugin, else the standalone docker-compose.
COMPOSE := $(shell docker compose version >/dev/null 2>&1 && echo "docker compose" || echo docker-compose)

build:
	$(GO) build -o bin/sbx ./cmd/sbx

run: deps build
	./bin/sbx serve

test: deps fmt-check tidy-check vet
	$(GO) test -race -count=1 -timeout 40m ./...

# test-v2 runs the sandbox, runner and cmd/sbx tests again in a qemu guest whose kernel has only cgroup v2
# (.ci/cgroup2-guest), for hosts on v1/hybrid; a v2 host already ran them in `make test`.
test-v2: deps
	@if [ -e /sys/fs/cgroup/cgroup.controllers ]; then echo "test-v2: this host is on cgroup v2: make test ran them"; \
	else \
		command -v qemu-system-x86_64 >/dev/null && command -v debootstrap >/dev/null && command -v mkfs.ext4 >/dev/null || \
		{ $(SUDO) apt-get update && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y --no-install-recommends qemu-system-x86 debootstrap e2fsprogs; }; \
		.ci/cgroup2-guest; fi

# bench prints each figure beside its baseline, measured in the same run: run-to-exit and jobs/s
# against the jobs' shell run bare (`bash -c true`), readonly against a bare bwrap with the same
# arguments, and output throughput; the cost of sleeping jobs (SBX_BENCH_SLEEPERS, 10000) against the
# same processes with none.
bench: deps
	$(GO) test -run '^$$' -bench 'RunToExit|ExitToNotification|JobsPerSecond' -benchtime 300x -timeout 20m ./cmd/sbx/
	$(GO) test -run '^$$' -bench OutputThroughput -benchtime 3x -timeout 20m ./cmd/sbx/
	$(GO) test -run '^$$' -bench SleepingJobs -benchtime 1x -timeout 30m ./cmd/sbx/
	$(GO) test -run '^$$' -bench . -benchtime 200x -timeout 20m ./sandbox/

# images builds the fleet's images without a registry (deploy/images.sh: base images only when absent).
images: deps
	deploy/images.sh

# fleet starts NATS, a coordinator and three runners (docker-compose.yml, docs/fleet.md).
fleet: images
	$(COMPOSE) up -d --scale runner=3
	@echo 'export SBX_TOKEN=$$($(COMPOSE) exec -T coordinator cat /run/sbx/token)'

vet:
	$(GO) vet ./...

# tidy-check fails when go.mod or go.sum would change under `go mod tidy`.
tidy-check:
	$(GO) mod tidy -diff

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change: $$out"; exit 1; fi

# deps installs the system packages sbx and its tests use, only when one is missing, and creates
# the job user.
deps:
	@missing=; \
	for c in bwrap gcc pkg-config python3 git; do command -v $$c >/dev/null 2>&1 || missing="$$missing $$c"; done; \
	pkg-config --exists libseccomp 2>/dev/null || missing="$$missing libseccomp"; \
	if [ -n "$$missing" ]; then \
		echo "installing system packages (missing:$$missing)"; \
		$(SUDO) apt-get update && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y $(PKGS); \
	fi
	@id -u $(JOB_USER) >/dev/null 2>&1 || { echo "creating the job user $(JOB_USER)"; \
		$(SUDO) useradd --system --create-home --home-dir /var/lib/$(JOB_USER) --shell /usr/sbin/nologin $(JOB_USER); }
