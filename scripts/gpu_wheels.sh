#!/usr/bin/env bash
# Fetch the wheels scripts/gpu_check.sh installs on the GPU machine, which reaches no
# package registry: kosmoss itself, and what kosmoss needs beyond that machine's image.
#
#   bash scripts/gpu_wheels.sh               # into gpu-wheels/ (ignored by git), then its size
#   bash scripts/gpu_wheels.sh --wheels DIR  # somewhere else
#
# Run it here, where pip reaches PyPI, after every change to kosmoss/ (the kosmoss wheel is
# built from this checkout, and gpu_check.sh refuses one that no longer matches it).
# The wheels are for CPython 3.12 on manylinux x86-64, the GPU machine's Python. Its image
# already holds torch, pytorch-lightning, torchmetrics, numpy, psutil, rich, tensorboard,
# matplotlib, pytest and pytest-timeout (docs/gpu.md), so only these travel:
#   nvitop (GPU facts for kosmoss env and ghosts), py-spy (kosmoss stacks), nvidia-ml-py
#   (nvitop's NVML binding: installed there only if the image lacks it).
# gpu_check.sh sources this file for the list (CARRIED) and the folder (WHEEL_DIR_DEFAULT).
# Environment: PYTHON (default: python3 on PATH), a Python with pip.

# One version of each, the ones the tests run against here (two versions stop pip).
CARRIED=(nvitop==1.7.2 nvidia-ml-py==13.615.71 py-spy==0.4.3)
# The lessons profile executes every lesson there (nbclient, a real kernel): the lessons
# extra and what it needs that the image lacks (pip download's resolution for CPython 3.12
# on 2026-11-26, less what the image holds). Installed only for that profile.
LESSON_CARRIED=(jupytext==1.19.6 nbclient==0.11.0 nbformat==5.11.1 ipykernel==7.4.0
                ipython==9.18.1 ipython_pygments_lexers==1.1.1 jupyter_client==8.10.0
                jupyter_core==5.9.1 traitlets==5.16.1 tornado==6.6.1 pyzmq==27.3.0
                comm==0.2.3 debugpy==1.8.22 matplotlib-inline==0.2.2 nest-asyncio2==1.7.4
                jedi==0.20.1 parso==0.8.7 pexpect==4.9.0 ptyprocess==0.7.0
                prompt_toolkit==3.0.53 wcwidth==0.9.4 stack-data==0.6.3 asttokens==3.0.2
                executing==2.3.0 pure_eval==0.2.4 fastjsonschema==2.22.3 jsonschema==4.26.0
                jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1
                mdit-py-plugins==0.7.0 platformdirs==4.14.8 tzdata==2026.6
                pytorch-optimizer==4.1.0)
WHEEL_DIR_DEFAULT=gpu-wheels
GPU_PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64
               manylinux2014_x86_64 manylinux_2_5_x86_64 manylinux1_x86_64)

# The file name pattern of a carried wheel: pip writes the name with "_" for "-".
wheel_glob() {
    local name=${1%%==*} version=${1##*==}
    echo "${name//-/_}-${version}-*.whl"
}

fetch_carried() {
    local dir=$1 platforms=() spec
    for p in "${GPU_PLATFORMS[@]}"; do platforms+=(--platform "$p"); done
    for spec in "${CARRIED[@]}" "${LESSON_CARRIED[@]}"; do
        # A carried name in another version: two versions of one wheel stop the install.
        local name=${spec%%==*}
        find "$dir" -maxdepth 1 -name "${name//-/_}-*.whl" ! -name "$(wheel_glob "$spec")" -delete
    done
    "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp "${platforms[@]}" -d "$dir" "${CARRIED[@]}" "${LESSON_CARRIED[@]}"
}

build_kosmoss() {
    local dir=$1 tree
    rm -f "$dir"/kosmoss-*.whl
    # From a copy of what git would send (tracked and untracked-not-ignored files): a build/
    # left in the checkout would put deleted modules back into the wheel.
    tree=$(mktemp -d)
    # pyproject's data-files name docs/*.md, the GPU records and scripts/install_horovod.sh.
    git ls-files -z --cached --others --exclude-standard -- kosmoss pyproject.toml setup.py \
        README.md trainup_cpu.py trainup_gpu.py notebooks slurm 'docs/*.md' \
        'docs/gpu/*/results.json' 'docs/hosts/*.json' scripts/install_horovod.sh |
        xargs -0 cp --parents -t "$tree" 2>/dev/null
    # A wheel, not the source tree: installing it there needs no setuptools and no index.
    "$PYTHON" -m pip wheel --quiet --no-deps -w "$(realpath "$dir")" "$tree"
    local rc=$?
    rm -rf "$tree"
    return $rc
}

main() {
    set -euo pipefail
    local dir=$WHEEL_DIR_DEFAULT
    while [ $# -gt 0 ]; do
        case "$1" in
            --wheels) [ $# -ge 2 ] || { echo "gpu_wheels.sh: --wheels needs a folder" >&2; exit 2; }
                      dir=$2; shift 2 ;;
            -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"
                       exit 0 ;;
            *) echo "gpu_wheels.sh: unknown argument $1 (use --wheels DIR or --help)" >&2; exit 2 ;;
        esac
    done
    cd "$(dirname "$0")/.."
    PYTHON=${PYTHON:-python3}
    if ! "$PYTHON" -m pip --version >/dev/null 2>&1; then
        echo "gpu_wheels.sh: $PYTHON has no pip; set PYTHON to a Python with pip (e.g. .venv/bin/python)" >&2
        exit 2
    fi
    mkdir -p "$dir"
    fetch_carried "$dir"
    build_kosmoss "$dir"
    ls -l "$dir"
    echo "gpu_wheels.sh: $(du -sh "$dir" | cut -f1) in $dir (keep it under 64 MiB if your remote runner copies at most that)"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    main "$@"
fi
