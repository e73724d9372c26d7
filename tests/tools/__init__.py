"""Support code of the tests: shared fixtures and builders (`helpers`, `checkpoint_helpers`), the adversarial
case table (`reliability_cases`) and the test programs run by hand (`python -m tests.tools.adversarial`,
`python -m tests.tools.import_graph`)."""

import os

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root
