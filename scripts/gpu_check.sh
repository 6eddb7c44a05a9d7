#!/usr/bin/env bash
# The GPU path of kosmoss, proven in one call on a GPU machine with no package registry
# (docs/gpu.md). From the repository root:
#
#   bash scripts/gpu_wheels.sh                     # here, after every change to kosmoss/
#   bash scripts/gpu_check.sh --dry-run            # here, on CPU: the plan; every file checked
#   bash scripts/gpu_check.sh                      # there: everything into $OUT (or --out DIR)
#   bash scripts/gpu_check.sh --only bench,sweep   # there, a second call for what did not fit
#
# Steps, in order (--only picks some; install always runs, data when a step needs it):
#   install   pip install --no-index --no-deps of the kosmoss wheel, and of the carried
#             wheels the machine lacks (never touching its torch), into a --target folder
#   env       kosmoss env: GPU, driver, CUDA, NCCL, torch, Lightning
#   data      a synthetic dataset sized for GPU batches (--columns), prepared in the
#             background while pytest runs
#   pytest    python -m pytest -m gpu: every GPU test
#   headline  trainup_gpu.py --strategy ddp --gpus 1 --num-nodes 2
#   bf16      trainup_gpu.py --gpus 1 --precision bf16-mixed --mode device
#   ghost     a torchrun rank outlives its agent's SIGKILL holding a CUDA context; kosmoss
#             ghosts --kill ends it; GPU memory read through nvitop before and after
#   bench     kosmoss bench, its GPU rows, the raw loops they are divided by, the raw
#             loop inside Lightning (lightning-gpu: Lightning's fixed cost against a GPU
#             step) and on Fabric (fabric-gpu: a loop of one's own), 300 steps a row; one
#             repeat instead of two when less than 440 s of the budget is left (its
#             shared-GPU prediction runs ddp_anatomy: ~45 s)
#   sweep     the raw bf16 loop at three batch sizes: is --gpu-batch large enough?
#   anatomy   the shared-GPU row's step split in parts: 1 process; 2 ranks on the one GPU,
#             nothing exchanged; + one flat all-reduce; + DDP (kosmoss.bench.ddp_anatomy)
#
# Options: --out DIR (default $OUT, else runs/gpu-check-<time>) --wheels DIR (gpu-wheels)
# --only STEP,... --tests PATH,... (what pytest collects: tests) --lessons NAME,... (what the
# lessons step runs: every lesson) --budget SECONDS (560: a
# remote runner that stops a command at 600 s; a step that no longer fits is reported not run)
# --columns N (131072) --gpu-batch N (16384).
# Writes into the output folder, 7 files: gpu-report.md (step, result, command, figure),
# results.json, gpu-check.log, pytest-gpu.log, bench.json, bench.csv, bench.png.
# Exit: 0 every step passed; 1 a step failed or did not run (the others still ran);
# 2 bad input (no GPU, a missing or stale wheel, a bad flag), one line on stderr.
# Environment: PYTHON (default python3), GPU_CHECK_SCRATCH (default /tmp/kosmoss-gpu-check:
# KOSMOSS_HOME, the dataset and the installed wheels, kept for a second call).
set -uo pipefail  # no -e: a failed step is recorded and the next one runs

PROG=gpu_check.sh
ORIGIN=$PWD  # --out and --wheels are relative to where the user stands
cd "$(dirname "$0")/.." || exit 2
# shellcheck source=scripts/gpu_wheels.sh
source scripts/gpu_wheels.sh  # CARRIED, WHEEL_DIR_DEFAULT, wheel_glob

# The anatomy last: the bench measures its first three lines itself (the shared-GPU
# prediction); the step adds the DDP lines, for when the budget allows.
STEPS=(install env data pytest headline bf16 ghost bench sweep anatomy ladder top lessons)
NEEDS_DATA=(headline bf16 sweep bench anatomy ladder top)
# What one call runs: each profile fits a 10-minute remote command with room to spare
# (an H100 on 2026-11-26 took 330 s for check's steps). install always runs.
declare -A PROFILES=([check]="env,data,pytest,headline,bf16,ghost"
                     [bench]="data,bench,sweep,anatomy"
                     [ladder]="data,ladder,top"
                     [lessons]="lessons")
PROFILE_ORDER="check, bench, ladder, lessons"
# The ladder's dataset: 2^17 training rows, so every batch it tries (16,384, 65,536, the
# whole split) is full and a CUDA graph replays every step of an epoch.
LADDER_COLUMNS=163840
LADDER_BATCHES="max"  # after --gpu-batch: the ladder's top rung at the largest batch too
# What kosmoss and its GPU tests import that the GPU machine's image already holds.
REQUIRED_THERE=(torch pytorch-lightning torchmetrics numpy psutil rich tensorboard matplotlib
                pytest pytest-timeout)
BENCH_ROWS=(raw-gpu lightning-gpu fabric-gpu kosmoss-gpu nodes-gpu-2x1 raw-gpu-bf16 kosmoss-gpu-bf16)
# kosmoss with the ladder's top features, beside the ladder the step before measured.
TOP_ROWS=(kosmoss-gpu kosmoss-gpu-top kosmoss-gpu-top-max)
SWEEP_BATCHES=4096,16384,32768
SHARD_SIZE=16384
declare -A LIMIT_S=([install]=120 [env]=60 [data]=300 [pytest]=300 [headline]=150 [bf16]=120
                    [ghost]=150 [sweep]=150 [bench]=420 [anatomy]=150 [ladder]=300
                    [top]=240 [lessons]=540)

die() { echo "$PROG: $*" >&2; exit 2; }

usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; }

positive() {  # positive FLAG VALUE
    [[ $2 =~ ^[1-9][0-9]*$ ]] || die "$1 $2: give a whole number >= 1"
}

