"""The run's devices outside their judges: GPU work of the run itself holds every GPU's gate."""

from __future__ import annotations

import asyncio

from kernforge.loop.devices import Devices


def test_gpu_work_holds_every_devices_gate_shared_and_gives_it_back():
    devices = Devices(["cuda:0", "cuda:1"], lanes=2)

    async def work() -> list[int]:
        async with devices.gpu_work():
            return [devices.gates[name]._shared for name in devices.names]

    assert asyncio.run(work()) == [1, 1]
    assert [devices.gates[name]._shared for name in devices.names] == [0, 0]
