#!/bin/sh
# Install the host packages the simulated cluster needs on Debian 12 (bookworm); idempotent and quiet.
#   systemd-container  systemd-nspawn: boots each node's real systemd
#   debootstrap        builds the nodes' cached base root (k3deploy sim base)
#   iproute2           network namespaces, veth pairs, the bridge
#   openssh-client     ssh / ssh-keygen: the cluster key, node host keys, readiness checks
#   openssh-server     sshd (also inside the base root; on the host only for tooling that wants it)
#   procps, curl       ps for inspection; HTTP checks against the simulated engines
#   rsync              k3_image_archive / k3_weights_source copies from the control machine (pyinfra files.rsync)
#   util-linux, mount  nsenter, mount, umount
#   libslurm-dev, gcc, libc6-dev  sim up --slurm builds the simulator's pyxis (a SPANK plugin) against slurm/spank.h
#   prometheus         promtool checks the exported scrape configuration and rules; sim up --monitoring runs it
# Usage: .ci/install-sim.sh            (as root)
set -eu
PKGS="systemd-container debootstrap iproute2 openssh-client openssh-server procps curl rsync util-linux mount libslurm-dev gcc libc6-dev prometheus"
if [ "$(id -u)" != 0 ]; then
  echo "install-sim.sh: run as root" >&2
  exit 2
fi
missing=""
for p in $PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  # shellcheck disable=SC2086
  apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
# the simulated nodes sit behind a bridge; br_netfilter with a DROP forward policy would filter them
if [ "$(cat /proc/sys/net/bridge/bridge-nf-call-iptables 2>/dev/null || echo 0)" = 1 ] &&
   command -v iptables >/dev/null 2>&1 && iptables -S FORWARD 2>/dev/null | grep -q -- '-P FORWARD DROP'; then
  echo "install-sim.sh: warning: bridged traffic passes iptables and FORWARD drops it; simulated nodes" \
       "will not reach each other (iptables -P FORWARD ACCEPT, or sysctl net.bridge.bridge-nf-call-iptables=0)" >&2
fi
exit 0
