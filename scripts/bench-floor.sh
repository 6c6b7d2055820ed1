#!/usr/bin/env bash
# The physical floor of a node cycle: what ferrovol's CreateVolume, NodeStage, NodePublish,
# NodeUnpublish, NodeUnstage and DeleteVolume do, done with the plain Linux tools and no
# driver: truncate (a sparse file), losetup (direct I/O, 4 KiB blocks, as ferrovol
# attaches), mkfs (ferrovol's options), mount, mount --bind, umount, umount, losetup -d, rm.
#
#   scripts/bench-floor.sh DIR FS COUNT [SIZE]
#
# DIR is where the backing files go (the pool filesystem) and the mounts are made; FS is
# ext4, xfs or block (no mkfs, no mount; the device node is bound onto a file). Prints one
# line per cycle with the milliseconds of each step and of the whole cycle, then the
# medians, as `key=value` words that scripts/bench.sh reads.
set -euo pipefail
dir=${1:?usage: bench-floor.sh DIR FS COUNT [SIZE]}
fs=${2:?usage: bench-floor.sh DIR FS COUNT [SIZE]}
count=${3:?usage: bench-floor.sh DIR FS COUNT [SIZE]}
size=${4:-1G}

now() { date +%s%N; }
ms() { echo "scale=3; ($2 - $1) / 1000000" | bc; }

work=$(mktemp -d "$dir/floor-XXXXXX")
device=
cleanup() {
  # Only what this script made: its own mounts and its own loop device.
  for m in "$work/target" "$work/staging"; do
    mountpoint -q "$m" 2>/dev/null && umount "$m" || true
  done
  if [ -n "$device" ] && losetup "$device" >/dev/null 2>&1; then losetup -d "$device" || true; fi
  rm -f "$work/volume.img"
  rmdir "$work/staging" "$work/target" 2>/dev/null || rm -f "$work/target"
  rmdir "$work" 2>/dev/null || true
}
trap cleanup EXIT

totals=()
for i in $(seq 1 "$count"); do
  mkdir -p "$work/staging"
  t0=$(now)
  truncate -s "$size" "$work/volume.img"
  t1=$(now)
  device=$(losetup --find --show --direct-io=on --sector-size 4096 "$work/volume.img")
  t2=$(now)
  case $fs in
    ext4) mkfs.ext4 -q -E lazy_itable_init=1,lazy_journal_init=1,nodiscard "$device" ;;
    xfs) mkfs.xfs -q -K "$device" ;;
    block) ;;
    *) echo "unknown fs $fs" >&2; exit 2 ;;
  esac
  t3=$(now)
  if [ "$fs" = block ]; then
    touch "$work/target"
    t4=$(now)
    mount --bind "$device" "$work/target"
    t5=$(now)
    umount "$work/target"
    t6=$(now)
    t7=$t6
    rm -f "$work/target"
  else
    mount -t "$fs" -o nosuid,nodev "$device" "$work/staging"
    t4=$(now)
    mkdir "$work/target"
    mount --bind "$work/staging" "$work/target"
    t5=$(now)
    umount "$work/target"
    rmdir "$work/target"
    t6=$(now)
    umount "$work/staging"
    t7=$(now)
  fi
  losetup -d "$device"
  device=
  t8=$(now)
  rm "$work/volume.img"
  t9=$(now)
  total=$(ms "$t0" "$t9")
  totals+=("$total")
  echo "cycle=$i truncate=$(ms "$t0" "$t1") losetup=$(ms "$t1" "$t2") mkfs=$(ms "$t2" "$t3") mount=$(ms "$t3" "$t4") bind=$(ms "$t4" "$t5") umount_bind=$(ms "$t5" "$t6") umount=$(ms "$t6" "$t7") losetup_d=$(ms "$t7" "$t8") rm=$(ms "$t8" "$t9") total_ms=$total"
done
median=$(printf '%s\n' "${totals[@]}" | sort -n | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}')
echo "floor fs=$fs cycles=$count median_ms=$median"
