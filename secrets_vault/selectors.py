"""Reads: secrets (never their values, except for the services that hand them out),
datasources and their knowledge (search included), providers and their state for a
user."""

from __future__ import annotations

import collections
import math
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
from django.conf import settings
from django.db import connection
from django.db.models import Count, OuterRef, Q, QuerySet, Subquery
from django.db.models.functions import Coalesce, Lower

from paw_sqlcheck.canonical import canonical_sql
from secrets_vault.fields import UNDECRYPTABLE
from secrets_vault.models import (
    CustomProvider,
    Datasource,
    DatasourceCredential,
    KnowledgeEntry,
    ProviderAccess,
    ProviderModelLimit,
    ProviderPreference,
    Secret,
)
from secrets_vault.providers import (
    ALL_MODELS,
    BUILTIN_PROVIDERS,
    DEFAULT_PROVIDER_NAME,
    DEMO_MODEL,
    DEMO_PROVIDER_LABEL,
    DEMO_PROVIDER_NAME,
    model_accepts_images,
    models_list,
)
from secrets_vault.vectors import vector_from_bytes
from teams.models import Access
from teams.selectors import accessible, user_team_ids

if TYPE_CHECKING:
    from accounts.models import User

OPENAI_DEFAULT_BASE_URL = "https://api.openai.com/v1"


# --- Secrets ----------------------------------------------------------------------------


def secret_list(*, user: User) -> QuerySet[Secret]:
    """The user's own secrets, by name, without their values."""
    return Secret.objects.filter(scope=Secret.Scope.USER, owner=user).defer("value")


def secret_list_all() -> QuerySet[Secret]:
    """Every secret (global first, then by name), without values: for operators."""
    return Secret.objects.select_related("owner").defer("value")


def secret_get(*, name: str, user: User | None) -> Secret | None:
    """The user's own secret ``name`` (or the global one when ``user`` is None), without
    its value; None when there is none."""
    query = Secret.objects.defer("value")
    if user is None:
        return query.filter(scope=Secret.Scope.GLOBAL, name=name).first()
    return query.filter(scope=Secret.Scope.USER, owner=user, name=name).first()


def secrets_lookup(*, user: User | None, names: list[str] | set[str]) -> dict[str, Secret]:
    """``NAME → Secret`` (values loaded) for each of ``names`` that exists: the user's own
    secret before a global one of the same name. Names not found are absent. A value no
    configured key can decrypt reads as ``fields.UNDECRYPTABLE``."""
    if not names:
        return {}
    owned = Q(scope=Secret.Scope.USER, owner=user) if user is not None else Q(pk__in=[])
    found: dict[str, Secret] = {}
    rows = Secret.objects.filter(Q(name__in=list(names)) & (owned | Q(scope="global")))
    for secret in rows:
        if secret.scope == Secret.Scope.USER or secret.name not in found:
            found[secret.name] = secret
    return found


# --- Datasources ------------------------------------------------------------------------


def datasource_list(*, enabled_only: bool = True) -> QuerySet[Datasource]:
    """Datasources by slug; only enabled ones unless ``enabled_only`` is False. Every
    datasource, whoever may use it: for operators; a person's are
    :func:`datasources_for_user`. Without the harvested structure (``schema_tables``,
    large for a large schema, read only by the schema refresh)."""
    query = Datasource.objects.defer("schema_tables")
    return query.filter(enabled=True) if enabled_only else query


def datasources_with_stale_examples(queryset: QuerySet[Datasource]) -> QuerySet[Datasource]:
    """``queryset`` with each datasource's count of stale examples as ``stale_examples``
    (one subquery, no join), read by :func:`datasource_stale_examples`."""
    stale = (
        KnowledgeEntry.objects.filter(
            datasource=OuterRef("pk"), kind=KnowledgeEntry.Kind.EXAMPLE, stale_since__isnull=False
        )
        .order_by()
        .values("datasource")
        .annotate(count=Count("pk"))
        .values("count")
    )
    return queryset.annotate(stale_examples=Coalesce(Subquery(stale), 0))


def datasource_stale_examples(datasource: Datasource) -> int:
    """How many examples of ``datasource`` are stale (failed when the last schema refresh
    ran them again): the annotation of :func:`datasources_with_stale_examples` when the
    datasource was read with it, else counted now."""
    annotated = getattr(datasource, "stale_examples", None)
    if annotated is not None:
        return int(annotated)
    return KnowledgeEntry.objects.filter(
        datasource=datasource, kind=KnowledgeEntry.Kind.EXAMPLE, stale_since__isnull=False
    ).count()


