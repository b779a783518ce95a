"""Where a worker computes: ``--device auto|cpu|cuda|cuda:N``."""

from __future__ import annotations

import torch


def resolve_device(name: str) -> torch.device:
    """``auto`` is the first GPU when one is present, else the CPU. CKKS encryption and the
    HTTP transport always run on the CPU; only the model's tensors move."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    if name == "cuda" or name.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise RuntimeError(f"--device {name} was requested but no CUDA device is available")
        device = torch.device(name)
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise RuntimeError(
                f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s)"
            )
        return device
    raise ValueError(f"unknown device {name!r}; choose auto, cpu, cuda or cuda:N")
