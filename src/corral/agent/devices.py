"""Finding this machine's GPUs: NVML when a driver is there, virtual devices otherwise.

Virtual devices are labelled virtual everywhere (the API, the CLI, the dashboard), so a
virtual GPU is never mistaken for a measured one.
"""

from __future__ import annotations

import logging
import socket
from dataclasses import dataclass

from corral.model import GIB
from corral.model.spec import Device

log = logging.getLogger("corral.agent.devices")


@dataclass(frozen=True, slots=True)
class Discovery:
    """What was found: the devices, whether they are real, and why not when they are not."""

    devices: tuple[Device, ...]
    model: str
    memory: int
    source: str  # "nvml" or "virtual"
    note: str
    # Per pair of device indices: "nvlink", "pcie-switch", "pcie-host", "system" (NVML only).
    links: tuple[tuple[int, int, str], ...] = ()


def nvml_devices() -> Discovery | None:
    """The real GPUs through NVML, or None when NVML or its driver is not available."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        count = pynvml.nvmlDeviceGetCount()
        if count == 0:
            return None
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        devices = []
        for index, handle in enumerate(handles):
            name = pynvml.nvmlDeviceGetName(handle)
            name = name.decode() if isinstance(name, bytes) else str(name)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
            memory = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
            devices.append(Device(index, uuid, name, memory, virtual=False))
        return Discovery(
            tuple(devices),
            devices[0].model,
            devices[0].memory,
            "nvml",
            f"{count} GPUs found through NVML",
            _links(pynvml, handles),
        )
    except pynvml.NVMLError:
        return None
    finally:
        pynvml.nvmlShutdown()


def _links(pynvml: object, handles: list[object]) -> tuple[tuple[int, int, str], ...]:
    """How each pair of devices is connected, the closest path NVML reports."""
    nvml = pynvml
    levels = {
        getattr(nvml, "NVML_TOPOLOGY_INTERNAL", 0): "same-board",
        getattr(nvml, "NVML_TOPOLOGY_SINGLE", 10): "pcie-switch",
        getattr(nvml, "NVML_TOPOLOGY_MULTIPLE", 20): "pcie-switch",
        getattr(nvml, "NVML_TOPOLOGY_HOSTBRIDGE", 30): "pcie-host",
        getattr(nvml, "NVML_TOPOLOGY_NODE", 40): "numa-node",
        getattr(nvml, "NVML_TOPOLOGY_SYSTEM", 50): "system",
    }
    links = []
    for a in range(len(handles)):
        for b in range(a + 1, len(handles)):
            kind = "unknown"
            try:
                if _nvlinked(nvml, handles[a], handles[b]):
                    kind = "nvlink"
                else:
                    level = nvml.nvmlDeviceGetTopologyCommonAncestor(  # type: ignore[attr-defined]
                        handles[a], handles[b]
                    )
                    kind = levels.get(level, "unknown")
            except nvml.NVMLError as error:  # type: ignore[attr-defined]
                # Some drivers and device pairs do not answer topology queries; the link
                # is then unknown, and placement treats it as the farthest.
                log.info("no topology for GPUs %d and %d: %s", a, b, error)
            links.append((a, b, kind))
    return tuple(links)


def _nvlinked(nvml: object, first: object, second: object) -> bool:
    try:
        status = nvml.nvmlDeviceGetP2PStatus(  # type: ignore[attr-defined]
            first,
            second,
            nvml.NVML_P2P_CAPS_INDEX_NVLINK,  # type: ignore[attr-defined]
        )
    except nvml.NVMLError as error:  # type: ignore[attr-defined]
        # NVLink status is not supported on every device (PCIe cards): no NVLink then.
        log.debug("no NVLink status: %s", error)
        return False
    return bool(status == nvml.NVML_P2P_STATUS_OK)  # type: ignore[attr-defined]


def virtual_devices(count: int, model: str = "virtual", memory: int = 80 * GIB) -> Discovery:
    host = socket.gethostname()
    devices = tuple(
        Device(index, f"virtual-{host}-{index}", model, memory, virtual=True)
        for index in range(count)
    )
    return Discovery(devices, model, memory, "virtual", f"{count} virtual GPUs")


def discover(
    virtual_gpus: int | None = None,
    virtual_model: str = "virtual",
    virtual_memory: int = 80 * GIB,
    default_virtual: int = 4,
) -> Discovery:
    """Real GPUs when NVML finds some and no virtual ones were asked for; otherwise virtual
    ones (`default_virtual` of them when none were asked for), saying why."""
    if virtual_gpus is not None:
        found = virtual_devices(virtual_gpus, virtual_model, virtual_memory)
        return Discovery(
            found.devices,
            found.model,
            found.memory,
            "virtual",
            f"{virtual_gpus} virtual GPUs, as asked",
        )
    real = nvml_devices()
    if real is not None:
        return real
    found = virtual_devices(default_virtual, virtual_model, virtual_memory)
    return Discovery(
        found.devices,
        found.model,
        found.memory,
        "virtual",
        f"no GPU found through NVML; starting with {default_virtual} virtual GPUs",
    )
