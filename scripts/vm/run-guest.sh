#!/usr/bin/env bash
# Boots the LVM test guest (qemu TCG; see scripts/vm/README.md) and runs one script in it.
# Exits with the guest script's exit code; 124 if the wall-clock timeout hit, 125 if the
# guest ended without reporting one (did not boot, panicked, init failed).
set -euo pipefail

usage() {
  cat <<'EOF'
usage: scripts/vm/run-guest.sh [options] SCRIPT [ARGS...]

Runs SCRIPT (a path on the host, inside the shared directory) in the guest, as root,
from the directory /host (the share), with ARGS.

options:
  --share DIR        host directory shared at /host, and bind-mounted at its own host path
                     (default: the repository root, so target/debug/deps/* is reachable)
  --disk-size SIZE   size of each fresh sparse scratch disk (default 8G)
  --disks N          number of scratch disks: /dev/vda, /dev/vdb, ... (default 1)
  --timeout SECS     wall-clock limit for the whole boot and run (default 600)
  --mem MB           guest memory (default 2048)
  --tmp-size SIZE    size limit of the guest's /tmp, a tmpfs (default: half the memory);
                     e.g. 16G for tests that check free space (sparse files only use RAM
                     for what is written to them)
  --smp N            guest CPUs (default 2)
  --env NAME         pass the host variable NAME to the script (repeatable); always passed
                     when set: CI RUST_LOG RUST_BACKTRACE RUST_TEST_THREADS NO_COLOR FERROVOL_*
  --quiet            do not copy the guest console to stdout (it is always in the log)
  --keep             keep the scratch disks in the run directory
  --no-build         do not run build-guest.sh first
  -h, --help         this text

In the guest: FERROVOL_VM=1, FERROVOL_VM_DISKS="/dev/vda ...", FERROVOL_VM_SHARE=/host,
FERROVOL_VM_HOSTPATH=<the share's host path>. Runs are kept in target/vm/runs/<id>/
(console.log, dmesg.log, exit-code); target/vm/last points to the latest.
EOF
}

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
vm=${FERROVOL_VM_DIR:-$repo/target/vm}
share=$repo
disk_size=8G
disks=1
timeout_s=600
mem=2048
tmp_size=
smp=2
quiet=0
keep=0
build=1
env_names=(CI RUST_LOG RUST_BACKTRACE RUST_TEST_THREADS NO_COLOR)

while [ $# -gt 0 ]; do
  case "$1" in
    --share) share=$2; shift 2 ;;
    --disk-size) disk_size=$2; shift 2 ;;
    --disks) disks=$2; shift 2 ;;
    --timeout) timeout_s=$2; shift 2 ;;
    --mem) mem=$2; shift 2 ;;
    --tmp-size) tmp_size=$2; shift 2 ;;
    --smp) smp=$2; shift 2 ;;
    --env) env_names+=("$2"); shift 2 ;;
    --quiet) quiet=1; shift ;;
    --keep) keep=1; shift ;;
    --no-build) build=0; shift ;;
    -h | --help) usage; exit 0 ;;
    --) shift; break ;;
    -*) echo "run-guest: unknown option $1" >&2; usage >&2; exit 2 ;;
    *) break ;;
  esac
done
[ $# -ge 1 ] || { usage >&2; exit 2; }
script=$1
shift

log() { printf 'run-guest: %s\n' "$*" >&2; }

share=$(cd "$share" && pwd -P)
[ -f "$script" ] || { log "no such script: $script"; exit 2; }
script_abs=$(cd "$(dirname "$script")" && pwd -P)/$(basename "$script")
case "$script_abs" in
  "$share"/*) guest_script=/host/${script_abs#"$share"/} ;;
  *) log "$script is not inside the shared directory $share (see --share)"; exit 2 ;;
esac
case "$guest_script" in
  *[[:space:]]*) log "the script path must not contain white space: $guest_script"; exit 2 ;;
esac

if [ "$build" = 1 ]; then
  "$here/build-guest.sh"
fi
for f in vmlinuz initramfs.cpio; do
  [ -s "$vm/$f" ] || { log "$vm/$f is missing: run scripts/vm/build-guest.sh"; exit 1; }
done
command -v qemu-system-x86_64 >/dev/null || { log "qemu-system-x86_64 is missing"; exit 1; }

# The run directory: the guest's control share (/ctl), console log, scratch disks.
mkdir -p "$vm/runs"
run_id=$(date +%Y%m%d-%H%M%S)-$$
run=$vm/runs/$run_id
mkdir -p "$run/ctl"
ln -sfn "runs/$run_id" "$vm/last"
# Keep the 20 latest runs.
(cd "$vm/runs" && ls -1t | tail -n +21 | xargs -r rm -rf)

disk_args=()
guest_disks=()
letters=(a b c d e f g h)
for ((i = 0; i < disks; i++)); do
  truncate -s "$disk_size" "$run/disk$i.img"
  disk_args+=(-drive "file=$run/disk$i.img,format=raw,if=virtio,cache=unsafe,discard=unmap")
  guest_disks+=("/dev/vd${letters[$i]}")
done
printf '%s\n' "${guest_disks[@]}" >"$run/ctl/disks"
cleanup() {
  [ "$keep" = 1 ] || rm -f "$run"/disk*.img
}
trap cleanup EXIT

# Environment and arguments for the guest script, as shell source for the guest's /init.
quote() { printf "'%s'" "$(printf '%s' "$1" | sed "s/'/'\\\\''/g")"; }
{
  echo "export FERROVOL_VM=1"
  echo "export FERROVOL_VM_DISKS=$(quote "${guest_disks[*]}")"
  echo "export FERROVOL_VM_SHARE=/host"
  echo "export FERROVOL_VM_HOSTPATH=$(quote "$share")"
  for name in "${env_names[@]}" $(compgen -e | grep '^FERROVOL_' | grep -v '^FERROVOL_VM' || true); do
    if [ -n "${!name+x}" ]; then
      echo "export $name=$(quote "${!name}")"
    fi
  done
} >"$run/ctl/env"
{
  printf 'set --'
  for a in "$@"; do printf ' %s' "$(quote "$a")"; done
  echo
} >"$run/ctl/args"
echo "$share" >"$run/ctl/hostpath"
[ -z "$tmp_size" ] || echo "$tmp_size" >"$run/ctl/tmp-size"

console=$run/console.log
kernel=$vm/vmlinuz
[ -s "$vm/vmlinux" ] && kernel=$vm/vmlinux # PVH entry: about 4 s faster under TCG
# The crypto self-tests and two initcalls nobody here needs cost about 1 s under TCG.
append="console=ttyS0 quiet loglevel=4 panic=-1 oops=panic 8250.nr_uarts=1 mitigations=off"
append+=" random.trust_cpu=on cryptomgr.notests=1"
append+=" initcall_blacklist=crypto_kdf108_init,init_kprobe_trace"
append+=" ferrovol.run=$guest_script"
# -display none rather than -nographic: with -nographic SeaBIOS also writes its banner and
# terminal-reset escapes to the serial console (our -serial and -monitor replace the rest).
# shellcheck disable=SC2054 # the commas are qemu's
qemu=(qemu-system-x86_64 -nodefaults -no-user-config -display none -no-reboot
  -accel tcg,thread=multi -cpu max -smp "$smp" -m "$mem"
  -kernel "$kernel" -initrd "$vm/initramfs.cpio" -append "$append"
  -chardev "stdio,id=con,logfile=$console,signal=off" -serial chardev:con -monitor none
  "${disk_args[@]}"
  -virtfs "local,path=$share,mount_tag=host,security_model=none,id=host"
  -virtfs "local,path=$run/ctl,mount_tag=ctl,security_model=none,id=ctl")

log "booting ($(cat "$vm/kernel-version" 2>/dev/null || echo kernel)); script $guest_script;" \
  "console log $console"
start=$(date +%s.%N)
set +e
if [ "$quiet" = 1 ]; then
  timeout --foreground -k 10 "$timeout_s" "${qemu[@]}" </dev/null >/dev/null 2>"$run/qemu.err"
else
  timeout --foreground -k 10 "$timeout_s" "${qemu[@]}" </dev/null 2>"$run/qemu.err"
fi
qemu_rc=$?
set -e
took=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')

[ -f "$run/ctl/dmesg.log" ] && mv "$run/ctl/dmesg.log" "$run/dmesg.log"
if [ -s "$run/ctl/exit-code" ]; then
  rc=$(cat "$run/ctl/exit-code")
  echo "$rc" >"$run/exit-code"
  log "guest script exited with code $rc after $took s (boot + run)"
  exit "$rc"
fi
echo
log "---- last 100 lines of $console ----"
tail -n 100 "$console" >&2 || true
log "---- end of console log ----"
[ -s "$run/qemu.err" ] && { log "qemu said:"; cat "$run/qemu.err" >&2; }
[ -s "$run/ctl/init-error" ] && log "guest init failed: $(cat "$run/ctl/init-error")"
if [ "$qemu_rc" = 124 ] || [ "$qemu_rc" = 137 ]; then
  log "timed out after $timeout_s s; the guest reported no exit code"
  exit 124
fi
log "the guest ended after $took s without reporting an exit code (qemu exit status $qemu_rc)"
exit 125
