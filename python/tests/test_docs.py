"""The Python examples of docs/python.md run (skipped outside a checkout, or without torch for
the examples that use it)."""

import pathlib
import re

import pytest

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "python.md"


def examples():
    if not DOC.is_file():
        return []
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


@pytest.mark.skipif(not DOC.is_file(), reason="docs/python.md not found (not a checkout)")
@pytest.mark.parametrize("index", range(len(examples())))
def test_example_runs(index):
    code = examples()[index]
    if "import torch" in code:
        pytest.importorskip("torch")
    exec(compile(code, f"{DOC}:example{index}", "exec"), {})
