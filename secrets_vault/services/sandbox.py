"""What a run's sandbox is given: its owner's secrets, datasource URLs, the provider."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.conf import settings

from paw_project.errors import InvalidRequest
from secrets_vault.embeddings import LocalEmbedder, embedder_configured
from secrets_vault.fields import UNDECRYPTABLE
from secrets_vault.masking import secret_values_register
from secrets_vault.models import Secret
from secrets_vault.selectors import datasource_credential_for, datasources_for_user
from secrets_vault.services.datasources import datasource_connection, datasources_validate
from secrets_vault.services.secrets import secrets_mark_used

if TYPE_CHECKING:
    from accounts.models import User
    from secrets_vault.services.providers import ProviderChoice

#: ``OPENAI_API_KEY`` for a provider that needs no key (the ``openai`` SDK refuses "").
NO_KEY = "no-key"


@dataclass(frozen=True)
class RunDatasource:
    """One datasource a run's sandbox is given (its URL is in the environment, under
    ``env_name``): ``slug``, ``name``, ``dialect`` (``postgresql``, ``mysql`` or
    ``sqlite``), ``description``, ``read_only``, and ``allowed_hosts``, the destinations
    beyond its own host and port an isolated sandbox may reach when the run uses it
    (``host``, ``host:port``, ``*.domain[:port]``)."""

    slug: str
    name: str
    dialect: str
    description: str
    env_name: str
    read_only: bool
    allowed_hosts: tuple[str, ...] = ()

    def described(self) -> dict[str, Any]:
        """What the runtime is told of it (an item of ``PAW_DATASOURCES``, PROTOCOL.md):
        ``{"slug", "name", "dialect", "description", "env", "read_only"}``."""
        return {
            "slug": self.slug,
            "name": self.name,
            "dialect": self.dialect,
            "description": self.description,
            "env": self.env_name,
            "read_only": self.read_only,
        }


@dataclass(frozen=True)
class SandboxEnvironment:
    """Variables to add to a sandbox's (otherwise minimal) environment, the secret values
    among them, and the run's datasources.

    ``env``: ``NAME → value``; ``datasources``: a :class:`RunDatasource` each, in the
    run's order (their URLs are in ``env``; the sandbox's launch turns the list into
    ``PAW_DATASOURCES``: ``sandboxes.launch.datasource_variables``); ``secret_values``:
    ``NAME → value`` for every secret value handed over (the user's secrets, secrets
    resolved into datasource URLs and their URL-encoded forms as ``NAME:urlencoded``, each
    whole datasource URL under its variable name, the provider key under its secret's
    name), to be given to ``masking.mask_secrets`` for everything PAW stores or sends.
    ``repr`` shows neither of those two.
    """

    env: dict[str, str] = field(repr=False)
    secret_values: dict[str, str] = field(repr=False)
    datasources: tuple[RunDatasource, ...] = ()


def sandbox_environment(
    *, user: User, datasource_slugs: list[str], provider: ProviderChoice | None = None
) -> SandboxEnvironment:
    """The environment for a sandbox running ``user``'s run.

    * Each of the user's own secrets as a variable of the same name (global secrets are
      never given as variables: only as provider keys or through placeholders).
    * For each datasource of ``datasource_slugs`` (each one ``user`` may use, checked
      again here on the worker: ``selectors.datasources_for_user``):
      ``PAW_DATASOURCE_<SLUG>_URL`` (slug upper-cased, ``-`` as ``_``; as the database
      user of ``user``'s team's credentials on it when one has its own,
      ``selectors.datasource_credential_for``, else the datasource's own; placeholders
      resolved by ``datasource_resolve``: the
      password the user's secret before a global one, host, port, database and user
      only global ones; never PAW's own database; URL forms in
      ``secrets_vault.connections``), and a :class:`RunDatasource` in ``datasources``
      (its allowed hosts among them); with embeddings configured (and datasources),
      ``PAW_EMBEDDING_BASE_URL``, ``PAW_EMBEDDING_MODEL`` and ``PAW_EMBEDDING_API_KEY``
      for the agent's ``search_knowledge`` (the operator's key, handed over like a
      provider key).
    * With ``provider`` (from :func:`provider_resolve`): ``OPENAI_BASE_URL``,
      ``OPENAI_API_KEY`` (``"no-key"`` for a keyless endpoint) and ``OPENAI_MODEL``,
      set last so they win over a user secret of the same name.

    Raises :class:`InvalidRequest` (400): ``unknown_datasource`` naming unknown,
    disabled or not allowed slugs, ``secret_missing`` / ``secret_undecryptable`` naming a secret a
    datasource needs or one of the user's secrets no configured key opens,
    ``invalid_connection`` for a resolved field that is not acceptable (a host list, a bad
    port), ``datasource_is_paw_database`` for a datasource that resolves to PAW's own
    database. Notes every
    secret given as used, and registers the values for log masking.
    """
    slugs = datasources_validate(slugs=datasource_slugs, user=user)
    env: dict[str, str] = {}
    secret_values: dict[str, str] = {}
    used: list[int] = []

    own = _own_secrets(user)
    broken = [secret.name for secret in own if secret.value is UNDECRYPTABLE]
    if broken:
        raise InvalidRequest(
            f"Your secret {', '.join(broken)} cannot be decrypted with the server's keys; "
            "set it again (PUT /api/secrets/NAME) or delete it.",
            code="secret_undecryptable",
            extra={"names": broken},
        )
    for secret in own:
        env[secret.name] = secret.value
        secret_values[secret.name] = secret.value
        used.append(secret.pk)

    described: list[RunDatasource] = []
    datasources = {d.slug: d for d in datasources_for_user(user).filter(slug__in=slugs)}
    for slug in slugs:
        connection = datasource_connection(
            datasource=datasources[slug],
            user=user,
            credential=datasource_credential_for(datasource=datasources[slug], user=user),
        )
        datasource = connection.datasource
        env[datasource.env_name] = connection.url
        for name, value in connection.secret_values.items():
            secret_values.setdefault(name, value)
        used += connection.secret_ids
        described.append(
            RunDatasource(
                slug=datasource.slug,
                name=datasource.name,
                dialect=datasource.dialect,
                description=datasource.description,
                env_name=datasource.env_name,
                read_only=datasource.read_only,
                allowed_hosts=tuple(datasource.allowed_hosts or ()),
            )
        )
    embedder = embedder_configured() if slugs else None
    # search_knowledge embeds its queries with the model the entries were embedded by,
    # through its endpoint; a local model lives in PAW's processes, not in the sandbox:
    # the sandbox's search is then full-text (the run's first context had the vectors).
    if embedder is not None and not isinstance(embedder, LocalEmbedder):
        env["PAW_EMBEDDING_BASE_URL"] = embedder.base_url
        env["PAW_EMBEDDING_MODEL"] = embedder.model
        env["PAW_EMBEDDING_API_KEY"] = embedder.api_key or NO_KEY
        if embedder.api_key:
            secret_values.setdefault("PAW_EMBEDDING_API_KEY", embedder.api_key)

    if provider is not None:
        env["OPENAI_BASE_URL"] = provider.base_url
        env["OPENAI_API_KEY"] = provider.api_key or NO_KEY
        env["OPENAI_MODEL"] = provider.model
        _provider_key_add(secret_values, provider)

    secrets_mark_used(secret_ids=sorted(set(used)))
    secret_values_register(secret_values)
    return SandboxEnvironment(env=env, secret_values=secret_values, datasources=tuple(described))


def prompt_secret_values(*, user: User, provider: ProviderChoice) -> dict[str, str]:
    """``NAME → value``: what a prompt of ``user``'s run on ``provider`` is masked with
    before it is stored (``conversations.services.runs.run_start``), so that a secret a
    person types is ``[secret:NAME]`` in the run, its history and title as in its events.
    These are the values :func:`sandbox_environment` hands the run's sandbox, and its
    events are masked with, that are known without resolving a datasource: the user's
    own secrets (those that can be decrypted; one that cannot fails the run at dispatch,
    as before) and the provider's key under its secret's name. Datasource passwords are
    not looked for: a person does not type them, and looking would tell whether a string
    is one. Registered for log masking; nothing is marked as used."""
    values = {
        secret.name: secret.value
        for secret in _own_secrets(user)
        if secret.value is not UNDECRYPTABLE
    }
    _provider_key_add(values, provider)
    secret_values_register(values)
    return values


def stored_secret_values(*, user: User) -> dict[str, str]:
    """``NAME → value``: every secret value a sandbox of ``user``'s may have been given
    that PAW keeps: ``user``'s own secrets, the operator's (``global``: provider keys,
    datasource passwords; one whose name a secret of ``user``'s also has is named
    ``NAME (operator)``) and the server's provider key ``PAW_LLM_API_KEY``. What the
    files of a shared conversation are masked with before other people see them
    (``conversations.services.shares``). Undecryptable values are left out."""
    values: dict[str, str] = {}
    if settings.PAW_LLM_API_KEY:
        values["PAW_LLM_API_KEY"] = settings.PAW_LLM_API_KEY
    for secret in Secret.objects.filter(scope=Secret.Scope.GLOBAL).order_by("name"):
        if secret.value is not UNDECRYPTABLE:
            values[secret.name] = secret.value
    for secret in _own_secrets(user):
        if secret.value is not UNDECRYPTABLE:
            if secret.name in values and values[secret.name] != secret.value:
                values[f"{secret.name} (operator)"] = values.pop(secret.name)
            values[secret.name] = secret.value
    return values


def _own_secrets(user: User) -> list[Secret]:
    """``user``'s own secrets, by name (their values decrypted, or ``UNDECRYPTABLE``)."""
    return list(Secret.objects.filter(scope=Secret.Scope.USER, owner=user).order_by("name"))


def _provider_key_add(secret_values: dict[str, str], provider: ProviderChoice) -> None:
    if provider.api_key:
        # The key was resolved user-first, so a user secret of the same name holds this
        # very value: the entry never hides another value.
        secret_values[provider.key_name or "OPENAI_API_KEY"] = provider.api_key
