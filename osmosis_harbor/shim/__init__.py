"""In-container runners for Osmosis workflows and graders (the "shim").

This package runs *inside* the sandbox, where only the task image, the bundle
wheel and its dependencies exist. It is copied into every bundle wheel as the
top-level package ``osmosis_harbor_shim``, so it may import only the standard
library, ``pydantic`` and ``osmosis_ai`` -- never ``harbor`` and never
``osmosis_harbor`` -- and refers to its own modules with relative imports only.

Entry points (both return an exit code and never raise):

* ``agent.main(workflow=..., workflow_config=...)`` -- runs ``AgentWorkflow.run``
  and leaves ``<logs>/agent/sample.json`` or ``<logs>/agent/error.json``.
* ``verifier.main(grader=..., grader_config=...)`` -- runs ``Grader.grade`` on
  that sample and leaves ``<logs>/verifier/{reward,sample}.json`` or
  ``<logs>/verifier/error.json``.

``SHIM_VERSION`` changes whenever a file format or entry point changes, so the
host can refuse a bundle built against a different contract.
"""

SHIM_VERSION = "1"

__all__ = ["SHIM_VERSION"]
