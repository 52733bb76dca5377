"""Oracle (and nop) validation of Harbor datasets, with Harbor's lint rules and JUnit output."""

from osmosis_harbor.validate.report import TaskValidation, ValidationReport
from osmosis_harbor.validate.run import validate_tasks

__all__ = ["TaskValidation", "ValidationReport", "validate_tasks"]
