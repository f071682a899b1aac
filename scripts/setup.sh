#!/bin/sh
# Installs the Debian packages mha needs that are not installed yet.
#   setup.sh core   build the library and the CLI
#   setup.sh mpi    also OpenMPI, for libmha_mpi and mha-mpi (make mpi)
#   setup.sh test   also run every test (MPI's too) and the fuzzers
#   setup.sh bench  also the benchmarks' peers (ONNX Runtime via npm, python3-onnx)
set -e
core="gcc make libc6-dev libjansson-dev libpng-dev zlib1g-dev pkg-config"
mpi="$core openmpi-bin libopenmpi-dev"
test="$mpi python3 python3-numpy python3-pytest python3-torch python3-pip python3-setuptools python3-wheel libopenblas-dev clang libomp-dev gcovr locales"
bench="$test python3-onnx nodejs"
case "${1:-core}" in
  core) want="$core" ;;
  mpi) want="$mpi" ;;
  test) want="$test" ;;
  bench) want="$bench" ;;
  *) echo "setup.sh: unknown set '$1' (expected core, mpi, test or bench)" >&2; exit 2 ;;
esac
if [ "$(id -u)" -eq 0 ]; then sudo=""; else sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
updated=""

# install PACKAGE... : apt-get install of those not installed yet
install() {
  missing=""
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
  done
  [ -z "$missing" ] && return 0
  echo "setup.sh: installing$missing"
  # Another apt-get (a second make, a package manager) holds dpkg's lock:
  # wait for it up to 10 minutes rather than fail at once.
  [ -n "$updated" ] || { $sudo apt-get -o DPkg::Lock::Timeout=600 update -qq; updated=1; }
  $sudo apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends $missing
}

install $want
# The fuzzers need clang's sanitizer runtime, packaged per clang version
# (libclang-rt-14-dev on bookworm): ask the installed clang which.
if [ "${1:-core}" = test ] || [ "${1:-core}" = bench ]; then
  major=$(clang -dumpversion | cut -d. -f1)
  install "libclang-rt-$major-dev"
fi
# A decimal-comma locale: the test that numbers in files ignore the
# caller's locale (tests/test_variants_io.c) runs a thread under de_DE.
if [ "${1:-core}" = test ] || [ "${1:-core}" = bench ]; then
  locale -a 2>/dev/null | grep -qi '^de_DE\.utf-\?8$' ||
    $sudo localedef -i de_DE -f UTF-8 de_DE.UTF-8 ||
    echo "setup.sh: localedef de_DE.UTF-8 failed; the locale test will say so" >&2
fi
# ONNX Runtime, the benchmark's peer: the npm package (CPU runtime inside),
# pinned in bench/ort/package.json; --ignore-scripts because its install
# script only downloads GPU parts (and fails offline). npm comes with some
# nodejs builds; Debian packages it apart. Only for the benchmarks: the
# tests never need it.
if [ "${1:-core}" = bench ]; then
  command -v npm >/dev/null 2>&1 || install npm
  here=$(dirname "$0")/..
  if [ ! -d "$here/bench/ort/node_modules/onnxruntime-node" ]; then
    echo "setup.sh: npm install onnxruntime-node into bench/ort/node_modules"
    npm install --prefix "$here/bench/ort" --ignore-scripts --no-audit --no-fund
  fi
fi
