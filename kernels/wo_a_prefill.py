"""Prefill of ``wo_a`` from the fp8 twin alone with the dequantisation hidden behind the GEMMs (issue 26).

Per group g: a side stream dequantises W[g] into one of two ``[R, D]`` bf16 scratches while the caller's
stream multiplies the previous group (``torch.mm`` into ``y[:, g, :]``); events order every scratch's
write after the GEMM that last read it and every GEMM after its scratch's write. The dequantisation is
memory-bound and the GEMMs are compute-bound, so the two share the GPU instead of running one after the
other (the per-group form of :func:`kernels.wo_a_w8.prefill` pays both in series). Scratch: two groups'
bf16 weights, freed with the call (never a full bf16 copy kept between calls). The kernels and their
order per group are the per-group form's, so the result is bit for bit that form's. Works under CUDA
graph capture (the side stream forks from and joins back into the capturing stream).

This module imports nothing from the project (it ships in the engine image with the package).
"""
from __future__ import annotations

from typing import Callable

import torch

_SIDE: dict[int, torch.cuda.Stream] = {}


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SIDE:
        _SIDE[index] = torch.cuda.Stream(device=index)
    return _SIDE[index]


def overlapped(x: torch.Tensor, y: torch.Tensor, rows: int, cols: int,
               dequantize_group: Callable[[int, torch.Tensor], object]) -> torch.Tensor:
    """y[:, g, :] = x[:, g, :] @ W[g]^T for every group, W[g] written by ``dequantize_group(g, scratch)``
    (a launch on the current stream) on a side stream, two scratches in turn. CUDA tensors only."""
    groups = x.shape[1]
    main = torch.cuda.current_stream(x.device)
    side = _side_stream(x.device)
    scratch = [torch.empty((rows, cols), dtype=torch.bfloat16, device=x.device) for _ in range(min(2, groups))]
    read_done: list[torch.cuda.Event | None] = [None] * len(scratch)
    side.wait_stream(main)  # x, the twin and the scratches are ready on the caller's stream
    for gi in range(groups):
        slot = gi % len(scratch)
        written = torch.cuda.Event()
        with torch.cuda.stream(side):
            if read_done[slot] is not None:
                side.wait_event(read_done[slot])  # the GEMM of group gi - 2 has read this scratch
            dequantize_group(gi, scratch[slot])
            written.record(side)
        main.wait_event(written)
        torch.mm(x[:, gi, :], scratch[slot].t(), out=y[:, gi, :])
        done = torch.cuda.Event()
        done.record(main)
        read_done[slot] = done
    return y