def datasources_for_user(user: User | None) -> QuerySet[Datasource]:
    """The enabled datasources ``user`` may use, by slug: the one rule of access
    (``teams.selectors.accessible``: open to everyone, or listing one of the user's teams;
    staff all; nobody signed in none). Every path that lets a person see or use a
    datasource reads it through here: ``GET /api/datasources`` and ``/{slug}``, a run's and
    a conversation's ``datasources``, ``POST /api/sql/ask``, what a run's sandbox and its
    knowledge are given on the worker."""
    return accessible(datasource_list(), user)


def datasource_credential_for(
    *, datasource: Datasource, user: User | None
) -> DatasourceCredential | None:
    """The team credentials ``user``'s runs on ``datasource`` connect with: of the teams
    ``user`` is in now that have their own on it, the one of the highest ``priority``
    (then the team's name); None when none has (the datasource's own user then). One
    query."""
    team_ids = user_team_ids(user)
    if not team_ids:
        return None
    return (
        DatasourceCredential.objects.filter(datasource=datasource, team_id__in=team_ids)
        .select_related("team")
        .order_by("-priority", "team__name", "pk")
        .first()
    )


def datasource_credentials(*, datasource: Datasource) -> QuerySet[DatasourceCredential]:
    """The datasource's team credentials, highest priority first, with their teams."""
    return (
        DatasourceCredential.objects.filter(datasource=datasource)
        .select_related("team")
        .order_by("-priority", "team__name", "pk")
    )


# --- Providers --------------------------------------------------------------------------


@dataclass(frozen=True)
class ProviderGrants:
    """What one person may use of the operators' providers (their keys and endpoints):
    ``denied`` the names of the providers they may not use; ``models`` per provider name
    the only model names they may use (a provider absent from it: every model). A
    person's own key is not covered: it is theirs whatever these say."""

    denied: frozenset[str] = frozenset()
    models: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def allows(self, name: str) -> bool:
        """Whether the provider ``name`` may be used through the operator's key."""
        return name not in self.denied

    def allowed_models(self, name: str) -> tuple[str, ...] | None:
        """The only models of ``name`` allowed, or ``None`` for every one."""
        return self.models.get(name)


#: What a provider's rule grants when nothing limits it (staff, the system's own use).
NO_LIMITS = ProviderGrants()


def provider_grants(*, user: User | None) -> ProviderGrants:
    """The one rule of who may use which provider and model through the operator's key.

    A provider is usable when it has no :class:`~secrets_vault.models.ProviderAccess`
    row, or when :func:`teams.selectors.accessible` lets ``user`` use its row (everyone,
    or a member of one of its teams; staff always). Its models: every one, unless every
    team of ``user``'s through which they may use it (all their teams for an ``everyone``
    provider, the listed ones of theirs for a ``teams`` one) has a
    :class:`~secrets_vault.models.ProviderModelLimit` — then the union of those limits
    (teams by id, each team's models in the order given). Staff have no limits; ``user``
    ``None`` (PAW's own use, e.g. embeddings) neither. One query while no provider has a
    rule, five at most."""
    if user is None or user.is_staff or user.is_superuser:
        return NO_LIMITS
    rules = list(ProviderAccess.objects.prefetch_related("teams"))
    if not rules:
        return NO_LIMITS
    usable = set(accessible(ProviderAccess.objects.all(), user).values_list("pk", flat=True))
    denied = frozenset(rule.provider for rule in rules if rule.pk not in usable)
    team_ids = user_team_ids(user)
    limits: dict[int, dict[int, list[str]]] = {}
    if team_ids:
        for limit in ProviderModelLimit.objects.filter(team_id__in=team_ids):
            limits.setdefault(limit.access_id, {})[limit.team_id] = list(limit.allowed_models)
    models: dict[str, tuple[str, ...]] = {}
    for rule in rules:
        if rule.pk not in usable or rule.pk not in limits:
            continue
        granting = (
            team_ids
            if rule.access == Access.EVERYONE
            else team_ids & {team.pk for team in rule.teams.all()}
        )
        if not granting or any(team not in limits[rule.pk] for team in granting):
            continue  # no team (an everyone provider) or an unlimited team: every model
        names = [name for team in sorted(granting) for name in limits[rule.pk][team]]
        models[rule.provider] = tuple(dict.fromkeys(name.strip() for name in names))
    return ProviderGrants(denied=denied, models=models)


