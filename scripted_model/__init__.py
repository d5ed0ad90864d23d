"""A scripted OpenAI-compatible model server, owned by the project for tests, benchmarks
and the offline demo. No Django here: it runs as ``python -m scripted_model``
or in-process (:class:`ScriptedModel`). The script format is described in ``script.py``.
"""

from scripted_model.script import Script, ScriptError
from scripted_model.server import ScriptedModel

__all__ = ("Script", "ScriptError", "ScriptedModel")
