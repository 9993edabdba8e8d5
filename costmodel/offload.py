"""Model states in host memory: what an offloaded plan keeps where, and what it pays for it (issue 10).

Two levels (plan key ``offload``, :data:`hetpart.vocabulary.OFFLOADS`):

* ``optimizer`` -- ZeRO-Offload (Ren et al., USENIX ATC 2021; DeepSpeed's ``offload_optimizer: cpu``,
  Megatron-Core's ``--optimizer-cpu-offload``). The device keeps its 16-bit weights (a shard of them at
  ``zero`` 3) and, at ``zero`` 0-1, its whole 16-bit gradients (Megatron-Core's offload keeps its gradient
  buffer); the fp32 master weights, the optimizer's moments and the gradient shard live in host memory, and
  the optimizer step runs on the CPU. Level 2 streams the gradients to the host unit by unit even for a lone
  replica (DeepSpeed's ZeRO-Offload on one GPU, whose device keeps 2 bytes per parameter). Per step
  each device copies its gradient shard to the host (at ``zero`` 2-3 unit by unit after each reduce-scatter,
  overlapped with the backward as the reduce-scatters are; at 0-1 after the gradient reduction), the CPU
  steps, and the updated 16-bit shard is copied back (before the parameter all-gather at levels 1-2).
* ``full`` -- also the 16-bit parameters (FSDP2's ``CPUOffloadPolicy``, ZeRO-Infinity's
  ``offload_param: cpu``); needs ``zero`` 3. Each unit's parameter shard is copied to the device before
  each all-gather (forward and backward, every micro-batch) and its gradient shard back after each
  reduce-scatter; the step runs on the CPU and nothing is copied back after it.

Where the numbers come from:

* **Host link** (:func:`host_link_gbyte_s`): one direction of the device's PCIe x16 link as pinned copies
  reach it (CUDA ``bandwidthTest``-style figures users publish: about 12 GB/s on PCIe 3, 24-26 on PCIe 4,
  50-55 on PCIe 5), by architecture: Pascal, Volta and Turing boards are PCIe 3, Ampere, Ada, CDNA2 and
  Ascend 910B PCIe 4, Hopper and CDNA3 PCIe 5. ASSUMED per architecture, not measured here (no GPU). A
  GH200 reaches its CPU over NVLink-C2C instead: 900 GB/s both ways in NVIDIA's datasheet, 450 per
  direction (:data:`HOST_LINK_BY_NAME`).
* **The CPU's optimizer step** (:func:`cpu_step_s`): element-wise over the parameter shard, bound by the
  host's memory bandwidth: :data:`~hetpart.costmodel.memory.OPTIMIZER_STEP_BYTES` per parameter over the
  node's bandwidth (a STREAM triad figure) shared by the node's offloading devices (they step at the same
  time), times :data:`CPU_ADAM_BANDWIDTH_FRACTION`. Measured on this machine (``python -m
  hetpart.experiments.measure_cpu_adam``, ``experiments/data/cpu_adam.json``, both cores): torch's fused CPU
  Adam moved its 28 bytes per parameter at 1.6-2.4x the rate of a C STREAM triad (OpenMP, gcc -O3) over
  as many elements, the ``foreach`` step several times slower. This shared virtual machine's memory does
  not behave like a node's (its plain read loop reached less than the Adam step "moved"), so the
  fraction is kept at 1.0: a CPU step priced at the triad's rate, conservative by up to 2x on this
  evidence, until a node-scale measurement exists.
* **Host memory and its bandwidth** per node: the cluster file's ``host_memory_gb`` and
  ``host_memory_gbyte_s`` where given, else ASSUMED: :data:`DEFAULT_HOST_MEMORY_GBYTE_S` and twice the
  node's device memory (:func:`host_memory_gb`).
* **Host bytes** per parameter: ZeRO-Offload's accounting, the fp32 gradient the CPU steps from
  (:data:`HOST_GRAD_BYTES`, whatever the training dtype) and the optimizer's states (12 bytes for Adam: fp32
  master and two moments) at ``optimizer``, plus the 16-bit weights at ``full``; each times the device's shard
  fraction.
* **Copies**: the gradient crosses PCIe to the host in fp32 (:data:`HOST_GRAD_BYTES`: DeepSpeed casts it on the
  device before the copy), the updated parameters come back in the training dtype (:func:`host_copy_bytes`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hetpart.costmodel.memory import optimizer_step_bytes, state_split
from hetpart.hardware import GIB, GPUSpec

if TYPE_CHECKING:  # pragma: no cover
    from hetpart.cluster import NodeGroup

__all__ = ["HOST_LINK_GBYTE_S", "HOST_LINK_BY_NAME", "DEFAULT_HOST_MEMORY_GBYTE_S", "CPU_ADAM_BANDWIDTH_FRACTION", "HOST_GRAD_BYTES",
           "host_link_gbyte_s", "host_memory_gb", "host_memory_gbyte_s", "device_state_parts", "device_state_bytes",
           "host_state_bytes", "host_copy_bytes", "cpu_step_bytes", "cpu_step_s"]

HOST_LINK_GBYTE_S: dict[str, float] = {
    "pascal": 12.0, "volta": 12.0, "turing": 12.0,
    "ampere": 24.0, "ada": 24.0, "cdna2": 24.0, "davinci": 24.0,
    "hopper": 50.0, "cdna3": 50.0,
}
"""ASSUMED: one direction of a device's PCIe x16 link as pinned host copies reach it, GB/s, by architecture
(module docstring); an unknown architecture gets the PCIe 3 figure."""
HOST_LINK_BY_NAME: dict[str, float] = {"GH200": 450.0}
"""Devices whose host link is not their architecture's PCIe, by name prefix: GB/s per direction (datasheets)."""
DEFAULT_HOST_MEMORY_GBYTE_S = 150.0
"""ASSUMED: a node's CPU memory bandwidth (STREAM triad) where the cluster file gives none, GB/s: two sockets
of the DDR4 generation reach 150-300, one workstation socket 50-100."""
CPU_ADAM_BANDWIDTH_FRACTION = 1.0
"""ASSUMED, bounded by a measurement (``experiments/data/cpu_adam.json``; module docstring): the CPU's Adam step
moves its 28 bytes per parameter at this multiple of a STREAM triad's reported bandwidth. Measured here:
1.6-2.4 with torch's fused step on a shared 2-core virtual machine; 1.0 is the conservative choice."""