@dataclass(frozen=True)
class ProviderState:
    """One provider as seen by one user, without its model list.

    ``api_key`` is the resolved key ("" when none is needed or none was found; never
    shown: ``repr`` leaves it out); ``key_name`` the secret (or setting) it came from;
    ``key_secret_id`` that secret's id, to note its use; ``vision_models`` the patterns of
    its model names that accept images (``providers.model_accepts_images``);
    ``allowed_models`` the only model names the user may use (:func:`provider_grants`;
    ``None``: all) and ``own_key`` whether the key is the user's own secret.
    """

    name: str
    label: str
    base_url: str
    key_name: str
    active: bool
    reason_if_inactive: str
    default_model: str
    known_models: tuple[str, ...]
    api_key: str = field(default="", repr=False)
    key_secret_id: int | None = None
    vision_models: tuple[str, ...] = ()
    #: The only models the user may use (their teams' limits), ``None`` for every one.
    allowed_models: tuple[str, ...] | None = None
    #: The key is the user's own secret: theirs whatever their teams.
    own_key: bool = False

    def allows_model(self, model: str) -> bool:
        """Whether the user may use ``model`` of this provider (their teams' limits)."""
        return self.allowed_models is None or model in self.allowed_models

    def accepts_images(self, model: str) -> bool:
        """Whether ``model`` of this provider accepts image content parts."""
        return model_accepts_images(self.vision_models, model)


@dataclass(frozen=True)
class ProviderInfo:
    """A provider as ``GET /api/providers`` shows it (``models``: live or known list;
    ``vision_models``: those of them that accept images)."""

    name: str
    label: str
    active: bool
    reason_if_inactive: str
    default_model: str
    models: list[str]
    vision_models: list[str] = field(default_factory=list)


def provider_default_configured() -> bool:
    """Whether the operator set the server-wide default (``PAW_LLM_BASE_URL`` or
    ``PAW_LLM_API_KEY``)."""
    return bool(settings.PAW_LLM_BASE_URL or settings.PAW_LLM_API_KEY)


def _key_missing_reason(key_name: str) -> str:
    return (
        f"No {key_name} secret: add yours (the API keys page, /settings/keys/, or PUT "
        f'/api/secrets/{key_name} with {{"value": "..."}}) or ask an operator to add a global '
        "one."
    )


def providers_for(
    *, user: User | None, grants: ProviderGrants | None = None
) -> list[ProviderState]:
    """Every provider the user could pick, in the order "first active" follows: the
    server-wide default (only when configured), the built-in providers, the enabled
    custom providers by name, then the offline demo (only when ``PAW_DEMO_BASE_URL`` is
    set, so any real provider is preferred to it). A provider is active when it needs no key or its key
    secret resolves (the user's own, then a global one) and decrypts. The server's
    process environment is never consulted.

    The access rule (``grants``, else :func:`provider_grants` of ``user``) leaves out
    the providers the user may not use through the operator's key or endpoint, unless
    the key is their own secret (theirs whatever their teams), and limits the models of
    the others (``allowed_models``; the default model is then the provider's own when
    allowed, else the first allowed one). ``user`` ``None``: PAW's own use (no rule)."""
    customs = list(CustomProvider.objects.filter(enabled=True))
    key_names = {spec.key_name for spec in BUILTIN_PROVIDERS}
    key_names |= {custom.key_secret_name for custom in customs if custom.key_secret_name}
    secrets = secrets_lookup(user=user, names=key_names)

    def keyed(**kwargs) -> ProviderState:
        key_name = kwargs["key_name"]
        if not key_name:
            return ProviderState(active=True, reason_if_inactive="", **kwargs)
        secret = secrets.get(key_name)
        if secret is None:
            return ProviderState(
                active=False, reason_if_inactive=_key_missing_reason(key_name), **kwargs
            )
        if secret.value is UNDECRYPTABLE or not secret.value:
            return ProviderState(
                active=False,
                reason_if_inactive=f"The {key_name} secret cannot be decrypted with the "
                "server's keys; set it again.",
                **kwargs,
            )
        return ProviderState(
            active=True,
            reason_if_inactive="",
            api_key=secret.value,
            key_secret_id=secret.pk,
            own_key=secret.scope == Secret.Scope.USER,
            **kwargs,
        )

    states: list[ProviderState] = []
    if provider_default_configured():
        model = settings.PAW_LLM_MODEL
        states.append(
            ProviderState(
                name=DEFAULT_PROVIDER_NAME,
                label="Server default",
                base_url=settings.PAW_LLM_BASE_URL or OPENAI_DEFAULT_BASE_URL,
                key_name="PAW_LLM_API_KEY" if settings.PAW_LLM_API_KEY else "",
                active=True,
                reason_if_inactive="",
                default_model=model,
                known_models=(model,) if model else (),
                api_key=settings.PAW_LLM_API_KEY,
                vision_models=ALL_MODELS if settings.PAW_LLM_VISION else (),
            )
        )
    for spec in BUILTIN_PROVIDERS:
        states.append(
            keyed(
                name=spec.name,
                label=spec.label,
                base_url=spec.base_url,
                key_name=spec.key_name,
                default_model=spec.default_model,
                known_models=spec.known_models,
                vision_models=spec.vision_models,
            )
        )
    for custom in customs:
        known = tuple(custom.known_models)
        states.append(
            keyed(
                name=custom.name,
                label=custom.label or custom.name,
                base_url=custom.base_url,
                key_name=custom.key_secret_name,
                default_model=custom.default_model or (known[0] if known else ""),
                known_models=known,
                vision_models=ALL_MODELS if custom.vision else (),
            )
        )
    if settings.PAW_DEMO_BASE_URL:
        states.append(
            ProviderState(
                name=DEMO_PROVIDER_NAME,
                label=DEMO_PROVIDER_LABEL,
                base_url=settings.PAW_DEMO_BASE_URL,
                key_name="",
                active=True,
                reason_if_inactive="",
                default_model=DEMO_MODEL,
                known_models=(DEMO_MODEL,),
            )
        )
    grants = provider_grants(user=user) if grants is None else grants
    return [
        _granted(state, grants) for state in states if state.own_key or grants.allows(state.name)
    ]


