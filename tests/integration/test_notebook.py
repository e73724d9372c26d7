"""`notebooks/mesh_debugging.ipynb` executes top to bottom (nbclient, kernel `python3` = this interpreter)."""

from __future__ import annotations

import importlib.util
import os
import re
import sys

import numpy as np
import pytest

from tests.tools import REPO

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
if importlib.util.find_spec("ipykernel") is None:
    pytest.skip("ipykernel is not installed (pip install -e '.[test]')", allow_module_level=True)


NOTEBOOK = os.path.join(REPO, "notebooks", "mesh_debugging.ipynb")


def _text(nb) -> str:
    out = []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            if o.get("output_type") == "stream":
                out.append(o["text"])
            elif o.get("output_type") in ("display_data", "execute_result"):
                out.append(str(o.get("data", {}).get("text/plain", "")))
    return "\n".join(out)


def test_mesh_debugging_notebook_executes():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    # jupyter_client replaces a kernelspec's "python" command with sys.executable, so the kernel runs this venv
    client = nbclient.NotebookClient(
        nb, kernel_name="python3", timeout=600, resources={"metadata": {"path": os.path.dirname(NOTEBOOK)}}
    )
    client.execute()  # raises CellExecutionError on the first failing cell
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    text = _text(nb)
    kernel_python = re.search(r"^python: (.+)$", text, re.M).group(1).strip()
    assert os.path.realpath(kernel_python) == os.path.realpath(sys.executable)
    assert "devices: 8" in text
    # the all_to_all cell: Y = X.T for X[e, j] = 10 e + j on the 4-device expert axis
    assert "all_to_all result matches NumPy X.T: True" in text
    expected = (10 * np.arange(4)[:, None] + np.arange(4)[None, :]).T
    printed = text.split("Y = all_to_all(X):")[1].split("all_to_all result")[0]
    assert np.array_equal(np.array([int(v) for v in re.findall(r"-?\d+", printed)]).reshape(4, 4), expected)
    # the train step ran and reported expert loads; EP all-to-alls are in the compiled step
    assert re.search(r"loss \d+\.\d+", text) and "load_cv per layer" in text
    assert int(re.search(r"all-to-all ops in the train step: (\d+)", text).group(1)) > 0
    assert "P(None, 'expert', None, None)" in text  # expert kernels sharded over the expert axis
