# IPython startup file for the "other machine" nbval run (scripts/nbval_numerics.sh):
# subnormal results become zero, as on GPUs and CPUs that flush denormals.
import torch

torch.set_flush_denormal(True)