def _granted(state: ProviderState, grants: ProviderGrants) -> ProviderState:
    """``state`` with the models ``grants`` allow (unchanged for the user's own key or a
    provider whose models are not limited)."""
    allowed = None if state.own_key else grants.allowed_models(state.name)
    if allowed is None:
        return state
    known = tuple(name for name in state.known_models if name in allowed) or allowed
    default = state.default_model if state.default_model in allowed else allowed[0]
    return replace(state, allowed_models=allowed, known_models=known, default_model=default)


def provider_models(state: ProviderState) -> list[str]:
    """The provider's models: its live list when it is active (cached; see
    ``providers.models_list``), else its known models; only those the user may use
    (``state.allowed_models``)."""
    if not state.active:
        return list(state.known_models)
    models = models_list(
        base_url=state.base_url, api_key=state.api_key, known_models=list(state.known_models)
    )
    return [name for name in models if state.allows_model(name)]


def provider_list(*, user: User) -> list[ProviderInfo]:
    """What ``GET /api/providers`` shows the user: each provider with its live model list
    (fetched concurrently, so one slow endpoint costs one timeout, not the sum). A
    provider without a configured default model offers its first listed model."""
    states = providers_for(user=user)
    with ThreadPoolExecutor(max_workers=max(1, min(8, len(states)))) as pool:
        model_lists = list(pool.map(provider_models, states))
    return [
        ProviderInfo(
            name=state.name,
            label=state.label,
            active=state.active,
            reason_if_inactive=state.reason_if_inactive,
            default_model=state.default_model or (models[0] if models else ""),
            models=models,
            vision_models=[name for name in models if state.accepts_images(name)],
        )
        for state, models in zip(states, model_lists, strict=True)
    ]


def provider_names() -> list[tuple[str, str]]:
    """``(name, label)`` of every provider an operator may set access on, in the order of
    :func:`providers_for`: the server default (when configured), the built-ins, every
    custom provider (disabled ones too), the demo (when offered)."""
    names = []
    if provider_default_configured():
        names.append((DEFAULT_PROVIDER_NAME, "Server default"))
    names += [(spec.name, spec.label) for spec in BUILTIN_PROVIDERS]
    names += [
        (custom.name, custom.label or custom.name)
        for custom in CustomProvider.objects.order_by("name")
    ]
    if settings.PAW_DEMO_BASE_URL:
        names.append((DEMO_PROVIDER_NAME, DEMO_PROVIDER_LABEL))
    return names


