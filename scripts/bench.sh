#!/usr/bin/env bash
# Runs every ferrovol benchmark and prints the figures BENCHMARKS.md reports:
#   - start-up: process start to the first Probe answering ready=true
#   - resident memory: idle, and with 1,000 volumes present
#   - create-delete: per-RPC latency and pairs/s at concurrency 1 and 16, with 0 and
#     1,000 volumes present (`ferrovol bench create-delete`)
#   - node-cycle for ext4, xfs and block (`ferrovol bench node-cycle`) against the plain
#     tools floor (scripts/bench-floor.sh)
#   - snapshot and restore of a 1 GiB volume holding 512 MiB on an XFS reflink pool
#   - fio through a published ext4 volume against the pool filesystem itself
#
#   scripts/bench.sh [OUT_DIR]        (as root; REPEAT=N runs each figure N times, default 3)
#
# Benchmarks print figures; they assert nothing. Every figure is the median of REPEAT
# runs. Raw reports (JSON, fio output) go to OUT_DIR (default /var/tmp/ferrovol-bench/out).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
[ "$(id -u)" = 0 ] || { echo "scripts/bench.sh needs root (loop devices, mounts)" >&2; exit 1; }
REPEAT=${REPEAT:-3}
base=/var/tmp/ferrovol-bench
out=${1:-$base/out}

command -v fio >/dev/null && command -v bc >/dev/null || {
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends fio bc >/dev/null
}
cargo build --release --quiet --bin ferrovol --example bench_tools
ferrovol=$repo/target/release/ferrovol
tools=$repo/target/release/examples/bench_tools

mkdir -p "$base" "$out"
work=$base/work          # staging and target paths (the drivers' --path-root)
mkdir -p "$work"
pids=()
xfs_image=$base/xfs-pool.img
xfs_pool=$base/xfs-pool
fio_id=
cleanup() {
  # A volume left published for fio goes first, while its driver still runs.
  if [ -n "$fio_id" ]; then "$tools" down "$endpoint" "$fio_id" "$staging" "$target" || true; fi
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true; done
  if mountpoint -q "$xfs_pool" 2>/dev/null; then umount "$xfs_pool" || true; fi
}
trap cleanup EXIT