parse_args() {
    DRY_RUN=0 OUT_ARG="" WHEELS=$WHEEL_DIR_DEFAULT ONLY="" BUDGET=560 COLUMNS=131072
    GPU_BATCH=16384 TESTS=tests PROFILE="" COLUMNS_GIVEN="" LESSONS=""
    while [ $# -gt 0 ]; do
        case "$1" in
            --dry-run) DRY_RUN=1; shift; continue ;;
            -h|--help) usage; exit 0 ;;
            --out|--wheels|--only|--budget|--columns|--gpu-batch|--tests|--profile|--lessons)
                [ $# -ge 2 ] || die "$1 needs a value (see --help)" ;;
            *) die "unknown argument $1 (see --help)" ;;
        esac
        case "$1" in
            --out) OUT_ARG=$2 ;;
            --wheels) WHEELS=$2 ;;
            --only) ONLY=$2 ;;
            --profile) PROFILE=$2 ;;
            --tests) TESTS=$2 ;;
            --lessons) LESSONS=$2 ;;
            --budget) positive "$1" "$2"; BUDGET=$2 ;;
            --columns) positive "$1" "$2"; COLUMNS=$2; COLUMNS_GIVEN=1 ;;
            --gpu-batch) positive "$1" "$2"; GPU_BATCH=$2 ;;
        esac
        shift 2
    done
    [ -n "$OUT_ARG" ] && [[ $OUT_ARG != /* ]] && OUT_ARG=$ORIGIN/$OUT_ARG
    [[ $WHEELS != /* ]] && [ "$WHEELS" != "$WHEEL_DIR_DEFAULT" ] && WHEELS=$ORIGIN/$WHEELS
    [ -n "$PROFILE" ] && [ -n "$ONLY" ] && die "--profile and --only: give one of them"
    if [ -n "$PROFILE" ]; then
        [ -n "${PROFILES[$PROFILE]+set}" ] || die "--profile $PROFILE: no such profile; choose from $PROFILE_ORDER"
    elif [ -z "$ONLY" ]; then
        PROFILE=check
    fi
    [ -n "$PROFILE" ] && ONLY=${PROFILES[$PROFILE]}
    [ "$PROFILE" = ladder ] && [ -z "$COLUMNS_GIVEN" ] && COLUMNS=$LADDER_COLUMNS
    local step
    for step in ${ONLY//,/ }; do
        [[ " ${STEPS[*]} " == *" $step "* ]] || die "--only $step: no such step; choose from ${STEPS[*]}"
    done
    local lesson
    for lesson in ${LESSONS//,/ }; do
        [ -e "notebooks/$lesson.py" ] || die "--lessons $lesson: no such lesson; give names as in notebooks/ without .py, comma-separated"
    done
    local tests
    for tests in ${TESTS//,/ }; do
        [ -e "${tests%%::*}" ] || die "--tests $tests: not in the checkout; give paths under tests/, comma-separated"
    done
    # The training split is 80 % of the columns; one GPU batch must fit in it.
    [ $((COLUMNS * 8 / 10)) -ge "$GPU_BATCH" ] ||
        die "--gpu-batch $GPU_BATCH is larger than the training split of --columns $COLUMNS: raise --columns"
    DATASET=gpu-check-$COLUMNS
    OUT_DIR=${OUT_ARG:-${OUT:-runs/gpu-check-$(date +%Y%m%d-%H%M%S)}}
    PY=${PYTHON:-python3}
    SCRATCH=${GPU_CHECK_SCRATCH:-${TMPDIR:-/tmp}/kosmoss-gpu-check}
    SITE=$SCRATCH/site
}

selected() {  # selected STEP: whether this call runs it
    local step=$1 needing
    [ "$step" = install ] && return 0
    [ -z "$ONLY" ] && return 0
    [[ ",$ONLY," == *",$step,"* ]] && return 0
    if [ "$step" = data ]; then
        for needing in "${NEEDS_DATA[@]}"; do
            [[ ",$ONLY," == *",$needing,"* ]] && return 0
        done
    fi
    return 1
}

# ---- input checks: each failure is one line and exit 2, before anything is written

check_gpu() {
    local listed
    listed=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ') || listed=0
    [ "$listed" -ge 1 ] ||
        die "no NVIDIA GPU here (nvidia-smi -L lists none): run it on the GPU machine (docs/gpu.md), or see the plan with --dry-run"
    "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 3)' 2>/dev/null ||
        die "nvidia-smi lists a GPU but $PY cannot use it (no torch, or torch.cuda.is_available() is False): set PYTHON to the Python that holds CUDA torch"
}

check_tools() {
    command -v "$PY" >/dev/null || die "$PY not found: set PYTHON to a Python 3.11+ interpreter"
    command -v timeout >/dev/null || die "timeout (GNU coreutils) not found: install coreutils"
    local file
    for file in trainup_gpu.py kosmoss/__init__.py tests/conftest.py tests/gpu/test_cuda_runs.py; do
        [ -f "$file" ] || die "$file not found: run from a kosmoss checkout"
    done
}

carried_wheel() {  # carried_wheel SPEC: its wheel file, or a one-line error
    local matches
    mapfile -t matches < <(compgen -G "$WHEELS/$(wheel_glob "$1")")
    [ "${#matches[@]}" -ge 1 ] ||
        die "missing wheel $WHEELS/$(wheel_glob "$1") ($1): fetch it with bash scripts/gpu_wheels.sh"
    [ "${#matches[@]}" -eq 1 ] ||
        die "two wheels for $1 in $WHEELS: remove all but one, or run bash scripts/gpu_wheels.sh"
    echo "${matches[0]}"
}

carried_here() {  # the carried specs this call needs: the lessons' only for their step
    printf '%s\n' "${CARRIED[@]}"
    selected lessons && printf '%s\n' "${LESSON_CARRIED[@]}"
    return 0
}

check_wheels() {
    local spec matches
    [ -d "$WHEELS" ] || die "missing wheel folder $WHEELS: fetch the wheels with bash scripts/gpu_wheels.sh"
    mapfile -t CARRIED_HERE < <(carried_here)
    for spec in "${CARRIED_HERE[@]}"; do
        carried_wheel "$spec" >/dev/null || exit 2
    done
    mapfile -t matches < <(compgen -G "$WHEELS/kosmoss-*-py3-none-any.whl")
    [ "${#matches[@]}" -ge 1 ] ||
        die "missing wheel $WHEELS/kosmoss-*-py3-none-any.whl (kosmoss): build it with bash scripts/gpu_wheels.sh"
    [ "${#matches[@]}" -eq 1 ] || die "two kosmoss wheels in $WHEELS: run bash scripts/gpu_wheels.sh"
    KOSMOSS_WHEEL=${matches[0]}
    "$PY" "$HELPER" fresh "$KOSMOSS_WHEEL" || exit 2
}

check_out_dir() {
    [ -e "$OUT_DIR" ] && [ ! -d "$OUT_DIR" ] && die "--out $OUT_DIR: is a file; give a folder"
    if [ -d "$OUT_DIR" ] && [ -n "$(ls -A "$OUT_DIR")" ] && [ ! -f "$OUT_DIR/gpu-report.md" ]; then
        die "--out $OUT_DIR: not empty and holds no gpu-report.md; give a new or empty folder"
    fi
}

# ---- the steps

command_of() {  # command_of STEP: sets CMD (what runs) and SHOWN (what the plan and report say)
    local site_wheels
    case $1 in
        install)
            CMD=(install_wheels)
            site_wheels=$(basename "${KOSMOSS_WHEEL:-kosmoss-*.whl}")
            SHOWN="$PY -m pip install --no-index --no-deps --no-compile --target $SITE $WHEELS/$site_wheels, and of $(printf '%s ' "${CARRIED_HERE[@]}")only those the machine lacks" ;;
        env) CMD=(show_env); SHOWN="$PY -m kosmoss env" ;;
        data) CMD=("$PY" -m kosmoss data prepare --columns "$COLUMNS" --shard-size "$SHARD_SIZE"
                   --name "$DATASET") ;;
        # A module that fails to import must not stop the GPU tests of the others.
        pytest) CMD=("$PY" -m pytest -m gpu -p no:cacheprovider -q -rs
                     --continue-on-collection-errors ${TESTS//,/ }) ;;
        headline) CMD=("$PY" trainup_gpu.py --strategy ddp --gpus 1 --num-nodes 2
                       --dataset "$DATASET" --batch-size "$GPU_BATCH" --max-steps 100
                       --max-epochs 1000 --no-progress --result-json "$SCRATCH/headline.json") ;;
        bf16) CMD=("$PY" trainup_gpu.py --gpus 1 --precision bf16-mixed --mode device
                   --require-gpu --dataset "$DATASET" --batch-size "$GPU_BATCH" --max-steps 200
                   --max-epochs 1000 --no-progress --result-json "$SCRATCH/bf16.json") ;;
        ghost)
            CMD=("$PY" "$HELPER" ghost "$SCRATCH")
            SHOWN="$PY -m torch.distributed.run --standalone --nproc_per_node 1 trainup_gpu.py --dataset tiny --batch-size 1024 --max-epochs 100000 --require-gpu --no-progress; kill -9 <torchrun's agent>; $PY -m kosmoss ghosts --json; $PY -m kosmoss ghosts --kill; nvitop Device.memory_used() before and after" ;;
        sweep)
            CMD=("$PY" "$HELPER" sweep "$SCRATCH" "$DATASET" "$SWEEP_BATCHES")
            SHOWN="$PY -m kosmoss.bench.baselines raw --device cuda --bf16 --dataset $DATASET --steps 60 --batch-size B, for B in $SWEEP_BATCHES" ;;
        anatomy) CMD=("$PY" -m kosmoss.bench.ddp_anatomy --device cuda
                      --dataset "$SCRATCH/home/data/$DATASET" --batch-size "$GPU_BATCH"
                      --steps 100 --repeats 1 --json "$SCRATCH/anatomy.json") ;;
        ladder) CMD=("$PY" -m kosmoss.bench.ladder --device cuda
                     --dataset "$SCRATCH/home/data/$DATASET" --batch-size "$GPU_BATCH"
                     $LADDER_BATCHES --steps 300 --also tf32 --out "$SCRATCH/ladder.json") ;;
        top) CMD=("$PY" -m kosmoss bench --only "${TOP_ROWS[@]}" --dataset "$DATASET"
                  --gpu-batch-size "$GPU_BATCH" --steps 300 --repeats 1 --out "$SCRATCH/bench") ;;
        lessons) CMD=("$PY" "$HELPER" lessons "$SCRATCH" "$OUT_DIR" ${LESSONS//,/ })
                 SHOWN="KOSMOSS_LESSON_QUICK=1: ${LESSONS:-every lesson} (kosmoss.lessons.site.execute_lessons, nbclient) on the GPU, one at a time; each lesson's time, and its cells that said they ran on CPU" ;;
        bench) CMD=("$PY" -m kosmoss bench --only "${BENCH_ROWS[@]}" --dataset "$DATASET"
                    --gpu-batch-size "$GPU_BATCH" --steps 300 --repeats "$(bench_repeats)"
                    --out "$SCRATCH/bench") ;;
    esac
    case $1 in install|env|ghost|sweep|lessons) ;; *) SHOWN="${CMD[*]}" ;; esac
}

bench_repeats() {  # a bench killed by its limit writes nothing: one repeat when time is short
    if [ $((BUDGET - SECONDS)) -lt 440 ]; then echo 1; else echo 2; fi
}

install_wheels() {
    local wheels=("$KOSMOSS_WHEEL") spec
    for spec in "${TO_INSTALL[@]}"; do
        wheels+=("$(carried_wheel "$spec")")
    done
    rm -rf "$SITE"
    # --target: the image's own environment stays as it was; PYTHONPATH puts SITE first.
    "$PY" -m pip install --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" \
        "${wheels[@]}"
}

show_env() {
    "$PY" -m kosmoss env && "$PY" -m kosmoss env --json >"$SCRATCH/env.json"
}

record() {  # record STEP STATUS SECONDS FIGURE
    "$PY" "$HELPER" row "$SCRATCH" "$1" "$2" "$3" "$SHOWN" "$4"
    "$PY" "$HELPER" report "$SCRATCH" "$OUT_DIR"
    echo "gpu_check: $1: $2 ($3 s) $4"
}

run_step() {  # run_step STEP: run it within its limit and the budget, then record it
    local step=$1 limit=${LIMIT_S[$1]} left rc started figure status log=$OUT_DIR/gpu-check.log
    command_of "$step"
    left=$((BUDGET - SECONDS))
    if [ "$left" -lt 30 ]; then
        NOT_RUN+=("$step")
        record "$step" "not run" 0 "the --budget of $BUDGET s was spent: run again with --only"
        return
    fi
    [ "$limit" -gt $((left - 5)) ] && limit=$((left - 5))
    [ "$step" = pytest ] && log=$OUT_DIR/pytest-gpu.log
    rm -f "$SCRATCH/$step.json" "$SCRATCH/$step.figure"
    echo "== $step (limit ${limit} s): $SHOWN" >>"$log"
    started=$SECONDS
    if declare -F "${CMD[0]}" >/dev/null; then
        "${CMD[@]}" >>"$log" 2>&1
    else
        timeout --kill-after=15 "$limit" "${CMD[@]}" >>"$log" 2>&1
    fi
    rc=$?
    finish_step "$step" "$rc" $((SECONDS - started)) "$limit"
}

finish_step() {  # finish_step STEP RC SECONDS LIMIT
    local figure status=pass
    figure=$("$PY" "$HELPER" figure "$1" "$SCRATCH" "$OUT_DIR" 2>>"$OUT_DIR/gpu-check.log") ||
        status=fail
    if [ "$2" -eq 124 ] || [ "$2" -eq 137 ]; then
        status=fail figure="timed out after $4 s. $figure"
    elif [ "$2" -ne 0 ]; then
        status=fail figure="exit code $2. $figure"
    fi
    [ "$status" = pass ] || FAILED+=("$1")
    record "$1" "$status" "$3" "$figure"
}

start_data() {  # prepared in the background while pytest holds the GPU
    command_of data
    DATA_SHOWN=$SHOWN
    local limit=${LIMIT_S[data]}
    [ "$limit" -gt $((BUDGET - SECONDS - 5)) ] && limit=$((BUDGET - SECONDS - 5))
    echo "== data (limit ${limit} s, in the background): $SHOWN" >>"$OUT_DIR/gpu-check.log"
    ( started=$SECONDS
      timeout --kill-after=15 "$limit" "${CMD[@]}" >"$SCRATCH/data.log" 2>&1
      echo "$? $((SECONDS - started)) $limit" >"$SCRATCH/data.status" ) &
    DATA_PID=$!
}

join_data() {
    [ -n "${DATA_PID:-}" ] || return 0
    wait "$DATA_PID"
    DATA_PID=""
    cat "$SCRATCH/data.log" >>"$OUT_DIR/gpu-check.log"
    local rc seconds limit
    read -r rc seconds limit <"$SCRATCH/data.status"
    SHOWN=$DATA_SHOWN
    finish_step data "$rc" "$seconds" "$limit"
}

print_plan() {
    local step
    echo "gpu_check.sh --dry-run: the plan (budget $BUDGET s; output into $OUT_DIR)"
    for step in "${STEPS[@]}"; do
        selected "$step" || continue
        command_of "$step"
        printf '  %-9s (limit %3s s)  %s\n' "$step" "${LIMIT_S[$step]}" "$SHOWN"
    done
    echo "wheels: $KOSMOSS_WHEEL (matches the checkout) and $(printf '%s ' "${CARRIED_HERE[@]}")in $WHEELS"
    echo "the GPU machine must already hold: ${REQUIRED_THERE[*]}"
    echo "dry run: every wheel and file is present; nothing was run or written"
}

on_exit() {
    [ -n "${DATA_PID:-}" ] && kill "$DATA_PID" 2>/dev/null
    [ "$DRY_RUN" = 0 ] && [ -d "${SCRATCH:-}" ] && "$PY" "$HELPER" cleanup "$SCRATCH"
    rm -f "$HELPER"
}

main() {
    parse_args "$@"
    HELPER=$(mktemp "${TMPDIR:-/tmp}/gpu_check_helper.XXXXXX") || die "mktemp failed: check TMPDIR"
    trap on_exit EXIT
    write_helper "$HELPER"
    check_tools
    [ "$DRY_RUN" = 1 ] || check_gpu
    check_wheels
    check_out_dir
    if [ "$DRY_RUN" = 1 ]; then
        print_plan
        exit 0
    fi
    local lacking
    lacking=$("$PY" "$HELPER" needs "${CARRIED_HERE[@]}" -- "${REQUIRED_THERE[@]}") || exit 2
    mapfile -t TO_INSTALL < <(grep . <<<"$lacking")
    mkdir -p "$OUT_DIR" "$SCRATCH/home"
    export KOSMOSS_HOME=$SCRATCH/home PYTHONUNBUFFERED=1 GPU_CHECK_DATASET=$DATASET
    export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH} PATH=$SITE/bin:$PATH
    export JUPYTER_PATH=$SITE/share/jupyter${JUPYTER_PATH:+:$JUPYTER_PATH}  # ipykernel's spec
    "$PY" "$HELPER" start "$SCRATCH" "$(nvidia-smi -L | head -n 1)" \
        "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git status --porcelain 2>/dev/null | grep -q . && echo ' + local changes')" \
        "bash scripts/gpu_check.sh $*"
    FAILED=() NOT_RUN=()
    local step
    for step in "${STEPS[@]}"; do
        selected "$step" || continue
        if [ "$step" = data ]; then
            start_data
            continue
        fi
        [[ " ${NEEDS_DATA[*]} " == *" $step "* ]] && join_data
        run_step "$step"
    done
    join_data
    cat "$OUT_DIR/gpu-report.md"
    if [ "${#NOT_RUN[@]}" -gt 0 ]; then
        echo "gpu_check: not run for lack of time: bash scripts/gpu_check.sh --only $(IFS=,; echo "${NOT_RUN[*]}")"
    fi
    [ "${#FAILED[@]}" -eq 0 ] && [ "${#NOT_RUN[@]}" -eq 0 ] || exit 1
}

write_helper() {  # the Python half: JSON, nvitop, the ghost and the report
    cat >"$1" <<'PYTHON'
"""gpu_check.sh's Python half (written to a temporary file by the script)."""
import json
import os
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

PY = sys.executable
REPO = Path.cwd()


def fail(message):
    print(f"gpu_check.sh: {message}", file=sys.stderr)
    sys.exit(2)


def fresh(wheel):
    """The kosmoss wheel must hold exactly the checkout's kosmoss/*.py and data files."""
    wheel = Path(wheel)
    stale = lambda why: fail(f"{wheel} does not match the checkout ({why}): rebuild it with "
                             "bash scripts/gpu_wheels.sh")
    try:
        archive = zipfile.ZipFile(wheel)
    except (OSError, zipfile.BadZipFile) as err:
        stale(f"not a wheel: {err}")
    names = set()
    for name in archive.namelist():
        if name.endswith("/"):
            continue
        if name.startswith("kosmoss/"):
            source = REPO / name
        elif ".data/data/share/kosmoss/lessons/" in name:
            source = REPO / name.split("/share/kosmoss/lessons/", 1)[1]
        else:
            continue
        names.add(name)
        if not source.is_file():
            stale(f"{name} is not in the checkout")
        if source.read_bytes() != archive.read(name):
            stale(f"{source.relative_to(REPO)} differs")
    for source in sorted((REPO / "kosmoss").rglob("*.py")):
        name = source.relative_to(REPO).as_posix()
        if "__pycache__" not in name and name not in names:
            stale(f"{name} is missing from it")


def installed(dist):
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def needs(args):
    """Prints the carried specs this machine lacks; a required package missing is exit 2."""
    split = args.index("--")
    carried, required = args[:split], args[split + 1:]
    for dist in required:
        if installed(dist) is None:
            fail(f"{dist} is not installed on this machine and no wheel carries it: add "
                 f"{dist}==VERSION to CARRIED in scripts/gpu_wheels.sh and run bash "
                 "scripts/gpu_wheels.sh")
    for spec in carried:
        if installed(spec.split("==")[0]) is None:
            print(spec)


# ---- the rows and the report


def start(scratch, device, commit, command):
    scratch = Path(scratch)
    # An earlier call's figures must not pass for this call's (the dataset and site stay).
    for name in ("rows.jsonl", *(f"{step}.{ext}" for step in FIGURES for ext in ("json", "figure"))):
        (scratch / name).unlink(missing_ok=True)
    for name in ("bench.json", "bench.csv", "bench.png"):
        (scratch / "bench" / name).unlink(missing_ok=True)
    meta = {"started": time.strftime("%Y-%m-%d %H:%M %Z"), "started_unix": time.time(),
            "device": device.split(" (UUID")[0], "commit": commit, "command": command}
    (scratch / "meta.json").write_text(json.dumps(meta))
    (scratch / "lessons").mkdir(exist_ok=True)


def row(scratch, step, status, seconds, command, figure):
    with open(Path(scratch) / "rows.jsonl", "a") as rows:
        rows.write(json.dumps({"step": step, "status": status, "seconds": int(seconds),
                               "command": command, "figure": figure}) + "\n")


def cell(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def report(scratch, out_dir):
    scratch, out_dir = Path(scratch), Path(out_dir)
    meta = json.loads((scratch / "meta.json").read_text())
    rows = [json.loads(line) for line in (scratch / "rows.jsonl").read_text().splitlines()]
    passed = sum(r["status"] == "pass" for r in rows)
    lines = [f"# kosmoss GPU check: {meta['device']}, {meta['started']}", "",
             f"`{meta['command']}` at commit {meta['commit']}: {passed} of {len(rows)} steps "
             f"passed in {time.time() - meta['started_unix']:.0f} s.", "",
             "| step | result | command | figure |", "|---|---|---|---|"]
    lines += [f"| {r['step']} | {r['status']} ({r['seconds']} s) | `{cell(r['command'])}` | "
              f"{cell(r['figure'])} |" for r in rows]
    results = {name: load(scratch / f"{name}.json")
               for name in ("env", "headline", "bf16", "sweep", "ghost", "anatomy", "ladder",
                            "lessons")}
    (out_dir / "results.json").write_text(json.dumps({"meta": meta, **results}, indent=2))
    for name in ("bench.json", "bench.csv", "bench.png"):
        if (scratch / "bench" / name).is_file():
            (out_dir / name).write_bytes((scratch / "bench" / name).read_bytes())
    lines += targets(scratch / "bench" / "bench.json", load(scratch / "ladder.json"))
    files = sorted(p.name for p in out_dir.iterdir() if p.name != "gpu-report.md")
    lines += ["", f"Files beside this report: {', '.join(files)} (results.json: kosmoss env, "
              "the runs' result.json, the sweep, the ghost, the anatomy). Written by scripts/gpu_check.sh "
              "(docs/gpu.md)."]
    (out_dir / "gpu-report.md").write_text("\n".join(lines) + "\n")


def load(path):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def bench_rows(path):
    bench = load(path) or {}
    return {r["id"]: r for r in bench.get("rows", []) if r.get("status") == "measured"}


def targets(path, ladder=None):
    rows = bench_rows(path)
    if not rows:
        return []
    out = ["", "## Targets", ""] + ladder_targets(rows, ladder)
    gpu = rows.get("kosmoss-gpu", {})
    if gpu.get("ratio") is not None:
        out.append(f"- kosmoss on 1 GPU ÷ raw CUDA loop, data on the GPU: {gpu['ratio']:.2f} "
                   f"(target ≥ 0.80: {'met' if gpu['ratio'] >= 0.8 else 'missed'}).")
    bf16 = rows.get("kosmoss-gpu-bf16", {})
    if bf16.get("samples_per_s"):
        speed = bf16["samples_per_s"]
        out.append(f"- kosmoss bf16 on 1 GPU: {speed / 1e6:.2f} M samples/s, "
                   f"{speed / 2e6:.0%} of the 2 M samples/s target for an H100.")
    for row in rows.values():
        if row.get("device") == "gpu" and row.get("predicted_over_measured") is not None:
            ratio = row["predicted_over_measured"]
            out.append(f"- {row['id']}: predicted {row['predicted_samples_per_s']:,.0f}"
                       f" ÷ measured {row['samples_per_s']:,.0f} samples/s = {ratio:.2f} "
                       f"(target 0.75-1.25: {'met' if 0.75 <= ratio <= 1.25 else 'missed'}).")
    out.append("- Why each figure is what it is: to be written by whoever commits this report.")
    return out


def ladder_targets(rows, ladder):
    """kosmoss with the top rung's features ÷ that rung at the same batch, and the speeds
    the GPU work aims at, each as a share of the GPU's limit."""
    if not ladder:
        return []
    out, limit = [], ladder.get("limit_samples_per_s")
    on_ladder = [r for r in ladder.get("rows", []) if not r.get("off_ladder")]
    top = on_ladder[-1]["rung"] if on_ladder else None  # the rung kosmoss-gpu-top copies
    rungs = {(r["rung"], r["batch_size"]): r for r in on_ladder}
    for row_id in ("kosmoss-gpu-top", "kosmoss-gpu-top-max"):
        mine = rows.get(row_id)
        raw = rungs.get((top, mine["batch_size"])) if mine else None
        if mine and raw and raw.get("samples_per_s"):
            ratio = mine["samples_per_s"] / raw["samples_per_s"]
            out.append(f"- {row_id} ÷ the {top} rung, batch {mine['batch_size']:,}: "
                       f"{ratio:.2f} (target ≥ 0.90: {'met' if ratio >= 0.9 else 'missed'}).")
    best = max((rows[r]["samples_per_s"] for r in ("kosmoss-gpu-top", "kosmoss-gpu-top-max")
                if r in rows), default=None)
    if best:
        share = f", {best / limit:.1%} of the limit" if limit else ""
        out.append(f"- kosmoss bf16, fastest: {best / 1e6:.1f} M samples/s{share} (target ≥ 20 M: "
                   f"{'met' if best >= 20e6 else 'missed'}).")
    return out


# ---- the figures of each step (exit 1: the step did not do what it should)


def figure(step, scratch, out_dir):
    scratch = Path(scratch)
    text, ok = FIGURES[step](scratch, Path(out_dir))
    print(text)
    sys.exit(0 if ok else 1)


def install_figure(scratch, out_dir):
    carried = ", ".join(f"{d} {installed(d)}" for d in ("kosmoss", "nvitop", "nvidia-ml-py", "py-spy"))
    there = ", ".join(f"{d} {installed(d)}" for d in ("torch", "pytorch-lightning", "torchmetrics"))
    return f"{carried}; the image's: {there}", installed("kosmoss") is not None


def env_figure(scratch, out_dir):
    env = load(scratch / "env.json") or {}
    try:
        import logging

        from nvitop import Device

        logging.getLogger("nvitop.api.libnvml").disabled = True  # its no-NVML banner
        driver = Device.driver_version()
    except Exception as err:  # the figure says so; the step's exit code decides
        driver = f"unknown ({err})"
    gpus = "; ".join(f"{g['name']} {g['memory_total_mib']} MiB" for g in env.get("gpus", []))
    text = (f"{gpus or 'no GPU listed'}, driver {driver}, CUDA {env.get('cuda')}, NCCL "
            f"{env.get('nccl')}, torch {env.get('torch')}, Lightning {env.get('lightning')}")
    return text, bool(env.get("gpus")) and env.get("cuda_available")


def data_figure(scratch, out_dir):
    dataset = Path(os.environ["KOSMOSS_HOME"]) / "data" / os.environ["GPU_CHECK_DATASET"]
    meta = load(dataset / "metadata.json")
    if not meta:
        return f"no dataset in {dataset}", False
    size = sum(f.stat().st_size for f in dataset.iterdir() if f.is_file())
    return f"{dataset.name}: {meta.get('n_samples', '?')} columns, {size / 2**30:.1f} GiB", True


def pytest_figure(scratch, out_dir):
    lines = [l.strip("= ") for l in (out_dir / "pytest-gpu.log").read_text().splitlines()
             if l.strip()]
    summary = lines[-1] if lines else "no output"
    return summary, "passed" in summary and "failed" not in summary and "error" not in summary


def run_figure(name, expect):
    def read(scratch, out_dir):
        result = load(scratch / f"{name}.json")
        if not result:
            return "no result.json", False
        text = (f"world {result.get('world_size')} ({result.get('num_nodes')} node(s)), "
                f"{result.get('accelerator')}, backend {result.get('backend')}, "
                f"{result.get('precision')}, data {result.get('data_mode')}, batch "
                f"{result.get('global_batch_size')}: "
                f"{number(result.get('train_samples_per_s'), ',.0f')} samples/s; val_loss "
                f"{number(result.get('val_loss'), '.4g')} (mean predictor "
                f"{number(result.get('mean_baseline_loss'), '.4g')})")
        wrong = [f"{key} {result.get(key)!r}, not {value!r}" for key, value in expect.items()
                 if result.get(key) != value]
        return text + ("; " + "; ".join(wrong) if wrong else ""), not wrong
    return read


def number(value, spec):
    return "none" if value is None else format(value, spec)


def written_figure(step):
    def read(scratch, out_dir):
        path = scratch / f"{step}.figure"
        return (path.read_text().strip(), True) if path.is_file() else ("no figure written", False)
    return read


def bench_figure(scratch, out_dir):
    rows = bench_rows(scratch / "bench" / "bench.json")
    if not rows:
        return "no bench.json, or no row measured", False
    parts = []
    for name, row in rows.items():
        part = f"{name} {(row.get('samples_per_s') or 0) / 1e6:.2f} M/s"
        if row.get("ratio") is not None:
            part += f" ({row['ratio']:.2f}x {row['versus']})"
        parts.append(part)
    return "; ".join(parts), True


def ladder_figure(scratch, out_dir):
    figures = load(scratch / "ladder.json")
    if not figures or not figures.get("rows"):
        return "no ladder.json", False
    parts = [f"{r['rung']}@{r['batch_size']}: " + (
             f"{r['samples_per_s'] / 1e6:.2f} M/s" + (f" ({r['of_limit']:.1%})"
                                                      if r.get("of_limit") else "")
             if r.get("samples_per_s") else f"failed ({r.get('error')})")
             for r in figures["rows"]]
    limit = figures.get("limit_samples_per_s")
    said = (f"; limit {limit / 1e6:,.0f} M samples/s ({figures.get('bound_by')}: "
            f"{(figures.get('limits') or {}).get('bandwidth_source')})" if limit else "")
    return "; ".join(parts) + said, all(r.get("samples_per_s") for r in figures["rows"])


def lessons_figure(scratch, out_dir):
    ran = load(scratch / "lessons.json") or []
    if not ran:
        return "no lesson ran", False
    parts = [f"{r['lesson']} unfinished after {time.time() - r['unfinished']:.0f} s"
             if "unfinished" in r else
             f"{r['lesson']} {r['seconds']:.0f} s" + (f" FAILED at cell {r['failed_cell']}"
             + (f" ({r['error']})" if r.get("error") else "")
             if r.get("failed_cell") is not None else "")
             + (f", CPU in cell(s) {r['cpu_cells']}" if r.get("cpu_cells") else "") for r in ran]
    return "; ".join(parts), all(r.get("failed_cell") is None and "unfinished" not in r
                                 for r in ran)


def anatomy_figure(scratch, out_dir):
    rows = load(scratch / "anatomy.json")
    if not rows:
        return "no anatomy.json", False
    return "; ".join(f"{r['variant']}: {r['samples_per_s'] / 1e6:.2f} M/s "
                     f"({r['ratio_to_1_process']:.2f}x)" for r in rows), True

FIGURES = {
    "install": install_figure, "env": env_figure, "data": data_figure, "pytest": pytest_figure,
    # The headline runs with --mode auto: on a GPU it must put the data there.
    "headline": run_figure("headline", {"world_size": 2, "num_nodes": 2, "accelerator": "gpu",
                                        "data_mode": "device"}),
    "bf16": run_figure("bf16", {"precision": "bf16-mixed", "accelerator": "gpu"}),
    "ghost": written_figure("ghost"), "sweep": written_figure("sweep"), "bench": bench_figure,
    "anatomy": anatomy_figure, "ladder": ladder_figure, "lessons": lessons_figure,
    "top": lambda scratch, out_dir: bench_figure(scratch, out_dir),
}



# ---- the sweep: is the GPU batch large enough to keep the device busy?


def sweep(scratch, dataset, batches):
    scratch, data = Path(scratch), Path(os.environ["KOSMOSS_HOME"]) / "data" / dataset
    n_train = int((load(data / "metadata.json") or {}).get("n_samples", 0) * 0.8)
    rates, too_large = {}, []
    for batch in (int(b) for b in batches.split(",")):
        if batch > n_train:
            too_large.append(str(batch))
            continue
        out = scratch / f"sweep-{batch}.json"
        argv = [PY, "-m", "kosmoss.bench.baselines", "raw", "--device", "cuda", "--bf16",
                "--dataset", str(data), "--steps", "60", "--batch-size", str(batch),
                "--out", str(out)]
        print("$", " ".join(argv), flush=True)
        done = subprocess.run(argv, timeout=120)
        rates[batch] = (load(out) or {}).get("samples_per_s") if done.returncode == 0 else None
    (scratch / "sweep.json").write_text(json.dumps({str(b): r for b, r in rates.items()}))
    measured = {b: r for b, r in rates.items() if r}
    if not measured:
        (scratch / "sweep.figure").write_text("no batch size measured")
        return 1
    best = max(measured.values())
    text = "raw bf16 loop: " + ", ".join(
        f"batch {b}: {r / 1e6:.2f} M samples/s ({r / best:.0%} of the best)"
        for b, r in measured.items())
    if too_large:
        text += f"; not run: batch {', '.join(too_large)} (over the {n_train} training samples)"
    (scratch / "sweep.figure").write_text(text)
    return 0 if len(measured) == len(rates) else 1


# ---- the ghost: a torchrun rank outlives its agent, holding a CUDA context


def gpu_used_mib():
    from nvitop import Device

    return sum(device.memory_used() for device in Device.all()) / 2**20


def rank_on_gpu(agent_pid):
    """A process under torchrun's agent that holds GPU memory, per nvitop (NVML)."""
    import psutil
    from nvitop import Device

    for device in Device.all():
        for pid in device.processes():
            try:
                if agent_pid in [p.pid for p in psutil.Process(pid).parents()]:
                    return pid
            except psutil.Error:
                continue
    return None


def alive(pid):
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def wait_for(condition, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.5)
    return None


def kosmoss(*args):
    print("$ python -m kosmoss", *args, flush=True)
    done = subprocess.run([PY, "-m", "kosmoss", *args], capture_output=True, text=True,
                          timeout=60)
    print(done.stdout + done.stderr, flush=True)
    return done


def ghost(scratch):
    scratch = Path(scratch)
    outcome = {"passed": False}
    figure_file = scratch / "ghost.figure"
    # torch elastic starts each worker in a session of its own (start_new_session=True) and
    # sets no parent-death signal: SIGKILL of the agent leaves the worker running.
    argv = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1",
            "trainup_gpu.py", "--dataset", "tiny", "--batch-size", "1024",
            "--max-epochs", "100000", "--require-gpu", "--no-progress"]
    print("$", " ".join(argv), flush=True)
    agent = subprocess.Popen(argv, stdout=open(scratch / "ghost-run.log", "w"),
                             stderr=subprocess.STDOUT)
    rank = None
    try:
        rank = wait_for(lambda: rank_on_gpu(agent.pid), 120)
        if rank is None:
            tail = (scratch / "ghost-run.log").read_text()[-300:]
            figure_file.write_text("no rank of the torchrun run appeared on the GPU within "
                                   f"120 s (NVML pids from another namespace?); log: {tail}")
            return 1
        # Its process record (kosmoss.launch.records) makes it part of a run: then it is a ghost.
        runs = Path(os.environ["KOSMOSS_HOME"]) / "runs"
        wait_for(lambda: list(runs.glob(f"*/processes/*-{rank}.json")), 60)
        time.sleep(3)  # a few steps: the rank is training, not starting
        before = gpu_used_mib()
        agent.send_signal(signal.SIGKILL)
        agent.wait()
        time.sleep(2)
        if not alive(rank):
            figure_file.write_text(f"rank {rank} died with its launcher: no ghost to find")
            return 1
        listed = {g["pid"]: g for g in json.loads(kosmoss("ghosts", "--json").stdout or "[]")}
        found = listed.get(rank)
        killed = kosmoss("ghosts", "--kill")
        summary = (killed.stdout.strip().splitlines() or ["no output"])[-1]
        wait_for(lambda: gpu_used_mib() < before - 1, 15)
        after = gpu_used_mib()
        outcome = {"rank": rank, "listed": found, "kill_exit": killed.returncode,
                   "kill_summary": summary, "gpu_used_mib_before": before,
                   "gpu_used_mib_after": after, "rank_alive_after": alive(rank)}
        outcome["passed"] = bool(found and found["kind"] == "launcher-gone"
                                 and killed.returncode == 0 and not alive(rank) and after < before)
        held = (found or {}).get("gpu_memory_bytes") or 0
        figure_file.write_text(
            f"rank {rank} listed as {found['kind'] if found else 'nothing'} holding "
            f"{held / 2**20:.0f} MiB; kosmoss ghosts --kill: {summary}; nvitop memory used "
            f"{before:.0f} -> {after:.0f} MiB (freed {before - after:.0f} MiB)")
        return 0 if outcome["passed"] else 1
    finally:
        (scratch / "ghost.json").write_text(json.dumps(outcome, indent=2))
        for pid in (agent.pid, rank):
            if pid and alive(pid):
                os.kill(pid, signal.SIGKILL)
        agent.poll()


# ---- the lessons on the GPU: each lesson's time, and the cells that said they ran on CPU

# What the device policy and the lessons print when a cell computes on CPU or shows a
# recorded GPU result instead of a live one (kosmoss.devices.policy, kosmoss.lessons.course).
CPU_MARKS = ("does not offer one: CPU", "none is visible", "gloo is the CPU backend",
             "recorded on", "no GPU here")


def lessons(scratch, out_dir, *names):
    """Every lesson (or those named) in quick mode, one at a time, as CI runs them; the
    figures written after each, so a call cut short keeps the lessons that ran."""
    import shutil

    os.environ["KOSMOSS_LESSON_QUICK"] = "1"
    from kosmoss.lessons.course import bundle, copy_lessons, lesson_sources, source_root, to_ipynb
    from kosmoss.lessons.site import execute_notebook

    work = Path(scratch) / "lessons"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    copy_lessons(work, bundle(source_root(), to_ipynb))
    ran = []
    sources = {lesson.stem: lesson for lesson in lesson_sources()}
    # In the order given: a short window runs the lessons that matter most first.
    for lesson in [sources[name] for name in names] if names else sources.values():
        started = time.monotonic()
        print(f"running {lesson.stem} ...", flush=True)
        # Written before it runs: a call cut short names the lesson it was in.
        (Path(scratch) / "lessons.json").write_text(json.dumps(
            ran + [{"lesson": lesson.stem, "unfinished": time.time()}], indent=2))
        notebook = execute_notebook(work / f"{lesson.stem}.ipynb")
        ran.append({"lesson": lesson.stem, "seconds": round(time.monotonic() - started, 1),
                    **lesson_cells(notebook)})
        print(f"  {ran[-1]}", flush=True)
        (Path(scratch) / "lessons.json").write_text(json.dumps(ran, indent=2))
    return 0 if ran and all(r["failed_cell"] is None for r in ran) else 1


def lesson_cells(notebook):
    """The first cell that failed (its index among code cells), and the cells whose output
    says they computed on CPU."""
    failed, cpu, error = None, [], None
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    for index, cell in enumerate(code, 1):
        outputs = cell.get("outputs", [])
        errors = [o for o in outputs if o.get("output_type") == "error"]
        if failed is None and errors:  # what it raised: the report says why, not only where
            failed, error = index, f"{errors[0].get('ename')}: {errors[0].get('evalue')}"[:600]
        text = " ".join(str(o.get("text", "")) + str(o.get("data", {}).get("text/plain", ""))
                        for o in outputs)
        if any(mark in text for mark in CPU_MARKS):
            cpu.append(index)
    return {"failed_cell": failed, "error": error, "cpu_cells": cpu}


def cleanup(scratch):
    """SIGKILL what this check started and left running: processes whose KOSMOSS_HOME is
    under the scratch folder (the ghost's rank and a timed-out bench row start sessions of
    their own, so a remote runner that ends the command would leave them running)."""
    import psutil

    scratch = str(Path(scratch).resolve())
    for proc in psutil.process_iter():
        try:
            home = proc.environ().get("KOSMOSS_HOME", "")
            if proc.pid != os.getpid() and home.startswith(scratch):
                proc.kill()
        except psutil.Error:
            continue


def main(argv):
    command, args = argv[0], argv[1:]
    if command == "fresh":
        fresh(*args)
    elif command == "needs":
        needs(args)
    elif command == "start":
        start(*args)
    elif command == "row":
        row(*args)
    elif command == "report":
        report(*args)
    elif command == "figure":
        figure(*args)
    elif command == "sweep":
        sys.exit(sweep(*args))
    elif command == "ghost":
        sys.exit(ghost(*args))
    elif command == "lessons":
        sys.exit(lessons(*args))
    elif command == "cleanup":
        cleanup(*args)


if __name__ == "__main__":
    main(sys.argv[1:])
PYTHON
}

main "$@"