@dataclass(frozen=True)
class ProviderAccessView:
    """One provider's access as operators see it: ``access`` (``everyone`` | ``teams``),
    ``teams`` ``[(id, name)]`` by name, ``model_limits`` ``[(team id, team name, [model,
    ...])]`` by team name; ``known`` whether the provider exists now (a rule outlives a
    deleted custom provider, and applies again to a new one of the same name)."""

    provider: str
    label: str
    access: str
    teams: list[tuple[int, str]]
    model_limits: list[tuple[int, str, list[str]]]
    known: bool = True


def provider_access_list(*, provider: str | None = None) -> list[ProviderAccessView]:
    """The access of every provider (:func:`provider_names`, then rules of providers that
    no longer exist), or of ``provider`` alone (empty when it is neither a provider nor a
    rule's). A provider without a rule shows ``everyone`` and no limits."""
    rules = {
        rule.provider: rule
        for rule in ProviderAccess.objects.prefetch_related("teams", "model_limits__team")
    }
    labels = dict(provider_names())
    names = list(labels) + sorted(name for name in rules if name not in labels)
    views = []
    for name in names:
        if provider is not None and name != provider:
            continue
        rule = rules.get(name)
        teams = [(team.pk, team.name) for team in rule.teams.all()] if rule else []
        limits = (
            [
                (lim.team_id, lim.team.name, list(lim.allowed_models))
                for lim in rule.model_limits.all()
            ]
            if rule
            else []
        )
        views.append(
            ProviderAccessView(
                provider=name,
                label=labels.get(name, name),
                access=rule.access if rule else Access.EVERYONE,
                teams=sorted(teams, key=lambda team: team[1].lower()),
                model_limits=sorted(limits, key=lambda limit: limit[1].lower()),
                known=name in labels,
            )
        )
    return views


def provider_preference_get(*, user: User) -> ProviderPreference | None:
    """The user's default provider and model, if they chose one."""
    return ProviderPreference.objects.filter(user=user).first()


# --- Datasource knowledge -----------------------------------------------------------------

#: Candidates each ranking (full-text, vectors) contributes before they are merged.
SEARCH_CANDIDATES = 50
#: Reciprocal rank fusion's constant (Cormack, Clarke and Büttcher, SIGIR 2009: k = 60).
RRF_K = 60
#: Words too common to say anything about a datasource (questions are full of them).
STOPWORDS = frozenset(
    {
        "a", "about", "all", "an", "and", "are", "as", "at", "be", "by", "can", "did", "do",
        "does", "each", "find", "for", "from", "give", "had", "has", "have", "how", "i", "in",
        "into", "is", "it", "its", "list", "many", "me", "much", "my", "of", "on", "or", "our",
        "show", "tell", "than", "that", "the", "their", "them", "there", "these", "they",
        "this", "to", "was", "we", "were", "what", "when", "where", "which", "who", "whom",
        "why", "will", "with", "would", "you", "your",
    }
)  # fmt: skip
_WORD = re.compile(r"[^\W_]+", re.UNICODE)


def knowledge_list(*, datasource: Datasource, kind: str | None = None) -> QuerySet[KnowledgeEntry]:
    """The datasource's knowledge entries (only ``kind`` when given), by kind and title,
    without their vectors."""
    entries = KnowledgeEntry.objects.filter(datasource=datasource).defer("vector")
    return entries.filter(kind=kind) if kind else entries


def knowledge_get(*, datasource: Datasource, entry_id: int) -> KnowledgeEntry | None:
    """One entry of the datasource, or None."""
    return knowledge_list(datasource=datasource).filter(pk=entry_id).first()


#: Verified examples of one datasource compared with an answer's SQL, at most.
VERIFIED_MATCH_LIMIT = 1000


def verified_example_matching(*, datasource_slug: str, sql: str) -> KnowledgeEntry | None:
    """The verified example of the datasource ``datasource_slug`` whose SQL is ``sql`` as
    parsed (same canonical form on the datasource's dialect:
    ``paw_sqlcheck.canonical.canonical_sql``; formatting, case, aliases and semicolons
    aside), the most recently verified first; None when none is, when ``sql`` is not one
    read, or when there is no such datasource. An example kept from runs
    (``flag_reason``) never matches. Compares at most :data:`VERIFIED_MATCH_LIMIT`
    examples; the forms are cached per process."""
    datasource = Datasource.objects.filter(slug=datasource_slug).only("pk", "dialect").first()
    if datasource is None or not isinstance(sql, str):
        return None
    wanted = canonical_sql(sql, dialect=datasource.dialect)
    if wanted is None:
        return None
    examples = (
        KnowledgeEntry.objects.filter(
            datasource=datasource,
            kind=KnowledgeEntry.Kind.EXAMPLE,
            verified_at__isnull=False,
            flag_reason="",
        )
        .defer("vector")
        .order_by("-verified_at", "-pk")[:VERIFIED_MATCH_LIMIT]
    )
    for example in examples:
        if canonical_sql(example.sql, dialect=datasource.dialect) == wanted:
            return example
    return None


