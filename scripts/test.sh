#!/usr/bin/env bash
# Runs every ferrovol check and test: format, lints, the CSI wire-format check, unit tests
# and the integration suites (real loop devices, mkfs and mounts, so it needs root).
# Installs what the tests need first, idempotently: xfsprogs, btrfs-progs, e2fsprogs,
# util-linux, the Python protobuf tools for the wire check, and kubectl (for
# `kubectl kustomize`), PyYAML and kubernetes-validate for the manifest checks.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
  echo "scripts/test.sh: the integration tests need root (loop devices, mkfs, mount)" >&2
  exit 1
fi

# tool -> Debian package that provides it
declare -A packages=(
  [mkfs.ext4]=e2fsprogs [resize2fs]=e2fsprogs
  [mkfs.xfs]=xfsprogs [xfs_growfs]=xfsprogs
  [mkfs.btrfs]=btrfs-progs
  [blkid]=util-linux [losetup]=mount
  [kubectl]=kubernetes-client
)
missing=()
for tool in "${!packages[@]}"; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("${packages[$tool]}")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: $(printf '%s\n' "${missing[@]}" | sort -u | tr '\n' ' ')"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    $(printf '%s\n' "${missing[@]}" | sort -u) >/dev/null
fi
python3 -c 'import google.protobuf, grpc_tools' 2>/dev/null \
  || python3 -m pip install --quiet --disable-pip-version-check grpcio-tools protobuf
python3 -c 'import yaml, kubernetes_validate' 2>/dev/null \
  || python3 -m pip install --quiet --disable-pip-version-check kubernetes-validate pyyaml
modprobe loop 2>/dev/null || true
[ -e /dev/loop-control ] || { echo "no /dev/loop-control: the kernel lacks loop devices" >&2; exit 1; }

echo "== cargo fmt"
cargo fmt --all -- --check
# The `crash-points` feature arms the driver's crash points for tests/sanity/crash.rs
# (inert unless FERROVOL_CRASH_AT names one); every test runs on that one build.
echo "== cargo clippy"
cargo clippy --all-targets --features crash-points --quiet -- -D warnings
echo "== CSI v1.12 wire format"
if [ -x ../shared/tools/csi-wire-table ] && [ -f ../shared/csi-wire.tsv ]; then
  diff ../shared/csi-wire.tsv <(../shared/tools/csi-wire-table proto/csi.proto)
  echo "proto/csi.proto matches the CSI v1.12 wire table"
elif [ "${CI:-}" = true ]; then
  echo "../shared/tools/csi-wire-table is missing; CI must check the wire format" >&2
  exit 1
else
  echo "skipped: ../shared/tools/csi-wire-table not found (outside the team checkout)"
fi
echo "== cargo test"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
rm -f target/vm/lvm-suite-passed
cargo test --all-targets --features crash-points -- --test-threads "${FERROVOL_TEST_THREADS:-4}" 2>&1 | tee "$log"
# One closing line over every test binary (cargo's own last line belongs to whichever
# target ran last, often one with no tests).
# Ignored tests are the lvm backend's own: they need device-mapper, so they run inside the
# LVM guest (sanity's lvm_guest test boots it), not on the host.
awk -v g="$(cat target/vm/lvm-suite-passed 2>/dev/null || echo 0)" '/^test result:/ { p += $4; f += $6; i += $8 }
     END { printf "ferrovol: %d passed, %d failed, %d ignored on the host (lvm-only, run in the guest); %d tests passed in the LVM guest\n", p, f, i, g
           exit (p == 0 || f > 0 || g == 0) }' "$log"
