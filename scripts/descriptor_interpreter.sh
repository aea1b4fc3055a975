#!/usr/bin/env bash
# The interpreter the tests run the tensor-descriptor (TMA) kernels on: a venv at DIR (default
# .venv-descriptors) with upstream Triton 3.6 (the Triton of the H200 runs), whose interpreter
# knows tensor descriptors (triton-ascend 3.2's, in .venv, does not), on top of .venv's packages
# (torch, opgen) through a .pth file. Usage: scripts/descriptor_interpreter.sh [DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-.venv-descriptors}
python3 -m venv "$dir"
"$dir/bin/pip" install --quiet "triton==3.6.0" "numpy>=1.26,<2.4"
site=$("$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' > "$site/opgen_main_venv.pth"
"$dir/bin/python" -c 'from triton.tools.tensor_descriptor import TensorDescriptor; import torch, opgen'
