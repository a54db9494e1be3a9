#!/usr/bin/env bash
# Installs the Debian packages moe.cu needs, only those that are missing. Run as root (or with sudo).
set -euo pipefail
pkgs=(g++ make doctest-dev libstb-dev nlohmann-json3-dev libopenmpi-dev openmpi-bin python3-torch libopenblas0-openmp)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing: ${missing[*]}"
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
