#!/bin/sh
# Smoke test of the LVM guest harness; runs inside the guest:
#   scripts/vm/run-guest.sh tests/vm/smoke.sh
# Proves that LVM (linear, classic snapshot, thin pool, thin LV, thin snapshot, tags, JSON
# reports, dmeventd monitoring), ext4/xfs/btrfs, online growth, loop devices and host-built
# Rust binaries all work in the guest. Any failure ends the script with a non-zero code.
set -eu

step() { echo "== smoke [$(cut -d' ' -f1 /proc/uptime)s]: $*"; }
fail() {
  echo "== smoke: FAILED: $*" >&2
  exit 1
}
size_kib() { df -k --output=size "$1" | tail -n1 | tr -d ' '; }
# Prints the one line of a JSON lvs report that describes LV $2; fails if there is none.
lv_line() {
  printf '%s\n' "$1" | grep "\"lv_name\":\"$2\"" || fail "no LV $2 in the report"
}
has() { printf '%s\n' "$1" | grep -qF "$2" || fail "expected $2 in: $1"; }

[ "${FERROVOL_VM:-}" = 1 ] || fail "run me in the guest: scripts/vm/run-guest.sh $0"
disk=${FERROVOL_VM_DISKS%% *}
vg=smoke

step "guest: $(uname -r), $(nproc) CPUs, disk $disk ($(blockdev --getsize64 "$disk") bytes)"
[ -b "$disk" ] || fail "no scratch disk $disk"
lvm version | head -n 1

step "pvcreate + vgcreate on $disk"
pvcreate -y "$disk"
vgcreate "$vg" "$disk"
vgs "$vg"

step "linear LV, ext4, mount"
lvcreate -y -n lin -L 256M "$vg"
[ -b "/dev/$vg/lin" ] || fail "/dev/$vg/lin was not created"
[ -b "/dev/mapper/$vg-lin" ] || fail "/dev/mapper/$vg-lin was not created"
mkfs.ext4 -q "/dev/$vg/lin"
mkdir -p /mnt/lin /mnt/linsnap /mnt/thin /mnt/snap /mnt/loop
mount "/dev/$vg/lin" /mnt/lin
echo "linear data" >/mnt/lin/file
sync

step "classic snapshot of the linear LV"
lvcreate -y -s -n linsnap -L 64M "$vg/lin"
mount -o ro "/dev/$vg/linsnap" /mnt/linsnap
[ "$(cat /mnt/linsnap/file)" = "linear data" ] || fail "classic snapshot content differs"
umount /mnt/linsnap
lvremove -y "$vg/linsnap"

step "online grow: lvextend + resize2fs"
before=$(size_kib /mnt/lin)
lvextend -L +256M "$vg/lin"
resize2fs "/dev/$vg/lin"
after=$(size_kib /mnt/lin)
echo "ext4: $before KiB -> $after KiB"
[ "$after" -gt $((before + 200000)) ] || fail "ext4 did not grow"
[ "$(cat /mnt/lin/file)" = "linear data" ] || fail "data lost after the ext4 growth"

step "thin pool + thin LV, xfs, mount"
lvcreate -y --type thin-pool -L 512M -n pool "$vg"
lvcreate -y -V 1G --thinpool "$vg/pool" -n thin
mkfs.xfs -q "/dev/$vg/thin"
mount "/dev/$vg/thin" /mnt/thin
dd if=/dev/urandom of=/mnt/thin/blob bs=1M count=8 2>/dev/null
sum=$(sha256sum </mnt/thin/blob)
sync

step "dmeventd monitors the thin pool"
monitor=$(lvs --noheadings -o seg_monitor "$vg/pool" | tr -d ' ')
[ "$monitor" = monitored ] || fail "thin pool monitoring is '$monitor', not 'monitored'"
pidof dmeventd >/dev/null || fail "dmeventd is not running"

