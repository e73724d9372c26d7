"""The import graph (every import statement of zaya_jax/, launch/, experiments/, benchmarks/, read from the
source): no circle between modules, each package imports only the layers below it, and docs/architecture.md
shows the map the source gives (`python -m tests.tools.import_graph` prints it)."""

from __future__ import annotations

import os

from tests.tools import import_graph


def test_no_import_circle_anywhere():
    graph = import_graph.edges()
    assert "zaya_jax.model.moe" in graph["zaya_jax.model.zaya"], "the graph sees module-level imports"
    assert "zaya_jax.train.schedule" in graph["zaya_jax.checkpoint.elastic"], "and function-level ones"
    assert import_graph.cycles(graph) == []


def test_cycle_finder_finds_a_circle():
    assert import_graph.cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_packages_import_only_the_layers_below_them():
    assert import_graph.upward_imports(import_graph.edges()) == []


def test_architecture_doc_shows_the_map_of_the_source():
    with open(os.path.join(import_graph.REPO, "docs", "architecture.md"), encoding="utf-8") as f:
        doc = f.read()
    assert import_graph.package_map(import_graph.edges()) in doc, "regenerate it: python -m tests.tools.import_graph"
