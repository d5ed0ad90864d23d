"""Secrets, datasources, custom model providers and each user's default provider.

Fields and constraints only; writes live in ``services``, reads in ``selectors``.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.core.validators import RegexValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

from secrets_vault.fields import EncryptedSecretField
from teams.models import Access, AccessRuled

SECRET_NAME_PATTERN = r"^[A-Z][A-Z0-9_]{0,63}$"  # noqa: S105 - a pattern, not a password
secret_name_validator = RegexValidator(
    SECRET_NAME_PATTERN,
    "A secret name is 1-64 characters: an upper-case letter, then upper-case letters, "
    "digits or underscores (like OPENAI_API_KEY).",
    code="invalid_name",
)

# Environment variables a sandbox needs for itself: a secret of that name would shadow
# them when a user's secrets become the sandbox's environment.
RESERVED_SECRET_NAMES = frozenset(
    {
        "PATH", "HOME", "TMPDIR", "TMP", "TEMP", "SHELL", "USER", "LOGNAME", "PWD",
        "LANG", "LANGUAGE", "TERM", "TZ", "ENV", "BASH_ENV", "IFS",
        "NO_PROXY", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY",
        "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE",
        "OPENAI_BASE_URL", "OPENAI_MODEL",
    }
)  # fmt: skip
RESERVED_SECRET_PREFIXES = ("PAW_", "XDG_", "LC_", "LD_", "PYTHON", "DJANGO_")


def secret_name_check_reserved(name: str) -> None:
    """Raise ``ValidationError`` when ``name`` would shadow a variable the sandbox needs
    (``PATH``, ``HOME``, ``PAW_*``, ``XDG_*``, ``LD_*``, ``PYTHON*``, ``OPENAI_BASE_URL``...)."""
    if name in RESERVED_SECRET_NAMES or name.startswith(RESERVED_SECRET_PREFIXES):
        raise ValidationError(
            f"{name} is reserved for the sandbox's own environment; choose another name.",
            code="reserved_name",
        )


class Secret(models.Model):
    """A named secret value, encrypted at rest.

    ``scope`` ``global`` secrets belong to the operator (no owner) and reach sandboxes only
    as provider keys or through ``{secret:NAME}`` placeholders; ``user`` secrets belong to
    ``owner`` and are also given to that user's sandboxes as environment variables of the
    same name. A name is unique per scope and owner. ``value`` is never shown by any page
    or endpoint, and reads as ``fields.UNDECRYPTABLE`` when no configured key opens it.
    """

    class Scope(models.TextChoices):
        GLOBAL = "global"
        USER = "user"

    name = models.CharField(
        max_length=64, validators=[secret_name_validator, secret_name_check_reserved]
    )
    scope = models.CharField(max_length=8, choices=Scope.choices, default=Scope.USER)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="secrets",
        help_text="The user a user-scope secret belongs to; empty for a global secret.",
    )
    value = EncryptedSecretField()
    description = models.CharField(max_length=500, blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    updated_at = models.DateTimeField(default=timezone.now, editable=False)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ("scope", "name")
        constraints = [
            models.UniqueConstraint(
                fields=["name"],
                condition=Q(scope="global"),
                name="secret_global_name_unique",
                violation_error_message="A global secret with this name already exists.",
            ),
            models.UniqueConstraint(
                fields=["owner", "name"],
                condition=Q(scope="user"),
                name="secret_user_name_unique",
                violation_error_message="This user already has a secret with this name.",
            ),
            models.CheckConstraint(
                condition=Q(scope="global", owner__isnull=True)
                | Q(scope="user", owner__isnull=False),
                name="secret_owner_matches_scope",
                violation_error_message="A user secret needs an owner; a global one has none.",
            ),
        ]

    def __str__(self) -> str:
        return self.name if self.scope == self.Scope.GLOBAL else f"{self.name} ({self.owner})"


DATASOURCE_SLUG_PATTERN = r"^[a-z][a-z0-9_-]{0,62}$"


class Datasource(AccessRuled):
    """An SQL database a run may be given (``datasources: [slug]``), to those its access
    rule lets use it (``access``, ``teams``: :func:`teams.selectors.accessible`).

    ``connection`` holds ``host``, ``port``, ``database`` (a file path for SQLite),
    ``user``, ``password`` and ``options`` (extra driver parameters such as ``sslmode``);
    any string in it may use ``{secret:NAME}`` placeholders, and a password may *only* be
    one. They are resolved just before use (``services.datasource_resolve``): the password
    (and options named like one) the requesting user's own secret first, every other
    field only the operator's global secrets; never to PAW's own database.
    ``read_only`` connections are opened read-only where the database allows it
    (PostgreSQL ``default_transaction_read_only``, SQLite ``mode=ro``) and are announced
    as such to the runtime.
    """

    class Dialect(models.TextChoices):
        POSTGRESQL = "postgresql", "PostgreSQL"
        MYSQL = "mysql", "MySQL / MariaDB"
        SQLITE = "sqlite", "SQLite"

    slug = models.CharField(
        max_length=63,
        unique=True,
        validators=[
            RegexValidator(
                DATASOURCE_SLUG_PATTERN,
                "A slug is 1-63 characters: a lower-case letter, then lower-case letters, "
                "digits, '-' or '_'.",
                code="invalid_slug",
            )
        ],
        help_text="Names the datasource in runs and in its sandbox variable "
        "PAW_DATASOURCE_<SLUG>_URL.",
    )
    name = models.CharField(max_length=200)
    description = models.TextField(
        blank=True, default="", help_text="Shown to users and to the agent: what is in it."
    )
    dialect = models.CharField(max_length=16, choices=Dialect.choices)
    connection = models.JSONField(
        default=dict,
        blank=True,
        help_text='e.g. {"host": "db.internal", "port": 5432, "database": "sales", '
        '"user": "reader", "password": "{secret:SALES_DB_PASSWORD}", '
        '"options": {"sslmode": "require"}}; for SQLite {"database": "/srv/data/x.sqlite3"}. '
        "A password must be a {secret:NAME} placeholder.",
    )
    read_only = models.BooleanField(default=True)
    allow_privileged_user = models.BooleanField(
        default=False,
        verbose_name="Accept a database user that can do more than read (unsafe)",
        help_text="UNSAFE. PAW refuses to save a read-only PostgreSQL or MySQL datasource "
        "whose user is a superuser, may read or write the server's files, run programs or "
        "signal other sessions, or (MySQL) holds any privilege beyond SELECT: the check of "
        "a read stops most, the database's own grants are the wall behind it. Tick only "
        "knowing that a statement the check lets through runs with all those powers.",
    )
    # What the database user could do beyond reading at the last check (connections.
    # UserPrivileges: {"refused": [...], "noted": [...]}), and when; null when never
    # checked (not read-only, SQLite, or the database could not be reached).
    user_privileges = models.JSONField(default=dict, blank=True, editable=False)
    privileges_checked_at = models.DateTimeField(null=True, blank=True, editable=False)
    enabled = models.BooleanField(default=True)
    allowed_hosts = models.JSONField(
        default=list,
        blank=True,
        help_text="More destinations an isolated sandbox may reach when a run uses this "
        'datasource (its own host and port always are): e.g. ["api.internal:443", '
        '"*.corp.example"]; host, host:port or *.domain[:port], at most 20.',
    )
    # Schema refresh (a worker harvests the live schema into knowledge entries): when it
    # was last asked for and last succeeded, and the database's error when it failed.
    schema_requested_at = models.DateTimeField(null=True, blank=True, editable=False)
    schema_refreshed_at = models.DateTimeField(null=True, blank=True, editable=False)
    schema_error = models.TextField(blank=True, default="", editable=False)
    # The last harvest's structure, {table: {column: type}} (types as the database spells
    # them), kept to tell what the next refresh changed; and what the last refresh
    # changed compared to the one before (services.knowledge, "The schema refresh":
    # {"at", "first_harvest", "tables_added", ..., "examples": {...}}); {} before any.
    schema_tables = models.JSONField(default=dict, blank=True, editable=False)
    schema_changes = models.JSONField(default=dict, blank=True, editable=False)
    # How far the refresh under way (or the last one) got: "250 of 1,204 tables read".
    schema_progress = models.CharField(max_length=300, blank=True, default="", editable=False)
    sample_values = models.BooleanField(
        default=False,
        verbose_name="Sample column values for the agent",
        help_text="The schema refresh lists, for each text column with at most "
        "PAW_KNOWLEDGE_VALUE_SAMPLE distinct values, those values in its schema entry, which "
        "runs are given (\"currency text — values: 'CZK', 'EUR'\"). Never for sensitive "
        "tables and columns.",
    )
    sensitive_columns = models.JSONField(
        default=list,
        blank=True,
        verbose_name="Sensitive tables and columns",
        help_text='Their values are never sampled: e.g. ["customers", "orders.note", '
        '"*.email", "hr.*"] (table, schema.table or table.column; * for any characters; '
        "case ignored). They keep their names and types in the schema entries.",
    )
    # Bumped by every change of the datasource's knowledge (entries, their vectors), in the
    # same transaction: caches of its index (vectors, the sandbox index file) key on it.
    knowledge_version = models.PositiveIntegerField(default=0, editable=False)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("slug",)

    def __str__(self) -> str:
        return self.name or self.slug

    @property
    def env_name(self) -> str:
        """The sandbox variable that carries this datasource's URL."""
        return f"PAW_DATASOURCE_{self.slug.upper().replace('-', '_')}_URL"

    def clean(self) -> None:
        from secrets_vault.connections import allowed_hosts_validate, connection_validate
        from secrets_vault.introspection import sensitive_columns_normalized

        if self.dialect in self.Dialect.values:
            connection_validate(dialect=self.dialect, connection=self.connection)
        allowed_hosts_validate(self.allowed_hosts)
        self.sensitive_columns = sensitive_columns_normalized(self.sensitive_columns)
        if self.slug:
            others = Datasource.objects.exclude(pk=self.pk).only("slug")
            clash = next((o for o in others if o.env_name == self.env_name), None)
            if clash is not None:
                raise ValidationError(
                    {"slug": f"'{clash.slug}' already uses the variable {self.env_name}."}
                )


