#!/bin/sh
# Installs the Debian packages mha needs that are not installed yet.
#   setup.sh core   build the library and the CLI
#   setup.sh test   also run every test and benchmark
set -e
core="gcc make libc6-dev libjansson-dev libpng-dev zlib1g-dev pkg-config"
test="$core python3 python3-numpy python3-pytest python3-torch libopenblas-dev clang libclang-rt-14-dev"
case "${1:-core}" in
  core) want="$core" ;;
  test) want="$test" ;;
  *) echo "setup.sh: unknown set '$1' (expected core or test)" >&2; exit 2 ;;
esac
missing=""
for p in $want; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
echo "setup.sh: installing$missing"
if [ "$(id -u)" -eq 0 ]; then sudo=""; else sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends $missing
