"""NVML figures for tencache's step table on a GPU: device memory used against the device budget,
utilisation and PCIe traffic.

    figures = DeviceFigures.open(device_index=0)      # None without NVML or a device
    row.update(figures.sample(budget_bytes))          # the columns below, one call per step

Columns (all floats): `gpu_mem_used` (bytes the whole device has in use, NVML), `gpu_mem_budget` (the
device budget given to tencache), `gpu_mem_vs_budget` (their ratio; above 1 when the CUDA context,
activations and other processes add to the pools), `gpu_util_pct` (percent of the last sample period
with a kernel running), `pcie_tx_MBps` / `pcie_rx_MBps` (device->host / host->device, MB/s, NVML's
20 ms counter at the moment of the call: a snapshot, not a step mean).
"""
from __future__ import annotations

from typing import Any

# NVML's pcie counters: 0 = TX (the device sends, device->host), 1 = RX (host->device)
_PCIE_TX, _PCIE_RX = 0, 1


class DeviceFigures:
    """One device's NVML handle; `nvml` is the pynvml module (tests pass a fake)."""

    def __init__(self, nvml: Any, handle: Any) -> None:
        self.nvml = nvml
        self.handle = handle

    @classmethod
    def open(cls, device_index: int = 0, nvml: Any = None) -> DeviceFigures | None:
        """NVML for `device_index`, or None when the library, the driver or the device is absent."""
        try:
            if nvml is None:
                import pynvml as nvml  # the gpu extra (nvidia-ml-py)
            nvml.nvmlInit()
            return cls(nvml, nvml.nvmlDeviceGetHandleByIndex(device_index))
        except Exception:  # ImportError, NVMLError (no driver, no such device): no figures
            return None

    def sample(self, budget_bytes: int) -> dict[str, float]:
        nvml, h = self.nvml, self.handle
        used = float(nvml.nvmlDeviceGetMemoryInfo(h).used)
        util = nvml.nvmlDeviceGetUtilizationRates(h)
        tx_kbps = nvml.nvmlDeviceGetPcieThroughput(h, _PCIE_TX)  # KB/s
        rx_kbps = nvml.nvmlDeviceGetPcieThroughput(h, _PCIE_RX)
        return {"gpu_mem_used": used, "gpu_mem_budget": float(budget_bytes),
                "gpu_mem_vs_budget": used / budget_bytes if budget_bytes > 0 else float("inf"),
                "gpu_util_pct": float(util.gpu),
                "pcie_tx_MBps": tx_kbps * 1000 / 1e6, "pcie_rx_MBps": rx_kbps * 1000 / 1e6}