class DatasourceCredential(models.Model):
    """A team's own database user (and password) on a datasource, so that the database
    itself decides what rows each team sees (PostgreSQL row-level security, per-user
    grants).

    A run of a member of ``team`` connects as ``db_user`` with ``password`` (a
    ``{secret:NAME}`` placeholder only, or empty for none) in place of the datasource's
    own ``user`` and ``password``; the other connection settings stay the datasource's.
    A person in several teams with their own credentials on the datasource gets those of
    the highest ``priority`` (then the team's name, alphabetically). The schema harvest,
    the example checks and the connection test of the datasource itself use the
    datasource's own user. ``user_privileges`` / ``privileges_checked_at``: what
    ``db_user`` could do beyond reading at the last check, as on the datasource. One per
    team and datasource.
    """

    datasource = models.ForeignKey(Datasource, on_delete=models.CASCADE, related_name="credentials")
    team = models.ForeignKey(
        Group,
        on_delete=models.CASCADE,
        related_name="datasource_credentials",
        help_text="Its members' runs connect with these credentials.",
    )
    db_user = models.CharField(
        max_length=200,
        verbose_name="database user",
        help_text="The user its members' runs connect as (may use global {secret:NAME} "
        "placeholders, like the datasource's user).",
    )
    password = models.CharField(
        max_length=200,
        blank=True,
        default="",
        help_text="A {secret:NAME} placeholder (never the password itself), or empty for none.",
    )
    priority = models.IntegerField(
        default=0,
        help_text="When a person is in several teams with their own credentials here, the "
        "highest priority wins.",
    )
    user_privileges = models.JSONField(default=dict, blank=True, editable=False)
    privileges_checked_at = models.DateTimeField(null=True, blank=True, editable=False)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("-priority", "team__name")
        verbose_name = "team credential"
        verbose_name_plural = "team credentials"
        constraints = [
            models.UniqueConstraint(
                fields=["datasource", "team"],
                name="datasource_credential_team_unique",
                violation_error_message="This team already has its credentials on this datasource.",
            )
        ]

    def __str__(self) -> str:
        return f"{self.datasource_id}: {self.db_user} for team {self.team_id}"

    def clean(self) -> None:
        from secrets_vault.connections import connection_validate

        datasource = self.datasource if self.datasource_id else None
        if datasource is None:
            return
        if datasource.dialect == Datasource.Dialect.SQLITE:
            raise ValidationError(
                "An SQLite datasource has no database users: team credentials are for "
                "PostgreSQL and MySQL datasources.",
                code="credentials_not_supported",
            )
        if not self.db_user.strip():
            raise ValidationError({"db_user": "Name the database user."}, code="invalid")
        connection = datasource.connection if isinstance(datasource.connection, dict) else {}
        try:
            connection_validate(
                dialect=datasource.dialect, connection=self.connection_for(connection)
            )
        except ValidationError as error:
            # Only this credential's fields can be wrong here: the datasource's were checked.
            messages = [m for ms in error.message_dict.values() for m in ms]
            field = "password" if any("password" in m for m in messages) else "db_user"
            raise ValidationError({field: messages}, code="invalid_connection") from None

    def connection_for(self, connection: dict) -> dict:
        """The datasource's ``connection`` with this credential's user and password in place
        of its own (no password when this one has none)."""
        merged = {key: value for key, value in connection.items() if key != "password"}
        merged["user"] = self.db_user
        if self.password:
            merged["password"] = self.password
        return merged


