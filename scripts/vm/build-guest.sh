#!/usr/bin/env bash
# Builds the LVM test guest once and caches it under target/vm/:
#   target/vm/vmlinux, vmlinuz   the Debian bookworm kernel (linux-image-amd64); vmlinux is the
#                                uncompressed ELF image, booted through its PVH entry point
#   target/vm/initramfs.cpio     (uncompressed) busybox, lvm2, dmeventd, thin-provisioning-tools,
#                                e2fsprogs, xfsprogs, btrfs-progs, util-linux, coreutils, bash,
#                                glibc for host-built Rust binaries, kernel modules and /init
#   target/vm/rust-check         a tiny host-built Rust binary the smoke test runs in the guest
# Installs qemu-system-x86 from bookworm-backports when qemu-system-x86_64 is missing.
# Idempotent: a stamp (hash of this script, guest-init.sh and the package list) decides whether
# the image is rebuilt; downloaded .deb files and the unpacked kernel are kept across rebuilds.
# Usage: scripts/vm/build-guest.sh [--force]
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
vm=${FERROVOL_VM_DIR:-$repo/target/vm}
force=0
case "${1:-}" in
  --force) force=1 ;;
  "") ;;
  *) echo "usage: $0 [--force]" >&2; exit 2 ;;
esac

# Guest userland packages (taken whole, minus docs); their missing library dependencies
# are downloaded too, the rest of the shared libraries come from the host (same release).
packages=(busybox-static lvm2 dmsetup dmeventd thin-provisioning-tools e2fsprogs xfsprogs
  btrfs-progs util-linux mount coreutils bash)
# Kernel modules to load at boot, with their dependency closure, in two lanes that /init
# loads in parallel (xfs.ko and btrfs.ko alone take about a second each to load under TCG);
# dependencies the lanes share are loaded first. crc32c_generic comes first so that
# libcrc32c does not make the kernel call modprobe for it.
modules_lane1=(crc32c_generic virtio_pci virtio_blk 9p 9pnet_virtio dm-mod dm-thin-pool
  dm-snapshot dm-bufio dm-persistent-data dm-bio-prison loop btrfs)
modules_lane2=(crc32c_generic ext4 xfs)
# Shared libraries every host-built Rust binary (and cargo test binary) may need.
rust_libs=(/lib64/ld-linux-x86-64.so.2 /lib/x86_64-linux-gnu/libc.so.6
  /lib/x86_64-linux-gnu/libm.so.6 /lib/x86_64-linux-gnu/libgcc_s.so.1
  /lib/x86_64-linux-gnu/libpthread.so.0 /lib/x86_64-linux-gnu/libdl.so.2
  /lib/x86_64-linux-gnu/librt.so.1 /lib/x86_64-linux-gnu/libutil.so.1)

