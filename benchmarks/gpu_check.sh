#!/usr/bin/env bash
# One prepared check of the GPU paths, on a machine with an NVIDIA GPU: every
# benchmarks/gpu_*.py at sizes that fit about 8 minutes in all, then one table of each
# figure against its baseline from the same run, with pass/fail against DESIGN.md
# section 8 (benchmarks/check_summary.py).
#
#   benchmarks/gpu_check.sh          # a bare GPU machine: makes a venv, installs, runs
#   benchmarks/gpu_check.sh --cpu    # the CPU paths, in the environment that has the
#                                    # project (PYTHON=.venv/bin/python): checks the table
#
# Outputs (logs, figures.jsonl, summary.md) go to benchmarks/results/gpu-check/, or to
# $GPU_CHECK_OUT. Exits 1 when a script failed or a check did not hold.
#
# What is installed, and why this way. The test extra pins torch==2.13.0 and the project's
# development setup installs that version's CPU build; here torch must be a CUDA build. So
# torch is installed first, on its own, from PyPI (whose Linux wheels of that version are
# the CUDA build; $GPU_CHECK_TORCH overrides the requirement, e.g. to add an index), and
# checked to see a GPU; where the machine's python3 already has a CUDA torch that sees the
# GPU, the venv uses the system's packages instead and downloads no torch. The project itself is not pip-installed: an editable install of
# this tree builds the JupyterLab extension with npm, which a bare GPU machine may lack,
# and the benchmarks need none of it. Instead its runtime dependencies (read from
# pyproject.toml; torch is not among them, so nothing can replace the CUDA build) are
# installed with ipykernel and numpy, and a .pth file puts this tree's jupyter_ckpt and
# jupyter_ckpt_server on the venv's path, for the scripts and the kernels they start. Only
# PyPI is needed.
set -uo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
MODE=gpu
if [[ "${1:-}" == "--cpu" ]]; then MODE=cpu; fi
OUT="${GPU_CHECK_OUT:-$ROOT/benchmarks/results/gpu-check}"

SEES_GPU='import sys, torch
sys.exit(0 if torch.version.cuda and torch.cuda.is_available() else
         f"torch {torch.__version__} (CUDA build {torch.version.cuda}) sees no GPU")'

install_venv() {
    local venv="${GPU_CHECK_VENV:-$ROOT/benchmarks/results/gpu-venv}"
    PY="$venv/bin/python"
    # A machine image that ships a CUDA build of torch (and maybe the rest) lends it to
    # the venv: nothing large to download, and what it has pip does not fetch again.
    local shared=()
    if python3 -c "$SEES_GPU" 2>/dev/null; then shared=(--system-site-packages); fi
    if [[ ! -x "$PY" ]] && ! python3 -m venv ${shared[@]+"${shared[@]}"} "$venv"; then
        echo "python3 -m venv failed (Debian/Ubuntu: apt-get install python3-venv)" >&2
        exit 1
    fi
    if ! "$PY" -c "$SEES_GPU" 2>/dev/null; then
        local torch_pin
        torch_pin="$(grep -o '"torch==[^"]*"' "$ROOT/pyproject.toml" | tr -d '"')"
        # shellcheck disable=SC2086  # the override may hold several words (an --index-url)
        "$PY" -m pip install -q ${GPU_CHECK_TORCH:-$torch_pin} || exit 1
        "$PY" -c "$SEES_GPU" || exit 1
    fi
    local deps
    deps="$("$PY" - "$ROOT/pyproject.toml" <<'PYTHON'
import re, sys
text = open(sys.argv[1]).read()
block = re.search(r"^dependencies = \[(.*?)^\]", text, re.S | re.M).group(1)
print("\n".join(re.findall(r'^\s*"([^"]+)"', block, re.M)))
PYTHON
)" || exit 1
    mapfile -t deps <<<"$deps"
    "$PY" -m pip install -q "${deps[@]}" ipykernel jupyter_client numpy || exit 1
    local site
    site="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
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
        *:gpu) echo "60" ;;       # a script added since: its defaults, in what is left
        *:cpu) echo "120 --cpu" ;;
    esac
}

if [[ $MODE == gpu ]]; then
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
