# Sourced by the entry points in scripts/ (train.sh, evaluate.sh, prepare-*.sh, slurm/*.sbatch): find the
# project's Python environment without the user activating it, so that a command from a login shell or a
# Slurm job (whose shell activated nothing) runs as the docs write it.
#
#   source "$ROOT/scripts/lib/env.sh"; find_python    # sets PY, or exits 2 with one line saying what to do
#
# The first of: $PYTHON (as given), the active virtualenv ($VIRTUAL_ENV) or conda env ($CONDA_PREFIX), then
# $ROOT/.venv (what scripts/setup_env.sh creates). An active environment without fairseq is passed over
# for .venv: a user's unrelated venv must not hide the project's (importlib's find_spec only: no import).

_env_has_fairseq() {
    "$1" -c 'import importlib.util as u, sys; sys.exit(not (u.find_spec("fairseq") and u.find_spec("omegaconf")))' \
        2>/dev/null
}

find_python() {
    local root="${ROOT:?find_python needs ROOT}" candidate
    if [[ -n "${PYTHON:-}" ]]; then
        PY="$PYTHON"
        command -v "$PY" >/dev/null 2>&1 || {
            echo "$(basename "$0"): PYTHON=$PY is not an executable; unset it to use $root/.venv (bash scripts/setup_env.sh creates it)" >&2
            exit 2; }
        return 0
    fi
    for candidate in "${VIRTUAL_ENV:+$VIRTUAL_ENV/bin/python}" "${CONDA_PREFIX:+$CONDA_PREFIX/bin/python}" \
                     "$root/.venv/bin/python"; do
        [[ -n "$candidate" && -x "$candidate" ]] || continue
        if _env_has_fairseq "$candidate"; then PY="$candidate"; return 0; fi
    done
    echo "$(basename "$0"): no Python environment with fairseq found (PYTHON unset, no active venv, $root/.venv missing or incomplete); create it with: bash scripts/setup_env.sh" >&2
    exit 2
}
