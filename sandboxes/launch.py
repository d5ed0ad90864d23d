"""How a sandbox process is started: its command line, environment and isolation.

The runtime is untrusted. It gets an environment built from scratch (never the server's
own), its own HOME, XDG folders and TMPDIR inside the workspace's private ``.paw/``
folder, resource limits (``prlimit``), and, with ``PAW_SANDBOX_ISOLATION=bwrap``, a
bubblewrap jail: system and Python paths read-only, only its workspace writable, none of
the server's files (database, keys, ``var/``, other workspaces) visible, its own PID
namespace, all capabilities dropped, and death with its parent. The network stays shared:
the model endpoint and datasources need it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import shlex
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote

from django.conf import settings

from conversations.workspaces import PRIVATE_DIR

logger = logging.getLogger(__name__)

#: The runtime's own package folder (run, never imported, by PAW).
RUNTIME_PACKAGE = Path(__file__).resolve().parent / "runtime"

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
    ``OPENAI_*``, the user's secrets, datasource URLs); ``secret_values`` maps secret names
    to the values handed over, for masking them in events. ``fingerprint`` changes when
    anything that needs a new process changes (provider, model, environment).
    """

    conversation_id: str
    workspace: Path
    provider: str
    model: str
    env: dict[str, str] = field(default_factory=dict)
    secret_values: dict[str, str] = field(default_factory=dict)

    @property
    def fingerprint(self) -> str:
        body = json.dumps([self.provider, self.model, sorted(self.env.items())])
        return hashlib.sha256(body.encode()).hexdigest()


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


def sandbox_dirs(workspace: Path) -> dict[str, Path]:
    """The private folders of a sandbox inside its workspace, created if missing, one
    level at a time and never through a symlink (the workspace is the agent's to change)."""
    private = workspace / PRIVATE_DIR
    dirs = {
        "home": private / "home",
        "tmp": private / "tmp",
        "data": private / "home" / ".local" / "share",
        "config": private / "home" / ".config",
        "cache": private / "home" / ".cache",
        "state": private / "home" / ".local" / "state",
    }
    for path in dirs.values():
        parts = path.relative_to(workspace).parts
        for depth in range(1, len(parts) + 1):
            _real_folder(workspace.joinpath(*parts[:depth]))
    return dirs


def build_environment(spec: SandboxSpec, *, sandbox_id: str) -> dict[str, str]:
    """The whole environment of the runtime process, from scratch.

    Contains PATH, locale, the private HOME/XDG_*/TMPDIR, ``NO_PROXY`` for loopback,
    ``PAW_SANDBOX_ID`` (a marker used to find every process of the sandbox when it is
    stopped), and ``spec.env``.
    """
    dirs = sandbox_dirs(spec.workspace)
    env = {
        "PATH": _search_path(),
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "HOME": str(dirs["home"]),
        "XDG_DATA_HOME": str(dirs["data"]),
        "XDG_CONFIG_HOME": str(dirs["config"]),
        "XDG_CACHE_HOME": str(dirs["cache"]),
        "XDG_STATE_HOME": str(dirs["state"]),
        "TMPDIR": str(dirs["tmp"]),
        "NO_PROXY": "127.0.0.1,localhost,::1",
        "no_proxy": "127.0.0.1,localhost,::1",
        "PYTHONUNBUFFERED": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "MPLBACKEND": "Agg",
        "PAW_SANDBOX_ID": sandbox_id,
    }
    env.update(spec.env)
    return env


def runtime_flags(workspace: Path) -> list[str]:
    """Flags every runtime gets (both runtimes accept them; PROTOCOL.md ``serve`` flags).

    The runtime's own answer timeout is a backstop behind PAW's approval deadline, and
    its wall clock matches PAW's run limit.
    """
    return [
        "--project", str(workspace),
        "--answer-timeout", str(settings.PAW_APPROVAL_TIMEOUT_SECONDS + 60),
        "--timeout", str(settings.PAW_RUN_TIMEOUT_SECONDS),
        "--max-rounds", str(settings.PAW_RUN_MAX_ROUNDS),
    ]  # fmt: skip


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