def knowledge_entries_named(
    *, entry_ids: list[int], datasource_slugs: list[str]
) -> dict[int, dict[str, Any]]:
    """The entries among ``entry_ids`` that belong to one of the datasources
    ``datasource_slugs``, by id: ``{"id", "kind", "title", "datasource"}`` each, from
    PAW's own rows (an id of another datasource, or of no entry, is left out)."""
    ids = [i for i in entry_ids if isinstance(i, int) and not isinstance(i, bool)]
    if not ids or not datasource_slugs:
        return {}
    rows = KnowledgeEntry.objects.filter(
        pk__in=ids, datasource__slug__in=datasource_slugs
    ).values_list("pk", "kind", "title", "datasource__slug")
    return {
        pk: {"id": pk, "kind": kind, "title": title, "datasource": slug}
        for pk, kind, title, slug in rows
    }


def knowledge_schema_columns(*, datasource_slug: str, tables: list[str]) -> dict[str, list[str]]:
    """Of the datasource's harvested schema, the ``tables`` named (titles as SQL names
    them, matched ignoring case) and their column names, read from each entry's column
    lines (``- name type …``: ``introspection.Table.entry_text``)."""
    wanted = {name.lower() for name in tables}
    if not wanted:
        return {}
    columns: dict[str, list[str]] = {}
    rows = (
        KnowledgeEntry.objects.filter(
            datasource__slug=datasource_slug, kind=KnowledgeEntry.Kind.SCHEMA
        )
        .annotate(lowered=Lower("title"))
        .filter(lowered__in=wanted)
        .values_list("title", "text")
    )
    for title, text in rows:
        lines = text.split("\nColumns:\n", 1)[1].splitlines() if "\nColumns:\n" in text else []
        columns[title] = [
            line[2:].split(" ", 1)[0]
            for line in lines
            if line.startswith("- ") and not line.startswith("- … ")
        ]
    return columns


def knowledge_unembedded(
    *, datasource_ids: list[int], model: str, limit: int
) -> list[KnowledgeEntry]:
    """Up to ``limit`` entries of the datasources without a vector by ``model``."""
    return list(
        KnowledgeEntry.objects.filter(datasource_id__in=datasource_ids)
        .exclude(vector_model=model, vector__isnull=False)
        .defer("vector")
        .order_by("id")[:limit]
    )


def query_words(text: str) -> list[str]:
    """The words of a question worth searching for: lower-case, without stopwords and
    one-letter words, each once, in order (table and column names split at ``_``)."""
    words = [w.lower() for w in _WORD.findall(text)]
    return list(dict.fromkeys(w for w in words if len(w) > 1 and w not in STOPWORDS))


@dataclass(frozen=True)
class KnowledgeHit:
    """An entry found for a query, with its ``score`` (reciprocal-rank fusion of the
    full-text and vector rankings: higher is better)."""

    entry: KnowledgeEntry
    score: float


def knowledge_search(
    *,
    datasource_ids: list[int],
    query: str,
    limit: int = 20,
    query_vector: np.ndarray | None = None,
    vector_model: str = "",
    kinds: tuple[str, ...] = (),
) -> list[KnowledgeHit]:
    """The entries of the datasources most relevant to ``query``, best first (at most
    ``limit``), without their vectors.

    Full-text: PostgreSQL ``ts_rank`` over the ``search`` tsvector (GIN), SQLite FTS5
    ``bm25``, or, on an SQLite without FTS5, a BM25 computed here; the question's words are
    OR-ed, so an entry matching some of them counts. With ``query_vector`` (normalised,
    by ``vector_model``), the entries' vectors by that model are ranked by cosine
    similarity too (numpy, over a per-process cache keyed on the datasources'
    ``knowledge_version``), and the two rankings merged by reciprocal rank fusion.
    ``kinds``, when given, keeps only entries of those kinds (``schema``, ``doc``,
    ``example``).
    """
    if not datasource_ids:
        return []
    words = query_words(query)
    # The full-text query brings its rows along: one round trip when it is all there is.
    found = (
        {entry.pk: entry for entry in _fulltext_ranked(datasource_ids, words, kinds)}
        if words
        else {}
    )
    rankings = [list(found)]
    if query_vector is not None and vector_model:
        rankings.append(_vector_ranked(datasource_ids, query_vector, vector_model, kinds))
    scores: dict[int, float] = {}
    for ranking in rankings:
        for rank, entry_id in enumerate(ranking):
            scores[entry_id] = scores.get(entry_id, 0.0) + 1.0 / (RRF_K + rank + 1)
    best = sorted(scores, key=lambda entry_id: (-scores[entry_id], entry_id))[:limit]
    missing = [entry_id for entry_id in best if entry_id not in found]
    if missing:
        found.update(KnowledgeEntry.objects.defer("vector").in_bulk(missing))
    return [KnowledgeHit(entry=found[i], score=scores[i]) for i in best if i in found]


