"""How a sandbox process is started: its command line, environment and isolation.

The runtime is untrusted. It gets an environment built from scratch (never the server's
own), its own HOME, XDG folders and TMPDIR inside the workspace's private ``.paw/``
folder, resource limits (``prlimit``), and, with ``PAW_SANDBOX_ISOLATION=bwrap``, a
bubblewrap jail: system and Python paths read-only, only its workspace writable, none of
the server's files (database, keys, ``var/``, other workspaces) visible, its own PID
namespace, all capabilities dropped, and death with its parent. With
``PAW_SANDBOX_NETWORK=isolated`` (the default under bubblewrap) it also gets a network
namespace of its own (``--unshare-net``): only what its run needs is reached, through the
node's forwarder (``sandboxes/network.py``, ``docs/runtime.md``). With
``PAW_SANDBOX_ISOLATION=none`` there is no jail, but the runtime still starts under the
keeper (``sandboxes/keeper.py``), so that no process of the sandbox outlives it (docs/runtime.md,
Isolation: what each mode guarantees).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import logging
import os
import shlex
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote

from django.conf import settings

from conversations.selectors.workspaces import PRIVATE_DIR
from sandboxes.host_folder import HOST_DIR, host_file_put
from sandboxes.network import JAIL_DIR, NetworkPlan, relay_prefix

if TYPE_CHECKING:
    from secrets_vault.services.sandbox import RunDatasource

logger = logging.getLogger(__name__)


#: The packages of this repository the runtime imports: paw-agent itself and the rule of a
#: read it shares with the server.
RUNTIME_PACKAGES = ("paw_agent", "paw_sqlcheck")


@functools.cache
def runtime_packages() -> tuple[Path, ...]:
    """The folders of the installed :data:`RUNTIME_PACKAGES` (found, never imported: PAW
    runs the runtime only as a subprocess); those not installed here are left out."""
    found = []
    for name in RUNTIME_PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            found.append(Path(next(iter(spec.submodule_search_locations))).resolve())
    return tuple(found)


# Pieces of /etc a Python process needs: names, TLS roots, time zone, fonts, linker cache.
_ETC_READ_ONLY = (
    "/etc/resolv.conf",
    "/etc/hosts",
    "/etc/nsswitch.conf",
    "/etc/host.conf",
    "/etc/gai.conf",
    "/etc/ssl",
    "/etc/ca-certificates",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/fonts",
    "/etc/alternatives",
    "/etc/mime.types",
    "/etc/passwd",
    "/etc/group",
)


@dataclass(frozen=True)
class SandboxSpec:
    """What a sandbox is started with.

    ``env`` holds the variables a run is given on top of the base environment (provider
    ``OPENAI_*``, the user's secrets, datasource URLs); ``datasources`` the run's
    datasources (a :class:`~secrets_vault.services.sandbox.RunDatasource` each: the launch
    turns them into ``PAW_DATASOURCES``, :func:`datasource_variables`, and the network
    plan and the jail's binds read them); ``secret_values`` maps secret names to the
    values handed over, for masking them in events. ``fingerprint`` changes when anything
    that needs a new process changes (provider, model, environment, datasources, the
    conversation's approval timeout).
    """

    conversation_id: str
    workspace: Path
    provider: str
    model: str
    env: dict[str, str] = field(default_factory=dict)
    secret_values: dict[str, str] = field(default_factory=dict)
    #: Seconds an approval of the conversation waits (its own, else the server default).
    answer_timeout: int = 0
    #: The model accepts images (sent with each submit, so not part of the fingerprint).
    vision: bool = False
    datasources: tuple[RunDatasource, ...] = ()

    @property
    def fingerprint(self) -> str:
        datasources = [[d.described(), list(d.allowed_hosts)] for d in self.datasources]
        body = json.dumps(
            [self.provider, self.model, sorted(self.env.items()), self.answer_timeout, datasources]
        )
        return hashlib.sha256(body.encode()).hexdigest()


def datasource_variables(datasources: tuple[RunDatasource, ...]) -> dict[str, str]:
    """The variables that tell the runtime its run's ``datasources``: ``PAW_DATASOURCES``,
    a JSON list of ``{"slug", "name", "dialect", "description", "env", "read_only"}``
    (``env``: the variable holding its URL; always set, ``[]`` when none). Made here once,
    for the process's environment (:func:`build_environment`) or a spare's hand-over
    (:func:`handover_variables`)."""
    described = [datasource.described() for datasource in datasources]
    return {"PAW_DATASOURCES": json.dumps(described, ensure_ascii=False)}


def runtime_argv() -> list[str]:
    """``PAW_HARNESS_CMD`` split like a shell would, its program resolved in the virtual
    environment first (``paw-agent`` and ``python-agent-harness`` are installed there).

    Raises ``FileNotFoundError`` when the program cannot be found.
    """
    argv = shlex.split(settings.PAW_HARNESS_CMD)
    if not argv:
        raise FileNotFoundError("PAW_HARNESS_CMD is empty")
    program = shutil.which(argv[0], path=_search_path())
    if program is None:
        raise FileNotFoundError(f"the runtime program {argv[0]!r} was not found")
    return [program, *argv[1:]]


def _search_path() -> str:
    return os.pathsep.join([str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin", "/bin"])


def _real_folder(path: Path) -> None:
    """Make ``path`` a real folder (mode 0700): whatever else stands there — a symlink
    the agent made (to lead PAW's own ``mkdir`` outside the workspace), a dangling link,
    a file — is removed first. Its parent must be a real folder already."""
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        path.unlink()
    path.mkdir(mode=0o700, exist_ok=True)


def _private_folders(workspace: Path) -> dict[str, Path]:
    """Where a sandbox's private folders are inside ``workspace`` (nothing is created)."""
    private = workspace / PRIVATE_DIR
    return {
        "home": private / "home",
        "tmp": private / "tmp",
        # Written by PAW only (read-only in the jail): knowledge indexes, runtime config.
        "host": private / HOST_DIR,
        "knowledge": private / HOST_DIR / "knowledge",
        "data": private / "home" / ".local" / "share",
        "config": private / "home" / ".config",
        "cache": private / "home" / ".cache",
        "state": private / "home" / ".local" / "state",
    }


def sandbox_dirs(workspace: Path) -> dict[str, Path]:
    """The private folders of a sandbox inside its workspace, created if missing, one
    level at a time and never through a symlink (the workspace is the agent's to change)."""
    dirs = _private_folders(workspace)
    for path in dirs.values():
        parts = path.relative_to(workspace).parts
        for depth in range(1, len(parts) + 1):
            _real_folder(workspace.joinpath(*parts[:depth]))
    return dirs


def _folder_variables(dirs: dict[str, Path]) -> dict[str, str]:
    """HOME, XDG_* and TMPDIR naming the private folders ``dirs``."""
    return {
        "HOME": str(dirs["home"]),
        "XDG_DATA_HOME": str(dirs["data"]),
        "XDG_CONFIG_HOME": str(dirs["config"]),
        "XDG_CACHE_HOME": str(dirs["cache"]),
        "XDG_STATE_HOME": str(dirs["state"]),
        "TMPDIR": str(dirs["tmp"]),
    }


def handover_variables(spec: SandboxSpec, *, seen_as: Path) -> dict[str, str]:
    """What a spare is given at its hand-over to ``spec``'s conversation, through its
    secrets pipe: ``spec.env`` (the provider's endpoint, key and model, the datasources'
    URLs, the person's secrets), ``PAW_DATASOURCES`` and the private folders' variables
    for the workspace at
    ``seen_as``, the path the runtime sees it at (in a jail, the spare's own folder,
    bound there before it was renamed; without one, the conversation's folder)."""
    return {
        **_folder_variables(_private_folders(seen_as)),
        **spec.env,
        **datasource_variables(spec.datasources),
    }


def build_environment(spec: SandboxSpec, *, sandbox_id: str, spare: bool = False) -> dict[str, str]:
    """The whole environment of the runtime process, from scratch.

    Contains PATH, locale, the private HOME/XDG_*/TMPDIR, ``NO_PROXY`` for loopback,
    ``PAW_SANDBOX_ID`` (a marker used to find every process of the sandbox when it is
    stopped), ``spec.env`` and the run's datasources (:func:`datasource_variables`; not
    for a ``spare``, which is told them at its hand-over: :func:`handover_variables`).
    """
    dirs = sandbox_dirs(spec.workspace)
    env = {
        "PATH": _search_path(),
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        **_folder_variables(dirs),
        "NO_PROXY": "127.0.0.1,localhost,::1",
        "no_proxy": "127.0.0.1,localhost,::1",
        "PYTHONUNBUFFERED": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "MPLBACKEND": "Agg",
        "PAW_SANDBOX_ID": sandbox_id,
    }
    env.update(spec.env)
    if not spare:
        env.update(datasource_variables(spec.datasources))
    return env


HARNESS_CONFIG = "harness-config.json"


def memory_exchanges() -> int:
    """The exchanges (a prompt and its answer) a runtime remembers: ``PAW_HISTORY_TURNS``
    counts turns as the seed does, one message each, so 12 turns are 6 exchanges."""
    return settings.PAW_HISTORY_TURNS // 2


def runtime_flags(spec: SandboxSpec) -> list[str]:
    """The runtime's flags: those both runtimes take (PROTOCOL.md ``serve`` flags), then
    the model limits in each one's own way: paw-agent's flags (``--max-output-tokens``,
    ``--context-budget``, ``--memory-turns``, ``--sql-result-rows``,
    ``--max-image-bytes``), or for
    python-agent-harness a config file PAW writes into the sandbox's read-only
    ``.paw/host`` (``llm.max_tokens``, ``context_windows``; unless ``PAW_HARNESS_CMD``
    names a ``--config`` of its own).

    The runtime's own answer timeout is a backstop behind PAW's approval deadline (the
    conversation's), and its wall clock matches PAW's run limit.
    """
    flags = [
        "--project", str(spec.workspace),
        "--answer-timeout", str(runtime_answer_timeout(spec)),
        "--timeout", str(settings.PAW_RUN_TIMEOUT_SECONDS),
        "--max-rounds", str(settings.PAW_RUN_MAX_ROUNDS),
    ]  # fmt: skip
    kind = runtime_kind()
    if kind == "paw-agent":
        flags += [
            "--max-output-tokens", str(settings.PAW_MODEL_MAX_OUTPUT_TOKENS),
            "--context-budget", str(settings.PAW_MODEL_MAX_CONTEXT_TOKENS),
            "--memory-turns", str(memory_exchanges()),
            "--sql-result-rows", str(settings.PAW_SQL_RESULT_ROWS),
            "--max-image-bytes", str(settings.PAW_MAX_IMAGE_BYTES),
        ]  # fmt: skip
    elif kind == "python-agent-harness" and "--config" not in runtime_argv():
        config = sandbox_dirs(spec.workspace)["host"] / HARNESS_CONFIG
        body = {
            "llm": {"max_tokens": settings.PAW_MODEL_MAX_OUTPUT_TOKENS},
            "context_windows": {spec.model: settings.PAW_MODEL_MAX_CONTEXT_TOKENS},
        }
        host_file_put(spec.workspace, (), HARNESS_CONFIG, json.dumps(body).encode())
        flags += ["--config", str(config)]
    return flags


def runtime_answer_timeout(spec: SandboxSpec) -> int:
    """Seconds the runtime lets a question wait (``--answer-timeout``, or a spare's
    hand-over): a backstop a minute behind PAW's own approval deadline, the
    conversation's or the server's default."""
    return (spec.answer_timeout or settings.PAW_APPROVAL_TIMEOUT_SECONDS) + 60


def resource_limits() -> list[str]:
    """``prlimit`` prefix applying the configured limits to the runtime and its children."""
    return [
        "prlimit",
        f"--cpu={settings.PAW_SANDBOX_CPU_SECONDS}",
        f"--as={settings.PAW_SANDBOX_MEMORY_MB * 1024 * 1024}",
        f"--fsize={settings.PAW_SANDBOX_FILE_MB * 1024 * 1024}",
        f"--nproc={settings.PAW_SANDBOX_PROCESSES}",
        "--",
    ]


def sqlite_datasource_binds(
    env: dict[str, str], datasources: tuple[RunDatasource, ...] = ()
) -> list[str]:
    """bubblewrap options that make the run's SQLite datasources visible in the jail.

    ``env`` is the sandbox environment, holding each of the run's ``datasources``' URL
    under its ``env_name`` (a SQLite URL is ``sqlite:////abs/path?mode=ro``, see
    ``secrets_vault.connections``). A read-only datasource's file is bound read-only (with
    its ``-wal`` and ``-shm`` files when present, which SQLite reads too); a writable one
    gets its folder bound read-write, because SQLite writes its journal next to the file.
    Nothing else of the host is added. Returns ``[]`` when the run has no SQLite datasource.
    """
    binds: list[str] = []
    for datasource in datasources:
        if datasource.dialect != "sqlite":
            continue
        url = env.get(datasource.env_name, "")
        if not url.startswith("sqlite:///"):
            continue
        path = unquote(url[len("sqlite:///") :].split("?", 1)[0])
        if not os.path.isabs(path):
            continue
        if datasource.read_only:
            binds += ["--ro-bind-try", path, path]
            for suffix in ("-wal", "-shm"):
                binds += ["--ro-bind-try", path + suffix, path + suffix]
        else:
            folder = os.path.dirname(path)
            binds += ["--bind-try", folder, folder]
    return binds


def bwrap_prefix(
    workspace: Path,
    env: dict[str, str] | None = None,
    datasources: tuple[RunDatasource, ...] = (),
    *,
    network_folder: Path | None = None,
) -> list[str]:
    """The bubblewrap command that jails the runtime (PAW_SANDBOX_ISOLATION=bwrap); ``env``
    (the sandbox environment) and ``datasources`` add the run's SQLite datasource files. ``network_folder``
    (the node's forwarder folder of the sandbox, :class:`sandboxes.network.SandboxNetwork`)
    gives the jail a network namespace of its own and binds the folder read-only at
    ``/run/paw-net``."""
    args = [
        "bwrap", "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-ipc",
        "--unshare-uts", "--unshare-cgroup-try", "--cap-drop", "ALL", "--hostname", "sandbox",
        "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",  # noqa: S108 - a private tmpfs
        "--ro-bind", "/usr", "/usr",
    ]  # fmt: skip
    for top in ("/bin", "/sbin", "/lib", "/lib64", "/lib32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    for path in _ETC_READ_ONLY:
        args += ["--ro-bind-try", path, path]
    args += ["--ro-bind-try", "/sys/devices/system/cpu", "/sys/devices/system/cpu"]
    for path in _python_paths():
        args += ["--ro-bind", str(path), str(path)]
    args += sqlite_datasource_binds(env or {}, datasources)
    if network_folder is not None:
        args += ["--unshare-net", "--ro-bind", str(network_folder), JAIL_DIR]
    args += ["--bind", str(workspace), str(workspace)]
    # PAW's own files for the sandbox (knowledge indexes, runtime config): read-only, so the
    # agent can neither change them nor plant a link PAW would then write through.
    host = workspace / PRIVATE_DIR / HOST_DIR
    args += ["--ro-bind", str(host), str(host)]
    # The sandbox's own root (a tmpfs holding the mount points) read-only: only the
    # workspace and /tmp (both mounts of their own) stay writable.
    args += ["--remount-ro", "/", "--chdir", str(workspace), "--"]
    return args


def _python_paths() -> list[Path]:
    """The interpreter, the virtual environment and the runtime's own source, read-only."""
    paths = {Path(sys.base_prefix).resolve(), Path(sys.prefix)}
    # An editable install imports the runtime from the source tree: expose only the
    # runtime's packages, never the rest of the project.
    paths.update(runtime_packages())
    return sorted(paths)


@functools.cache
def _warn_no_bwrap() -> None:
    """Say once per process that sandboxes run without a jail."""
    logger.warning(
        "bubblewrap is not installed: sandboxes run without isolation "
        "(install it: apt-get install bubblewrap; or set PAW_SANDBOX_ISOLATION=none to "
        "choose this)"
    )


class IsolationUnavailable(RuntimeError):
    """The sandbox isolation PAW must use is not available on this machine."""


def isolation_mode() -> str:
    """``bwrap`` or ``none`` (``PAW_SANDBOX_ISOLATION``; the default is ``bwrap`` when
    bubblewrap is installed). Without bubblewrap and without an explicit
    ``PAW_SANDBOX_ISOLATION=none``, only the embedded mode falls back to ``none`` (with a
    warning); with Redis configured (production) that raises
    :class:`IsolationUnavailable`, as does ``bwrap`` asked for but missing."""
    mode = settings.PAW_SANDBOX_ISOLATION or ("bwrap" if shutil.which("bwrap") else "none")
    if not settings.PAW_SANDBOX_ISOLATION and mode == "none":
        if not settings.EMBEDDED:
            raise IsolationUnavailable(
                "bubblewrap is not installed, so sandboxes cannot be isolated: install it "
                "(apt-get install bubblewrap), or set PAW_SANDBOX_ISOLATION=none to run "
                "them without a jail on purpose (docs/runtime.md: Isolation)"
            )
        _warn_no_bwrap()
    if mode == "bwrap" and not shutil.which("bwrap"):
        raise IsolationUnavailable(
            "PAW_SANDBOX_ISOLATION=bwrap but bubblewrap is not installed (apt install bubblewrap)"
        )
    if mode not in ("bwrap", "none"):
        raise RuntimeError(f"PAW_SANDBOX_ISOLATION must be bwrap or none, not {mode!r}")
    return mode


def network_mode() -> str:
    """``isolated`` or ``host`` (``PAW_SANDBOX_NETWORK``; the default is ``isolated``
    under bubblewrap). Without bubblewrap (``PAW_SANDBOX_ISOLATION=none``) it is always
    ``host``: a network namespace needs the jail (logged once when ``isolated`` was asked)."""
    asked = settings.PAW_SANDBOX_NETWORK or "isolated"
    if isolation_mode() != "bwrap":
        if settings.PAW_SANDBOX_NETWORK == "isolated":
            _warn_isolated_ignored()
        return "host"
    return asked


@functools.cache
def _warn_isolated_ignored() -> None:
    logger.warning(
        "PAW_SANDBOX_NETWORK=isolated is ignored: PAW_SANDBOX_ISOLATION=none runs sandboxes "
        "without bubblewrap, so they share the host's network"
    )


def runtime_kind() -> str:
    """Which runtime ``PAW_HARNESS_CMD`` runs, by its program's name: ``paw-agent``,
    ``python-agent-harness``, or ``other``."""
    name = Path(runtime_argv()[0]).name
    return name if name in ("paw-agent", "python-agent-harness") else "other"


class UngatedRuntime(RuntimeError):
    """``PAW_HARNESS_CMD`` runs a runtime known to run its tools without asking
    (python-agent-harness), and ``PAW_ALLOW_UNGATED_RUNTIME`` does not accept that."""


def runtime_gate_check() -> str | None:
    """The start-up check of ``PAW_HARNESS_CMD`` against ``PAW_ALLOW_UNGATED_RUNTIME``
    (a worker node's start, ``runpaw`` and ``runpaw --check``).

    Raises :class:`UngatedRuntime` when it runs python-agent-harness, whose ``ready``
    offers no ``approval_gate`` (measured: docs/runtime.md, "Ungated runtimes"), and the
    setting is off. Returns a warning (str) for another program than paw-agent without
    the setting: whether it is gated is known only from its ``ready``, which each sandbox's
    start checks (``sandboxes.services``). ``None`` otherwise, and when the program
    cannot be found (each sandbox's start says so)."""
    if settings.PAW_ALLOW_UNGATED_RUNTIME:
        return None
    try:
        kind = runtime_kind()
    except FileNotFoundError:
        return None
    if kind == "python-agent-harness":
        raise UngatedRuntime(
            "PAW_HARNESS_CMD runs python-agent-harness, which runs its tools (Bash, Write, "
            "Edit, Agent) without asking: PAW's approvals cannot hold there, it can only end "
            "a run after such a call. Use paw-agent, or set PAW_ALLOW_UNGATED_RUNTIME=1 to "
            "run it knowingly (every conversation on it is told that approvals apply to "
            "paw-agent only)."
        )
    if kind == "other":
        return (
            f"PAW_HARNESS_CMD runs {Path(runtime_argv()[0]).name}, not paw-agent: its "
            "sandboxes start only if its ready offers approval_gate (its risky tools ask "
            "first); set PAW_ALLOW_UNGATED_RUNTIME=1 to run an ungated runtime knowingly."
        )
    return None


def takes_secrets_fd() -> bool:
    """Whether the runtime reads its secret variables from a pipe (``--secrets-fd``):
    PAW's own ``paw-agent`` does; other runtimes get them in their environment."""
    return runtime_kind() == "paw-agent"


def private_variables(
    env: dict[str, str], datasources: tuple[RunDatasource, ...] = ()
) -> dict[str, str]:
    """The variables of ``env`` the runtime's tools must never read: the provider's key,
    the embedding endpoint's key and the URLs of the ``datasources`` (and any other
    ``PAW_DATASOURCE_*_URL``: they may carry an operator's passwords). Handed to
    ``paw-agent`` through a pipe rather than its environment, they are not in any
    ``/proc/<pid>/environ`` of the jail (bubblewrap's own init process would show them)."""
    names = {"OPENAI_API_KEY", "PAW_EMBEDDING_API_KEY"}
    names |= {datasource.env_name for datasource in datasources if datasource.env_name}
    names |= {name for name in env if name.startswith("PAW_DATASOURCE_") and name.endswith("_URL")}
    return {name: env[name] for name in names if name in env}


#: The first process of a sandbox without bubblewrap (see ``sandboxes/keeper.py``).
KEEPER = str(Path(__file__).resolve().parent / "keeper.py")


def keeper_prefix() -> list[str]:
    """The keeper that owns a sandbox run without bubblewrap (``PAW_SANDBOX_ISOLATION=none``):
    a child subreaper whose descendants are the sandbox's processes, killed when the
    runtime exits, on SIGUSR1, and when this process (its parent) dies. stdlib only,
    started isolated (``-I -S``)."""
    return [sys.executable, "-I", "-S", KEEPER, str(os.getpid()), "--"]


# Inside the jail, before the runtime: makes the descriptors named by its first two
# arguments the runtime's stdin and stdout, then executes the rest (after "--") in place.
_STDIO_CODE = (
    "import os,sys;i,o=int(sys.argv[1]),int(sys.argv[2]);os.dup2(i,0);os.dup2(o,1);"
    "[os.close(f) for f in {i,o} if f>2];os.execvp(sys.argv[4],sys.argv[4:])"
)


def stdio_prefix(stdio_fds: tuple[int, int]) -> list[str]:
    """The command that hands the runtime its protocol pipes inside the jail:
    ``stdio_fds`` = (the descriptor to read ops from, the one to write lines to), passed
    to bubblewrap above 2.

    Why: bubblewrap's init, PID 1 of the sandbox's PID namespace, keeps the descriptors 0,
    1 and 2 it was started with, runs as the sandbox's user and can be read through
    ``/proc`` (``/proc/1/fd/1``). Were the protocol pipes its stdin and stdout, any code a
    run executes could write lines the host takes for the runtime's (a forged answer,
    approval or usage) or read the host's ops. So bubblewrap gets ``/dev/null`` there and
    the pipes on higher descriptors, which its init closes (it keeps 0, 1 and 2); only
    this exec chain carries them to the runtime (paw-agent then makes itself
    non-dumpable)."""
    return [sys.executable, "-I", "-S", "-c", _STDIO_CODE, *map(str, stdio_fds), "--"]


def build_command(
    spec: SandboxSpec,
    *,
    secrets_fd: int | None = None,
    network: NetworkPlan | None = None,
    network_folder: Path | None = None,
    stdio_fds: tuple[int, int] | None = None,
    spare: bool = False,
) -> list[str]:
    """The full argv: limits, then bubblewrap (its own PID namespace) or the keeper
    (:func:`keeper_prefix`), then the runtime with its flags (``--secrets-fd`` when its
    secret variables come through that pipe). With ``network`` and ``network_folder``
    (isolated network, bubblewrap only) the jail has its own network namespace and the
    relay (``sandboxes/jail_relay.py``) starts the runtime. With ``stdio_fds`` (bubblewrap
    only) the runtime's stdin and stdout are those descriptors (:func:`stdio_prefix`).
    ``spare``: a spare paw-agent (``--spare``, its relay with the spare's forward ports),
    ``spec`` then being the spare's own (its folder, no variables)."""
    argv = [*runtime_argv(), *runtime_flags(spec)]
    if secrets_fd is not None:
        argv += ["--secrets-fd", str(secrets_fd)]
    if spare:
        argv += ["--spare"]
    if isolation_mode() == "bwrap":
        if stdio_fds is not None:
            argv = [*stdio_prefix(stdio_fds), *argv]
        if network is not None and network_folder is not None:
            argv = [*relay_prefix(network, spare=spare), *argv]
        else:
            network_folder = None
        argv = [
            *bwrap_prefix(
                spec.workspace, spec.env, spec.datasources, network_folder=network_folder
            ),
            *argv,
        ]
    else:
        argv = [*keeper_prefix(), *argv]
    return [*resource_limits(), *argv]
