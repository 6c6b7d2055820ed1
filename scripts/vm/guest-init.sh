#!/bin/sh
# /init of the ferrovol test guest (/bin/sh is bash there), packed by build-guest.sh.
# Mounts the pseudo filesystems, loads the kernel modules (order computed at build time),
# writes /etc/lvm/lvm.conf for a udev-less system, mounts the 9p shares:
#   /host  tag "host": the shared host directory (also bind-mounted at its host path)
#   /ctl   tag "ctl":  the run's control directory (env, args, hostpath, disks, tmp-size;
#                      the guest writes exit-code, dmesg.log and, if it fails, init-error)
# then runs the script named by ferrovol.run= on the kernel command line, writes its exit
# code to /ctl/exit-code and powers off.
export PATH=/usr/sbin:/usr/bin HOME=/root TERM=dumb LANG=C.UTF-8 SHELL=/bin/sh

uptime_s() { cut -d' ' -f1 /proc/uptime; }
say() { echo "guest-init: [$(uptime_s)s] $*"; }
halt_now() {
  sync
  poweroff -f
  sleep 5
}
die() {
  echo "guest-init: FATAL: $*"
  # Tell the host why, if the control share is there.
  if [ -d /ctl ] && mountpoint -q /ctl 2>/dev/null; then
    echo "$*" >/ctl/init-error
  fi
  halt_now
}

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts -o gid=5,mode=620 devpts /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount -t tmpfs -o mode=1777 tmpfs /tmp
mount -t tmpfs -o mode=755 tmpfs /run
ln -sf /proc/self/fd /dev/fd
ln -sf /proc/self/fd/0 /dev/stdin
ln -sf /proc/self/fd/1 /dev/stdout
ln -sf /proc/self/fd/2 /dev/stderr
mkdir -p /run/lock/lvm /run/lvm /var/tmp /var/lock /etc/lvm
chmod 1777 /var/tmp
hostname ferrovol-guest
say "booted $(uname -r)"

# Modules: lane 0 (shared dependencies) first, then lanes 1 and 2 in parallel; plain insmod
# in an order computed at build time is much faster than modprobe under TCG.
kver=$(cat /etc/ferrovol/kernel)
load_lane() {
  while read -r lane path; do
    [ "$lane" = "$1" ] || continue
    name=${path##*/}
    name=${name%%.ko*}
    name=$(echo "$name" | tr - _)
    [ -d "/sys/module/$name" ] && continue
    insmod "/lib/modules/$kver/$path" || echo "guest-init: insmod $path failed"
  done </etc/ferrovol/modules
}
load_lane 0
load_lane 1 &
load_lane 2
wait
say "modules loaded"

cat >/etc/lvm/lvm.conf <<'EOF'
# Written by the ferrovol guest /init: no udev in this guest.
devices {
	obtain_device_list_from_udev = 0
	external_device_info_source = "none"
	use_devicesfile = 0
}
activation {
	udev_sync = 0
	udev_rules = 0
	monitoring = 1
}
global {
	use_lvmpolld = 0
}
EOF

ip link set lo up 2>/dev/null || ifconfig lo 127.0.0.1 up

p9opts=trans=virtio,version=9p2000.L,msize=512000
mount -t 9p -o "$p9opts" ctl /ctl || die "cannot mount the 9p control share"
rm -f /ctl/exit-code /ctl/init-error
mount -t 9p -o "$p9opts" host /host || die "cannot mount the 9p share 'host' at /host"
# Cargo test binaries carry absolute host paths (CARGO_BIN_EXE_*, CARGO_MANIFEST_DIR):
# make the share reachable at its host path too.
if [ -s /ctl/hostpath ]; then
  hostpath=$(cat /ctl/hostpath)
  if [ "$hostpath" != / ] && { ! [ -e "$hostpath" ] || [ -z "$(ls -A "$hostpath" 2>/dev/null)" ]; }; then
    mkdir -p "$hostpath" && mount --bind /host "$hostpath" \
      || echo "guest-init: could not bind the share at $hostpath"
  else
    echo "guest-init: $hostpath exists in the guest; the share is only at /host"
  fi
fi

# /tmp is a tmpfs; the host may ask for another size limit (sparse files count only when written).
if [ -s /ctl/tmp-size ]; then
  mount -o "remount,size=$(cat /ctl/tmp-size)" /tmp || echo "guest-init: could not resize /tmp"
fi

# Wait (briefly) for the scratch disks to show up.
n=0
while [ -n "$(cat /ctl/disks 2>/dev/null)" ] && ! [ -b "$(head -n1 /ctl/disks)" ] && [ $n -lt 50 ]; do
  sleep 0.1
  n=$((n + 1))
done

script=
for word in $(cat /proc/cmdline); do
  case "$word" in ferrovol.run=*) script=${word#ferrovol.run=} ;; esac
done
[ -n "$script" ] || die "no ferrovol.run= on the kernel command line"
[ -f "$script" ] || die "script $script not found in the guest"

# Environment from the host and the script's arguments.
[ -f /ctl/env ] && . /ctl/env
set --
[ -f /ctl/args ] && . /ctl/args
cd "${FERROVOL_VM_CWD:-/host}" || die "cannot cd to ${FERROVOL_VM_CWD:-/host}"

say "running $script $*"
if [ -x "$script" ]; then
  "$script" "$@" </dev/null
else
  sh "$script" "$@" </dev/null
fi
rc=$?
say "script exited with code $rc"
dmesg >/ctl/dmesg.log 2>/dev/null || true # the console shows warnings and worse only
echo "$rc" >/ctl/exit-code.tmp && mv /ctl/exit-code.tmp /ctl/exit-code
halt_now
