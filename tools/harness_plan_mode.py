"""Measure what python-agent-harness's plan mode gates, on the real package over its
``serve`` protocol, against the project's scripted model (docs/runtime.md, *Ungated
runtimes*): ``.venv/bin/python tools/harness_plan_mode.py [CASE ...]``.

Each case starts a fresh harness process in a scratch workspace (its own HOME, XDG_*,
TMPDIR, as PAW gives a sandbox), submits prompts, answers any ``ask`` with the case's
answers, and prints the run's lines (``delta``, ``usage``, ``context``, ``todos`` and
``tools`` left out), the tools the model was offered, the tool results the model was
sent, and what ``count.txt`` holds afterwards. The scripted model's first step is the
call to measure (``Bash`` ``echo x >> count.txt``, ``Write`` of ``count.txt``, ``Agent``
delegating the append, ``PlanExit``).

Cases ``serve-*`` run the package as PAW does, unchanged (``python-agent-harness serve``).
Cases ``plan-*`` start it in plan mode, which ``serve`` has no flag, config key, op or
environment variable for (only the TUI's ``/plan`` calls ``Session.switch_to_plan()``):
a few lines here call that internal method before the package's own ``run_serve``, to see
what plan mode would gate if a host could reach it.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripted_model import ScriptedModel  # noqa: E402
from tests.paw_agent.driver import spawned  # noqa: E402

VENV_BIN = Path(sys.executable).parent
KEY = "sk-measure"
#: The harness's own serve loop, in plan mode (the internal call the TUI's /plan makes).
IN_PLAN_MODE = (
    "import sys\n"
    "from python_agent_harness.entry import cli\n"
    "from python_agent_harness.entry.server import run_serve\n"
    "session = cli.make_session_with_mcp(sys.argv[1], config_path=None, stream=None)\n"
    "session.switch_to_plan()\n"
    "sys.exit(run_serve(session, answer_timeout=0))\n"
)
QUIET_KINDS = {"usage", "context", "todos", "tools"}

BASH = {"tool_calls": [{"name": "Bash", "arguments": {"command": "echo x >> count.txt"}}]}
WRITE = {
    "tool_calls": [
        {"name": "Write", "arguments": {"path": ".", "filename": "count.txt", "content": "w\n"}}
    ]
}
DELEGATE = {"description": "append", "prompt": "append x to count.txt", "subagent_type": "general"}
AGENT = {"tool_calls": [{"name": "Agent", "arguments": DELEGATE}]}
PLAN_EXIT = {"tool_calls": [{"name": "PlanExit", "arguments": {}}]}

#: name: (description, model steps, prompts, plan mode, answers to asks)
CASES: dict[str, tuple[str, list[Any], list[str], bool, list[str]]] = {
    "serve-bash": ("unchanged serve: Bash", [BASH, "Appended."], ["Append x to count.txt."], False, []),
    "serve-slash-plan": ("unchanged serve: a '/plan' prompt", [BASH, "Appended."],
                         ["/plan Append x to count.txt."], False, []),
    "serve-plan-exit": ("unchanged serve: the model calls PlanExit", [PLAN_EXIT, "Tried."],
                        ["Exit plan mode."], False, []),
    "plan-bash-write": ("plan mode: Bash, then Write", [BASH, WRITE, "Blocked."],
                        ["Append x to count.txt."], True, []),
    "plan-agent": ("plan mode: a sub-agent's Bash", [AGENT, BASH, "Sub-agent done.", "Done."],
                   ["Delegate the append."], True, []),
    "plan-declined": ("plan mode: PlanExit declined, then Bash", [PLAN_EXIT, BASH, "Planning."],
                      ["Plan, then append x to count.txt."], True, ["no"]),
    "plan-approved": ("plan mode: PlanExit approved, Bash; then a second run's Bash",
                      [PLAN_EXIT, BASH, "Appended.", "ok", "ok", BASH, "Appended again."],
                      ["Plan, then append x to count.txt.", "Append again."], True, ["yes"]),
}  # fmt: skip


def environment(root: Path, model: ScriptedModel) -> dict[str, str]:
    """A scratch HOME, XDG_* and TMPDIR under ``root``, and the scripted model."""
    folders = {"HOME": "home", "XDG_DATA_HOME": "data", "XDG_CONFIG_HOME": "config",
               "XDG_CACHE_HOME": "cache", "TMPDIR": "tmp"}  # fmt: skip
    for name in folders.values():
        (root / name).mkdir()
    return {
        **{variable: str(root / name) for variable, name in folders.items()},
        "PATH": f"{VENV_BIN}:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "OPENAI_BASE_URL": model.base_url,
        "OPENAI_API_KEY": KEY,
        "OPENAI_MODEL": "scripted-model",
        "NO_PROXY": "127.0.0.1,localhost",
    }


def measure(name: str) -> None:
    title, steps, prompts, plan, answers = CASES[name]
    script = {"api_key": KEY, "untooled": {"text": "Title"}, "responses": steps, "fallback": "ok"}
    answers = list(answers)
    print(f"\n=== {name}: {title}")
    with tempfile.TemporaryDirectory() as scratch, ScriptedModel(script) as model:
        root = Path(scratch)
        workspace = root / "workspace"
        workspace.mkdir()
        if plan:
            command = [str(VENV_BIN / "python"), "-c", IN_PLAN_MODE, str(workspace)]
        else:
            command = [str(VENV_BIN / "python-agent-harness"), "serve", "--project", str(workspace)]
        with spawned(command, environment(root, model), workspace) as runtime:
            ready = runtime.ready()
            print("ready.capabilities:", ready["capabilities"])
            for number, prompt in enumerate(prompts, 1):
                run_id = f"run-{number}"
                print(f"--- submit {prompt!r} (run_id {run_id})")
                runtime.send({"op": "submit", "prompt": prompt, "run_id": run_id})
                while True:
                    line = runtime.next(60)
                    if line.get("run_id") != run_id:
                        continue
                    line.pop("_at", None)
                    if line["type"] != "delta" and line.get("kind") not in QUIET_KINDS:
                        print(json.dumps(line, ensure_ascii=False))
                    if line["type"] == "notify" and line["kind"] == "ask":
                        answer = answers.pop(0)
                        print(f"<<< answer {answer!r}")
                        runtime.send({"op": "answer", "run_id": run_id, "answers": [answer],
                                      "ask_id": line["data"]["ask_id"]})  # fmt: skip
                    if line["type"] == "result":
                        break
        offered = {tuple(t["function"]["name"] for t in body.get("tools") or [])
                   for body in model.requests}  # fmt: skip
        print("tools offered:", sorted(offered - {()}))
        results = [
            body["messages"][-1]["content"]
            for body in model.requests
            if body["messages"] and body["messages"][-1].get("role") == "tool"
        ]
        print("tool results sent to the model:", results)
        count = workspace / "count.txt"
        print("count.txt:", repr(count.read_text()) if count.exists() else "absent")


if __name__ == "__main__":
    for case in sys.argv[1:] or CASES:
        measure(case)
