# Shared by the project's scripts: install what the build needs, then configure and build.
# Source it; it defines functions and sets PARASOL_ROOT and PARASOL_BUILD.

PARASOL_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PARASOL_BUILD="${PARASOL_BUILD:-$PARASOL_ROOT/build}"

# Debian packages the build, the tests and the benchmarks need.
PARASOL_PACKAGES=(
  build-essential cmake ninja-build pkg-config
  libzmq3-dev cppzmq-dev libsodium-dev libxxhash-dev
  libflatbuffers-dev flatbuffers-compiler
  libboost-dev libyaml-cpp-dev libopenblas-dev
  libgtest-dev libbenchmark-dev libcli11-dev libspdlog-dev libfmt-dev nlohmann-json3-dev librocksdb-dev
  python3-dev pybind11-dev python3-numpy
  iproute2
  clang libclang-rt-14-dev
)

# Prints those of the named Debian packages that are not installed, one per line.
parasol_missing_packages() {
  local p
  for p in "$@"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
      echo "$p"
    fi
  done
}

parasol_install_deps() {
  local missing=()
  mapfile -t missing < <(parasol_missing_packages "${PARASOL_PACKAGES[@]}")
  if [ "${#missing[@]}" -eq 0 ]; then
    return 0
  fi
  echo "parasol: installing Debian packages: ${missing[*]}"
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
      sudo="sudo"
    else
      echo "parasol: missing packages (${missing[*]}) and not root; install them first" >&2
      return 1
    fi
  fi
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -q
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    "${missing[@]}"
}

# What only the tests need: a real Slurm for the `slurm` test (it runs Slurm's daemons, so as
# root only). Best effort: without it that test reports itself skipped, with the reason.
PARASOL_TEST_PACKAGES=(slurm-wlm munge)

parasol_install_test_deps() {
  if [ "$(id -u)" -ne 0 ]; then
    echo "parasol: not root: the Slurm test will be skipped (it runs Slurm's daemons)"
    return 0
  fi
  local missing=()
  mapfile -t missing < <(parasol_missing_packages "${PARASOL_TEST_PACKAGES[@]}")
  [ "${#missing[@]}" -eq 0 ] && return 0
  echo "parasol: installing Debian packages for the tests: ${missing[*]}"
  # The packages' own services must not start (the test runs its own daemons): a policy-rc.d
  # that denies every start, for the install only, where there is none.
  local policy=/usr/sbin/policy-rc.d placed=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && placed=1
  fi
  if ! env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
      --no-install-recommends "${missing[@]}"; then
    env DEBIAN_FRONTEND=noninteractive apt-get update -q || true
    env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
      --no-install-recommends "${missing[@]}" ||
      echo "parasol: could not install ${missing[*]}: the Slurm test will be skipped"
  fi
  [ "$placed" = 1 ] && rm -f "$policy"
  return 0
}

parasol_build() {
  local build_type="${1:-Release}"
  # PARASOL_WERROR=ON (the test command sets it under CI) makes warnings errors.
  cmake -S "$PARASOL_ROOT" -B "$PARASOL_BUILD" -G Ninja -DCMAKE_BUILD_TYPE="$build_type" \
    -DPARASOL_WERROR="${PARASOL_WERROR:-OFF}"
  cmake --build "$PARASOL_BUILD" -j "$(nproc)"
}