#: The columns a search reads (never the vector).
_ENTRY_COLUMNS = (
    "e.id, e.datasource_id, e.kind, e.title, e.text, e.sql, e.vector_model, e.flag_reason, "
    "e.stale_since, e.verified_at, e.created_at, e.updated_at"
)


def _fulltext_ranked(
    datasource_ids: list[int], words: list[str], kinds: tuple[str, ...] = ()
) -> list[KnowledgeEntry]:
    """Entries matching any of ``words`` (of ``kinds``, when given), best first (at most
    ``SEARCH_CANDIDATES``), without their vectors."""
    vendor = connection.vendor
    kinds = tuple(kinds) or tuple(KnowledgeEntry.Kind.values)
    table = KnowledgeEntry._meta.db_table
    if vendor == "postgresql":
        # plainto_tsquery stems and drops stopwords; its terms are then OR-ed.
        return list(
            KnowledgeEntry.objects.raw(
                f"""
                SELECT {_ENTRY_COLUMNS} FROM {table} e,
                     CAST(replace(plainto_tsquery('english', %s)::text, ' & ', ' | ') AS tsquery) q
                WHERE e.datasource_id = ANY(%s) AND e.kind = ANY(%s) AND e.search @@ q
                ORDER BY ts_rank(e.search, q, 1) DESC, e.id LIMIT %s
                """,  # noqa: S608 - the table name is the model's
                [" ".join(words), list(datasource_ids), list(kinds), SEARCH_CANDIDATES],
            )
        )
    if vendor == "sqlite" and _sqlite_fts_ready():
        match = " OR ".join('"' + word.replace('"', '""') + '"' for word in words)
        # Django's cursor takes %s placeholders on SQLite too (it turns them into ?).
        marks = ", ".join("%s" for _ in datasource_ids)
        kind_marks = ", ".join("%s" for _ in kinds)
        return list(
            KnowledgeEntry.objects.raw(
                f"""
                SELECT {_ENTRY_COLUMNS} FROM {FTS_TABLE} f JOIN {table} e ON e.id = f.rowid
                WHERE {FTS_TABLE} MATCH %s AND e.datasource_id IN ({marks})
                  AND e.kind IN ({kind_marks})
                ORDER BY bm25({FTS_TABLE}, 4.0, 1.0, 0.5), e.id LIMIT %s
                """,  # noqa: S608 - names are the model's, values are parameters
                [match, *datasource_ids, *kinds, SEARCH_CANDIDATES],
            )
        )
    ranked = _python_ranked(datasource_ids, words, kinds)
    entries = KnowledgeEntry.objects.defer("vector").in_bulk(ranked)
    return [entries[i] for i in ranked if i in entries]


FTS_TABLE = "secrets_vault_knowledge_fts"