median() { sort -n | awk '{a[NR]=$1} END {if (NR==0) print "n/a"; else print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
# A field of a run (jq-free): python reads the bench's JSON report.
field() { python3 -c "
import json,sys
r=json.load(open(sys.argv[1])); run=r['runs'][int(sys.argv[2])]; key=sys.argv[3]
if key.startswith('call:'):
    _,call,k=key.split(':'); print(next(c[k] for c in run['calls'] if c['call']==call))
else: print(run[key])" "$@"; }

# start_driver NAME POOL_DIR: a fresh driver with its own state; sets $endpoint and $pid.
start_driver() {
  local name=$1 pool=$2
  rm -rf "$base/$name-state"
  mkdir -p "$pool"
  endpoint=unix://$base/$name.sock
  RUST_LOG=warn "$ferrovol" --endpoint "$endpoint" --node-id bench-node \
    --state-dir "$base/$name-state" --pool-dir "$pool" --path-root "$work" \
    --metrics-address off >"$out/$name-driver.log" 2>&1 &
  pid=$!
  pids+=("$pid")
  for _ in $(seq 100); do [ -S "$base/$name.sock" ] && break; sleep 0.05; done
}
stop_driver() { kill "$1"; wait "$1" 2>/dev/null || true; }
rss_kib() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }
bench() { "$ferrovol" bench --endpoint "$endpoint" --output json "$@"; }

echo "machine: $(nproc) cores, kernel $(uname -r), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "pool filesystem (ext4 runs): $(df -T "$base" | awk 'NR==2 {print $2" on "$1}')"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"

# --- start-up and memory --------------------------------------------------------------
for r in $(seq "$REPEAT"); do
  rm -rf "$base/probe-state"
  "$tools" first-probe "unix://$base/probe.sock" -- "$ferrovol" --endpoint "unix://$base/probe.sock" \
    --state-dir "$base/probe-state" --pool-dir "$base/probe-pool" --path-root "$work" \
    --metrics-address off
done | tee "$out/first-probe.txt" >/dev/null
echo "first Probe after start: median $(median <"$out/first-probe.txt") ms (runs: $(tr '\n' ' ' <"$out/first-probe.txt"))"

start_driver loop "$base/loop-pool"
loop_pid=$pid
# One Probe, so the idle figure includes a served connection.
"$ferrovol" bench create-delete --endpoint "$endpoint" -n 1 -c 1 --size 16M --output json >/dev/null
sleep 1
echo "RSS idle: $(rss_kib "$loop_pid") KiB"
"$tools" fill "$endpoint" rss 1000 16M
sleep 1
echo "RSS with 1000 volumes: $(rss_kib "$loop_pid") KiB"
"$tools" drain "$endpoint" rss 1000

# --- create-delete ----------------------------------------------------------------------
# cd_runs LABEL: every spec once per repeat, interleaved, so that drift in the machine's
# load spreads over all of them alike; then one line per spec.
cd_specs=("1 0 500" "16 0 4000" "1 1000 500" "16 1000 4000")
cd_runs() {
  local label=$1 spec c existing n r
  for r in $(seq "$REPEAT"); do
    for spec in "${cd_specs[@]}"; do
      set -- $spec
      bench create-delete -n "$3" -c "$1" --existing "$2" --size 16M >"$out/cd-$label-c$1-e$2-$r.json"
    done
  done
  for spec in "${cd_specs[@]}"; do
    set -- $spec
    c=$1 existing=$2 n=$3
    local files=() rates cp50 dp50 cp99 errors spread
    for r in $(seq "$REPEAT"); do files+=("$out/cd-$label-c$c-e$existing-$r.json"); done
    rates=$(for f in "${files[@]}"; do field "$f" 0 iterations_per_second; done | median)
    spread=$(for f in "${files[@]}"; do printf '%.0f ' "$(field "$f" 0 iterations_per_second)"; done)
    cp50=$(for f in "${files[@]}"; do field "$f" 0 call:CreateVolume:p50_ms; done | median)
    dp50=$(for f in "${files[@]}"; do field "$f" 0 call:DeleteVolume:p50_ms; done | median)
    cp99=$(for f in "${files[@]}"; do field "$f" 0 call:CreateVolume:p99_ms; done | median)
    errors=$(for f in "${files[@]}"; do field "$f" 0 errors; done | paste -sd+ | bc)
    printf '%s create-delete c=%s existing=%s n=%s: %.0f pairs/s (runs: %s), CreateVolume p50 %s ms p99 %s ms, DeleteVolume p50 %s ms, errors %s\n' \
      "$label" "$c" "$existing" "$n" "$rates" "$spread" "$cp50" "$cp99" "$dp50" "$errors"
  done
}
cd_runs disk
stop_driver "$loop_pid"
# The same on tmpfs, where fsync costs nothing: the driver's own cost per operation.
rm -rf /dev/shm/ferrovol-bench-state /dev/shm/ferrovol-bench-pool
endpoint=unix://$base/tmpfs.sock
RUST_LOG=warn "$ferrovol" --endpoint "$endpoint" --node-id bench-node \
  --state-dir /dev/shm/ferrovol-bench-state --pool-dir /dev/shm/ferrovol-bench-pool \
  --path-root "$work" --metrics-address off >"$out/tmpfs-driver.log" 2>&1 &
tmpfs_pid=$!
pids+=("$tmpfs_pid")
for _ in $(seq 100); do [ -S "$base/tmpfs.sock" ] && break; sleep 0.05; done
cd_runs tmpfs
stop_driver "$tmpfs_pid"
rm -rf /dev/shm/ferrovol-bench-state /dev/shm/ferrovol-bench-pool
start_driver loop "$base/loop-pool"
loop_pid=$pid

# --- node cycle against the floor ----------------------------------------------------------
for fs in ext4 xfs block; do
  for r in $(seq "$REPEAT"); do
    bench node-cycle -n 20 -c 1 --size 1G --fs-types "$fs" --work-dir "$work" >"$out/nc-$fs-$r.json"
    scripts/bench-floor.sh "$base/loop-pool" "$fs" 20 1G >"$out/floor-$fs-$r.txt"
  done
  cycle=$(for r in $(seq "$REPEAT"); do field "$out/nc-$fs-$r.json" 0 call:cycle:p50_ms; done | median)
  floor=$(for r in $(seq "$REPEAT"); do awk '/^floor/ {sub("median_ms=","",$4); print $4}' "$out/floor-$fs-$r.txt"; done | median)
  stage=$(for r in $(seq "$REPEAT"); do field "$out/nc-$fs-$r.json" 0 call:NodeStageVolume:p50_ms; done | median)
  echo "node-cycle $fs 1 GiB: ferrovol cycle p50 $cycle ms (NodeStage p50 $stage ms), floor $floor ms, ratio $(echo "scale=2; $cycle / $floor" | bc)"
done
stop_driver "$loop_pid"

# --- snapshot on an XFS reflink pool ---------------------------------------------------------
rm -f "$xfs_image"
truncate -s 8G "$xfs_image"
mkfs.xfs -q -m reflink=1 "$xfs_image"
mkdir -p "$xfs_pool"
mount -o loop "$xfs_image" "$xfs_pool"
start_driver xfs "$xfs_pool/pool"
xfs_pid=$pid
for r in $(seq "$REPEAT"); do
  bench snapshot -n 20 -c 1 --size 1G --data 512M --work-dir "$work" >"$out/snap-$r.json"
done
snap=$(for r in $(seq "$REPEAT"); do field "$out/snap-$r.json" 0 call:CreateSnapshot:p50_ms; done | median)
restore=$(for r in $(seq "$REPEAT"); do field "$out/snap-$r.json" 0 call:CreateVolume:p50_ms; done | median)
echo "snapshot of 1 GiB holding 512 MiB on XFS reflink: CreateSnapshot p50 $snap ms, restore (CreateVolume from it) p50 $restore ms"
stop_driver "$xfs_pid"
umount "$xfs_pool"
rm -f "$xfs_image"

# --- fio: published ext4 volume vs the pool filesystem -----------------------------------
start_driver fio "$base/loop-pool"
fio_pid=$pid
staging=$work/fio-staging target=$work/fio-target
fio_id=$("$tools" up "$endpoint" fio-volume 2G ext4 "$staging" "$target")
mkdir -p "$base/loop-pool/fio-direct"
# fio_job NAME DIR RW BS: one 10 s job on DIR/fio.dat (512 MiB); prints KiB/s.
fio_job() {
  fio --name="$1" --filename="$2/fio.dat" --rw="$3" --bs="$4" --size=512M --direct=1 \
    --ioengine=libaio --iodepth=16 --runtime=10 --time_based --group_reporting \
    --output-format=json >"$out/fio-$1.json"
  python3 -c "
import json,sys
j=json.load(open(sys.argv[1]))['jobs'][0]
print(j['read']['bw'] + j['write']['bw'])" "$out/fio-$1.json"
}
# First touch: random writes into a new file (fio allocates it with fallocate): on the
# volume they also allocate the sparse backing file underneath.
for r in $(seq "$REPEAT"); do
  rm -f "$target/fio.dat" "$base/loop-pool/fio-direct/fio.dat"
  echo "$(fio_job "firsttouch-volume-$r" "$target" randwrite 4k) $(fio_job "firsttouch-pool-$r" "$base/loop-pool/fio-direct" randwrite 4k)"
done >"$out/fio-firsttouch.txt"
vol=$(awk '{print $1}' "$out/fio-firsttouch.txt" | median)
pool=$(awk '{print $2}' "$out/fio-firsttouch.txt" | median)
echo "fio randwrite bs=4k into a new file (first touch): volume $vol KiB/s, pool $pool KiB/s, ratio $(echo "scale=3; $vol / $pool" | bc)"
# Steady state: the file is written in full first, then every job runs over it.
for dir in "$target" "$base/loop-pool/fio-direct"; do
  rm -f "$dir/fio.dat"
  fio --name=layout --filename="$dir/fio.dat" --rw=write --bs=1M --size=512M --direct=1 \
    --fallocate=none --output-format=terse >/dev/null
done
for job in "seqwrite write 1M" "seqread read 1M" "randwrite randwrite 4k" "randread randread 4k"; do
  set -- $job
  name=$1 rw=$2 bs=$3
  for r in $(seq "$REPEAT"); do
    echo "$(fio_job "$name-volume-$r" "$target" "$rw" "$bs") $(fio_job "$name-pool-$r" "$base/loop-pool/fio-direct" "$rw" "$bs")"
  done >"$out/fio-$name.txt"
  vol=$(awk '{print $1}' "$out/fio-$name.txt" | median)
  pool=$(awk '{print $2}' "$out/fio-$name.txt" | median)
  echo "fio $name bs=$bs (written file): volume $vol KiB/s, pool $pool KiB/s, ratio $(echo "scale=3; $vol / $pool" | bc)"
done
rm -f "$target/fio.dat"
rm -rf "$base/loop-pool/fio-direct"
"$tools" down "$endpoint" "$fio_id" "$staging" "$target"
fio_id=
stop_driver "$fio_pid"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
