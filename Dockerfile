# syntax=docker/dockerfile:1
#
# The `noetl` binary (every tool kind, DuckDB included) on Debian slim with
# python3 for the `python` kind. Build: `make image` (or `docker build .`).
# Runs as uid 10001 with its data directory (NOETL_HOME) at /var/lib/noetl;
# the Helm chart (charts/noetl) mounts an emptyDir there and on /tmp so the
# root filesystem can stay read-only.

ARG RUST_VERSION=1.95
ARG DEBIAN_RELEASE=trixie

# ---- build ---------------------------------------------------------------
FROM rust:${RUST_VERSION}-slim-${DEBIAN_RELEASE} AS build

# g++: DuckDB is compiled from its C++ sources (the `duckdb` feature).
# Package versions are those of the pinned Debian release; pinning each
# one as well would break the build at every Debian point release.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends g++ \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /src
COPY . .
ENV CARGO_TARGET_DIR=/src/target
# The cache mounts keep crates and compiled dependencies between builds
# (BuildKit); the binary is copied out of the cached target directory.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p noetl-cli \
 && install -D -m 0755 /src/target/release/noetl /out/noetl

# ---- runtime -------------------------------------------------------------
FROM debian:${DEBIAN_RELEASE}-slim

# python3: the `python` tool kind; ca-certificates: TLS to HTTP APIs, S3
# and NATS; tini: PID 1 that forwards SIGTERM to noetl (which then drains)
# and reaps processes orphaned by user Python code. Versions: see above.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates python3 tini \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 noetl \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/noetl \
      --no-create-home --shell /usr/sbin/nologin noetl \
 && install -d -o 10001 -g 10001 -m 0750 /var/lib/noetl

COPY --from=build /out/noetl /usr/local/bin/noetl

ENV NOETL_HOME=/var/lib/noetl \
    HOME=/var/lib/noetl \
    NOETL_PYTHON=python3
WORKDIR /var/lib/noetl
USER 10001:10001
# /healthz, /readyz and /metrics when started with --http-addr 0.0.0.0:9090;
# `noetl serve api` serves the HTTP API and console (and those) on 8082.
EXPOSE 9090 8082
ENTRYPOINT ["/usr/bin/tini", "--", "noetl"]
CMD ["--help"]
