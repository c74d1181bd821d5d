#!/usr/bin/env bash
# Re-execute chapters under nbval as another reader's machine would compute them.
#
#   scripts/nbval_numerics.sh ENV [notebooks or pytest args...]
#
# ENV is one of
#   native     this machine as it is
#   default    ATEN_CPU_CAPABILITY=default (PyTorch's plain C++ kernels, no AVX)
#   avx2       ATEN_CPU_CAPABILITY=avx2
#   compatible MKL_CBWR=COMPATIBLE (MKL's most portable code path)
#   auto       MKL_CBWR=AUTO
#   ftz        flush-to-zero inside the kernel (an IPython startup file)
#   other      default + compatible + ftz at once: what `make test` runs second
# With no notebooks given, every chapter is run.
set -euo pipefail
cd "$(dirname "$0")/.."
env_name=${1:?usage: scripts/nbval_numerics.sh ENV [notebooks...]}
shift
case "$env_name" in
  native) ;;
  default) export ATEN_CPU_CAPABILITY=default ;;
  avx2) export ATEN_CPU_CAPABILITY=avx2 ;;
  compatible) export MKL_CBWR=COMPATIBLE ;;
  auto) export MKL_CBWR=AUTO ;;
  ftz) export IPYTHONDIR="$PWD/scripts/numerics/ipython" ;;
  other)
    export ATEN_CPU_CAPABILITY=default MKL_CBWR=COMPATIBLE
    export IPYTHONDIR="$PWD/scripts/numerics/ipython" ;;
  *) echo "unknown ENV '$env_name'" >&2; exit 2 ;;
esac
if [ $# -eq 0 ]; then set -- chapters; fi
exec .venv/bin/python -m pytest --nbval --nbval-current-env \
  --nbval-sanitize-with tests/sanitize.cfg "$@"