HOST_GRAD_BYTES = 4.0
"""Bytes per parameter of the gradient an offloaded optimizer steps from, in host memory and on its way there: fp32
whatever the training dtype. DeepSpeed's ZeRO-Offload (``deepspeed/runtime/zero/stage_1_and_2.py``) keeps the host's
gradient partition as the ``.grad`` of its fp32 master partition (``single_partition_of_fp32_groups``; its
``master_weights_and_grads_dtype`` is fp32 unless ``fp16_master_weights_and_gradients``), and
``async_inplace_copy_grad_to_fp32_buffer_from_gpu`` casts each gradient slice to that dtype on the device
(``src_tensor.to(self.master_weights_and_grads_dtype)``) before the non-blocking copy to the host; ``stage3.py``'s
``partition_grads`` does the same (``grad_buffer.to(dtype=self.master_weights_and_grads_dtype)``);
``DeepSpeedCPUAdam`` then updates the fp32 master from fp32 gradients. The ZeRO-Offload paper (Ren et al., USENIX
ATC 2021, Fig. 2) draws the gradient crossing PCIe in fp16 (2 bytes) and converted on the CPU; the engine as
shipped moves 4. Megatron-Core's ``--optimizer-cpu-offload`` copies its fp32 ``main_grad`` likewise."""


def host_copy_bytes(precision: str) -> tuple[float, float]:
    """``(to the host, back to the device)`` bytes per parameter an offloaded optimizer's copies move: the fp32
    gradient (:data:`HOST_GRAD_BYTES`) out, the updated parameters back in the training dtype (DeepSpeed stages them
    in a 16-bit pinned buffer on the host, DeepSpeed #7309: "the H2D memory copy needs a 16bit pinned memory
    buffer"); under ``full`` each unit's parameter shard comes in as the latter before its gathers."""
    return HOST_GRAD_BYTES, state_split(precision)[0]


