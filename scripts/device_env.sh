# Source on a GPU host whose Python lacks opgen's dependencies and reaches no package index: installs
# the wheels kept in .whl/ (optuna, pydantic, fla-core 0.6.0) into /tmp/site and puts them and the
# repository on PYTHONPATH. The device scripts (scripts/gpu_*.sh, scripts/h200_*_users.sh) source it.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || return 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
