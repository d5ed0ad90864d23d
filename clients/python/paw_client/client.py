"""The client: :class:`Client` (one method per public endpoint of PAW's REST API), the
:class:`Conversation` and :class:`Run` handles built on it.

Every error PAW answers is raised as a typed :mod:`paw_client.errors` exception with its
``code`` and ``detail``. Uploads stream from disk with a known ``Content-Length`` (PAW
refuses an oversized body before reading it); downloads stream to a ``.part`` file that is
renamed when complete. ``progress(done, total)`` callbacks get byte counts (``total`` may
be ``None`` when the server sent no length).
"""

from __future__ import annotations

import contextlib
import io
import os
import secrets
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import IO, Any

import httpx

from paw_client import errors
from paw_client.auth import Credentials
from paw_client.models import (
    FINISHED_STATUSES,
    ApiToken,
    Approval,
    Artifact,
    Datasource,
    Event,
    File,
    Provider,
    RunError,
    Secret,
    Turn,
    Usage,
    UsageReport,
    User,
    parse_time,
)
from paw_client.stream import CONNECTED, ConversationSocket, frame_events

__version__ = "0.1.0"

#: ``progress(done_bytes, total_bytes_or_None)``.
Progress = Callable[[int, int | None], None]
#: What an upload takes: a path, bytes (with ``name=``), a binary file object, or
#: ``(name, bytes_or_file)``.
UploadSource = str | os.PathLike | bytes | IO[bytes] | tuple
#: What ``on_approval`` returns: ``True``/``False`` for a confirm, strings for a question.
Decision = bool | str | Sequence[str]
ApprovalCallback = Callable[[Approval], Decision]

CHUNK = 256 * 1024
#: Seconds between checks of a run's state while its websocket is quiet.
QUIET_CHECK_SECONDS = 15.0
#: Seconds a run that sent its ``result`` may take to be recorded as finished.
FINISH_WAIT_SECONDS = 10.0


