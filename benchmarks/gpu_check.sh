#!/usr/bin/env bash
# One prepared check of the GPU paths, on a machine with an NVIDIA GPU: every
# benchmarks/gpu_*.py at sizes that fit about 8 minutes in all, then one table of each
# figure against its baseline from the same run, with pass/fail against DESIGN.md
# section 8 (benchmarks/check_summary.py).
#
#   benchmarks/gpu_check.sh          # a bare GPU machine: makes a venv, installs, runs
#   benchmarks/gpu_check.sh --cpu    # the CPU paths, in the environment that has the
#                                    # project (PYTHON=.venv/bin/python): checks the table
#   benchmarks/gpu_check.sh --download DIR [pip download options]
#                                    # the wheels for a GPU machine without network
#
# Outputs (logs, figures.jsonl, summary.md) go to benchmarks/results/gpu-check/, or to
# $GPU_CHECK_OUT. Exits 1 when a script failed or a check did not hold.
# $GPU_CHECK_ONLY="gpu_demand gpu_suspend" runs those scripts alone (a rerun of one).
#
# What is installed, and why this way. The test extra pins torch==2.13.0 and the project's
# development setup installs that version's CPU build; here torch must be a CUDA build. So
# torch is installed first, on its own, from PyPI (whose Linux wheels of that version are
# the CUDA build; $GPU_CHECK_TORCH overrides the requirement, e.g. to add an index), and
# checked to see a GPU. Where the machine's python3 already has a CUDA torch that sees the
# GPU, it lends its packages to the venv instead (a .pth file adds its site-packages after
# the venv's own: --system-site-packages is not enough, since a venv made by a venv's
# python3 gets the base interpreter's packages, not that venv's) and no torch is
# downloaded. The project itself is not pip-installed: an editable install of this tree
# builds the JupyterLab extension with npm, which a bare GPU machine may lack, and the
# benchmarks need none of it. Instead its runtime dependencies (read from pyproject.toml;
# torch is not among them, so nothing can replace the CUDA build) are installed with
# ipykernel, jupyter_client and numpy, and a .pth file puts this tree's jupyter_ckpt and
# jupyter_ckpt_server on the venv's path, for the scripts and the kernels they start.
#
# A GPU machine without network installs from a folder of wheels: $GPU_CHECK_WHEELS=DIR
# makes every pip install here `--no-index --find-links DIR`. Download them elsewhere, for
# the GPU machine's Python and platform, with this script's --download, which passes the
# same requirements and its further options to `pip download --only-binary=:all:`:
#
#   benchmarks/gpu_check.sh --download wheels --python-version 3.12 \
#       --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64
#   GPU_CHECK_WHEELS=wheels benchmarks/gpu_check.sh      # then, on the GPU machine
#
# Packages the lending python3 already has at a version that fits are not installed again,
# so their wheels may be left out of DIR (numpy, for one).
set -uo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
MODE=gpu
case "${1:-}" in
    --cpu) MODE=cpu ;;
    --download) MODE=download ;;
esac
OUT="${GPU_CHECK_OUT:-$ROOT/benchmarks/results/gpu-check}"
# pip's source: PyPI, or only the wheels in $GPU_CHECK_WHEELS
PIP_SOURCE=()
if [[ -n "${GPU_CHECK_WHEELS:-}" ]]; then
    PIP_SOURCE=(--no-index --find-links "$GPU_CHECK_WHEELS")
fi

SEES_GPU='import sys, torch
sys.exit(0 if torch.version.cuda and torch.cuda.is_available() else
         f"torch {torch.__version__} (CUDA build {torch.version.cuda}) sees no GPU")'

# What the scripts need besides torch, one per line: the project's runtime dependencies
# (pyproject.toml), ipykernel, jupyter_client and numpy. $1: a python to read them with.
requirements() {
    "$1" - "$ROOT/pyproject.toml" <<'PYTHON'
import re, sys
text = open(sys.argv[1]).read()
block = re.search(r"^dependencies = \[(.*?)^\]", text, re.S | re.M).group(1)
deps = re.findall(r'^\s*"([^"]+)"', block, re.M)
print("\n".join([*deps, "ipykernel", "jupyter_client", "numpy"]))
PYTHON
}

# --download DIR [pip download options]: the wheels of requirements() into DIR
download_wheels() {
    local dir="${1:?usage: gpu_check.sh --download DIR [pip download options]}"
    shift
    local reqs
    reqs="$(requirements python3)" || exit 1
    mapfile -t reqs <<<"$reqs"
    python3 -m pip download --only-binary=:all: -d "$dir" "$@" "${reqs[@]}" || exit 1
}