def cpu_step_bytes(optimizer: str, precision: str) -> float:
    """Host-memory bytes the CPU's optimizer step moves per parameter: the device's
    :func:`~hetpart.costmodel.memory.optimizer_step_bytes` with the gradient read in fp32 (:data:`HOST_GRAD_BYTES`;
    the same under bf16 and fp32, 2 more under fp16)."""
    return optimizer_step_bytes(optimizer, precision) - state_split(precision, optimizer)[1] + HOST_GRAD_BYTES


def host_link_gbyte_s(gpu: GPUSpec) -> float:
    """GB/s of one direction of ``gpu``'s link to its host (:data:`HOST_LINK_BY_NAME`, else
    :data:`HOST_LINK_GBYTE_S` by architecture)."""
    for prefix, rate in HOST_LINK_BY_NAME.items():
        if gpu.name.startswith(prefix):
            return rate
    return HOST_LINK_GBYTE_S.get(gpu.arch, 12.0)


def host_memory_gb(group: "NodeGroup") -> float:
    """Host memory of one node of ``group``, GB: the cluster file's, else ASSUMED twice the node's device
    memory (at least 64 GB)."""
    if group.host_memory_gb:
        return group.host_memory_gb
    return max(64.0, 2.0 * sum(gpu.memory_gb * GIB * n for gpu, n in group.gpu_counts))


def host_memory_gbyte_s(group: "NodeGroup") -> float:
    """The CPU memory bandwidth of one node of ``group``, GB/s (:data:`DEFAULT_HOST_MEMORY_GBYTE_S` unless the
    cluster file gives one)."""
    return group.host_memory_gbyte_s or DEFAULT_HOST_MEMORY_GBYTE_S


def device_state_parts(w: float, g: float, opt: float, zero: int, fraction: float,
                       offload: str) -> tuple[float, float, float]:
    """``(weights, gradients, optimizer states)`` bytes per parameter a device keeps at rest (working sets
    aside), ``w``, ``g`` and ``opt`` the whole states' bytes: the ZeRO level's shards
    (:mod:`~hetpart.costmodel.sharding`) less what ``offload`` keeps on the host."""
    if offload == "full":
        return 0.0, 0.0, 0.0
    if offload == "optimizer":
        return w * (fraction if zero >= 3 else 1.0), (g if zero <= 1 else 0.0), 0.0
    return (w * (fraction if zero >= 3 else 1.0), g * (fraction if zero >= 2 else 1.0),
            opt * (fraction if zero >= 1 else 1.0))


def device_state_bytes(w: float, g: float, opt: float, zero: int, fraction: float, offload: str) -> float:
    """Bytes per parameter of model states a device keeps at rest: the sum of :func:`device_state_parts`."""
    return sum(device_state_parts(w, g, opt, zero, fraction, offload))


def host_state_bytes(w: float, g: float, opt: float, fraction: float, offload: str) -> float:
    """Bytes per parameter a device's states take in host memory (``fraction``: its shard, 1 unsharded): the
    gradient in fp32 (:data:`HOST_GRAD_BYTES`, not the device's ``g``: 2 under fp16) with the optimizer's states,
    and at ``full`` the weights."""
    if offload == "full":
        return (w + HOST_GRAD_BYTES + opt) * fraction
    if offload == "optimizer":
        return (HOST_GRAD_BYTES + opt) * fraction
    return 0.0


def cpu_step_s(params: float, step_bytes: float, group: "NodeGroup", sharing: int) -> float:
    """Seconds the CPU takes for the optimizer step of ``params`` parameters (``step_bytes`` moved each) while
    ``sharing`` devices of the same node step at once."""
    rate = host_memory_gbyte_s(group) * 1e9 * CPU_ADAM_BANDWIDTH_FRACTION / max(1, sharing)
    return params * step_bytes / rate