class KnowledgeEntry(models.Model):
    """One thing the agent is told about a datasource when it works on it.

    ``kind``: ``schema`` (one table or view, harvested from the live database by a schema
    refresh, which replaces them all at once), ``doc`` (an operator's Markdown note) or
    ``example`` (a question in ``title``/``text`` and the ``sql`` that answers it, checked
    read-only against the database when saved). ``flag_reason``, when set, keeps the entry
    from runs (an example saved under an older rule of a read that the current one
    refuses: migration 0005); ``stale_since``, when set, too (an example a schema refresh
    ran again and the database refused, with its error in ``stale_error``). ``vector`` is
    the entry's embedding
    (float32, little-endian) by the model named in ``vector_model``, or null.

    An example is *verified* when ``verified_at`` is set: a staff member
    (``verified_by``, null once that account is deleted) checked it at the datasource's
    ``knowledge_version`` ``verified_version``. Verified examples come first among the
    examples a run is given, and an answer whose SQL is one's (as parsed:
    ``paw_sqlcheck.canonical``) is shown as a verified query. Changing its SQL clears all
    three (``services.knowledge``).

    Full-text search is kept by the database itself, outside this model's fields
    (migration 0002): on PostgreSQL a generated ``tsvector`` column ``search`` with a GIN
    index; on SQLite an FTS5 table ``secrets_vault_knowledge_fts`` fed by triggers (a
    later migration that rebuilds this table on SQLite must create them again).
    """

    class Kind(models.TextChoices):
        SCHEMA = "schema"
        DOC = "doc"
        EXAMPLE = "example"

    datasource = models.ForeignKey(Datasource, on_delete=models.CASCADE, related_name="knowledge")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    title = models.CharField(max_length=300)
    text = models.TextField(blank=True, default="")
    sql = models.TextField(
        blank=True, default="", help_text="Examples only: the SQL that answers the question."
    )
    vector = models.BinaryField(null=True, blank=True, editable=False)
    vector_model = models.CharField(max_length=200, blank=True, default="", editable=False)
    flag_reason = models.TextField(
        blank=True,
        default="",
        editable=False,
        help_text="Why this entry is kept from runs until an operator acts (empty: it is "
        "given to runs): e.g. an example whose SQL is not a read under the current rule. "
        "Saving the example with SQL that passes the check clears it.",
    )
    verified_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        editable=False,
        related_name="+",
        help_text="Examples only: the staff member who verified it.",
    )
    verified_at = models.DateTimeField(
        null=True,
        blank=True,
        editable=False,
        help_text="Examples only: when it was verified (empty: not verified). Changing its "
        "SQL clears it.",
    )
    verified_version = models.PositiveIntegerField(
        null=True,
        blank=True,
        editable=False,
        help_text="The datasource's knowledge version it was verified against.",
    )
    # An example whose SQL failed when a schema refresh ran it again: the database's
    # error (secret values masked) and since when it fails; kept from runs until its SQL
    # passes again (the next refresh's re-check, or saving it). ``checked_at``: when its
    # SQL last ran (saved, or re-checked by a refresh), null before.
    stale_error = models.TextField(
        blank=True,
        default="",
        editable=False,
        help_text="The database's error when a schema refresh ran this example again "
        "(empty: it passed). A stale example is kept from runs until its SQL passes again.",
    )
    stale_since = models.DateTimeField(null=True, blank=True, editable=False)
    checked_at = models.DateTimeField(null=True, blank=True, editable=False)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    updated_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ("kind", "title", "id")
        verbose_name_plural = "knowledge entries"
        indexes = [models.Index(fields=["datasource", "kind"], name="knowledge_datasource_kind")]

    def __str__(self) -> str:
        return f"{self.kind}: {self.title}"


