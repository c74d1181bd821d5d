"""Shared test settings: hypothesis profile sized for a 2-core CI machine."""

import os

import torch
from hypothesis import HealthCheck, settings

settings.register_profile(
    "course",
    max_examples=60,
    deadline=None,
    derandomize=True,  # the same examples on every run and machine
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "course"))
torch.set_num_threads(1)
