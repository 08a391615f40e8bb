# Sourced by the other scripts (after they cd to the repository root): the project virtualenv.
# Its location is .venv in the repository root unless WARMSHELL_VENV names another directory.
WARMSHELL_VENV="$(realpath -m "${WARMSHELL_VENV:-.venv}")"

# Put the virtualenv first on PATH, as `source .venv/bin/activate` does, so that python, warmshell,
# pytest, ruff and kubectl all come from it (and the gateway's own interpreter, which it gives to
# supervisors, is the virtualenv's).
use_venv() {
  if [ ! -x "$WARMSHELL_VENV/bin/python" ]; then
    echo "$(basename "$0"): no virtualenv at $WARMSHELL_VENV: run ./scripts/bootstrap first" >&2
    exit 1
  fi
  export VIRTUAL_ENV="$WARMSHELL_VENV"
  export PATH="$WARMSHELL_VENV/bin:$PATH"
}