install_venv() {
    local venv="${GPU_CHECK_VENV:-$ROOT/benchmarks/results/gpu-venv}"
    PY="$venv/bin/python"
    # A machine image whose python3 has a CUDA build of torch (and maybe the rest) lends
    # its site-packages to the venv: nothing large to download, and what it has at a
    # version that fits pip does not install again. Its pip serves the venv too.
    local lender=""
    if python3 -c "$SEES_GPU" 2>/dev/null; then
        lender="$(python3 -c 'import site; print(repr(site.getsitepackages()))')" || exit 1
    fi
    if [[ ! -x "$PY" ]] && ! python3 -m venv ${lender:+--without-pip} "$venv"; then
        echo "python3 -m venv failed (Debian/Ubuntu: apt-get install python3-venv)" >&2
        exit 1
    fi
    local site
    site="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" || exit 1
    if [[ -n "$lender" ]]; then
        # after the venv's own site-packages; addsitedir also runs the lender's .pth files
        echo "import site; [site.addsitedir(d) for d in $lender]" >"$site/gpu-check-lender.pth"
    fi
    if ! "$PY" -c "$SEES_GPU" 2>/dev/null; then
        local torch_pin
        torch_pin="$(grep -o '"torch==[^"]*"' "$ROOT/pyproject.toml" | tr -d '"')"
        # shellcheck disable=SC2086  # the override may hold several words (an --index-url)
        "$PY" -m pip install -q ${PIP_SOURCE[@]+"${PIP_SOURCE[@]}"} \
            ${GPU_CHECK_TORCH:-$torch_pin} || exit 1
        "$PY" -c "$SEES_GPU" || exit 1
    fi
    local deps
    deps="$(requirements "$PY")" || exit 1
    mapfile -t deps <<<"$deps"
    "$PY" -m pip install -q ${PIP_SOURCE[@]+"${PIP_SOURCE[@]}"} "${deps[@]}" || exit 1
    printf '%s\n%s\n' "$ROOT" "$ROOT/server_extension" >"$site/jupyter-ckpt-worktree.pth"
    # kernels named python3 must be this venv's, whatever else the machine has installed
    "$PY" -m ipykernel install --sys-prefix >/dev/null || exit 1
    export JUPYTER_PATH="$venv/share/jupyter"
}

# The arguments and the time limit (seconds) of each script: on one GPU, 8 minutes in all.
plan() {
    case "$1:$MODE" in
        gpu_roundtrip:gpu) echo "100 --size 4G --rounds 3" ;;
        gpu_roundtrip:cpu) echo "120 --cpu --size 64M --rounds 1" ;;
        gpu_save_memory:gpu) echo "100 --size 8G --buffer 256M --buffer 64M" ;;
        gpu_save_memory:cpu) echo "120 --cpu --size 256M" ;;
        gpu_suspend:gpu) echo "100 --size 4G" ;;
        gpu_suspend:cpu) echo "180 --cpu --size 64M" ;;
        gpu_idle_work:gpu) echo "60 --seconds 12 --idle-timeout 2" ;;
        gpu_idle_work:cpu) echo "60 --cpu" ;;
        gpu_autosave:gpu) echo "120 --gib 4 --rounds 3" ;;
        gpu_autosave:cpu) echo "180 --cpu --gib 0.0625 --rounds 1" ;;
        gpu_demand:gpu) echo "120 --budget 12G" ;;
        gpu_demand:cpu) echo "120 --cpu" ;;
        *:gpu) echo "60" ;;       # a script added since: its defaults, in what is left
        *:cpu) echo "120 --cpu" ;;
    esac
}

if [[ $MODE == download ]]; then
    shift
    download_wheels "$@"
    exit 0
elif [[ $MODE == gpu ]]; then
    install_venv
else
    PY="${PYTHON:-python3}"
fi
mkdir -p "$OUT"
: >"$OUT/figures.jsonl"
: >"$OUT/status.txt"
cd "$ROOT" || exit 1
"$PY" -c 'import jupyter_ckpt, torch; print("jupyter_ckpt from", jupyter_ckpt.__file__, "| torch", torch.__version__)'
for script in benchmarks/gpu_*.py; do
    name="$(basename "$script" .py)"
    if [[ -n "${GPU_CHECK_ONLY:-}" && " $GPU_CHECK_ONLY " != *" $name "* ]]; then
        continue
    fi
    read -r limit args <<<"$(plan "$name")"
    echo "== $name $args (limit ${limit} s)"
    started=$SECONDS
    # shellcheck disable=SC2086  # args are words
    CKPT_BENCH_FIGURES="$OUT/figures.jsonl" timeout "$limit" "$PY" "$script" $args \
        >"$OUT/$name.log" 2>&1
    code=$?
    echo "$name $code $((SECONDS - started))" >>"$OUT/status.txt"
    echo "   exit $code after $((SECONDS - started)) s; log: $OUT/$name.log"
done
echo
"$PY" benchmarks/check_summary.py "$OUT" | tee "$OUT/summary.md"
