"""``validate --json FILE``: the report as UTF-8 JSON that any parser reads.

A task id is a dataset's directory name, and a name with bytes that are not UTF-8 reaches
Python as lone surrogates, which no UTF-8 file can hold: those are spelled as escapes
(``\\udcff``, as text). Control characters stay as they are, JSON-escaped by the encoder.
"""

from __future__ import annotations

import json

from osmosis_harbor.trials.printable import json_safe
from osmosis_harbor.validate.report import ValidationReport

__all__ = ["report_json"]


def report_json(report: ValidationReport) -> str:
    """``report`` as indented JSON text, ending in a newline."""
    return json.dumps(json_safe(report.model_dump(mode="json")), indent=2, ensure_ascii=False) + "\n"
