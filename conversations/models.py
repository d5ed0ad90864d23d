"""Conversations and what happens in them: files, runs, run events and approvals.

Fields and constraints only; writes live in ``services.py``, reads in ``selectors.py``.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone


class Conversation(models.Model):
    """A chat between one user and the agent, with its own workspace folder and sandbox.

    ``event_cursor`` is the last cursor handed to a :class:`RunEvent` of this conversation:
    cursors are allocated by incrementing it under the row lock, so they increase in
    commit order and a client resuming "after cursor N" never misses an event.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="conversations"
    )
    title = models.CharField(max_length=200, blank=True, default="")
    auto_approve = models.BooleanField(
        default=False, help_text="Approve the agent's risky actions without asking."
    )
    llm_provider = models.CharField(max_length=64, blank=True, default="")
    llm_model = models.CharField(max_length=200, blank=True, default="")
    approval_timeout_seconds = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Seconds an approval of this conversation waits for an answer; empty: the "
        "server default (PAW_APPROVAL_TIMEOUT_SECONDS).",
    )
    # Slugs of the datasources every run of the conversation is given unless the run names
    # its own (the chat page's datasource picker).
    datasources = models.JSONField(default=list, blank=True)
    event_cursor = models.BigIntegerField(default=0, editable=False)
    # Runs before this moment are not replayed into a new sandbox's memory ("forget").
    memory_since = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    updated_at = models.DateTimeField(auto_now=True)
    last_activity_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ("-last_activity_at",)
        indexes = [models.Index(fields=["user", "-last_activity_at"], name="conv_user_activity")]

    def __str__(self) -> str:
        return self.title or f"Conversation {self.id}"