class Client:
    """PAW at ``base_url`` (e.g. ``http://127.0.0.1:8000``).

    Credentials, the first that is given: ``token`` (a personal API token ``paw_…`` or a
    JWT access token), else the ``PAW_TOKEN`` environment variable, else ``username`` and
    ``password`` (a JWT pair, renewed before it expires and after a 401), else
    ``refresh_token`` (a stored JWT refresh token; ``on_refresh(new)`` is told each
    rotated one). Without any, only :meth:`register` and the login calls work.

    ``timeout``: seconds for connecting and for each read. Use it as a context manager,
    or call :meth:`close`, to release its connections.
    """

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        username: str | None = None,
        password: str | None = None,
        *,
        refresh_token: str | None = None,
        on_refresh: Callable[[str], None] | None = None,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.user_agent = f"paw-client/{__version__}"
        self._http = httpx.Client(
            base_url=self.base_url,
            timeout=httpx.Timeout(timeout),
            headers={"User-Agent": self.user_agent},
            transport=transport,
        )
        if token is None and not (username and password):
            token = os.environ.get("PAW_TOKEN") or None
        self._credentials = Credentials(
            call=self._post_public,
            token=token,
            username=username,
            password=password,
            refresh_token=refresh_token,
            on_refresh=on_refresh,
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the HTTP connections."""
        self._http.close()

    # --- the HTTP layer -------------------------------------------------------------------

    def _post_public(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._send("POST", path, json=body, authenticate=False).json()

    def _send(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        body: Callable[[], tuple[Iterable[bytes], dict[str, str]]] | None = None,
        authenticate: bool = True,
        stream: bool = False,
    ) -> httpx.Response:
        """One request; on a 401 the JWT is renewed and the request sent once more.
        ``body()`` makes a fresh streamed body and its headers for each attempt. Raises the
        typed error for any answer >= 400 and :class:`errors.ConnectionFailed` when PAW
        cannot be reached."""
        used: str | None = None
        for attempt in (1, 2):
            headers: dict[str, str] = {}
            if authenticate:
                used = self._credentials.bearer()
                if used:
                    headers["Authorization"] = f"Bearer {used}"
            content = None
            if body is not None:
                content, extra = body()
                headers.update(extra)
            request = self._http.build_request(
                method, path, json=json, params=params, content=content, headers=headers
            )
            try:
                response = self._http.send(request, stream=stream)
            except httpx.TransportError as error:
                raise errors.ConnectionFailed(
                    f"{self.base_url} cannot be reached: {error}"
                ) from error
            if (
                response.status_code == 401
                and authenticate
                and attempt == 1
                and self._credentials.renew_after_401(used)
            ):
                response.close()
                continue
            if response.status_code >= 400:
                if stream:
                    response.read()
                    response.close()
                try:
                    data = response.json()
                except ValueError:
                    data = response.content
                raise errors.error_for(response.status_code, data, response.headers)
            return response
        raise AssertionError("unreachable")  # pragma: no cover

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self._send(method, path, **kwargs)
        return response.json() if response.content else None

    def _pages(
        self, path: str, params: dict[str, Any] | None = None, *, limit: int | None = None
    ) -> list[dict]:
        """Every item of a list endpoint, following ``next`` (at most ``limit`` items).
        Endpoints that answer a plain list are taken as one page."""
        items: list[dict] = []
        url: str | None = path
        query: dict[str, Any] | None = dict(params or {})
        query.setdefault("page_size", 100)
        while url:
            data = self._json("GET", url, params=query)
            if isinstance(data, list):
                items.extend(data)
                break
            items.extend(data.get("results") or [])
            # `next` carries its own query (page, cursor, page_size): no params, as httpx
            # would replace that query with even an empty dict (and page 1 come back).
            url, query = data.get("next"), None
            if limit is not None and len(items) >= limit:
                break
        return items[:limit] if limit is not None else items

    @staticmethod
    def _id(value: Any) -> str:
        return str(getattr(value, "id", value))

    # --- auth -------------------------------------------------------------------------

    def register(self, username: str, password: str, email: str = "") -> User:
        """``POST /api/auth/register``: create an account (it does not sign in)."""
        data = self._send(
            "POST",
            "/api/auth/register",
            json={"username": username, "password": password, "email": email},
            authenticate=False,
        ).json()
        return User.from_json(data)

    def login(self, username: str, password: str) -> dict[str, str]:
        """``POST /api/auth/token``: a JWT pair ``{"access", "refresh"}``; this client
        uses it from now on (renewing it with the refresh token)."""
        pair = self._post_public("/api/auth/token", {"username": username, "password": password})
        self._credentials.use_pair(pair, username=username, password=password)
        return pair

    def refresh(self, refresh_token: str) -> dict[str, str]:
        """``POST /api/auth/token/refresh``: a new pair; the refresh token given stops
        working (PAW rotates them)."""
        return self._post_public("/api/auth/token/refresh", {"refresh": refresh_token})

    @property
    def refresh_token(self) -> str | None:
        """The current JWT refresh token, when signed in with a password or refresh token."""
        return self._credentials.refresh_token

    def logout(self) -> None:
        """``POST /api/auth/logout``: every token of the user stops working, everywhere
        (JWTs and personal API tokens, this client's too)."""
        self._send("POST", "/api/auth/logout")

    def change_password(self, old_password: str, new_password: str) -> dict[str, str]:
        """``POST /api/auth/password``: revokes every earlier token; returns a new pair."""
        return self._json(
            "POST", "/api/auth/password",
            json={"old_password": old_password, "new_password": new_password},
        )  # fmt: skip

    def me(self) -> User:
        """``GET /api/auth/me``: who the credentials belong to."""
        return User.from_json(self._json("GET", "/api/auth/me"))

    def tokens(self) -> list[ApiToken]:
        """``GET /api/auth/tokens``: the user's personal API tokens (never their values)."""
        return [ApiToken.from_json(t) for t in self._pages("/api/auth/tokens")]

    def create_token(self, name: str, expires_in_days: int | None = None) -> ApiToken:
        """``POST /api/auth/tokens``: a new personal API token; its ``token`` (``paw_…``)
        is shown this once."""
        body: dict[str, Any] = {"name": name}
        if expires_in_days is not None:
            body["expires_in_days"] = expires_in_days
        return ApiToken.from_json(self._json("POST", "/api/auth/tokens", json=body))

    def delete_token(self, token_id: int | ApiToken) -> None:
        """``DELETE /api/auth/tokens/{id}``: revoke a personal API token."""
        self._send("DELETE", f"/api/auth/tokens/{self._id(token_id)}")

    # --- conversations ----------------------------------------------------------------

    def conversations(self, *, limit: int | None = 100) -> list[Conversation]:
        """``GET /api/conversations``: newest activity first, at most ``limit``."""
        return [Conversation(self, c) for c in self._pages("/api/conversations", limit=limit)]

    def new_conversation(self, **fields: Any) -> Conversation:
        """``POST /api/conversations`` with any of ``title``, ``auto_approve``,
        ``llm_provider``, ``llm_model``, ``datasources`` (slugs its runs are given)."""
        return Conversation(self, self._json("POST", "/api/conversations", json=fields))

    create_conversation = new_conversation

    def conversation(self, conversation_id: str) -> Conversation:
        """``GET /api/conversations/{id}``."""
        return Conversation(
            self, self._json("GET", f"/api/conversations/{self._id(conversation_id)}")
        )

    def update_conversation(self, conversation_id: str, **fields: Any) -> Conversation:
        """``PATCH /api/conversations/{id}``: ``title``, ``auto_approve``, ``llm_provider``,
        ``llm_model``, ``datasources``."""
        data = self._json("PATCH", f"/api/conversations/{self._id(conversation_id)}", json=fields)
        return Conversation(self, data)

    def delete_conversation(self, conversation_id: str) -> None:
        """``DELETE /api/conversations/{id}``: with its files, runs and workspace."""
        self._send("DELETE", f"/api/conversations/{self._id(conversation_id)}")

    def history(self, conversation_id: str) -> list[Turn]:
        """``GET /api/conversations/{id}/history``: the turns, oldest first."""
        path = f"/api/conversations/{self._id(conversation_id)}/history"
        return [Turn.from_json(t) for t in self._pages(path)]

    def reset_session(self, conversation_id: str) -> None:
        """``DELETE /api/conversations/{id}/session``: the agent forgets the earlier turns
        (the transcript stays). :class:`errors.RunActive` while a run is going on."""
        self._send("DELETE", f"/api/conversations/{self._id(conversation_id)}/session")

    # --- files and artifacts ----------------------------------------------------------

    def files(self, conversation_id: str) -> list[File]:
        """``GET /api/conversations/{id}/files``: the uploads, oldest first (every page of
        the paginated list)."""
        path = f"/api/conversations/{self._id(conversation_id)}/files"
        return [File.from_json(f) for f in self._pages(path)]

    def upload(
        self,
        conversation_id: str,
        source: UploadSource,
        *,
        name: str | None = None,
        progress: Progress | None = None,
    ) -> File:
        """``POST /api/conversations/{id}/files``: upload ``source`` (a path, bytes, a
        binary file object, or ``(name, data)``) as ``name`` (default: the file's own
        name). Raises :class:`errors.PayloadTooLarge` over the server's limit and
        :class:`errors.RateLimited` past the upload throttle."""
        filename, opener, size = _upload_source(source, name)

        def body() -> tuple[Iterable[bytes], dict[str, str]]:
            return _multipart(filename, opener, size, progress)

        path = f"/api/conversations/{self._id(conversation_id)}/files"
        return File.from_json(self._send("POST", path, body=body).json())

    def delete_file(self, conversation_id: str, file_id: str) -> None:
        """``DELETE /api/conversations/{id}/files/{file_id}``: the record and the file."""
        self._send(
            "DELETE", f"/api/conversations/{self._id(conversation_id)}/files/{self._id(file_id)}"
        )

    def download_file(
        self,
        conversation_id: str,
        file_id: str,
        dest: str | os.PathLike | None = None,
        *,
        progress: Progress | None = None,
    ) -> bytes | Path:
        """``GET /api/conversations/{id}/files/{file_id}/content``: the bytes (``dest``
        None), or saved to ``dest`` (a folder: under the server's file name), returning
        the path."""
        path = f"/api/conversations/{self._id(conversation_id)}/files/{self._id(file_id)}/content"
        return self._download(path, dest, progress)

    def artifacts(self, conversation_id: str) -> list[Artifact]:
        """``GET /api/conversations/{id}/artifacts``: what the agent made, by path (every
        page of the paginated list)."""
        path = f"/api/conversations/{self._id(conversation_id)}/artifacts"
        return [Artifact.from_json(a) for a in self._pages(path)]

    def download_artifact(
        self,
        conversation_id: str,
        path: str | Artifact,
        dest: str | os.PathLike | None = None,
        *,
        progress: Progress | None = None,
    ) -> bytes | Path:
        """``GET /api/conversations/{id}/artifacts/{path}``: like :meth:`download_file`."""
        artifact_path = path.path if isinstance(path, Artifact) else str(path)
        quoted = urllib.parse.quote(artifact_path, safe="/")
        url = f"/api/conversations/{self._id(conversation_id)}/artifacts/{quoted}"
        return self._download(url, dest, progress)

    def export(
        self,
        conversation_id: str,
        export_format: str = "ipynb",
        dest: str | os.PathLike | None = None,
        *,
        progress: Progress | None = None,
    ) -> bytes | Path:
        """``GET /api/conversations/{id}/export?format=...``: the conversation as ``md``
        (a zip of ``conversation.md`` and the files it shows, or a plain ``.md`` when it
        shows none), ``json`` (its stored events) or ``ipynb`` (a Jupyter notebook of its
        ``run_python`` calls); like :meth:`download_file` (a folder ``dest`` keeps the
        server's name, made from the title). Another format: :class:`InvalidRequest` (400)."""
        query = urllib.parse.urlencode({"format": export_format})
        path = f"/api/conversations/{self._id(conversation_id)}/export?{query}"
        return self._download(path, dest, progress)

    def _download(
        self, path: str, dest: str | os.PathLike | None, progress: Progress | None
    ) -> bytes | Path:
        response = self._send("GET", path, stream=True)
        try:
            total = (
                int(response.headers["Content-Length"])
                if "Content-Length" in response.headers
                else None
            )
            if dest is None:
                buffer = io.BytesIO()
                for chunk in response.iter_bytes(CHUNK):
                    buffer.write(chunk)
                    if progress:
                        progress(buffer.tell(), total)
                return buffer.getvalue()
            target = Path(dest)
            if target.is_dir():
                target = target / _filename(response.headers.get("Content-Disposition", ""), path)
            part = target.with_name(f".{target.name}.{secrets.token_hex(4)}.part")
            done = 0
            try:
                with open(part, "wb") as out:
                    for chunk in response.iter_bytes(CHUNK):
                        out.write(chunk)
                        done += len(chunk)
                        if progress:
                            progress(done, total)
                os.replace(part, target)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    part.unlink()
            return target
        finally:
            response.close()

    # --- runs, events, approvals ------------------------------------------------------

    def events(self, conversation_id: str, *, after: int = 0, limit: int = 100) -> dict[str, Any]:
        """``GET /api/conversations/{id}/events``: ``{"events": [Event], "next_after",
        "has_more"}`` (poll with ``after=next_after``; nothing is missed or repeated)."""
        data = self._json(
            "GET", f"/api/conversations/{self._id(conversation_id)}/events",
            params={"after": after, "limit": limit},
        )  # fmt: skip
        return {**data, "events": [Event.from_json(e) for e in data["events"]]}

    def runs(self, conversation_id: str, *, limit: int | None = 100) -> list[Run]:
        """``GET /api/conversations/{id}/runs``: newest first."""
        path = f"/api/conversations/{self._id(conversation_id)}/runs"
        return [Run(self, r) for r in self._pages(path, limit=limit)]

    def run(self, conversation_id: str, run_id: str) -> Run:
        """``GET /api/conversations/{id}/runs/{run_id}``. Its :meth:`Run.events` replays
        from the conversation's first event (it was not started here)."""
        path = f"/api/conversations/{self._id(conversation_id)}/runs/{self._id(run_id)}"
        return Run(self, self._json("GET", path))

    def start_run(
        self,
        conversation_id: str,
        prompt: str,
        *,
        provider: str | None = None,
        model: str | None = None,
        datasources: Sequence[str] | None = None,
        after: int | None = None,
        on_approval: ApprovalCallback | None = None,
    ) -> Run:
        """``POST /api/conversations/{id}/runs``: start a run (202). ``after``: a cursor no
        later than the run's first event (by default the conversation's current one, read
        first). Raises :class:`errors.RunActive` (409), :class:`errors.BudgetExhausted`
        (402), :class:`errors.RateLimited` (429), :class:`errors.ProviderInactive` and
        :class:`errors.InvalidRequest` (400: unknown provider, model or datasource)."""
        cid = self._id(conversation_id)
        if after is None:
            after = int(self._json("GET", f"/api/conversations/{cid}").get("event_cursor") or 0)
        body: dict[str, Any] = {"prompt": prompt}
        if provider:
            body["llm_provider"] = provider
        if model:
            body["llm_model"] = model
        if datasources:
            body["datasources"] = list(datasources)
        data = self._json("POST", f"/api/conversations/{cid}/runs", json=body)
        return Run(self, data, after=after, on_approval=on_approval)

    def cancel_run(self, conversation_id: str, run_id: str) -> Run:
        """``POST /api/conversations/{id}/runs/{run_id}/cancel`` (202): it ends
        ``cancelled`` shortly. :class:`errors.Conflict` (``run_finished``) if it ended."""
        path = f"/api/conversations/{self._id(conversation_id)}/runs/{self._id(run_id)}/cancel"
        return Run(self, self._json("POST", path))

    def approvals(self, conversation_id: str, *, status: str | None = None) -> list[Approval]:
        """``GET /api/conversations/{id}/approvals`` (``status="pending"`` for the open ones)."""
        params = {"status": status} if status else None
        path = f"/api/conversations/{self._id(conversation_id)}/approvals"
        return [Approval.from_json(a) for a in self._pages(path, params)]

    def decide(
        self,
        approval_id: str,
        *,
        approved: bool | None = None,
        answers: Sequence[str] | None = None,
    ) -> Approval:
        """``POST /api/approvals/{id}/decision``: ``approved`` for a confirm, ``answers``
        for a question. :class:`errors.ApprovalClosed` when it was already decided or
        expired."""
        body: dict[str, Any] = {}
        if approved is not None:
            body["approved"] = approved
        if answers is not None:
            body["answers"] = list(answers)
        data = self._json("POST", f"/api/approvals/{self._id(approval_id)}/decision", json=body)
        return Approval.from_json(data)

    # --- providers, datasources, secrets, usage ---------------------------------------

    def providers(self) -> list[Provider]:
        """``GET /api/providers``: every provider, active or not, with its models."""
        return [Provider.from_json(p) for p in self._json("GET", "/api/providers")["providers"]]

    def default_provider(self) -> dict[str, str]:
        """``GET /api/providers/default``: ``{"llm_provider", "llm_model"}`` (the user's)."""
        return self._json("GET", "/api/providers/default")

    def set_default_provider(self, provider: str, model: str = "") -> dict[str, str]:
        """``PUT /api/providers/default``: the user's default provider and model."""
        return self._json(
            "PUT", "/api/providers/default", json={"llm_provider": provider, "llm_model": model}
        )

    def datasources(self) -> list[Datasource]:
        """``GET /api/datasources``: the databases runs may use."""
        return [
            Datasource.from_json(d) for d in self._json("GET", "/api/datasources")["datasources"]
        ]

    def datasource(self, slug: str) -> dict[str, Any]:
        """``GET /api/datasources/{slug}``: one datasource with what the agent knows of it
        (its docs, examples and a schema summary). :class:`errors.NotFound` when unknown
        or disabled."""
        return self._json("GET", f"/api/datasources/{urllib.parse.quote(slug, safe='')}")

    def sql_ask(
        self,
        datasource: str,
        question: str,
        *,
        conversation: str | None = None,
        provider: str | None = None,
        model: str | None = None,
        on_approval: ApprovalCallback | None = None,
    ) -> Run:
        """``POST /api/sql/ask``: a run that answers ``question`` with SQL on
        ``datasource`` (tools ``run_sql``, ``search_knowledge``, ``ask_user`` only), in
        ``conversation`` or a new one. Follow it like any run; the finished run's
        ``result`` is ``{sql, columns, rows, row_count, truncated, lineage}`` (``lineage``:
        what the answer rests on, docs/data.md; ``{lineage}`` alone when no query
        returned rows).
        Errors as :meth:`start_run`."""
        after = 0
        body: dict[str, Any] = {"datasource": datasource, "question": question}
        if conversation:
            cid = self._id(conversation)
            after = int(self._json("GET", f"/api/conversations/{cid}").get("event_cursor") or 0)
            body["conversation"] = cid
        if provider:
            body["llm_provider"] = provider
        if model:
            body["llm_model"] = model
        data = self._json("POST", "/api/sql/ask", json=body)
        return Run(self, data, after=after, on_approval=on_approval)

    def secrets(self) -> list[Secret]:
        """``GET /api/secrets``: the user's own secrets (names and dates only)."""
        return [Secret.from_json(s) for s in self._json("GET", "/api/secrets")["secrets"]]

    def set_secret(self, name: str, value: str, description: str = "") -> Secret:
        """``PUT /api/secrets/{name}``: store (or replace) a secret, e.g. ``OPENAI_API_KEY``."""
        data = self._json(
            "PUT", f"/api/secrets/{urllib.parse.quote(name, safe='')}",
            json={"value": value, "description": description},
        )  # fmt: skip
        return Secret.from_json(data)

    def delete_secret(self, name: str) -> None:
        """``DELETE /api/secrets/{name}``."""
        self._send("DELETE", f"/api/secrets/{urllib.parse.quote(name, safe='')}")

    def usage(
        self, *, from_: str | None = None, to: str | None = None, user: str | None = None
    ) -> UsageReport:
        """``GET /api/usage``: the token usage between ``from_`` and ``to``
        (``YYYY-MM-DD``, default this month) and the budget; staff may pass ``user``."""
        params = {k: v for k, v in (("from", from_), ("to", to), ("user", user)) if v}
        return UsageReport.from_json(self._json("GET", "/api/usage", params=params))

    # --- the staff API (answers as PAW's JSON) ----------------------------------------

    def admin_secrets(self) -> list[dict[str, Any]]:
        """``GET /api/admin/secrets`` (staff): every secret's name, scope and owner."""
        data = self._json("GET", "/api/admin/secrets")
        return data.get("secrets", data) if isinstance(data, dict) else data

    def admin_create_secret(self, **fields: Any) -> dict[str, Any]:
        """``POST /api/admin/secrets`` (staff): ``name``, ``value``, ``scope``, ``owner``,
        ``description``."""
        return self._json("POST", "/api/admin/secrets", json=fields)

    def admin_secret(self, secret_id: int) -> dict[str, Any]:
        """``GET /api/admin/secrets/{id}`` (staff)."""
        return self._json("GET", f"/api/admin/secrets/{secret_id}")

    def admin_update_secret(self, secret_id: int, **fields: Any) -> dict[str, Any]:
        """``PATCH /api/admin/secrets/{id}`` (staff): ``value``, ``description``."""
        return self._json("PATCH", f"/api/admin/secrets/{secret_id}", json=fields)

    def admin_delete_secret(self, secret_id: int) -> None:
        """``DELETE /api/admin/secrets/{id}`` (staff)."""
        self._send("DELETE", f"/api/admin/secrets/{secret_id}")

    def admin_datasources(self) -> list[dict[str, Any]]:
        """``GET /api/admin/datasources`` (staff)."""
        data = self._json("GET", "/api/admin/datasources")
        return data.get("datasources", data) if isinstance(data, dict) else data

    def admin_create_datasource(self, **fields: Any) -> dict[str, Any]:
        """``POST /api/admin/datasources`` (staff): ``slug``, ``name``, ``dialect``,
        ``connection`` (passwords as ``{secret:NAME}``), ``read_only``, ``enabled``,
        ``access`` (``"everyone"`` or ``"teams"``, the default: then only the members of
        ``teams``, a list of team ids, and staff may use it)."""
        return self._json("POST", "/api/admin/datasources", json=fields)

    def admin_datasource(self, slug: str) -> dict[str, Any]:
        """``GET /api/admin/datasources/{slug}`` (staff)."""
        return self._json("GET", f"/api/admin/datasources/{slug}")

    def admin_update_datasource(self, slug: str, **fields: Any) -> dict[str, Any]:
        """``PATCH /api/admin/datasources/{slug}`` (staff)."""
        return self._json("PATCH", f"/api/admin/datasources/{slug}", json=fields)

    def admin_delete_datasource(self, slug: str) -> None:
        """``DELETE /api/admin/datasources/{slug}`` (staff)."""
        self._send("DELETE", f"/api/admin/datasources/{slug}")

    def admin_test_datasource(self, slug: str) -> dict[str, Any]:
        """``POST /api/admin/datasources/{slug}/test`` (staff): really connects."""
        return self._json("POST", f"/api/admin/datasources/{slug}/test")

    def admin_refresh_schema(self, slug: str) -> dict[str, Any]:
        """``POST /api/admin/datasources/{slug}/refresh-schema`` (staff, 202): the worker
        harvests the schema; the new ``schema`` entries appear when it is done (a failure
        is the datasource's ``schema_error``)."""
        return self._json("POST", f"/api/admin/datasources/{slug}/refresh-schema")

    def admin_knowledge(self, slug: str, *, kind: str | None = None) -> list[dict[str, Any]]:
        """``GET /api/admin/datasources/{slug}/knowledge`` (staff): every entry
        (``kind``: ``schema``, ``doc`` or ``example`` for one kind)."""
        params = {"kind": kind} if kind else None
        return self._pages(f"/api/admin/datasources/{slug}/knowledge", params)

    def admin_add_knowledge(self, slug: str, **fields: Any) -> dict[str, Any]:
        """``POST .../knowledge`` (staff): ``kind`` (``doc`` or ``example``), ``title``,
        ``text``, ``sql`` (examples; checked by running it read-only, refused with the
        database's error)."""
        return self._json("POST", f"/api/admin/datasources/{slug}/knowledge", json=fields)

    def admin_knowledge_entry(self, slug: str, entry_id: int) -> dict[str, Any]:
        """``GET .../knowledge/{id}`` (staff)."""
        return self._json("GET", f"/api/admin/datasources/{slug}/knowledge/{int(entry_id)}")

    def admin_update_knowledge(self, slug: str, entry_id: int, **fields: Any) -> dict[str, Any]:
        """``PATCH .../knowledge/{id}`` (staff): ``title``, ``text``, ``sql``."""
        path = f"/api/admin/datasources/{slug}/knowledge/{int(entry_id)}"
        return self._json("PATCH", path, json=fields)

    def admin_delete_knowledge(self, slug: str, entry_id: int) -> None:
        """``DELETE .../knowledge/{id}`` (staff)."""
        self._send("DELETE", f"/api/admin/datasources/{slug}/knowledge/{int(entry_id)}")


class Conversation:
    """A conversation: its fields (``id``, ``title``, ``auto_approve``, ``llm_provider``,
    ``llm_model``, ``datasources``, ``created``, ``last_activity``, ``active_run_id``,
    ``event_cursor``)
    and the calls about it. ``event_cursor`` follows what this handle has seen, so each
    :meth:`ask` reads only the events after it."""

    def __init__(self, client: Client, data: dict[str, Any]) -> None:
        self.client = client
        self._load(data)

    def _load(self, data: dict[str, Any]) -> None:
        self.raw = data
        self.id: str = str(data["id"])
        self.title: str = data.get("title") or ""
        self.auto_approve: bool = bool(data.get("auto_approve"))
        self.llm_provider: str = data.get("llm_provider") or ""
        self.llm_model: str = data.get("llm_model") or ""
        # Slugs of the datasources every run of it is given (unless the run names its own).
        self.datasources: list[str] = list(data.get("datasources") or [])
        self.created: datetime | None = parse_time(data.get("created"))
        self.last_activity: datetime | None = parse_time(data.get("last_activity"))
        self.active_run_id: str | None = data.get("active_run_id")
        self.event_cursor: int = max(
            int(data.get("event_cursor") or 0), getattr(self, "event_cursor", 0)
        )

    def __repr__(self) -> str:
        return f"<Conversation {self.id} {self.title!r}>"

    def refresh(self) -> Conversation:
        """Read it again."""
        self._load(self.client._json("GET", f"/api/conversations/{self.id}"))
        return self

    def update(self, **fields: Any) -> Conversation:
        """Change ``title``, ``auto_approve``, ``llm_provider``, ``llm_model`` or
        ``datasources``."""
        self._load(self.client.update_conversation(self.id, **fields).raw)
        return self

    def delete(self) -> None:
        self.client.delete_conversation(self.id)

    def history(self) -> list[Turn]:
        return self.client.history(self.id)

    def reset_session(self) -> None:
        self.client.reset_session(self.id)

    def files(self) -> list[File]:
        return self.client.files(self.id)

    def upload(
        self, source: UploadSource, *, name: str | None = None, progress: Progress | None = None
    ) -> File:
        return self.client.upload(self.id, source, name=name, progress=progress)

    def delete_file(self, file_id: str) -> None:
        self.client.delete_file(self.id, file_id)

    def download_file(
        self,
        file_id: str,
        dest: str | os.PathLike | None = None,
        *,
        progress: Progress | None = None,
    ) -> bytes | Path:
        return self.client.download_file(self.id, file_id, dest, progress=progress)

    def artifacts(self) -> list[Artifact]:
        return self.client.artifacts(self.id)

    def download_artifact(
        self,
        path: str | Artifact,
        dest: str | os.PathLike | None = None,
        *,
        progress: Progress | None = None,
    ) -> bytes | Path:
        return self.client.download_artifact(self.id, path, dest, progress=progress)

    def export(
        self,
        export_format: str = "ipynb",
        dest: str | os.PathLike | None = None,
        *,
        progress: Progress | None = None,
    ) -> bytes | Path:
        return self.client.export(self.id, export_format, dest, progress=progress)

    def events(self, *, after: int = 0, limit: int = 100) -> dict[str, Any]:
        return self.client.events(self.id, after=after, limit=limit)

    def runs(self, *, limit: int | None = 100) -> list[Run]:
        return self.client.runs(self.id, limit=limit)

    def approvals(self, *, status: str | None = None) -> list[Approval]:
        return self.client.approvals(self.id, status=status)

    def ask(
        self,
        prompt: str,
        *,
        provider: str | None = None,
        model: str | None = None,
        datasources: Sequence[str] | None = None,
        files: Sequence[UploadSource] = (),
        on_approval: ApprovalCallback | None = None,
        progress: Callable[[str, int, int | None], None] | None = None,
    ) -> Run:
        """Upload ``files`` (``progress(name, done, total)`` for each), then start a run of
        ``prompt``; returns the :class:`Run` (follow it with :meth:`Run.events` or
        :meth:`Run.wait`). Errors as :meth:`Client.start_run`."""
        for source in files:
            filename = _upload_source(source, None)[0]
            report = (lambda d, t, n=filename: progress(n, d, t)) if progress else None
            self.upload(source, progress=report)
        run = self.client.start_run(
            self.id, prompt, provider=provider, model=model, datasources=datasources,
            after=self.event_cursor, on_approval=on_approval,
        )  # fmt: skip
        run.conversation = self
        return run


class Run:
    """A run: its fields (``id``, ``conversation_id``, ``prompt``, ``status``, ``answer``,
    ``errors``, ``provider``, ``model``, ``datasources``, ``kind``, ``result``, ``usage``,
    ``created``, ``started``, ``finished``), its events and its approvals.

    :meth:`events` yields the run's events exactly once, in cursor order, however often the
    websocket drops (it resumes from the last cursor it yielded) and however often it is
    called again (each call goes on where the last one stopped). Approvals go to
    ``on_approval(approval) -> decision`` (``True``/``False`` for a confirm, strings for a
    question), or are raised as :class:`errors.ApprovalRequired`: answer with
    :meth:`approve`, :meth:`decline` or :meth:`answer`, then call :meth:`events` (or
    :meth:`wait`) again.
    """

    def __init__(
        self,
        client: Client,
        data: dict[str, Any],
        *,
        after: int = 0,
        on_approval: ApprovalCallback | None = None,
    ) -> None:
        self.client = client
        self.conversation: Conversation | None = None
        self.on_approval = on_approval
        self.artifacts: list[Artifact] = []
        self._cursor = after
        self._ended = False
        self._socket: ConversationSocket | None = None
        self._pending: dict[str, Approval] = {}
        self._closed_approvals: set[str] = set()
        self._load(data)

    def _load(self, data: dict[str, Any]) -> None:
        self.raw = data
        self.id: str = str(data["id"])
        self.conversation_id: str = str(data["conversation_id"])
        self.prompt: str = data.get("prompt") or ""
        self.status: str = data.get("status") or ""
        self.answer: str = data.get("answer") or ""
        self.errors: list[RunError] = [RunError.from_json(e) for e in data.get("errors") or []]
        self.provider: str = data.get("provider") or ""
        self.model: str = data.get("model") or ""
        self.datasources: list[str] = list(data.get("datasources") or [])
        self.kind: str = data.get("kind") or "chat"
        #: ``{datasource, sql, columns, rows, row_count, truncated}`` of the run's last
        #: ``run_sql`` that returned rows (``POST /api/sql/ask`` runs above all) and, once
        #: a run on datasources finished, ``lineage`` (``{datasources, entries, tables,
        #: columns}``: what its answer rests on; the only key of a run without such a
        #: query); None for a run on no datasource without rows.
        self.result: dict[str, Any] | None = data.get("result")
        self.usage: Usage = Usage.from_json(data.get("usage"))
        self.created: datetime | None = parse_time(data.get("created"))
        self.started: datetime | None = parse_time(data.get("started"))
        self.finished: datetime | None = parse_time(data.get("finished"))

    def __repr__(self) -> str:
        return f"<Run {self.id} {self.status}>"

    @property
    def finished_ok(self) -> bool:
        """Whether it ended ``done``."""
        return self.status == "done"

    @property
    def is_finished(self) -> bool:
        return self.status in FINISHED_STATUSES

    @property
    def cursor(self) -> int:
        """The cursor of the last event this handle read (where it resumes)."""
        return self._cursor

    @property
    def pending_approvals(self) -> list[Approval]:
        """The approvals raised to the caller that nobody has decided yet."""
        return list(self._pending.values())

    def refresh(self) -> Run:
        """Read it again (``GET …/runs/{id}``)."""
        self._load(
            self.client._json("GET", f"/api/conversations/{self.conversation_id}/runs/{self.id}")
        )
        return self

    def cancel(self) -> Run:
        """Ask it to stop; it ends ``cancelled`` shortly (follow :meth:`events`). Its
        pending approvals close with it."""
        self._load(self.client.cancel_run(self.conversation_id, self.id).raw)
        self._closed_approvals.update(self._pending)
        self._pending.clear()
        return self

    # --- approvals ------------------------------------------------------------------

    def approve(self, approval: Approval | str | None = None) -> None:
        """Approve a confirm (default: the one pending approval)."""
        self._decide(self._approval(approval), True)

    def decline(self, approval: Approval | str | None = None) -> None:
        """Decline a confirm (default: the one pending approval)."""
        self._decide(self._approval(approval), False)

    def answer(self, answers: Sequence[str], approval: Approval | str | None = None) -> None:
        """Answer a question with strings, one per question (default: the pending one)."""
        self._decide(self._approval(approval), list(answers))

    def _approval(self, approval: Approval | str | None) -> Approval:
        if isinstance(approval, Approval):
            return approval
        if approval is not None:
            return self._pending.get(str(approval)) or Approval(
                id=str(approval), run_id=self.id, kind=""
            )
        if len(self._pending) != 1:
            raise ValueError(f"{len(self._pending)} approvals are pending: say which one")
        return next(iter(self._pending.values()))

    def _decide(self, approval: Approval, decision: Decision) -> None:
        if isinstance(decision, bool):
            if approval.kind == "ask":
                raise ValueError("answer a question with strings, not True/False")
            kwargs: dict[str, Any] = {"approved": decision}
        elif isinstance(decision, str):
            kwargs = {"answers": [decision]}
        else:
            kwargs = {"answers": [str(a) for a in decision]}
        # Decided elsewhere first, or expired: it is closed either way.
        with contextlib.suppress(errors.ApprovalClosed):
            self.client.decide(approval.id, **kwargs)
        self._pending.pop(approval.id, None)
        self._closed_approvals.add(approval.id)

    # --- events ---------------------------------------------------------------------

    def events(self, *, on_approval: ApprovalCallback | None = None) -> Iterator[Event]:
        """The run's events from its websocket, each exactly once and in order, until its
        end (its ``result``, or its end without one: a crash, a cancel before it started).
        Raises :class:`errors.ApprovalRequired` for an approval when there is no callback,
        and the connection errors of :class:`paw_client.stream.ConversationSocket`."""
        callback = on_approval or self.on_approval
        for approval in list(self._pending.values()):
            if callback is None:
                raise errors.ApprovalRequired(approval)
            self._decide(approval, callback(approval))
        while not self._ended:
            if self._socket is None:
                self._socket = ConversationSocket(self.client, self.conversation_id)
            message = self._socket.receive(after=self._cursor, timeout=QUIET_CHECK_SECONDS)
            kind = (message or {}).get("type")
            if message is None or kind == CONNECTED:
                # (Re)connected, or quiet for a while: the run may have ended meanwhile
                # without a result line (a crash, a cancel before it started).
                yield from self._end_if_finished()
                continue
            for item in frame_events(message):
                if int(item["cursor"]) <= self._cursor:
                    continue  # already yielded (a replay overlapping the live stream)
                self._cursor = int(item["cursor"])
                if self.conversation is not None:
                    self.conversation.event_cursor = max(
                        self.conversation.event_cursor, self._cursor
                    )
                if str(item.get("run_id")) != self.id:
                    continue
                event = Event.from_json(item)
                yield event
                if event.type == "result":
                    self._ended = True
                    self._refresh_until_finished()
                    self._close_socket()
                    return
            if message.get("run_id") != self.id:
                continue
            if kind == "agent_confirm_request":
                approval = Approval.from_message(message)
                if approval.id in self._closed_approvals or approval.id in self._pending:
                    continue
                self._pending[approval.id] = approval
                if callback is None:
                    raise errors.ApprovalRequired(approval)
                self._decide(approval, callback(approval))
            elif kind == "agent_confirm_resolved":
                self._pending.pop(str(message.get("approval_id")), None)
                self._closed_approvals.add(str(message.get("approval_id")))
            elif kind == "run.status" and message.get("status") in FINISHED_STATUSES:
                yield from self._end_if_finished()

    def _refresh_until_finished(self) -> None:
        """Read the run again until it has finished (at most :data:`FINISH_WAIT_SECONDS`):
        its ``result`` line can reach a client a few milliseconds before PAW has recorded
        the run's end (docs/api.md, "The live path")."""
        deadline = time.monotonic() + FINISH_WAIT_SECONDS
        pause = 0.02
        self.refresh()
        while not self.is_finished and time.monotonic() < deadline:
            time.sleep(pause)
            pause = min(0.5, pause * 2)
            self.refresh()

    def _end_if_finished(self) -> Iterator[Event]:
        """If the run has ended, yield its stored events after the cursor (from the REST
        API, in order) and end the stream."""
        self.refresh()
        if not self.is_finished:
            return
        while True:
            page = self.client.events(self.conversation_id, after=self._cursor, limit=1000)
            for event in page["events"]:
                if event.cursor <= self._cursor:
                    continue
                self._cursor = event.cursor
                if event.run_id == self.id:
                    yield event
            if not page["has_more"]:
                break
        if self.conversation is not None:
            self.conversation.event_cursor = max(self.conversation.event_cursor, self._cursor)
        self._ended = True
        self._close_socket()

    def _close_socket(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None

    def close(self) -> None:
        """Close its websocket (a later :meth:`events` reconnects)."""
        self._close_socket()

    def wait(self, *, on_approval: ApprovalCallback | None = None) -> Run:
        """Read the events to the end (approvals as in :meth:`events`), then return this
        run as it ended: ``status``, ``answer``, ``errors``, ``usage``, and in
        ``artifacts`` the files it made or changed."""
        for _ in self.events(on_approval=on_approval):
            pass
        if self.created is not None:
            since = self.created - timedelta(milliseconds=1)
            self.artifacts = [
                a for a in self.client.artifacts(self.conversation_id)
                if a.modified is not None and a.modified >= since
            ]  # fmt: skip
        return self

    def raise_for_status(self) -> Run:
        """Raise :class:`errors.RunFailed` unless the run ended ``done``."""
        if self.status != "done":
            raise errors.RunFailed(self)
        return self


# --- uploads ----------------------------------------------------------------------------


def _upload_source(
    source: UploadSource, name: str | None
) -> tuple[str, Callable[[], IO[bytes]], int]:
    """``(file name, open() of a fresh binary reader, size in bytes)`` of an upload."""
    if isinstance(source, tuple):
        name = name or str(source[0])
        source = source[1]
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
        if not name:
            raise ValueError("give name= for an upload of bytes")
        return name, lambda: io.BytesIO(data), len(data)
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        return name or path.name, lambda: open(path, "rb"), path.stat().st_size
    if hasattr(source, "read"):
        handle = source
        start = handle.tell()
        handle.seek(0, os.SEEK_END)
        size = handle.tell() - start
        handle.seek(start)

        def reopen() -> IO[bytes]:
            handle.seek(start)
            return _Unclosed(handle)

        return name or Path(getattr(handle, "name", "upload")).name, reopen, size
    raise TypeError(f"cannot upload a {type(source).__name__}")


class _Unclosed(io.RawIOBase):
    """A caller's file object, read through without being closed by the upload."""

    def __init__(self, handle: IO[bytes]) -> None:
        self._handle = handle

    def read(self, size: int = -1) -> bytes:  # type: ignore[override]
        return self._handle.read(size)

    def readable(self) -> bool:
        return True


def _quote_filename(name: str) -> str:
    """A file name for a multipart ``filename="…"`` parameter, escaped as browsers do
    (WHATWG HTML: ``"`` → ``%22``, CR → ``%0D``, LF → ``%0A``), UTF-8 kept."""
    return name.replace("\\", "\\\\").replace('"', "%22").replace("\r", "%0D").replace("\n", "%0A")


def _multipart(
    name: str, opener: Callable[[], IO[bytes]], size: int, progress: Progress | None
) -> tuple[Iterator[bytes], dict[str, str]]:
    """A ``multipart/form-data`` body with one part ``file`` (RFC 7578), streamed from
    ``opener()`` in 256 KiB chunks, and its headers (with the exact ``Content-Length``)."""
    boundary = secrets.token_hex(16)
    head = (
        f"--{boundary}\r\n"
        f'Content-Disposition: form-data; name="file"; filename="{_quote_filename(name)}"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()
    tail = f"\r\n--{boundary}--\r\n".encode()

    def chunks() -> Iterator[bytes]:
        yield head
        done = 0
        with opener() as handle:
            while True:
                chunk = handle.read(CHUNK)
                if not chunk:
                    break
                done += len(chunk)
                yield chunk
                if progress:
                    progress(done, size)
        yield tail

    headers = {
        "Content-Type": f"multipart/form-data; boundary={boundary}",
        "Content-Length": str(len(head) + size + len(tail)),
    }
    return chunks(), headers


def _filename(disposition: str, fallback: str) -> str:
    """The file name of a ``Content-Disposition`` (RFC 6266: ``filename*`` first), made
    safe to write in a folder (no path part), else the last part of ``fallback``."""
    name = ""
    for part in disposition.split(";"):
        key, _, value = part.strip().partition("=")
        if key.lower() == "filename*" and value.lower().startswith("utf-8''"):
            name = urllib.parse.unquote(value[7:])
            break
        if key.lower() == "filename" and not name:
            name = value.strip('"')
    name = name or urllib.parse.unquote(fallback.rsplit("/", 1)[-1])
    name = name.replace("\\", "/").rsplit("/", 1)[-1].lstrip(".")
    return name or "download"
