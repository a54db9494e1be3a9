#!/usr/bin/env bash
# Installs the Debian packages moe.cu needs, only those that are missing. Run as root (or with sudo).
#   tools/install_deps.sh run    what building and running train_cpu needs
#   tools/install_deps.sh test   that, plus the test tools: doctest and PyTorch with OpenBLAS (the twin, bench-cpu)
#   tools/install_deps.sh fuzz   that of run, plus clang (libFuzzer and the sanitizers) for make fuzz
set -euo pipefail
pkgs=(g++ make nlohmann-json3-dev libstb-dev libxxhash-dev libopenmpi-dev openmpi-bin)
[ "${1:-test}" = "test" ] && pkgs+=(doctest-dev python3-torch libopenblas0-openmp)
[ "${1:-test}" = "fuzz" ] && pkgs+=(clang)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing: ${missing[*]}"
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
