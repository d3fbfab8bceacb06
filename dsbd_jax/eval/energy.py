"""Energy counters: NVML's cumulative GPU energy on NVIDIA GPUs, RAPL (``/sys/class/powercap``) on
CPUs where it is readable. Where neither works the meter says why; it never makes up a number.

    meter = energy_meter()          # picks the counter for jax's default backend
    start = meter.read()            # joules so far (None if unavailable)
    ...                             # the work, ending in block_until_ready
    joules = meter.joules_since(start)

NVML: ``nvmlDeviceGetTotalEnergyConsumption`` (millijoules since the driver loaded, Volta and
later), summed over the GPUs JAX uses. RAPL: ``energy_uj`` of every top-level package domain
(``intel-rapl:N``), corrected for counter wrap-around with ``max_energy_range_uj``; it counts the
whole CPU package (every process), so run benchmarks on a quiet machine.
"""

from __future__ import annotations

import glob
import os
from typing import List, Optional, Sequence

POWERCAP = "/sys/class/powercap"


class EnergyMeter:
    """A cumulative energy counter in joules; ``source`` is ``"nvml"``, ``"rapl"`` or ``None``
    with ``reason`` saying why there is none."""

    source: Optional[str] = None
    reason: str = ""

    @property
    def available(self) -> bool:
        return self.source is not None

    def read(self) -> Optional[float]:
        return None

    def joules_since(self, start: Optional[float]) -> Optional[float]:
        if start is None:
            return None
        now = self.read()
        return None if now is None else self._delta(start, now)

    def _delta(self, start: float, now: float) -> float:
        return now - start

    def describe(self) -> dict:
        return {"source": self.source, "reason": self.reason or None}


class Unavailable(EnergyMeter):
    def __init__(self, reason: str):
        self.reason = reason


class RaplMeter(EnergyMeter):
    """Sum of the package domains' ``energy_uj`` counters."""

    source = "rapl"

    def __init__(self, domains: Sequence[str]):
        self.domains = list(domains)
        self.ranges = [_read_int(os.path.join(d, "max_energy_range_uj")) for d in self.domains]
        self.reason = f"RAPL package domains: {', '.join(os.path.basename(d) for d in self.domains)}"
        self._last: Optional[List[int]] = None
        self._total_uj = 0

    def read(self) -> float:
        # accumulate per-domain deltas (mod the counter range) so wrap-arounds between reads count
        now = [_read_int(os.path.join(d, "energy_uj")) for d in self.domains]
        if self._last is not None:
            for n, last, r in zip(now, self._last, self.ranges):
                self._total_uj += (n - last) % (r + 1) if r else max(n - last, 0)
        self._last = now
        return self._total_uj / 1e6


class NvmlMeter(EnergyMeter):
    source = "nvml"

    def __init__(self, nvml, handles):
        self.nvml = nvml
        self.handles = handles
        self.reason = f"NVML total energy of {len(handles)} GPU(s)"

    def read(self) -> float:
        return sum(self.nvml.nvmlDeviceGetTotalEnergyConsumption(h) for h in self.handles) / 1e3


def _read_int(path: str) -> int:
    with open(path) as f:
        return int(f.read().strip())


def rapl_meter(root: str = POWERCAP) -> EnergyMeter:
    """RAPL over the package domains under ``root``, or ``Unavailable`` with the reason."""
    domains = sorted(d for d in glob.glob(os.path.join(root, "intel-rapl:*"))
                     if os.path.basename(d).count(":") == 1)
    if not domains:
        return Unavailable(f"no RAPL package domains under {root} (not an Intel/AMD host with "
                           "powercap, or not exposed to this container)")
    try:
        for d in domains:
            _read_int(os.path.join(d, "energy_uj"))
    except (OSError, ValueError) as e:
        return Unavailable(f"RAPL counters are not readable ({e}); reading them usually needs "
                           "root: sudo chmod a+r /sys/class/powercap/intel-rapl:*/energy_uj")
    meter = RaplMeter(domains)
    meter.read()
    return meter


def nvml_meter(device_indices: Optional[Sequence[int]] = None) -> EnergyMeter:
    """NVML over the given GPU indices (default: all), or ``Unavailable`` with the reason."""
    try:
        import pynvml
    except ImportError:
        return Unavailable("NVML bindings missing: pip install nvidia-ml-py")
    try:
        pynvml.nvmlInit()
        n = pynvml.nvmlDeviceGetCount()
        idx = range(n) if device_indices is None else device_indices
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in idx]
        for h in handles:
            pynvml.nvmlDeviceGetTotalEnergyConsumption(h)
    except Exception as e:  # NVMLError has many subclasses; all mean "no counter"
        return Unavailable(f"NVML energy counter unavailable: {e}")
    return NvmlMeter(pynvml, handles)


def energy_meter(platform: Optional[str] = None) -> EnergyMeter:
    """The meter for JAX's default backend: NVML on ``gpu`` (CUDA), RAPL on ``cpu``; TPUs have
    no counter readable from here."""
    if platform is None:
        import jax
        platform = jax.default_backend()
    if platform in ("gpu", "cuda"):
        return nvml_meter()
    if platform == "cpu":
        return rapl_meter()
    return Unavailable(f"no energy counter for the {platform!r} backend")
