"""The device mesh over several nodes: only `data` crosses nodes; `context` and `expert` stay in one, whatever
order the runtime lists the devices in (the 2-process training run is in tests/integration/test_multiprocess.py)."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

from zaya_jax.config import ConfigError
from zaya_jax.parallel.mesh import hybrid_device_grid, parse_mesh_spec


@dataclasses.dataclass(frozen=True)
class FakeDevice:  # the attributes mesh_utils reads
    id: int
    process_index: int
    platform: str = "cpu"
    device_kind: str = "cpu"


def _nodes(count: int, per_node: int, seed: int) -> list[FakeDevice]:
    devices = [FakeDevice(n * per_node + i, n) for n in range(count) for i in range(per_node)]
    random.Random(seed).shuffle(devices)  # the runtime's listing order is not ours to rely on
    return devices


@pytest.mark.parametrize(
    "spec", ["data:4,expert:4", "data:2,context:2,expert:4", "data:8,expert:2", "data:4,context:4"]
)
def test_only_data_crosses_nodes(spec):
    sizes = parse_mesh_spec(spec)
    grid = hybrid_device_grid(sizes, _nodes(2, 8, seed=len(spec)))
    assert grid.shape == (sizes["data"], sizes["context"], sizes["expert"])
    node = np.vectorize(lambda d: d.process_index)(grid)
    rows_per_node = sizes["data"] // 2
    for row in range(sizes["data"]):  # every [context, expert] block lives on one node: row // rows_per_node
        assert (node[row] == row // rows_per_node).all(), (spec, row, node[row])
    ids = np.vectorize(lambda d: d.id)(grid)
    assert sorted(ids.ravel().tolist()) == list(range(16))
    for n in range(2):  # inside a node, devices in id order (the runtime's local order)
        assert ids[node == n].tolist() == sorted(ids[node == n].tolist())


def test_axes_that_cannot_stay_in_a_node_are_one_line_errors():
    with pytest.raises(ConfigError, match="context x expert .16. must divide the 8 devices of a node"):
        hybrid_device_grid(parse_mesh_spec("data:1,expert:16"), _nodes(2, 8, seed=0))
    with pytest.raises(ConfigError, match="mesh.data must be a multiple of 2"):
        hybrid_device_grid(parse_mesh_spec("data:3,expert:1"), _nodes(2, 8, seed=0))