class ConversationFile(models.Model):
    """A file a user uploaded into the conversation's workspace (stored at ``name``)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="files")
    name = models.CharField(max_length=255)
    size = models.BigIntegerField(help_text="bytes")
    sha256 = models.CharField(max_length=64)
    content_type = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ("created_at",)
        constraints = [
            models.UniqueConstraint(
                fields=["conversation", "name"], name="file_name_unique_per_conv"
            )
        ]

    def __str__(self) -> str:
        return self.name


class Run(models.Model):
    """One prompt handed to the agent and everything until its ``result``.

    At most one run per conversation is active (queued, starting or running): a partial
    unique constraint enforces it, so two concurrent starts cannot both succeed.
    """

    class Status(models.TextChoices):
        QUEUED = "queued"
        STARTING = "starting"
        RUNNING = "running"
        DONE = "done"
        ERROR = "error"
        CANCELLED = "cancelled"

    class Kind(models.TextChoices):
        CHAT = "chat"  # a prompt from the chat page or POST .../runs: every tool
        SQL = "sql"  # POST /api/sql/ask: a question answered with SQL (``tools`` restricted)

    ACTIVE_STATUSES = (Status.QUEUED, Status.STARTING, Status.RUNNING)
    FINISHED_STATUSES = (Status.DONE, Status.ERROR, Status.CANCELLED)

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="runs")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="runs"
    )
    prompt = models.TextField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    answer = models.TextField(blank=True, default="")
    # [{"code": str, "message": str}], from the runtime's result or from PAW itself.
    errors = models.JSONField(default=list, blank=True)
    provider = models.CharField(max_length=64, blank=True, default="")
    model = models.CharField(max_length=200, blank=True, default="")
    kind = models.CharField(max_length=8, choices=Kind.choices, default=Kind.CHAT)
    # Datasource slugs this run may query.
    datasources = models.JSONField(default=list, blank=True)
    # The only tools the run may use (empty: all the runtime has). Sent with the submit;
    # a tool_calls line naming another one stops the run (run_effects).
    tools = models.JSONField(default=list, blank=True)
    # Images of the workspace sent to the model with the prompt (paths relative to the
    # workspace; conversations.services.attachments checks them). Empty: none.
    attachments = models.JSONField(default=list, blank=True)
    # The last run_sql of the run that returned rows: {"datasource", "sql", "columns",
    # "rows" (the first PAW_SQL_RESULT_ROWS), "row_count", "truncated"}, and "verified":
    # {"id", "title", "datasource", "verified_at"} when its SQL is a verified example's
    # (run_effects.verified_query_of); null before. A finished run on datasources also
    # has "lineage" there (conversations.services.lineage): what its answer rests on.
    result = models.JSONField(null=True, blank=True)
    # The knowledge entries the worker gave the run with its submit, from PAW's own rows:
    # [{"id", "kind", "title", "datasource"}] (its lineage's "given" entries).
    knowledge_given = models.JSONField(default=list, blank=True)
    # Final token counts: {"input": int, "output": int, "rounds": int, "estimated": bool}.
    usage = models.JSONField(default=dict, blank=True)
    node = models.CharField(max_length=200, blank=True, default="")
    # The earlier version of the same turn this run answers anew (an edited prompt or a
    # regenerated answer): the replaced run stays stored, shown as a previous version, and
    # is left out of the agent's memory. A run is replaced at most once (the next version
    # replaces the newest one), so the versions of a turn form a chain.
    replaces = models.OneToOneField(
        "self",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="replaced_by",
    )
    cancel_requested = models.BooleanField(default=False)
    # Whether the runtime that ran it asks before its risky tools act (its ready offers
    # approval_gate: paw-agent); false for an ungated one (python-agent-harness), whose
    # tools run without asking; null until its runtime started it.
    runtime_gated = models.BooleanField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now, editable=False, db_index=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ("created_at",)
        constraints = [
            models.UniqueConstraint(
                fields=["conversation"],
                condition=Q(status__in=["queued", "starting", "running"]),
                name="one_active_run_per_conversation",
            )
        ]
        indexes = [models.Index(fields=["status"], name="run_status")]

    def __str__(self) -> str:
        return f"Run {self.id} ({self.status})"

    @property
    def is_active(self) -> bool:
        return self.status in self.ACTIVE_STATUSES


class RunEvent(models.Model):
    """One stored event of a conversation: a runtime line or a PAW notice.

    ``cursor`` increases across the whole conversation (unique with it); ``type`` is the
    line type (``start``, ``delta``, ``notify``, ``log``, ``result``, ``error``, or a
    PAW type such as ``notice``); ``kind`` the notify kind; ``payload`` the line as sent
    to clients (secret values already masked).
    """

    id = models.BigAutoField(primary_key=True)
    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="events")
    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="events", null=True, blank=True
    )
    cursor = models.BigIntegerField()
    type = models.CharField(max_length=32)
    kind = models.CharField(max_length=64, blank=True, default="")
    payload = models.JSONField(default=dict)
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ("cursor",)
        constraints = [
            models.UniqueConstraint(fields=["conversation", "cursor"], name="event_cursor_unique")
        ]

    def __str__(self) -> str:
        return f"{self.type}{'/' + self.kind if self.kind else ''} #{self.cursor}"


class Approval(models.Model):
    """A question or a confirm the agent raised (``notify ask``), and its decision.

    Kept as an audit trail: who decided (``decided_by``: ``user``, ``auto`` or
    ``timeout``; ``decided_by_user`` when a person did), how (``via``), and when.
    """

    class Kind(models.TextChoices):
        CONFIRM = "confirm"
        ASK = "ask"

    class Status(models.TextChoices):
        PENDING = "pending"
        APPROVED = "approved"
        DECLINED = "declined"
        ANSWERED = "answered"
        EXPIRED = "expired"
        CANCELLED = "cancelled"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    conversation = models.ForeignKey(
        Conversation, on_delete=models.CASCADE, related_name="approvals"
    )
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="approvals")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    prompt = models.TextField(blank=True, default="")
    # [{"question": str, "options": [str | {"label", "description"}]}] for kind "ask".
    questions = models.JSONField(default=list, blank=True)
    ask_id = models.CharField(max_length=200, blank=True, default="")
    # The tool call a confirm is for, as the runtime named it (``{"name", "args", "input"}``,
    # the item its ``tool_calls`` line will carry); ``None``: it named none, and its approval
    # allows no gated call.
    call = models.JSONField(null=True, blank=True)
    # When a gated call of the run used this approval (each approval allows one call, once).
    used_at = models.DateTimeField(null=True, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    answers = models.JSONField(default=list, blank=True)
    decided_by = models.CharField(max_length=16, blank=True, default="")
    decided_by_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    via = models.CharField(max_length=16, blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    expires_at = models.DateTimeField()
    decided_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ("created_at",)
        indexes = [models.Index(fields=["status", "expires_at"], name="approval_status_deadline")]

    def __str__(self) -> str:
        return f"{self.kind} {self.id} ({self.status})"


class Share(models.Model):
    """A read-only link to a snapshot of a conversation, for an audience.

    The snapshot is what the conversation was when the share was made (or last updated):
    its runs that had finished then (``runs``), its events up to ``cursor`` (those of
    these runs and PAW's notices of no run), its title, and copies of its workspace files
    (``files``: ``[{"path", "size", "upload", "sha256"}]``, kept in the share's folder
    ``<PAW_WORKSPACE_ROOT>/.shares/<id>/<snapshot>/``, see
    ``conversations.selectors.workspaces.share_folder``); ``files_left_out``:
    ``[{"path", "size", "reason"}]`` for those over the limits. ``audience`` is
    ``teams`` (the members of ``teams``) or ``signed_in`` (every signed-in person); the
    owner is the conversation's. ``expires_at``: ``None`` for never.

    The id is the link: a UUID4, 122 bits from the operating system's random source
    (``uuid.uuid4`` reads ``os.urandom``), so a link cannot be guessed.
    """

    class Audience(models.TextChoices):
        TEAMS = "teams"
        SIGNED_IN = "signed_in"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="shares")
    audience = models.CharField(max_length=16, choices=Audience.choices)
    teams = models.ManyToManyField("auth.Group", blank=True, related_name="shares")
    title = models.CharField(max_length=200, blank=True, default="")
    runs = models.ManyToManyField(Run, blank=True, related_name="shares")
    cursor = models.BigIntegerField(default=0, help_text="The last event cursor of the snapshot.")
    snapshot = models.PositiveIntegerField(
        default=1, help_text="The snapshot's number: 1 when made, one more at each update."
    )
    files = models.JSONField(default=list, blank=True)
    files_left_out = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    snapshot_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ("-created_at",)
        indexes = [models.Index(fields=["conversation", "-created_at"], name="share_conv_created")]

    def __str__(self) -> str:
        return f"Share {self.id} of {self.conversation_id} ({self.audience})"
