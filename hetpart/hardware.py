"""Typed descriptions of hardware: accelerators, intra-node links and network cards.

Every physical quantity carries its unit in its name. ``_gb`` is 10^9 bytes (except the marketed
:attr:`GPUSpec.memory_gb`, binary as vendors count it), ``_gbyte_s`` is
10^9 bytes per second, ``_gbit_s`` is 10^9 bits per second, ``_us`` is microseconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["Vendor", "GPUSpec", "LinkSpec", "NICSpec", "GIB"]

Vendor = Literal["nvidia", "amd", "huawei", "intel", "other"]


GIB = 2**30 / 1e9
"""GB (10^9 bytes) in one GiB: the factor from a marketed device-memory size (:attr:`GPUSpec.memory_gb`) to GB."""


@dataclass(frozen=True)
class GPUSpec:
    """One accelerator type (one device as a process sees it: a MI250X GCD is one device)."""

    name: str
    """Catalog name, e.g. ``A100-80GB``."""
    tflops_bf16: float
    """Dense 16-bit matrix peak in TFLOPS (bf16, or fp16 where bf16 is not supported); never sparse."""
    tflops_fp32: float
    """Dense fp32 peak in TFLOPS without TF32 tensor cores."""
    memory_gb: float
    """Device memory as marketed. Vendors' "GB" of device memory are binary gigabytes (GiB, 2^30 bytes): an
    "80GB" A100 or H100 holds 80 GiB of HBM (nvidia-smi reports 81,920 and 81,559 MiB), an "RTX 3090 24GB"
    24 GiB. Consumers of this field convert with :data:`GIB` (:func:`hetpart.costmodel.memory.memory_capacity_gb`
    does); everything else in hetpart counts memory in GB of 10^9 bytes."""
    hbm_gbyte_s: float
    """Device memory bandwidth in GB/s."""
    vendor: Vendor = "other"
    """Vendor; collectives between vendors cannot use NCCL/RCCL and go through gloo or host memory."""
    supports_bf16: bool = True
    """False where the hardware only has fp16 matrix units (P100, V100, T4)."""
    source: str = ""
    """Where the figures come from."""
    arch: str = ""
    """Architecture (``volta``, ``turing``, ``ampere``, ``ada``, ``hopper``, ``cdna2``, ``cdna3``, ...): picks
    the matrix-efficiency curve (:mod:`hetpart.costmodel.efficiency`); empty for an unknown or emulated type."""
    tflops_tf32: float = 0.0
    """Dense TF32 tensor-core peak in TFLOPS; 0 where the hardware has none (fp32 products then run at
    ``tflops_fp32``, as PyTorch does when TF32 is asked for on such a device)."""
    tflops_fp8: float = 0.0
    """Dense fp8 matrix peak in TFLOPS (fp32 accumulate); 0 where the hardware has no fp8 units."""

    def __post_init__(self) -> None:
        for field in ("tflops_bf16", "tflops_fp32", "memory_gb", "hbm_gbyte_s"):
            value = getattr(self, field)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0 or value > 1e6:
                raise ValueError(f"{field} must be a positive number below 1e6, got {value!r}")
        for field in ("tflops_tf32", "tflops_fp8"):
            value = getattr(self, field)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value <= 1e6:
                raise ValueError(f"{field} must be a number in [0, 1e6] (0: not supported), got {value!r}")

    @property
    def supports_fp8(self) -> bool:
        """Whether the device has fp8 matrix units (Hopper, Ada, CDNA3)."""
        return self.tflops_fp8 > 0

    def tflops(self, precision: str) -> float:
        """Dense matrix peak for ``precision`` in TFLOPS.

        ``bf16``/``fp16``: the 16-bit peak; ``fp32``: plain fp32 (no tensor cores); ``tf32``: the TF32
        tensor-core peak, or the fp32 peak where there is none; ``fp8``: the fp8 peak.

        Raises:
            ValueError: ``fp8`` on a device without fp8 units (callers check with :attr:`supports_fp8`).
        """
        if precision == "fp32":
            return self.tflops_fp32
        if precision == "tf32":
            return self.tflops_tf32 or self.tflops_fp32
        if precision == "fp8":
            if not self.tflops_fp8:
                raise ValueError(f"{self.name} has no fp8 matrix units")
            return self.tflops_fp8
        return self.tflops_bf16


@dataclass(frozen=True)
class LinkSpec:
    """The link between devices of one node (per device, per direction)."""

    name: str
    bandwidth_gbyte_s: float
    """Unidirectional bandwidth one device can drive to a peer in the node, GB/s."""
    latency_us: float
    """One-way latency of a small message, microseconds."""
    source: str = ""
    efficiency: float = 1.0
    """Fraction of ``bandwidth_gbyte_s`` that NCCL's transfers reach over this link (protocol overhead,
    staging through host memory); the cost model prices collectives and sends at
    ``bandwidth_gbyte_s * efficiency``. Catalog entries name their source; inline links default to 1
    (give the bandwidth you measured, or the datasheet rate and an efficiency)."""

    def __post_init__(self) -> None:
        if not self.bandwidth_gbyte_s > 0 or self.bandwidth_gbyte_s > 1e6:
            raise ValueError(f"bandwidth_gbyte_s must be positive, got {self.bandwidth_gbyte_s!r}")
        if not self.latency_us >= 0 or self.latency_us > 1e7:
            raise ValueError(f"latency_us must be >= 0, got {self.latency_us!r}")
        if not 0 < self.efficiency <= 1:
            raise ValueError(f"efficiency must be in (0, 1], got {self.efficiency!r}")

    @property
    def achieved_gbyte_s(self) -> float:
        """The bandwidth transfers really reach, GB/s (``bandwidth_gbyte_s * efficiency``)."""
        return self.bandwidth_gbyte_s * self.efficiency


@dataclass(frozen=True)
class NICSpec:
    """A network card type (one port's line rate)."""

    name: str
    bandwidth_gbit_s: float
    """Line rate in Gbit/s."""
    latency_us: float
    """One-way latency of a small message through one switch, microseconds."""
    rdma: bool = False
    """True for InfiniBand and RoCE (GPUDirect RDMA possible); False for TCP Ethernet."""
    source: str = ""

    def __post_init__(self) -> None:
        if not self.bandwidth_gbit_s > 0 or self.bandwidth_gbit_s > 1e6:
            raise ValueError(f"bandwidth_gbit_s must be positive, got {self.bandwidth_gbit_s!r}")
        if not self.latency_us >= 0 or self.latency_us > 1e7:
            raise ValueError(f"latency_us must be >= 0, got {self.latency_us!r}")

    @property
    def bandwidth_gbyte_s(self) -> float:
        """Line rate in GB/s."""
        return self.bandwidth_gbit_s / 8.0
