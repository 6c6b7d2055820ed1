# syntax=docker/dockerfile:1
# The ferrovol image that deploy/kubernetes runs:
#
#   docker build -t ghcr.io/ferrovol/ferrovol:0.1.0 .
#
# Build stage: the Rust toolchain on the same Debian release as the runtime, so the binary
# links against the glibc it will find. protoc comes from the protoc-bin-vendored crate; no
# system protobuf compiler is needed. The dependencies need Rust 1.88 or newer.
ARG RUST_VERSION=1.95
FROM rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin ferrovol \
    && install -D -m 0755 target/release/ferrovol /out/ferrovol

# Runtime: the binary and only the tools it runs.
#   e2fsprogs             mkfs.ext4, resize2fs, e2fsck
#   xfsprogs              mkfs.xfs, xfs_growfs
#   btrfs-progs           mkfs.btrfs, btrfs filesystem resize
#   util-linux            blkid
#   mount                 mount, umount, losetup
#   lvm2, thin-provisioning-tools   the LVM backend
FROM debian:bookworm-slim
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        e2fsprogs xfsprogs btrfs-progs util-linux mount lvm2 thin-provisioning-tools \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/ferrovol /usr/local/bin/ferrovol
# The node service must run as root (loop devices, mkfs, mount); the Kubernetes manifests
# drop every privilege for the controller-only instance.
ENTRYPOINT ["/usr/local/bin/ferrovol"]
