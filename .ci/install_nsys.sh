#!/usr/bin/env bash
# Nsight Systems 2022.4's command-line target from Debian non-free, unpacked (its full package depends on libcuda1,
# which a machine without a GPU cannot install). Enough for `nsys export`. Needs root.
set -euo pipefail
printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm\nComponents: non-free\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
  > /etc/apt/sources.list.d/non-free.sources
apt-get update -qq
tmp=$(mktemp -d)
(cd "$tmp" && apt-get download -qq nsight-systems-target && dpkg -x nsight-systems-target_*.deb /opt/nsys)
ln -sf /opt/nsys/usr/lib/x86_64-linux-gnu/nsight-systems/target-linux-x64/nsys /usr/local/bin/nsys
nsys --version
