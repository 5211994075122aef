# The few commands people run. See README.md.
SHELL := bash
.SHELLFLAGS := -euo pipefail -c
DEMO_DIR ?= $(CURDIR)/.demo

.PHONY: demo demo-down test lint bench bench-admission bench-cluster fuzz static control-plane helm

## demo: start a local control plane with four nodes and show berth at work; leaves it running
demo: control-plane
	scripts/demo "$(DEMO_DIR)"

## demo-down: stop what `make demo` started
demo-down:
	@if [ -d "$(DEMO_DIR)" ]; then tests/cluster/down "$(DEMO_DIR)"; else echo "no demo running"; fi

## test: the whole suite in tiers (lint, fast, end-to-end on a real control plane),
## printing the time each took; `cargo test` alone runs the fast tier
test:
	scripts/test-tiers

## bench: criterion benchmark of decision + patch with 1, 20 and 200 policies
bench:
	cargo bench --locked --bench decision

## bench-admission: pod creates/s through the apiserver with and without each part of
## berth's admission, and berth's memory under a flood of 2 MB dry-run pods
bench-admission: control-plane
	cargo bench --locked --bench admission

## bench-cluster: berth beside the native constructs it replaces (anti-affinity,
## pod affinity), on BENCH_NODES fake nodes (default 1000): times, ratios, CPU, RSS
bench-cluster: control-plane
	cargo bench --locked --bench cluster

## fuzz: run the decision fuzz target for FUZZ_SECONDS (needs nightly and cargo-fuzz)
FUZZ_SECONDS ?= 600
fuzz:
	cd fuzz && cargo +nightly fuzz run decide -- -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1

## static: the Dockerfile's build step: a static release binary
static:
	scripts/build-static

## lint: formatting, clippy with warnings denied, shell syntax, and `helm lint` of the chart
lint: helm
	cargo fmt --all -- --check   # the fuzz target too: it is in the workspace
	cargo clippy --locked --all-targets --features e2e -- -D warnings   # the end-to-end tests too
	cargo check --locked -p berth-fuzz   # keep the fuzz target compiling
	for f in tests/cluster/{build,build-helm,up,down,add-nodes,component,berth-up,lib.sh} scripts/* .ci/run; do bash -n "$$f"; done
	"$$(tests/cluster/build-helm)" lint --strict charts/berth

## helm: build helm once from its Go module (tests/cluster/helm), into ~/.cache/berth
helm:
	tests/cluster/build-helm >/dev/null

## control-plane: build etcd and the Kubernetes binaries once, into ~/.cache/berth
control-plane:
	tests/cluster/build >/dev/null
