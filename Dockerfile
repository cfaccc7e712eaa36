# tollgate's container image (docs/container.md).
#
#   docker build -t tollgate .
#   podman build --format docker -t tollgate .    # `Containerfile` links here
#
# podman: `--format docker`, or the OCI format drops HEALTHCHECK (with a
# warning). Stages: `build` compiles the release binary; `runtime` is the
# image without it; `prebuilt` adds a binary built elsewhere (the test's,
# from `--build-context tollgate-binary=DIR`); `release`, the default, adds
# the one `build` made.

ARG RUST_IMAGE=docker.io/library/rust:1-bookworm
ARG RUNTIME_IMAGE=docker.io/library/debian:bookworm-slim

FROM ${RUST_IMAGE} AS build
WORKDIR /src
COPY . .
# Cargo.lock pins every dependency; the binary's SQL migrations, Lua scripts
# and templates are compiled in, so the binary is all the runtime needs.
RUN cargo build --profile dist --locked --bin tollgate \
    && install -m 0755 target/dist/tollgate /usr/local/bin/tollgate

# Debian slim, as the binary is built on bookworm (glibc 2.36). CA
# certificates for rediss://, PostgreSQL over TLS, the SMS and captcha
# providers and SMTP; nothing else is installed (no shell tools are needed:
# the health check is the binary's own).
FROM ${RUNTIME_IMAGE} AS runtime
ARG VERSION=0.1.0
ARG REVISION=unknown
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin \
    && groupadd --system --gid 10001 tollgate \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/tollgate \
        --no-create-home --shell /usr/sbin/nologin tollgate \
    && install -d -m 0750 -o tollgate -g tollgate /var/lib/tollgate /var/lib/tollgate/spool
# Listens on all interfaces (8080 public, 8081 admin and /metrics) and keeps
# its SQLite audit file and spool in the volume; holds no secret.
COPY packaging/container/tollgate.toml /etc/tollgate/tollgate.toml
LABEL org.opencontainers.image.title="tollgate" \
      org.opencontainers.image.description="Self-hosted anti-abuse service: SMS and login rate limits, with an SQL audit trail" \
      org.opencontainers.image.licenses="MIT" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.documentation="docs/container.md"
ENV TOLLGATE_CONFIG=/etc/tollgate/tollgate.toml
# Numeric, so that Kubernetes' runAsNonRoot can check it.
USER 10001:10001
WORKDIR /var/lib/tollgate
VOLUME ["/var/lib/tollgate"]
EXPOSE 8080 8081
# SIGTERM: stop accepting, finish the requests in flight, flush the audit
# queue (to the database, or the spool), exit 0.
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 \
    CMD ["tollgate", "healthcheck"]
ENTRYPOINT ["tollgate"]
CMD ["serve"]

FROM runtime AS prebuilt
COPY --from=tollgate-binary tollgate /usr/bin/tollgate

FROM runtime AS release
COPY --from=build /usr/local/bin/tollgate /usr/bin/tollgate