PROVIDER_NAME_PATTERN = r"^[a-z][a-z0-9_-]{0,63}$"
#: The rule of a provider's name, for a custom provider's and a provider access rule's.
PROVIDER_NAME_VALIDATOR = RegexValidator(
    PROVIDER_NAME_PATTERN,
    "A provider name is a lower-case letter, then lower-case letters, digits, '-' or '_'.",
    code="invalid_name",
)


class CustomProvider(models.Model):
    """An OpenAI-compatible endpoint added by an operator (Ollama, vLLM, LiteLLM, the
    scripted demo model...), next to the built-in providers.

    ``key_secret_name`` names the secret holding its API key (the user's own, else a
    global one); empty means it needs no key, so it is active for everyone. ``known_models``
    is the list shown when the endpoint's live ``GET /models`` cannot be read;
    ``default_model`` (else the first listed model) is used when a run names none.
    ``vision``: its models accept images.
    """

    name = models.CharField(
        max_length=64,
        unique=True,
        validators=[PROVIDER_NAME_VALIDATOR],
    )
    label = models.CharField(max_length=200, blank=True, default="")
    base_url = models.URLField(
        max_length=500, help_text="The OpenAI-compatible API root, e.g. http://127.0.0.1:11434/v1"
    )
    key_secret_name = models.CharField(
        max_length=64,
        blank=True,
        default="",
        validators=[secret_name_validator],
        help_text="The secret holding the API key (a user's own first, then a global one). "
        "Leave empty when the endpoint needs no key.",
    )
    known_models = models.JSONField(
        default=list,
        blank=True,
        help_text='Model names offered when the live list cannot be read, e.g. ["llama3.2"].',
    )
    default_model = models.CharField(max_length=200, blank=True, default="")
    vision = models.BooleanField(
        default=False,
        help_text="Its models accept images (image content parts): a run may then send "
        "PNG, JPEG or WebP images from the workspace to them. Off: such runs are refused.",
    )
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("name",)

    def __str__(self) -> str:
        return self.label or self.name

    def clean(self) -> None:
        from secrets_vault.providers import RESERVED_PROVIDER_NAMES

        if self.name in RESERVED_PROVIDER_NAMES:
            raise ValidationError({"name": f"'{self.name}' is a built-in provider's name."})
        if not isinstance(self.known_models, list) or not all(
            isinstance(item, str) and item.strip() for item in self.known_models
        ):
            raise ValidationError({"known_models": "Give a JSON list of model names."})
        if self.default_model and self.known_models and self.default_model not in self.known_models:
            raise ValidationError({"default_model": "Not one of the listed models."})


