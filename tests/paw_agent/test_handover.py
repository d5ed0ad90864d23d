"""A spare paw-agent (``serve --spare --secrets-fd FD``): started with nothing of a person,
it refuses runs until its ``handover`` op, then runs with the variables of its secrets
pipe in the workspace the op names (the folder it was started in, renamed), and is
handed over once. Real processes against the scripted model."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.paw_agent.conftest import API_KEY, runtime_env
from tests.paw_agent.driver import VENV_BIN, notifies, of_type, runtime_command, spawned
from tests.sandboxes.observe import process_environment

DUMP = """
import json, os
with open("seen.json", "w") as f:
    json.dump({"environ": dict(os.environ), "cwd": os.getcwd()}, f)
print("dumped")
"""


def test_a_spare_refuses_runs_until_its_handover_then_runs_as_its_pipe_and_op_say(
    tmp_path: Path, model
):
    folder = tmp_path / "spare"
    folder.mkdir()
    env = runtime_env(tmp_path / "env", model, "paw-test-spare")
    for name in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "OPENAI_MODEL"):
        del env[name]  # a spare is nobody's: no endpoint, key or model
    reader, writer = os.pipe()
    command = runtime_command("paw-agent", folder, "--spare", "--secrets-fd", str(reader))
    with spawned(command, env, cwd=folder, pass_fds=(reader,)) as runtime:
        os.close(reader)
        assert "handover" in runtime.ready()["capabilities"]
        runtime.send({"op": "submit", "prompt": "Hi", "run_id": "early", "op_id": "s1"})
        refused = runtime.error()
        assert refused["op_id"] == "s1"
        assert refused["message"] == "submit: this spare runtime has not been handed over yet"
        runtime.send({"op": "history", "turns": [], "op_id": "h1"})
        assert runtime.error()["op_id"] == "h1"
        runtime.send({"op": "handover", "op_id": "bad"})  # no project
        assert runtime.error()["op_id"] == "bad"

        # The hand-over: the folder becomes the conversation's workspace (renamed under
        # the running process), the run's variables come through the pipe.
        workspace = tmp_path / "conversation"
        folder.rename(workspace)
        variables = {
            "OPENAI_BASE_URL": model.base_url,
            "OPENAI_API_KEY": API_KEY,
            "OPENAI_MODEL": "handed-over-model",
            "ALICE_TOKEN": "alice-token-value",
        }
        os.write(writer, json.dumps(variables).encode())
        os.close(writer)
        runtime.send(
            {"op": "handover", "project": str(workspace), "answer_timeout": 30, "op_id": "h"}
        )
        runtime.send({"op": "ping", "op_id": "p"})
        pong = runtime.next()  # the next line: the hand-over wrote nothing (no error)
        assert (pong["type"], pong["op_id"]) == ("pong", "p")

        model.load(
            {
                "api_key": API_KEY,
                "responses": [
                    {"tool_calls": [{"name": "run_python", "arguments": {"code": DUMP}}]},
                    "Done.",
                ],
            }
        )
        lines = runtime.submit("Look.")
        result = of_type(lines, "result")[0]
        assert result["errors"] == [] and result["model"] == "handed-over-model"
        assert [tool["ok"] for tool in notifies(lines, "tool")] == [True]
        assert {entry["authorization"] for entry in model.log} == {f"Bearer {API_KEY}"}
        assert {entry["body"]["model"] for entry in model.log} == {"handed-over-model"}
        seen = json.loads((workspace / "seen.json").read_text())
        assert seen["cwd"] == str(workspace)
        assert seen["environ"]["ALICE_TOKEN"] == "alice-token-value"  # the person's, for tools
        assert not [name for name in seen["environ"] if name.startswith("OPENAI_")]
        # Nothing of the run is in the environment /proc shows.
        started_with = process_environment(runtime.pid)
        assert not set(variables) & set(started_with)

        # Used once.
        runtime.send({"op": "handover", "project": str(workspace), "op_id": "again"})
        again = runtime.error()
        assert again["op_id"] == "again" and "handed over already" in again["message"]


def test_a_runtime_started_normally_is_no_spare(start):
    runtime = start()
    assert "handover" not in runtime.ready()["capabilities"]
    runtime.send({"op": "handover", "project": ".", "op_id": "h"})
    error = runtime.error()
    assert error["op_id"] == "h" and "no spare" in error["message"]


def test_a_spare_needs_its_secrets_pipe(tmp_path: Path):
    done = subprocess.run(
        [str(VENV_BIN / "paw-agent"), "serve", "--spare", "--project", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "--spare needs --secrets-fd" in done.stderr
