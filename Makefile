# The few commands people run. See README.md.
SHELL := bash
.SHELLFLAGS := -euo pipefail -c
DEMO_DIR ?= $(CURDIR)/.demo

.PHONY: demo demo-down test test-semantics test-faults soak lint bench bench-admission bench-cluster bench-room bench-missed fuzz static control-plane helm oracle tekton real-node

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

## test-semantics: the differential test against Kubernetes' own code, long: every
## contract promise on SEMANTICS_WORLDS generated worlds (default 9000, over 100,000
## admissions), judged by the oracle; prints the counts
SEMANTICS_WORLDS ?= 9000
test-semantics: oracle
	SEMANTICS_WORLDS=$(SEMANTICS_WORLDS) cargo test --locked --release --features oracle --test semantics -- --nocapture

## test-faults: the fault suite in full: every case (berth killed, rolled, its leader
## killed; kube-apiserver and etcd restarted, the watch cut; certificate and CA
## rotated; policies edited and deleted; a flood) under 50 pod creates/s for 60 s,
## against the release build, with a table of results per kind
test-faults: control-plane
	cargo build --locked --release --bin berth
	BERTH_FAULTS=full BERTH_BIN="$(CURDIR)/target/release/berth" \
		cargo test --locked --features e2e --test faults -- --include-ignored --skip soak --nocapture

## soak: the release build under a fixed load of pod creates (SOAK_RATE/s, default 20)
## for SOAK_SECONDS (default 600), its RSS sampled every 10 s and checked flat within 10%
SOAK_SECONDS ?= 600
SOAK_RATE ?= 20
soak: control-plane
	cargo build --locked --release --bin berth
	SOAK_SECONDS=$(SOAK_SECONDS) SOAK_RATE=$(SOAK_RATE) BERTH_BIN="$(CURDIR)/target/release/berth" \
		cargo test --locked --features e2e --test faults -- --ignored --exact soak --nocapture

## bench: criterion benchmark of decision + patch with 1, 20 and 200 policies
bench:
	cargo bench --locked --bench decision

## bench-admission: pod creates/s through the apiserver with and without each part of
## berth's admission, and berth's memory under a flood of 2 MB dry-run pods
bench-admission: control-plane
	cargo bench --locked --bench admission

## bench-cluster: what berth's model of the cluster costs, beside the berth of
## BASELINE_REV (bench-room), then berth beside the native constructs it replaces
## (anti-affinity, pod affinity), on BENCH_NODES fake nodes (default 1000): times,
## ratios, CPU, RSS
bench-cluster: bench-room
	cargo bench --locked --bench cluster

## bench-room: watches, passes, CPU, RSS, a policy change, /mutate and a pool over
## every node, for the berth of BASELINE_REV and for this checkout
bench-room: control-plane
	scripts/bench-room $(BASELINE_REV)

## bench-missed: a CDN Deployment scaled while berth is killed, with onMissed Report
## and Evict: how many of its pods end up on the pool, and how soon
bench-missed: control-plane
	cargo build --quiet --bin berth
	scripts/bench-missed

## fuzz: run the decision fuzz target on one worker for FUZZ_RUNS executions (default
## 2000000), stopped early after FUZZ_SECONDS if set, then libFuzzer's final stats; needs
## the nightly toolchain, installs cargo-fuzz (pinned) once into ~/.cache/berth
FUZZ_RUNS ?= 2000000
FUZZ_SECONDS ?=
fuzz:
	FUZZ_RUNS="$(FUZZ_RUNS)" FUZZ_SECONDS="$(FUZZ_SECONDS)" scripts/fuzz

## static: the Dockerfile's build step: a static release binary
static:
	scripts/build-static

## lint: formatting, clippy with warnings denied, shell syntax, no import circles in
## src/ (scripts/check-circles), and `helm lint` of the chart
lint: helm
	cargo fmt --all -- --check   # the fuzz target too: it is in the workspace
	cargo clippy --locked --all-targets --features e2e,oracle -- -D warnings   # the end-to-end and differential tests too
	cargo check --locked -p berth-fuzz   # keep the fuzz target compiling
	for f in tests/cluster/{build,build-helm,build-oracle,build-tekton,build-node,tekton-up,up,down,add-nodes,add-real-node,remove-real-node,load-image,berth-image,component,berth-up,lib.sh} $$(grep -l '^#!.*bash' scripts/*) .ci/run; do bash -n "$$f"; done
	scripts/check-circles   # no file of src/ uses another that uses it back
	test -z "$$(gofmt -l tests/cluster/oracle)" || { gofmt -l tests/cluster/oracle; exit 1; }
	"$$(tests/cluster/build-helm)" lint --strict charts/berth
	scripts/check-commits   # commit subjects of at most 72 characters

## helm: build helm once from its Go module (tests/cluster/helm), into ~/.cache/berth
helm:
	tests/cluster/build-helm >/dev/null

## oracle: build the oracle (Kubernetes' scheduling, validation and admission-policy
## code for the differential tests) from its Go module, into ~/.cache/berth
oracle:
	tests/cluster/build-oracle >/dev/null

## tekton: build the Tekton Pipelines controller once from its Go module
## (tests/cluster/tekton), with its config/, into ~/.cache/berth
tekton:
	tests/cluster/build-tekton >/dev/null

## control-plane: build etcd and the Kubernetes binaries once, into ~/.cache/berth
control-plane:
	tests/cluster/build >/dev/null

## real-node: build what a real test node runs once (kubelet, containerd, the CNI
## plugins, pause; runc from the distribution), into ~/.cache/berth
real-node:
	tests/cluster/build-node >/dev/null
