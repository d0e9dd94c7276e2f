# -*- coding: utf-8 -*-
"""How the packer assembles packed rows in memory before an ``O_DIRECT`` write (issue 24).

Two methods, chosen once per process (``interleave_method``) and reported in the pack's result:

- ``numpy``: two strided block copies on row-block views (``out[:, :32] = weights; out[:, 32] = scales``
  on 64-bit words, byte views where an offset is not a multiple of 8) into an anonymous aligned mapping.
  Measured on cold 4 MiB chunks: about 0.1 CPU s/GB, against 0.6-0.7 for the kernel gather.
- ``kernel-gather``: standard library only (``RowBuffer.stage``): ``pwritev`` of one 264-byte iovec per row
  into a memfd, then a strided copy of the 8-byte scales.

numpy is torch's own dependency, so the engine image always has it; a host's own Python may not (DGX OS
does not promise it): without it the kernel gather is used, with the same bytes. ``SPARKFLEET_PACK_INTERLEAVE``
(``auto``, the default; ``numpy``; ``kernel-gather``) forces one, for tests and measurements.
"""
from __future__ import annotations

import os
from typing import Optional, Tuple

try:
    from ansible.module_utils.engram_format import ROW_BYTES, SCALE_BYTES, WEIGHT_BYTES
except ImportError:  # stand-alone: the packer's files side by side
    from engram_format import ROW_BYTES, SCALE_BYTES, WEIGHT_BYTES  # type: ignore

INTERLEAVE_ENV = "SPARKFLEET_PACK_INTERLEAVE"
METHODS = ("numpy", "kernel-gather")
_CHOSEN: Optional[Tuple[str, object]] = None  # (method, numpy module or None), once per process


def _import_numpy():
    # one BLAS thread: the packer never multiplies matrices, and OpenBLAS would start a thread per core
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(name, "1")
    import numpy  # noqa: PLC0415  (optional: only where the host has it)
    return numpy


def choose(want: str) -> Tuple[str, object]:
    """(method, numpy or None) for the setting ``want`` (auto, numpy or kernel-gather); raises ValueError
    for another setting, or for ``numpy`` where numpy cannot be imported."""
    if want not in ("auto",) + METHODS:
        raise ValueError("%s must be auto, numpy or kernel-gather, not %r" % (INTERLEAVE_ENV, want))
    if want == "kernel-gather":
        return "kernel-gather", None
    try:
        return "numpy", _import_numpy()
    except ImportError as exc:
        if want == "numpy":
            raise ValueError("%s=numpy but numpy cannot be imported here (%s)" % (INTERLEAVE_ENV, exc)) from None
        return "kernel-gather", None


def interleave_method() -> Tuple[str, object]:
    """The process's method, chosen at the first call from ``SPARKFLEET_PACK_INTERLEAVE``."""
    global _CHOSEN
    if _CHOSEN is None:
        _CHOSEN = choose(os.environ.get(INTERLEAVE_ENV, "auto").strip() or "auto")
    return _CHOSEN


def numpy_stage(np, out, delta: int, weights, wdelta: int, scales, sdelta: int, rows: int) -> None:
    """Packed rows [0, rows) into ``out`` from ``delta``: row i is weight row i (``weights`` from ``wdelta``)
    followed by scale row i (``scales`` from ``sdelta``). Buffers are page-aligned mappings, so the offsets
    decide whether 64-bit words line up."""
    if delta % 8 == 0 and wdelta % 8 == 0 and sdelta % 8 == 0:
        dtype, unit = np.uint64, 8
    else:
        dtype, unit = np.uint8, 1
    wcols, rcols, scols = WEIGHT_BYTES // unit, ROW_BYTES // unit, SCALE_BYTES // unit
    dst = np.frombuffer(out, dtype, rows * rcols, delta).reshape(rows, rcols)
    dst[:, :wcols] = np.frombuffer(weights, dtype, rows * wcols, wdelta).reshape(rows, wcols)
    dst[:, wcols:] = np.frombuffer(scales, dtype, rows * scols, sdelta).reshape(rows, scols)
