# Sourced by scripts/demo and scripts/test: make .venv hold what servelab needs, once.
# The first run creates .venv and installs the CPU torch build, then servelab with its dev
# extras; later runs only compare a stamp (pyproject.toml's hash) and go straight on.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
TORCH_VERSION=2.13.0
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
. .venv/bin/activate
stamp=".venv/.servelab-installed"
want="$(python -c 'import hashlib,sys; print(hashlib.sha256(open("pyproject.toml","rb").read()).hexdigest())') torch==$TORCH_VERSION"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "setting up .venv (first run, or pyproject.toml changed)..." >&2
    python -m pip install --quiet --upgrade pip
    # The CPU build is enough for everything here (any torch >= 2.1 works).
    python -c "import torch" 2>/dev/null || python -m pip install --quiet "torch==$TORCH_VERSION"
    python -m pip install --quiet -e '.[dev]'
    echo "$want" > "$stamp"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