log() { printf 'build-guest: %s\n' "$*" >&2; }
t0=$(date +%s.%N)
elapsed() { awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

export DEBIAN_FRONTEND=noninteractive
apt_updated=0
apt_update() {
  if [ "$apt_updated" = 0 ]; then
    log "apt-get update"
    apt-get update -qq
    apt_updated=1
  fi
}

# --- host tools: qemu-system-x86 from bookworm-backports ---------------------------------
if ! command -v qemu-system-x86_64 >/dev/null 2>&1; then
  if [ "$(id -u)" != 0 ]; then
    log "qemu-system-x86_64 is missing and installing it needs root"
    exit 1
  fi
  if ! grep -rqs '^[^#]*bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
    log "adding the bookworm-backports apt source"
    echo 'deb http://deb.debian.org/debian bookworm-backports main' \
      >/etc/apt/sources.list.d/bookworm-backports.list
    apt_update
  fi
  if ! apt-cache policy qemu-system-x86 | grep -c bookworm-backports >/dev/null; then
    apt_updated=0
    apt_update
  fi
  log "installing qemu-system-x86 from bookworm-backports"
  apt-get install -y -qq --no-install-recommends -t bookworm-backports qemu-system-x86 >/dev/null
  log "qemu installed ($(elapsed) s)"
fi

# --- rust-check: a tiny host-built Rust binary for the guest (cheap, outside the stamp) ----
if command -v rustc >/dev/null 2>&1; then
  src=$repo/tests/vm/rust-check.rs
  if [ -f "$src" ] && ! [ "$vm/rust-check" -nt "$src" ]; then
    mkdir -p "$vm"
    log "compiling $src"
    rustc --edition 2021 -C opt-level=1 -C strip=debuginfo -o "$vm/rust-check.tmp" "$src"
    mv "$vm/rust-check.tmp" "$vm/rust-check"
  fi
fi

# --- up to date? ---------------------------------------------------------------------------
stamp_value=$( {
  echo "format 1"
  cat "$here/build-guest.sh" "$here/guest-init.sh"
  printf '%s\n' "${packages[@]}" "${modules_lane1[@]}" "${modules_lane2[@]}"
} | sha256sum | cut -d' ' -f1)
if [ "$force" = 0 ] && [ -f "$vm/stamp" ] && [ "$(cat "$vm/stamp")" = "$stamp_value" ] \
  && [ -s "$vm/vmlinuz" ] && [ -s "$vm/initramfs.cpio" ]; then
  exit 0
fi

mkdir -p "$vm"
exec 9>"$vm/.build.lock"
flock 9
# Another build may have finished while we waited for the lock.
if [ "$force" = 0 ] && [ -f "$vm/stamp" ] && [ "$(cat "$vm/stamp")" = "$stamp_value" ] \
  && [ -s "$vm/vmlinuz" ] && [ -s "$vm/initramfs.cpio" ]; then
  exit 0
fi
log "building the guest in $vm"

# --- download the packages (cached in target/vm/debs) ---------------------------------------
debs=$vm/debs
mkdir -p "$debs"
apt_dl() { (cd "$debs" && apt-get download -qq -o APT::Sandbox::User=root "$@"); }

# Prints "name file" for every package to fetch: the kernel meta package, the versioned kernel
# image it depends on, the userland packages and whatever of their dependencies the host lacks.
resolve() {
  local kimage
  kimage=$(apt-cache show --no-all-versions linux-image-amd64 | sed -n 's/^Depends: //p' \
    | tr ',' '\n' | grep -o 'linux-image-[0-9][^ ]*-amd64' | head -n1)
  [ -n "$kimage" ] || return 1
  # --print-uris leaves out what is already downloaded: ask from an empty directory.
  local empty=$vm/.resolve extra
  rm -rf "$empty"
  mkdir -p "$empty/partial"
  extra=$(apt-get install --print-uris -qq --no-install-recommends \
    -o Dir::Cache::Archives="$empty" "${packages[@]}" | awk '{ print $2 }' | sed 's/_.*//')
  # shellcheck disable=SC2086
  (cd "$empty" && apt-get download --print-uris -o APT::Sandbox::User=root \
    linux-image-amd64 "$kimage" "${packages[@]}" $extra) \
    | awk '{ f = $2; n = f; sub(/_.*/, "", n); print n, f }' | sort -u
}
fetch() {
  local list missing
  list=$(resolve) || return 1
  missing=$(echo "$list" | while read -r name file; do
    [ -s "$debs/$file" ] || echo "$name"
  done)
  if [ -n "$missing" ]; then
    log "downloading: ${missing//$'\n'/ }"
    # shellcheck disable=SC2086
    apt_dl $missing || return 1
  fi
  [ -n "$list" ] || return 1
  echo "$list" >"$debs/selected"
}
if ! fetch; then
  # Stale package lists name versions the mirror no longer has: refresh them once.
  log "fetching failed; refreshing the package lists and retrying"
  apt_update
  fetch
fi
log "packages ready ($(elapsed) s)"

deb_of() { awk -v n="$1" '$1 == n { print $2 }' "$debs/selected"; }
bb_deb=$debs/$(deb_of busybox-static)
bbdir=$vm/busybox
if ! [ -x "$bbdir/bin/busybox" ] || ! [ "$bbdir/bin/busybox" -nt "$bb_deb" ]; then
  rm -rf "$bbdir"
  dpkg-deb -x "$bb_deb" "$bbdir"
  touch "$bbdir/bin/busybox"
fi
bb=$bbdir/bin/busybox

# --- kernel: unpack, depmod (cached per kernel package) ---------------------------------------
kimage=$(awk '$1 ~ /^linux-image-[0-9]/ { print $1 }' "$debs/selected" | head -n1)
kdeb=$debs/$(deb_of "$kimage")
kdir=$vm/kernel/$(basename "$kdeb" .deb)
if ! [ -f "$kdir/.ready" ]; then
  rm -rf "$kdir"
  mkdir -p "$kdir"
  log "unpacking $(basename "$kdeb")"
  dpkg-deb -x "$kdeb" "$kdir"
  kver=$(ls "$kdir/lib/modules")
  log "depmod $kver"
  "$bb" depmod -b "$kdir" "$kver"
  touch "$kdir/.ready"
fi
kver=$(ls "$kdir/lib/modules")
kmods=$kdir/lib/modules/$kver
log "kernel $kver ready ($(elapsed) s)"

# Module load order: dependencies first (depth-first over modules.dep), each module once.
declare -A dep_of=() path_of=() seen=()
while IFS= read -r line; do
  mod=${line%%:*}
  name=${mod##*/}; name=${name%%.ko*}; name=${name//-/_}
  path_of[$name]=$mod
  dep_of[$name]=${line#*:}
done <"$kmods/modules.dep"
order=()
visit() {
  local name=${1//-/_} d dn
  [ -n "${seen[$name]:-}" ] && return 0
  seen[$name]=1
  if [ -z "${path_of[$name]:-}" ]; then
    if grep -Eq "/${name//_/[-_]}\.ko" "$kmods/modules.builtin"; then
      return 0 # built into the kernel
    fi
    log "kernel module $1 not found in $kver"
    exit 1
  fi
  for d in ${dep_of[$name]}; do
    dn=${d##*/}; dn=${dn%%.ko*}
    visit "$dn"
  done
  order+=("${path_of[$name]}")
}
lane_order() {
  order=()
  seen=()
  local m
  for m in "$@"; do visit "$m"; done
  printf '%s\n' "${order[@]}"
}
lane1=$(lane_order "${modules_lane1[@]}")
lane2=$(lane_order "${modules_lane2[@]}")
# "LANE PATH" lines; lane 0 (shared dependencies) first, then lanes 1 and 2 side by side.
module_plan=$(
  for m in $lane1; do
    if grep -qxF "$m" <<<"$lane2"; then echo "0 $m"; else echo "1 $m"; fi
  done
  for m in $lane2; do grep -qxF "$m" <<<"$lane1" || echo "2 $m"; done
)
# lanes 1 and 2 keep their own order; lane 0 keeps lane 1's order
module_plan=$(echo "$module_plan" | awk '$1 == 0' ; echo "$module_plan" | awk '$1 != 0')
module_files=$(echo "$module_plan" | awk '{ print $2 }')

# --- the root filesystem ----------------------------------------------------------------------
root=$vm/root
rm -rf "$root"
mkdir -p "$root"/usr/{bin,sbin,lib/x86_64-linux-gnu,lib64} \
  "$root"/{dev,proc,sys,tmp,run,mnt,root,host,ctl,etc/ferrovol}
ln -s usr/bin "$root/bin"
ln -s usr/sbin "$root/sbin"
ln -s usr/lib "$root/lib"
ln -s usr/lib64 "$root/lib64"

for name in $(awk '{ print $1 }' "$debs/selected"); do
  case "$name" in linux-image-*) continue ;; esac
  dpkg-deb --fsys-tarfile "$debs/$(deb_of "$name")" \
    | tar -x -C "$root" --keep-directory-symlink \
      --exclude=./usr/share/doc --exclude=./usr/share/man --exclude=./usr/share/info \
      --exclude=./usr/share/locale --exclude=./usr/share/lintian --exclude=./usr/share/bug \
      --exclude=./usr/share/bash-completion --exclude=./usr/share/zsh \
      --exclude=./usr/share/initramfs-tools --exclude=./usr/include \
      --exclude=./lib/systemd --exclude=./usr/lib/systemd --exclude=./etc/init.d \
      --exclude=./lib/udev --exclude=./usr/lib/udev --exclude=./etc/cron.d \
      --exclude=./etc/cron.daily --exclude=./etc/cron.weekly --exclude=./etc/logrotate.d \
      --exclude='./usr/sbin/xfs_scrub*' --exclude='./bin/btrfs-*' --exclude=./bin/btrfstune
    # (xfs_scrub pulls in 35 MB of libicu; the btrfs repair extras are not needed)
done

# busybox applets for every command the full packages do not provide
"$bb" --list-full | while read -r applet; do
  b=${applet##*/}
  if ! [ -e "$root/usr/bin/$b" ] && ! [ -e "$root/usr/sbin/$b" ] && ! [ -L "$root/usr/bin/$b" ] \
    && ! [ -L "$root/usr/sbin/$b" ]; then
    case "$applet" in
      sbin/* | usr/sbin/*) ln -s /usr/bin/busybox "$root/usr/sbin/$b" ;;
      *) ln -s /usr/bin/busybox "$root/usr/bin/$b" ;;
    esac
  fi
done
# /bin/sh is bash: Debian's busybox sh runs its own applets before anything on PATH, so
# scripts would get busybox's df, mount, losetup... instead of the real ones.
ln -sf bash "$root/usr/bin/sh"

# Shared libraries: resolve every ELF file of the root (libraries of the root first), copy what
# only the host has; plus what host-built Rust binaries need.
libpath=$root/usr/lib/x86_64-linux-gnu:$root/usr/lib/x86_64-linux-gnu/device-mapper
rust_bins=()
[ -x "$vm/rust-check" ] && rust_bins+=("$vm/rust-check")
[ -x "$repo/target/debug/ferrovol" ] && rust_bins+=("$repo/target/debug/ferrovol")
ldd_out=$( {
  find "$root/usr" -type f \( -perm -u+x -o -name '*.so*' \) -print0 \
    | LD_LIBRARY_PATH=$libpath xargs -0 ldd 2>/dev/null || true
  [ ${#rust_bins[@]} = 0 ] || ldd "${rust_bins[@]}" 2>/dev/null || true
})
if grep -q 'not found' <<<"$ldd_out"; then
  echo "$ldd_out" | grep -B100 'not found' >&2
  log "unresolved shared libraries (see above)"
  exit 1
fi
{
  echo "$ldd_out" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// && $2 ~ /^\(/ { print $1 }'
  printf '%s\n' "${rust_libs[@]}"
} | sort -u | while read -r lib; do
  case "$lib" in "$root"/*) continue ;; esac
  [ -e "$lib" ] || continue
  [ -e "$root$lib" ] || cp -L "$lib" "$root$lib"
done
printf '/usr/lib/x86_64-linux-gnu\n/usr/lib/x86_64-linux-gnu/device-mapper\n' >"$root/etc/ld.so.conf"
ldconfig -r "$root"

# Kernel modules, their load order and a modules.dep for the subset (so modprobe works too)
for m in $module_files; do
  mkdir -p "$root/lib/modules/$kver/$(dirname "$m")"
  cp "$kmods/$m" "$root/lib/modules/$kver/$m"
done
cp "$kmods"/modules.{builtin,builtin.modinfo,order} "$root/lib/modules/$kver/" 2>/dev/null || true
"$bb" depmod -b "$root" "$kver"
echo "$module_plan" >"$root/etc/ferrovol/modules"
echo "$kver" >"$root/etc/ferrovol/kernel"

# /etc basics and /init
cat >"$root/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/bin/bash
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin
EOF
cat >"$root/etc/group" <<'EOF'
root:x:0:
disk:x:6:
nogroup:x:65534:
EOF
printf '127.0.0.1\tlocalhost ferrovol-guest\n::1\tlocalhost ip6-localhost\n' >"$root/etc/hosts"
printf 'passwd: files\ngroup: files\nhosts: files\n' >"$root/etc/nsswitch.conf"
echo ferrovol-guest >"$root/etc/hostname"
: >"$root/etc/fstab"
ln -sf /proc/self/mounts "$root/etc/mtab"
cp "$here/guest-init.sh" "$root/init"
chmod 755 "$root/init"

# Uncompressed on purpose: under TCG the guest needs 1.5 to 2.5 s more to unpack a gzip one.
log "packing the initramfs"
(cd "$root" && find . -mindepth 1 | LC_ALL=C sort | "$bb" cpio -o -H newc 2>/dev/null) \
  >"$vm/initramfs.cpio.tmp"
mv "$vm/initramfs.cpio.tmp" "$vm/initramfs.cpio"
rm -f "$vm/initramfs.cpio.gz"
cp "$kdir/boot/vmlinuz-$kver" "$vm/vmlinuz"
# The uncompressed ELF kernel boots through its PVH entry point: that skips the real-mode
# setup and the xz decompression, about 4 s under TCG. run-guest.sh falls back to vmlinuz.
rm -f "$vm/vmlinux"
xz_at=$(LC_ALL=C grep -abo $'\xfd7zXZ\x00' "$vm/vmlinuz" | head -n1 | cut -d: -f1 || true)
# (xz stops at the end of its stream, so tail may die of SIGPIPE: that is fine)
if [ -n "$xz_at" ] && { tail -c +$((xz_at + 1)) "$vm/vmlinuz" || true; } | xz -dc --single-stream \
  >"$vm/vmlinux.tmp" 2>/dev/null \
  && grep -Eq '\(0x00000012\)|PHYS32_ENTRY' <<<"$(readelf -n "$vm/vmlinux.tmp" 2>/dev/null)"; then
  mv "$vm/vmlinux.tmp" "$vm/vmlinux"
else
  rm -f "$vm/vmlinux.tmp"
  log "could not extract a PVH-bootable vmlinux; the guest boots vmlinuz (slower)"
fi
echo "$kver" >"$vm/kernel-version"
echo "$stamp_value" >"$vm/stamp"
log "done in $(elapsed) s: kernel $kver, initramfs $(du -h "$vm/initramfs.cpio" | cut -f1)," \
  "$(echo "$module_files" | wc -l) modules"
