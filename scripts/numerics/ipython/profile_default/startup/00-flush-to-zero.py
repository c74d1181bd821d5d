# Kept outside tests/: pytest --doctest-modules imports every .py under tests/, and this
# file switches flush-to-zero on for the whole process that imports it.
# IPython startup file for the "other machine" nbval run (scripts/nbval_numerics.sh):
# subnormal results become zero, as on GPUs and CPUs that flush denormals.
import torch

torch.set_flush_denormal(True)
