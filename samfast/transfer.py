"""Host arrays to a device without a host-device sync.

A copy from pageable host memory to a GPU makes the CPU wait for the GPU (a cudaStreamSynchronize
inside aten::copy_, found by parity.checks.syncs); a copy from pinned memory with non_blocking does not.
"""

from __future__ import annotations

import numpy as np
import torch


def to_device(array, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Host array (numpy, list, scalar) -> a `dtype` tensor on `device`, through pinned memory on a GPU."""
    tensor = torch.as_tensor(np.asarray(array), dtype=dtype)
    if torch.device(device).type != "cuda":
        return tensor
    return tensor.pin_memory().to(device, non_blocking=True)