class ProviderPreference(models.Model):
    """A user's default provider and model for new runs (below a run's and a
    conversation's choice, above the server-wide default). Empty means "no preference"."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="provider_preference"
    )
    llm_provider = models.CharField(max_length=64, blank=True, default="")
    llm_model = models.CharField(max_length=200, blank=True, default="")
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.user}: {self.llm_provider or '-'} {self.llm_model}".strip()


class ProviderAccess(AccessRuled):
    """Who may use one provider through the operator's key or endpoint: ``provider`` is
    its name (a built-in one, ``default`` for ``PAW_LLM_*``, ``demo``, or a custom
    provider's), so a provider defined in settings has its rule as a custom one does.

    Unlike a datasource, a provider without a row, and a new row, is open to everyone
    signed in (as providers were before teams); ``teams`` limits it to the members of the
    listed teams (staff always). A person's own key (their secret of the provider's key
    name) is theirs whatever the rule. Read only through
    :func:`secrets_vault.selectors.provider_grants` (on :func:`teams.selectors.accessible`).
    """

    provider = models.CharField(
        max_length=64,
        unique=True,
        validators=[PROVIDER_NAME_VALIDATOR],
        help_text="The provider's name: openai, anthropic, gemini, mistral, default (the "
        "server's PAW_LLM_*), demo, or a custom provider's name.",
    )
    access = models.CharField(
        max_length=16,
        choices=Access.choices,
        default=Access.EVERYONE,
        help_text="Everyone signed in, or only the members of the teams below (staff always).",
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("provider",)
        verbose_name = "provider access"
        verbose_name_plural = "provider access"

    def __str__(self) -> str:
        return f"Access to {self.provider}"


class ProviderModelLimit(models.Model):
    """The only models of a provider (``access.provider``) a team's members may use
    through the operator's key: exact model names. A person whose every team that may use
    the provider is limited gets the union of those teams' models; one team without a
    limit (or no team at all) gives every model."""

    access = models.ForeignKey(
        ProviderAccess, on_delete=models.CASCADE, related_name="model_limits"
    )
    team = models.ForeignKey(
        "auth.Group", on_delete=models.CASCADE, related_name="provider_model_limits"
    )
    allowed_models = models.JSONField(
        default=list,
        help_text='The model names this team may use, e.g. ["gpt-4o-mini"].',
    )

    class Meta:
        ordering = ("access__provider", "team__name")
        constraints = [
            models.UniqueConstraint(fields=["access", "team"], name="provider_model_limit_once")
        ]
        verbose_name = "model limit"

    def __str__(self) -> str:
        return f"{self.team} on {self.access.provider}: {', '.join(self.allowed_models)}"

    def clean(self) -> None:
        if (
            not isinstance(self.allowed_models, list)
            or not self.allowed_models
            or not all(isinstance(item, str) and item.strip() for item in self.allowed_models)
        ):
            raise ValidationError(
                {"allowed_models": "Give a JSON list of one or more model names."}
            )