step "thin snapshot (activation skip), lvchange -ay -K, mount -o nouuid"
lvcreate -y -s -n snap "$vg/thin"
attr=$(lvs --noheadings -o lv_attr "$vg/snap" | tr -d ' ')
echo "snapshot attributes: $attr"
lvchange -ay -K "$vg/snap"
[ -b "/dev/$vg/snap" ] || fail "/dev/$vg/snap was not activated"
mount -o ro,nouuid "/dev/$vg/snap" /mnt/snap
[ "$(sha256sum </mnt/snap/blob)" = "$sum" ] || fail "thin snapshot content differs"
echo "changed after the snapshot" >/mnt/thin/blob
[ "$(sha256sum </mnt/snap/blob)" = "$sum" ] || fail "thin snapshot changed with its origin"

step "online grow: lvextend + xfs_growfs"
before=$(size_kib /mnt/thin)
lvextend -L 2G "$vg/thin"
xfs_growfs /mnt/thin >/dev/null
after=$(size_kib /mnt/thin)
echo "xfs: $before KiB -> $after KiB"
[ "$after" -gt $((before + 900000)) ] || fail "xfs did not grow"

step "LV tags"
tag=ferrovol.io/volume=pvc-0123
lvchange --addtag "$tag" "$vg/thin"
lvchange --addtag other-tag "$vg/thin"
tags=$(lvs --noheadings -o lv_tags "$vg/thin" | tr -d ' ')
echo "tags: $tags"
has "$tags" "$tag"
[ "$(lvs --noheadings -o lv_name "@$tag" | tr -d ' ')" = thin ] || fail "lvs @TAG did not select the LV"
lvchange --deltag other-tag "$vg/thin"

step "lvs --reportformat json"
json=$(lvs --reportformat json --units b --nosuffix \
  -o lv_name,lv_size,lv_tags,lv_attr,lv_path,pool_lv,origin,data_percent "$vg")
printf '%s\n' "$json"
has "$json" '"report": ['
has "$json" '"lv": ['
line=$(lv_line "$json" thin)
has "$line" '"lv_size":"2147483648"'
has "$line" "\"lv_tags\":\"$tag\""
has "$line" '"pool_lv":"pool"'
has "$line" "\"lv_path\":\"/dev/$vg/thin\""
line=$(lv_line "$json" snap)
has "$line" '"origin":"thin"'
line=$(lv_line "$json" lin)
has "$line" '"lv_size":"536870912"'
has "$line" '"lv_tags":""'
lv_line "$json" pool >/dev/null

step "remove the thin snapshot"
umount /mnt/snap
lvremove -y "$vg/snap"
[ ! -e "/dev/$vg/snap" ] || fail "/dev/$vg/snap is still there"

step "loop device with btrfs"
truncate -s 256M /tmp/loop.img
loopdev=$(losetup -f --show /tmp/loop.img)
echo "loop device: $loopdev"
mkfs.btrfs -q "$loopdev"
mount "$loopdev" /mnt/loop
echo "btrfs data" >/mnt/loop/file
umount /mnt/loop
losetup -d "$loopdev"

step "host-built Rust binaries from the share ($PWD)"
if [ -x target/vm/rust-check ]; then
  target/vm/rust-check
else
  echo "target/vm/rust-check is missing (no rustc when the guest was built)"
fi
if [ -x target/debug/ferrovol ]; then
  target/debug/ferrovol --version
else
  echo "target/debug/ferrovol not built: skipped"
fi
[ -x target/vm/rust-check ] || [ -x target/debug/ferrovol ] || fail "no host-built Rust binary to run"
# a cargo test binary (the newest sanity-*): it must start and list its tests
test_bin=
for f in target/debug/deps/sanity-*; do
  case "$f" in *.d) continue ;; esac
  [ -x "$f" ] || continue
  # shellcheck disable=SC3013 # the guest sh is bash
  if [ -z "$test_bin" ] || [ "$f" -nt "$test_bin" ]; then test_bin=$f; fi
done
if [ -n "$test_bin" ]; then
  count=$("$test_bin" --list 2>/dev/null | grep -c ': test$' || true)
  echo "$test_bin lists $count tests"
  [ "$count" -gt 0 ] || fail "$test_bin listed no tests"
fi

step "tear down"
umount /mnt/thin /mnt/lin
vgchange -an "$vg"
vgremove -y "$vg" >/dev/null
step "all smoke checks passed"
