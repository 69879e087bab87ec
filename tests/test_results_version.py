"""results.jsonl carries its version: results made with the prompts and
scoring before the fidelity fixes are refused, never mixed with new ones."""
from __future__ import annotations

import json

import pytest

from engine.errors import TulvingError
from engine.evaluation.results import RESULTS_VERSION, ResultRecord, load_results, write_results


def test_results_of_another_version_are_refused(tmp_path):
    path = write_results(tmp_path / "results.jsonl", [ResultRecord(q_idx=0, question="q?", f1=0.5)])
    assert json.loads(path.read_text())["results_version"] == RESULTS_VERSION == 2
    assert load_results(path)[0].f1 == 0.5
    old = json.loads(path.read_text())
    del old["results_version"]  # written before the fidelity fixes
    path.write_text(json.dumps(old) + "\n")
    with pytest.raises(TulvingError, match="results version 1, this Tulving reads version 2"):
        load_results(path)
