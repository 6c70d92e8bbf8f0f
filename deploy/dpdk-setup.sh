#!/usr/bin/env bash
# Prepare a host for dlcpd's DPDK datapath (run as root). See deploy/README.md,
# "DPDK datapath".
#
#   dpdk-setup.sh status                     hugepages, hugetlbfs mounts, NICs and their drivers
#   dpdk-setup.sh hugepages COUNT [SIZE_KB]  reserve COUNT pages (default 2048 kB each) and
#                                            mount hugetlbfs on /dev/hugepages
#   dpdk-setup.sh bind PCI_ADDR              hand a NIC to vfio-pci (DPDK owns it; the kernel
#                                            interface disappears)
#   dpdk-setup.sh unbind PCI_ADDR            give the NIC back to its kernel driver
#
# --dry-run as first argument prints what would be written instead of doing it.
# Only sysfs and modprobe are used (no dpdk-devbind.py needed). Settings do not
# survive a reboot: put `hugepages=N` on the kernel command line (or a systemd
# unit running this script) for production.
set -euo pipefail

DRY=0
if [ "${1:-}" = "--dry-run" ]; then DRY=1; shift; fi
die() { echo "dpdk-setup.sh: $*" >&2; exit 2; }
write() { # write VALUE FILE
  if ((DRY)); then echo "echo '$1' > $2"; else echo "$1" > "$2"; fi
}
run() {
  if ((DRY)); then echo "$*"; else "$@"; fi
}

status() {
  echo "hugepages:"
  for d in /sys/kernel/mm/hugepages/hugepages-*; do
    [ -d "$d" ] || continue
    echo "  $(basename "$d"): total $(cat "$d/nr_hugepages"), free $(cat "$d/free_hugepages")"
  done
  echo "hugetlbfs mounts:"
  grep hugetlbfs /proc/mounts | awk '{print "  " $2 " " $4}' || echo "  none (DPDK needs one, or --no-huge for development)"
  echo "network devices (PCI):"
  local any=0
  for dev in /sys/bus/pci/devices/*; do
    [ -e "$dev/class" ] || continue
    # PCI class 0x02xxxx: network controller
    case "$(cat "$dev/class")" in 0x02*) ;; *) continue ;; esac
    any=1
    local drv="none" ifs=""
    [ -e "$dev/driver" ] && drv=$(basename "$(readlink "$dev/driver")")
    [ -d "$dev/net" ] && ifs=$(ls "$dev/net" | tr '\n' ' ')
    echo "  $(basename "$dev") driver=$drv ${ifs:+interfaces: $ifs}"
  done
  ((any)) || echo "  none (virtual machines and containers: use a vdev, e.g. net_af_packet or net_af_xdp)"
}

hugepages() {
  local count=${1:?hugepages needs COUNT} size=${2:-2048}
  [[ $count =~ ^[0-9]+$ ]] || die "COUNT must be a number, got '$count'"
  local d=/sys/kernel/mm/hugepages/hugepages-${size}kB
  [ -d "$d" ] || die "this kernel has no ${size} kB hugepages ($(ls /sys/kernel/mm/hugepages 2>/dev/null | tr '\n' ' '))"
  write "$count" "$d/nr_hugepages"
  if ! grep -q " /dev/hugepages hugetlbfs " /proc/mounts; then
    run mkdir -p /dev/hugepages
    run mount -t hugetlbfs -o "pagesize=${size}K" nodev /dev/hugepages
  fi
  ((DRY)) || echo "reserved $(cat "$d/nr_hugepages") of $count pages of $size kB (fragmented memory can give fewer: reserve at boot)"
}

pci_dev() {
  local pci=${1:?needs a PCI address like 0000:3b:00.0}
  [[ $pci =~ ^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$ ]] || die "not a PCI address: '$pci' (want 0000:3b:00.0)"
  [ -e "/sys/bus/pci/devices/$pci" ] || ((DRY)) || die "no PCI device $pci (see: dpdk-setup.sh status)"
  echo "/sys/bus/pci/devices/$pci"
}

bind() {
  local dev; dev=$(pci_dev "${1:-}")
  local pci=${1}
  if [ -d "$dev/net" ] && ! ((DRY)); then
    for i in "$dev"/net/*; do
      if ip -br addr show dev "$(basename "$i")" 2>/dev/null | grep -q UP; then
        echo "warning: $(basename "$i") is up; binding takes it away from the kernel" >&2
      fi
    done
  fi
  run modprobe vfio-pci
  write vfio-pci "$dev/driver_override"
  if [ -e "$dev/driver" ] || ((DRY)); then write "$pci" "$dev/driver/unbind"; fi
  write "$pci" /sys/bus/pci/drivers_probe
  ((DRY)) || echo "$pci -> $(basename "$(readlink "$dev/driver")") (use -a $pci in datapath.dpdk.eal_args)"
}

unbind() {
  local dev; dev=$(pci_dev "${1:-}")
  local pci=${1}
  write "" "$dev/driver_override"
  if [ -e "$dev/driver" ] || ((DRY)); then write "$pci" "$dev/driver/unbind"; fi
  write "$pci" /sys/bus/pci/drivers_probe
}

case "${1:-}" in
  status) status ;;
  hugepages) shift; hugepages "$@" ;;
  bind) shift; bind "$@" ;;
  unbind) shift; unbind "$@" ;;
  *) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
