# The two commands of the README:
#   make demo   the main job: two real nodes, ecall:send/2 against `!`
#   make test   every test: Rust unit and integration tests, Common Test on real nodes
# Both install what they need first (Erlang from Debian packages, as root).
SHELL := /bin/bash
export ECALL_OTP27_CACHE ?= /var/cache/ecall-otp27
export ECALL_OTP29_CACHE ?= /var/cache/ecall-otp29

.PHONY: all deps build demo test test-rust test-ct test-build chaos examples check clean config-doc

all: build

deps:
	@bash .ci/deps.sh

build: deps
	rebar3 compile

demo: build
	test/scripts/with_epmd.sh bench/run.sh demo

test: build test-rust test-ct test-build

# Then the loom model tests of the writer's state and the byte budget
# (every interleaving, to three preemptions; a few seconds).
test-rust:
	test/scripts/with_epmd.sh cargo test --release --workspace
	cargo test --release -p ecall_dist --features loom --lib loom_

test-ct:
	test/scripts/ct.sh

# The chaos suite for longer than `make test' runs it: rounds of
# CHAOS_TESTS sequences for CHAOS_MINUTES, or one round with CHAOS_SEED
# (test/scripts/chaos.sh).
chaos: build
	test/scripts/chaos.sh

# The build without cargo: the message, then ECALL_NO_NIF=1 and two nodes on
# the pure-Erlang transport; a library installed while two nodes run it; and
# the check that fails a run in which a test's node crashed.
test-build:
	test/scripts/no_nif_build.sh
	test/scripts/nif_reinstall.sh
	test/scripts/crash_check.sh

# examples/: a mix project and a relx release, each on two nodes.
examples: build
	examples/run.sh

# Static checks (CI runs them before the tests).
check: deps
	cargo fmt --all -- --check
	cargo clippy --release --workspace --all-targets -- -D warnings
	cargo clippy --release -p ecall_dist --features loom --all-targets -- -D warnings
	@# The maintainers' API docs (private items included) build without a warning.
	RUSTDOCFLAGS="-D warnings -A rustdoc::private_intra_doc_links" cargo doc --release --workspace --no-deps --document-private-items
	rebar3 xref
	escript test/scripts/layers.escript _build/default/lib/ecall/ebin
	rebar3 dialyzer
	rebar3 edoc
	@# The benchmark's scripts and modules (not part of the app), warnings as errors.
	python3 -m py_compile bench/plot.py bench/profile.py
	mkdir -p _build/check && erlc +warnings_as_errors -o _build/check -I test bench/ecall_bench.erl bench/ecall_bench_big.erl bench/ecall_bench_fanout.erl test/ecall_test_nodes.erl

# doc/configuration.md, from ecall_config:spec/0 (a test checks they agree).
config-doc: build
	erl -noshell -pa _build/default/lib/ecall/ebin -eval 'ok = ecall_config:write_doc("doc/configuration.md"), halt().'

clean:
	rm -rf _build priv/*.so examples/*/_build examples/*/deps
