# Source on the lent GPU machine: installs the carried wheels (.whl/, see README "Device runs")
# into /tmp/site and puts them and the repository on PYTHONPATH.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || return 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