def sqlite_datasource_binds(env: dict[str, str]) -> list[str]:
    """bubblewrap options that make the run's SQLite datasources visible in the jail.

    ``env`` is the sandbox environment (``PAW_DATASOURCES`` describes each datasource and
    names its URL variable; a SQLite URL is ``sqlite:////abs/path?mode=ro``, see
    ``secrets_vault.connections``). A read-only datasource's file is bound read-only (with
    its ``-wal`` and ``-shm`` files when present, which SQLite reads too); a writable one
    gets its folder bound read-write, because SQLite writes its journal next to the file.
    Nothing else of the host is added. Returns ``[]`` when the run has no SQLite datasource.
    """
    try:
        described = json.loads(env.get("PAW_DATASOURCES") or "[]")
    except ValueError:
        return []
    binds: list[str] = []
    for datasource in described if isinstance(described, list) else []:
        if not isinstance(datasource, dict) or datasource.get("dialect") != "sqlite":
            continue
        url = env.get(str(datasource.get("env") or ""), "")
        if not url.startswith("sqlite:///"):
            continue
        path = unquote(url[len("sqlite:///") :].split("?", 1)[0])
        if not os.path.isabs(path):
            continue
        if datasource.get("read_only", True):
            binds += ["--ro-bind-try", path, path]
            for suffix in ("-wal", "-shm"):
                binds += ["--ro-bind-try", path + suffix, path + suffix]
        else:
            folder = os.path.dirname(path)
            binds += ["--bind-try", folder, folder]
    return binds


def bwrap_prefix(workspace: Path, env: dict[str, str] | None = None) -> list[str]:
    """The bubblewrap command that jails the runtime (PAW_SANDBOX_ISOLATION=bwrap); ``env``
    (the sandbox environment) adds the run's SQLite datasource files."""
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
    args += sqlite_datasource_binds(env or {})
    args += ["--bind", str(workspace), str(workspace)]
    # The sandbox's own root (a tmpfs holding the mount points) read-only: only the
    # workspace and /tmp (both mounts of their own) stay writable.
    args += ["--remount-ro", "/", "--chdir", str(workspace), "--"]
    return args


def _python_paths() -> list[Path]:
    """The interpreter, the virtual environment and the runtime's own source, read-only."""
    paths = {Path(sys.base_prefix).resolve(), Path(sys.prefix)}
    # An editable install imports the runtime from the source tree: expose only the
    # runtime package (and its parent's __init__), never the rest of the project.
    source = RUNTIME_PACKAGE.parent
    paths.add(source / "__init__.py")
    paths.add(RUNTIME_PACKAGE)
    return sorted(paths)


@functools.cache
def _warn_no_bwrap() -> None:
    """Say once per process that sandboxes run without a jail."""
    logger.warning(
        "bubblewrap is not installed: sandboxes run without isolation "
        "(install it: apt-get install bubblewrap; or set PAW_SANDBOX_ISOLATION=none to "
        "choose this)"
    )


def isolation_mode() -> str:
    """``bwrap`` or ``none`` (``PAW_SANDBOX_ISOLATION``; the default is ``bwrap`` when
    bubblewrap is installed). Raises ``RuntimeError`` if bwrap is asked for but missing."""
    mode = settings.PAW_SANDBOX_ISOLATION or ("bwrap" if shutil.which("bwrap") else "none")
    if not settings.PAW_SANDBOX_ISOLATION and mode == "none":
        _warn_no_bwrap()
    if mode == "bwrap" and not shutil.which("bwrap"):
        raise RuntimeError(
            "PAW_SANDBOX_ISOLATION=bwrap but bubblewrap is not installed (apt install bubblewrap)"
        )
    if mode not in ("bwrap", "none"):
        raise RuntimeError(f"PAW_SANDBOX_ISOLATION must be bwrap or none, not {mode!r}")
    return mode


def takes_secrets_fd() -> bool:
    """Whether the runtime reads its secret variables from a pipe (``--secrets-fd``):
    PAW's own ``paw-agent`` does; other runtimes get them in their environment."""
    return Path(runtime_argv()[0]).name == "paw-agent"


def private_variables(env: dict[str, str]) -> dict[str, str]:
    """The variables of ``env`` the runtime's tools must never read: the provider's key
    and the datasource URLs (they may carry an operator's passwords). Handed to
    ``paw-agent`` through a pipe rather than its environment, they are not in any
    ``/proc/<pid>/environ`` of the jail (bubblewrap's own init process would show them)."""
    names = {"OPENAI_API_KEY"}
    try:
        described = json.loads(env.get("PAW_DATASOURCES") or "[]")
    except ValueError:
        described = []
    for datasource in described if isinstance(described, list) else []:
        if isinstance(datasource, dict) and datasource.get("env"):
            names.add(str(datasource["env"]))
    names |= {name for name in env if name.startswith("PAW_DATASOURCE_") and name.endswith("_URL")}
    return {name: env[name] for name in names if name in env}


def build_command(spec: SandboxSpec, *, secrets_fd: int | None = None) -> list[str]:
    """The full argv: limits, then (maybe) bubblewrap, then the runtime with its flags
    (``--secrets-fd`` when its secret variables come through that pipe)."""
    argv = [*runtime_argv(), *runtime_flags(spec.workspace)]
    if secrets_fd is not None:
        argv += ["--secrets-fd", str(secrets_fd)]
    if isolation_mode() == "bwrap":
        argv = [*bwrap_prefix(spec.workspace, spec.env), *argv]
    return [*resource_limits(), *argv]
