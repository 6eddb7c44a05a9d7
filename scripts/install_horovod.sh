#!/usr/bin/env bash
# Install Horovod 0.28.1 (PyTorch + gloo, NCCL when CUDA is there) into the active Python.
#
#   bash scripts/install_horovod.sh            # build once, then reuse the cached wheel
#   bash scripts/install_horovod.sh --rebuild  # ignore the cache
#
# Why a script: Horovod 0.28.1, its latest release, hard-codes C++14 while torch >= 2.1
# headers need C++17, so `pip install horovod` fails to compile against torch 2.x.
# Upstream fixed it (horovod/horovod#3998, for #3996) but never released the fix. This
# script fetches the 0.28.1 sdist from PyPI, changes `set(CMAKE_CXX_STANDARD 14)` to 17 in
# CMakeLists.txt and horovod/torch/CMakeLists.txt (nothing else), builds a wheel against
# the torch already installed, caches it under
#   ${KOSMOSS_WHEEL_CACHE:-~/.cache/kosmoss/wheels}/horovod-0.28.1/torch-<version>-<ops>/
# and installs it: a second run with the same torch and Python takes seconds.
# Environment: PYTHON (default: python3 on PATH), KOSMOSS_WHEEL_CACHE, MAKEFLAGS (default -j<cores>).
set -euo pipefail

HOROVOD_VERSION=0.28.1
PYTHON=${PYTHON:-python3}
rebuild=0
for arg in "$@"; do
    case "$arg" in
        --rebuild) rebuild=1 ;;
        -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "install_horovod.sh: unknown argument $arg (use --rebuild or --help)" >&2; exit 2 ;;
    esac
done

say() { echo "install_horovod: $*"; }

if ! torch_version=$("$PYTHON" -c 'import torch; print(torch.__version__)' 2>/dev/null); then
    echo "install_horovod.sh: torch is not importable by $PYTHON; install torch first (e.g. pip install torch==2.13.0)" >&2
    exit 2
fi
torch_cuda=$("$PYTHON" -c 'import torch; print(torch.version.cuda or "")')
python_tag=$("$PYTHON" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')

# NCCL needs both a CUDA build of torch and the CUDA compiler; otherwise gloo does everything.
ops=gloo
if [ -n "$torch_cuda" ] && command -v nvcc >/dev/null; then
    ops=gloo-nccl
fi

# torch's own headers say which C++ they need: C++17 from torch 2.1, C++20 in newer builds
# (ATen.h: "#error C++20 or later compatible compiler is required to use ATen").
torch_include=$("$PYTHON" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "include"))')
cxx_std=17
if grep -qs "C++20 or later" "$torch_include/ATen/ATen.h"; then
    cxx_std=20
fi

cache_dir="${KOSMOSS_WHEEL_CACHE:-$HOME/.cache/kosmoss/wheels}/horovod-$HOROVOD_VERSION/torch-$torch_version-$ops"
cached_wheel=$(ls "$cache_dir"/horovod-"$HOROVOD_VERSION"-"$python_tag"-*.whl 2>/dev/null | head -n 1 || true)

install_wheel() {
    say "installing $1"
    # --force-reinstall --no-deps replaces an installed horovod without touching torch;
    # the second call only adds horovod's own requirements (cloudpickle, pyyaml, ...) if missing.
    "$PYTHON" -m pip install --quiet --force-reinstall --no-deps "$1"
    "$PYTHON" -m pip install --quiet "$1"
}

check_install() {
    "$PYTHON" -c 'import horovod.torch as hvd; assert hvd.gloo_built(), "horovod was built without gloo"; print("install_horovod: horovod", __import__("horovod").__version__, "imports; gloo built:", hvd.gloo_built(), "NCCL built:", bool(hvd.nccl_built()))'
}

if [ "$rebuild" = 0 ] && [ -n "$cached_wheel" ]; then
    say "cached wheel for torch $torch_version ($ops, $python_tag) found: horovod $HOROVOD_VERSION"
    say "  with CMAKE_CXX_STANDARD 14 -> $cxx_std (what torch $torch_version's headers need)"
    install_wheel "$cached_wheel"
    check_install
    exit 0
fi

# Build tools: a fresh machine may have only Python and pip.
if ! command -v cmake >/dev/null; then
    say "cmake not found: installing it from PyPI"
    "$PYTHON" -m pip install --quiet cmake
    export PATH="$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_path("scripts"))'):$PATH"
fi
if ! command -v g++ >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        say "g++ not found: installing it with apt-get"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq g++ make >/dev/null
    else
        echo "install_horovod.sh: g++ is needed to build Horovod; install it (e.g. sudo apt-get install g++) and run again" >&2
        exit 2
    fi
fi

# --no-build-isolation builds against the installed torch, so the build tools must be there
# too: setuptools >= 70.1 makes wheels itself (a Python 3.11 venv starts with 65.5, which
# needs the separate `wheel` package).
"$PYTHON" -m pip install --quiet "setuptools>=70.1"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

say "fetching the horovod $HOROVOD_VERSION sdist from PyPI"
"$PYTHON" -m pip download --quiet --no-deps --no-binary :all: --no-build-isolation \
    "horovod==$HOROVOD_VERSION" -d "$work"
tar -xzf "$work/horovod-$HOROVOD_VERSION.tar.gz" -C "$work"
src="$work/horovod-$HOROVOD_VERSION"

say "patching: CMAKE_CXX_STANDARD 14 -> $cxx_std in CMakeLists.txt and horovod/torch/CMakeLists.txt"
say "  (torch $torch_version's headers need C++$cxx_std; upstream's C++17 fix, horovod/horovod#3998, is unreleased)"
for cmake_file in CMakeLists.txt horovod/torch/CMakeLists.txt; do
    sed -i "s/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD $cxx_std)/" "$src/$cmake_file"
    if ! grep -q "set(CMAKE_CXX_STANDARD $cxx_std)" "$src/$cmake_file" \
        || grep -q 'set(CMAKE_CXX_STANDARD 14)' "$src/$cmake_file"; then
        echo "install_horovod.sh: the C++$cxx_std patch did not apply to $cmake_file; the sdist changed?" >&2
        exit 1
    fi
done

export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1
export HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1
if [ "$ops" = gloo-nccl ]; then
    export HOROVOD_GPU_OPERATIONS=NCCL
    # torch's pip wheels bring NCCL as the nvidia-nccl package: point Horovod at it.
    nccl_home=$("$PYTHON" -c 'import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null || true)
    if [ -z "${HOROVOD_NCCL_HOME:-}" ] && [ -n "$nccl_home" ]; then
        export HOROVOD_NCCL_HOME="$nccl_home"
    fi
fi
export MAKEFLAGS=${MAKEFLAGS:--j$(nproc)}

say "building the wheel against torch $torch_version ($ops; about 12 minutes on 2 cores)"
"$PYTHON" -m pip wheel --no-deps --no-build-isolation "$src" -w "$work/dist"
built=$(ls "$work"/dist/horovod-*.whl)
mkdir -p "$cache_dir"
cp "$built" "$cache_dir/"
say "cached $(basename "$built") in $cache_dir"
install_wheel "$cache_dir/$(basename "$built")"
check_install