def _sqlite_fts_ready() -> bool:
    """Whether this SQLite database has the FTS5 table (its SQLite had FTS5 when the
    migration ran)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM sqlite_master WHERE name = %s", [FTS_TABLE])
        return cursor.fetchone() is not None


def _python_ranked(
    datasource_ids: list[int], words: list[str], kinds: tuple[str, ...]
) -> list[int]:
    """BM25 (k1 = 1.2, b = 0.75; Robertson and Zaragoza, 2009) over every entry of the
    datasources, on word prefixes of 5 letters as a poor man's stemming: the fallback of
    a database without a full-text index. The title counts three times."""
    stems = {word[:5] for word in words}
    documents = []
    for entry_id, title, text, sql in KnowledgeEntry.objects.filter(
        datasource_id__in=datasource_ids, kind__in=kinds
    ).values_list("id", "title", "text", "sql"):
        tokens = [w.lower()[:5] for w in _WORD.findall(f"{title} {title} {title} {text} {sql}")]
        documents.append((entry_id, tokens))
    if not documents:
        return []
    average = sum(len(tokens) for _, tokens in documents) / len(documents) or 1.0
    frequency = {stem: sum(stem in set(tokens) for _, tokens in documents) for stem in stems}
    scored = []
    for entry_id, tokens in documents:
        score = 0.0
        for stem in stems:
            count = tokens.count(stem)
            if count:
                idf = math.log(
                    1 + (len(documents) - frequency[stem] + 0.5) / (frequency[stem] + 0.5)
                )
                score += idf * count * 2.2 / (count + 1.2 * (0.25 + 0.75 * len(tokens) / average))
        if score > 0:
            scored.append((score, entry_id))
    scored.sort(key=lambda item: (-item[0], item[1]))
    return [entry_id for _, entry_id in scored[:SEARCH_CANDIDATES]]


_VECTOR_CACHE: collections.OrderedDict[tuple, tuple[np.ndarray, np.ndarray, np.ndarray]] = (
    collections.OrderedDict()
)
_VECTOR_CACHE_LOCK = threading.Lock()
#: Sets of datasources whose vectors a process keeps (10,000 entries of 1,536 float32
#: dimensions are 60 MB).
VECTOR_CACHE_SIZE = 8


def knowledge_versions(datasource_ids: list[int]) -> tuple[tuple[int, int], ...]:
    """``((datasource id, knowledge_version), ...)`` by id: the key of the per-process
    caches of the datasources' knowledge (the vectors here, ``context.schema_map``)."""
    return tuple(
        Datasource.objects.filter(pk__in=datasource_ids)
        .order_by("pk")
        .values_list("pk", "knowledge_version")
    )


def _vector_matrix(
    datasource_ids: list[int], model: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(entry ids, matrix of their vectors, their kinds)`` by ``model``, from the cache
    while no datasource's ``knowledge_version`` changed."""
    key = (model, knowledge_versions(datasource_ids))
    with _VECTOR_CACHE_LOCK:
        if key in _VECTOR_CACHE:
            _VECTOR_CACHE.move_to_end(key)
            return _VECTOR_CACHE[key]
    rows = list(
        KnowledgeEntry.objects.filter(
            datasource_id__in=datasource_ids, vector_model=model, vector__isnull=False
        ).values_list("id", "vector", "kind")
    )
    vectors = [vector_from_bytes(vector) for _, vector, _ in rows]
    dims = {len(v) for v in vectors}
    if len(dims) > 1:  # vectors of another shape: a model renamed in between; skip them
        common = max(dims, key=lambda d: sum(len(v) == d for v in vectors))
        rows, vectors = zip(
            *[(r, v) for r, v in zip(rows, vectors, strict=True) if len(v) == common], strict=True
        )
    ids = np.array([entry_id for entry_id, _, _ in rows], dtype=np.int64)
    kinds = np.array([kind for _, _, kind in rows], dtype=object)
    matrix = np.vstack(vectors) if vectors else np.zeros((0, 0), dtype=np.float32)
    with _VECTOR_CACHE_LOCK:
        _VECTOR_CACHE[key] = (ids, matrix, kinds)
        while len(_VECTOR_CACHE) > VECTOR_CACHE_SIZE:
            _VECTOR_CACHE.popitem(last=False)
    return ids, matrix, kinds


def _vector_ranked(
    datasource_ids: list[int], query_vector: np.ndarray, model: str, kinds: tuple[str, ...] = ()
) -> list[int]:
    """Entry ids (of ``kinds``, when given) by cosine similarity to ``query_vector``, best
    first (at most ``SEARCH_CANDIDATES``)."""
    ids, matrix, entry_kinds = _vector_matrix(datasource_ids, model)
    if kinds and len(ids):
        keep = np.isin(entry_kinds, list(kinds))
        ids, matrix = ids[keep], matrix[keep]
    if not len(ids) or matrix.shape[1] != len(query_vector):
        return []
    similarity = matrix @ query_vector.astype(np.float32)
    count = min(SEARCH_CANDIDATES, len(ids))
    top = np.argpartition(-similarity, count - 1)[:count]
    top = top[np.lexsort((ids[top], -similarity[top]))]
    return [int(ids[i]) for i in top]
