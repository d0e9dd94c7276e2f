"""Kernel tests run on a CUDA GPU when one is present, else on the CPU under TRITON_INTERPRET=1.

The interpreter switch is read when ``@triton.jit`` decorates the kernels, so it is set here, before
any test module imports ``kernels``; CI sets it explicitly anyway."""
from __future__ import annotations

import os

try:
    import torch

    _CUDA = torch.cuda.is_available()
except Exception:  # torch missing or broken: the test modules skip with the reason
    _CUDA = False

if not _CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
