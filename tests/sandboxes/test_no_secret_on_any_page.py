"""No secret value on any page (issue 14, point 4): what a runtime writes — its whole
environment to stderr before it dies, or a real run's tool output, approval, title and
answer — is masked before it is stored, so neither a column of the database nor any admin
page (every change list, every change page) shows the operator's provider key or a user's
secret."""

from __future__ import annotations

import base64
import json
import secrets as pysecrets

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model

from accounts.services import auth_token_pair_for
from conversations.models import Run, RunEvent
from conversations.services.runs import run_start
from conversations.services.workspaces import workspace_ensure
from paw_project.asgi import application
from sandboxes.models import Sandbox
from secrets_vault.services import secret_set
from tests.conftest import PAW_AGENT, SCRIPTED_API_KEY, api_client_for
from tests.factories import ConversationFactory
from tests.live import wait_for
from tests.sandboxes.fake_runtime import value_forms
from tests.sandboxes.observe import finished
from tests.secrets_vault.leak_scan import record_stored_runtime_output, visit_every_admin_page

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_a_runtime_printing_its_secrets_to_stderr_leaves_none_in_a_column_or_on_a_page(
    fake_worker, client, secret_scan
):
    conversation = ConversationFactory()
    token = f"user-token-{pysecrets.token_hex(16)}"
    secret_set(name="MY_TOKEN", value=token, user=conversation.user)
    (workspace_ensure(conversation.id) / "fake_mode").write_text("leak MY_TOKEN")
    run = run_start(user=conversation.user, conversation_id=conversation.id, prompt="go")
    run = wait_for(lambda: finished(run.id), what="the run to end")
    assert run.status == Run.Status.ERROR and run.errors[0]["code"] == "sandbox_exited"
    sandbox = wait_for(
        lambda: Sandbox.objects.filter(conversation=conversation, exit_code=3).first(),
        what="the sandbox's end to be stored",
    )

    tail = sandbox.stderr_tail
    assert "MY_TOKEN=[secret:MY_TOKEN]" in tail
    assert "OPENAI_API_KEY=[secret:PAW_LLM_API_KEY]" in tail
    for value in (token, SCRIPTED_API_KEY):
        assert value not in tail
        # Masked before the line was cut at 2000 characters: no half value is left either.
        assert value[: len(value) // 2 + 1] not in tail
    assert "[secret:MY_TOKEN]" in run.errors[0]["message"]

    operator = get_user_model().objects.create_superuser("operator", password=None)
    client.force_login(operator)
    visited = visit_every_admin_page(client, operator)
    assert f"/admin/sandboxes/sandbox/{sandbox.id}/change/" in visited
    assert f"/admin/conversations/run/{run.id}/change/" in visited
    assert record_stored_runtime_output() > 0
    secret_scan.check()  # every page and column above, with the suite's known values


def test_a_real_run_handling_a_secret_leaves_none_in_a_column_or_on_a_page(
    worker_node, scripted_model, client, secret_scan
):
    """paw-agent's run prints the user's secret from run_python (stdout and stderr), asks
    to run a shell command naming it (an approval, auto-approved), and the model repeats
    it in its answer: events, tool outputs, the approval, the answer and the usage rows
    all hold it masked."""
    worker_node.use(PAW_AGENT)
    conversation = ConversationFactory(auto_approve=True)
    token = f"user-token-{pysecrets.token_hex(16)}"
    secret_set(name="MY_TOKEN", value=token, user=conversation.user)
    code = "import os, sys\nprint(os.environ['MY_TOKEN'])\nprint(os.environ['MY_TOKEN'], file=sys.stderr)"
    scripted_model.load(
        {
            "api_key": SCRIPTED_API_KEY,
            "untooled": f"Title {token}",
            "rules": [
                {
                    "match": "use my token",
                    "responses": [
                        {"tool_calls": [{"name": "run_python", "arguments": {"code": code}}]},
                        {
                            "tool_calls": [
                                {"name": "shell", "arguments": {"command": f"echo {token}"}}
                            ]
                        },
                        {"text": f"It printed {{{{tool_result}}}}; the token is {token}."},
                    ],
                }
            ],
        }
    )
    run = run_start(
        user=conversation.user, conversation_id=conversation.id, prompt="Please use my token."
    )
    run = wait_for(lambda: finished(run.id), timeout=60, what="the run to end")
    assert run.status == Run.Status.DONE, run.errors
    assert "[secret:MY_TOKEN]" in run.answer and token not in run.answer

    operator = get_user_model().objects.create_superuser("operator", password=None)
    client.force_login(operator)
    visited = visit_every_admin_page(client, operator)
    assert f"/admin/conversations/run/{run.id}/change/" in visited
    assert any(path.startswith("/admin/conversations/approval/") for path in visited[1:])
    assert record_stored_runtime_output() > 0
    secret_scan.check()


def test_what_a_runtime_names_or_cuts_is_masked_before_it_is_stored_or_shown(
    fake_worker, secret_scan
):
    """A secret value as a notify kind or a line's type (stored as the event's kind and
    type), in a foreign run id or a malformed line where PAW cuts them (masked whole
    first), and in a runtime's refusal of a run (its error message)."""
    conversation = ConversationFactory()
    token = f"user-token-{pysecrets.token_hex(16)}"
    secret_set(name="MY_TOKEN", value=token, user=conversation.user)
    mode = workspace_ensure(conversation.id) / "fake_mode"
    mode.write_text("leak-shapes MY_TOKEN")
    run = run_start(user=conversation.user, conversation_id=conversation.id, prompt="go")
    run = wait_for(lambda: finished(run.id), what="the run to end")
    assert run.status == Run.Status.DONE, run.errors
    events = wait_for(
        lambda: (
            list(RunEvent.objects.filter(conversation=conversation).order_by("cursor"))
            if RunEvent.objects.filter(conversation=conversation, type="result").exists()
            else None
        ),
        what="the events to be stored",
    )
    pieces = (token, token[: len(token) // 2], token[len(token) // 2 :])
    for event in events:
        text = f"{event.type}|{event.kind}|{json.dumps(event.payload)}"
        assert not any(piece in text for piece in pieces), text
    kinds = {event.kind for event in events}
    assert "[secret:MY_TOKEN]" in kinds  # the notify's kind, masked
    listed = api_client_for(conversation.user).get(
        f"/api/conversations/{conversation.id}/events?limit=1000"
    )
    assert listed.status_code == 200 and not any(
        piece in listed.content.decode() for piece in pieces
    )

    mode.write_text("refuse MY_TOKEN")
    refused = run_start(user=conversation.user, conversation_id=conversation.id, prompt="again")
    refused = wait_for(lambda: finished(refused.id), what="the refused run to end")
    assert refused.status == Run.Status.ERROR
    message = refused.errors[0]["message"]
    assert "[secret:MY_TOKEN]" in message and not any(piece in message for piece in pieces)
    assert record_stored_runtime_output() > 0
    secret_scan.check()


def test_a_secret_printed_encoded_or_reversed_is_masked_in_events_api_socket_and_admin(
    fake_worker, client, secret_scan
):
    """Issue 25: the value reversed, in Base64, hex, percent-encoded, and inside a longer
    Base64 text, streamed three characters a delta, as a tool's output and as the answer:
    each line is ``[secret:MY_TOKEN]`` in the stored events, the run, the API's events,
    runs and history, the websocket's replay and every admin page (the suite's scan looks
    for the forms too), and the worker's log holds none of them."""
    conversation = ConversationFactory()
    user = conversation.user
    token = f"tok/{pysecrets.token_hex(12)}+{pysecrets.token_hex(12)}&x"  # quote() changes it
    secret_set(name="MY_TOKEN", value=token, user=user)
    (workspace_ensure(conversation.id) / "fake_mode").write_text("leak-forms MY_TOKEN")
    run = run_start(user=user, conversation_id=conversation.id, prompt="go")
    run = wait_for(lambda: finished(run.id), what="the run to end")
    assert run.status == Run.Status.DONE, run.errors
    printed = value_forms(token)  # one a line (some equal: this value's Base64 has no +/)
    forms = set(printed)
    assert token not in forms

    def assert_masked(text: str, where: str) -> None:
        assert not [form for form in forms if form in text], where
        assert token not in text, where

    # The answer: every line masked; the one inside "user:<value>" keeps its edges only.
    lines = run.answer.splitlines()
    assert lines[:-1] == ["[secret:MY_TOKEN]"] * (len(printed) - 1), lines
    assert "[secret:MY_TOKEN]" in lines[-1] and len(lines[-1]) <= len("[secret:MY_TOKEN]") + 12
    events = list(RunEvent.objects.filter(conversation=conversation).order_by("cursor"))
    streamed = "".join(e.payload.get("text", "") for e in events if e.type == "delta")
    assert streamed == run.answer
    (tool,) = [e for e in events if e.kind == "tool"]
    assert tool.payload["data"]["stdout"] == run.answer
    for event in events:
        assert_masked(f"{event.type}|{event.kind}|{json.dumps(event.payload)}", "stored event")

    api = api_client_for(user)
    for path in (
        f"/api/conversations/{conversation.id}/events?limit=1000",
        f"/api/conversations/{conversation.id}/runs",
        f"/api/conversations/{conversation.id}/runs/{run.id}",
        f"/api/conversations/{conversation.id}/history",
    ):
        response = api.get(path)
        assert response.status_code == 200, path
        assert_masked(response.content.decode(), path)
        assert "[secret:MY_TOKEN]" in response.content.decode(), path

    replayed = async_to_sync(socket_replay)(
        conversation.id, auth_token_pair_for(user=user)["access"]
    )
    assert "[secret:MY_TOKEN]" in replayed
    assert_masked(replayed, "websocket")

    operator = get_user_model().objects.create_superuser("operator", password=None)
    client.force_login(operator)
    visited = visit_every_admin_page(client, operator)
    assert f"/admin/conversations/run/{run.id}/change/" in visited
    assert record_stored_runtime_output() > 0
    secret_scan.check()
    assert_masked(fake_worker.output(), "the worker's log")


async def socket_replay(conversation_id, access_token: str) -> str:
    """Everything the conversation's websocket sends on ``resume`` from the start, up to
    the run's result, as text."""
    socket = WebsocketCommunicator(
        application,
        f"/ws/conversations/{conversation_id}/",
        [(b"origin", b"http://localhost")],
        subprotocols=["paw", access_token],
    )
    connected, _ = await socket.connect()
    assert connected
    await socket.send_json_to({"type": "resume", "after": 0})
    received = []
    while True:
        message = await socket.receive_json_from(timeout=10)
        received.append(json.dumps(message))
        if message.get("type") == "run.event" and message["event"].get("type") == "result":
            break
    await socket.disconnect()
    return "\n".join(received)


def test_a_secret_typed_into_a_prompt_is_stored_masked_like_the_events(fake_worker, secret_scan):
    """Issue 25: the prompt was masked in the run's events but returned as typed by the
    runs and history endpoints. It is masked before it is stored, with the same values
    (the user's secrets, the provider key) and forms: the run, the API's runs, run,
    history and conversation (its title, taken from the prompt), a regenerated answer and
    what the sandbox is sent (its ``start`` line echoes the prompt it got) all agree."""
    conversation = ConversationFactory(title="")  # to be named after the first prompt
    user = conversation.user
    token = f"typed-token-{pysecrets.token_hex(16)}"
    secret_set(name="MY_TOKEN", value=token, user=user)
    (workspace_ensure(conversation.id) / "fake_mode").write_text("flood 1")
    encoded = base64.b64encode(token.encode()).decode()
    api = api_client_for(user)
    runs = f"/api/conversations/{conversation.id}/runs"
    started = api.post(runs, {"prompt": f"Log in with {token} (or {encoded})"}, format="json")
    assert started.status_code == 202, started.content
    masked = "Log in with [secret:MY_TOKEN] (or [secret:MY_TOKEN])"
    assert started.json()["prompt"] == masked
    run = wait_for(lambda: finished(started.json()["id"]), what="the run to end")
    assert run.status == Run.Status.DONE, run.errors
    assert run.prompt == masked
    start = RunEvent.objects.get(run=run, type="start")
    assert start.payload["prompt"] == masked  # what the sandbox was sent

    again = api.post(runs, {"replaces": str(run.id)}, format="json")  # regenerate
    assert again.status_code == 202, again.content
    assert again.json()["prompt"] == masked
    wait_for(lambda: finished(again.json()["id"]), what="the regenerated run to end")

    listed = api.get(runs).json()["results"]
    assert [item["prompt"] for item in listed] == [masked, masked]
    assert api.get(f"{runs}/{run.id}").json()["prompt"] == masked
    history = api.get(f"/api/conversations/{conversation.id}/history").json()["results"]
    assert {turn["prompt"] for turn in history} == {masked}
    detail = api.get(f"/api/conversations/{conversation.id}").json()
    assert detail["title"] == masked
    assert record_stored_runtime_output() > 0
    secret_scan.check()
