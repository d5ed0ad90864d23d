"""Datasource connection settings: validation, the URL a sandbox gets, a live test.

URL forms (what ``PAW_DATASOURCE_<SLUG>_URL`` holds, placeholders already resolved):

* PostgreSQL: ``postgresql://user:password@host:port/database?option=value`` — a libpq
  URI, accepted as is by ``psycopg.connect(url)``. A read-only datasource adds
  ``options=-c default_transaction_read_only=on``, so the server itself refuses writes.
* MySQL / MariaDB: ``mysql://user:password@host:port/database?option=value``.
* SQLite: ``sqlite:////absolute/path.sqlite3?mode=ro`` (the SQLAlchemy / dj-database-url
  form: everything after ``sqlite:///`` up to ``?`` is the percent-encoded absolute path).
  Path and query make an SQLite URI filename:
  ``sqlite3.connect("file:" + path + "?" + query, uri=True)``; ``mode=ro`` when read-only.

User names, passwords, database names and option values are percent-encoded (RFC 3986);
the host is a host name or an IP literal only (checked by :func:`connection_resolved_check`
once placeholders are resolved), so no resolved value can add a URL part (a second host,
a port, a path, a query parameter).

A datasource may never be PAW's own database (:func:`connection_is_paw_database`): any
user of it could read every session key and password hash.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import socket
import sqlite3
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from django.conf import settings
from django.core.exceptions import ValidationError

from paw_sqlcheck import (
    POSTGRESQL_SESSION_OPTIONS,
    SessionMismatch,
    judge,
    mysql_mode_lexes_as_parsed,
    mysql_sql_mode,
    sqlite_limit,
)
from secrets_vault.placeholders import PLACEHOLDER, placeholder_whole

#: Seconds to wait for a database to answer a connection test.
CONNECT_TIMEOUT = 5

_SERVER_KEYS = ("host", "port", "database", "user", "password", "options")
_SQLITE_KEYS = ("database", "options")
#: A host name (RFC 1123 labels; ``_`` tolerated) — no port, comma, slash or bracket.
_HOSTNAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,62})(?:\.[A-Za-z0-9_][A-Za-z0-9_-]{0,62})*\.?$"
)
_OPTION_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
#: Option names that would say where to connect (or as whom) behind the fields' back:
#: libpq takes any connection parameter from the URL's query.
_CONNECTION_OPTION_KEYS = frozenset(
    {"host", "hostaddr", "port", "dbname", "database", "user", "service", "servicefile",
     "passfile", "unix_socket", "read_default_file", "bind_address"}
)  # fmt: skip


def _is_secret_key(key: str) -> bool:
    """Whether a connection field holds a secret by nature (the password, an option whose
    name says password, key or secret): only these may resolve the user's own secret."""
    lowered = key.lower()
    return _is_password_key(key) or lowered in ("sslpassword",) or "secret" in lowered


def connection_is_secret_field(path: tuple[str, ...]) -> bool:
    """Whether the connection field at ``path`` (``("password",)``,
    ``("options", "sslpassword")``) holds a secret by nature: only those resolve the
    requesting user's own secret first; every other field (host, port, database, user,
    options) resolves only the operator's global secrets."""
    if path == ("password",):
        return True
    return len(path) == 2 and path[0] == "options" and _is_secret_key(path[1])


def _is_password_key(key: str) -> bool:
    lowered = key.lower()
    return "password" in lowered or "passwd" in lowered


#: At most this many allowed-host entries per datasource.
MAX_ALLOWED_HOSTS = 20
_HOST_PATTERN = re.compile(
    r"^(\*\.)?[a-z0-9]([a-z0-9-]{0,62})(\.[a-z0-9]([a-z0-9-]{0,62}))*\.?(:[0-9]{1,5})?$"
)


def allowed_hosts_validate(entries: Any) -> None:
    """Check a datasource's ``allowed_hosts``: a list of at most
    :data:`MAX_ALLOWED_HOSTS` strings, each ``host``, ``host:port`` or
    ``*.domain[:port]`` (a DNS name or an IPv4 address, case ignored; a port 1-65535), the
    forms of ``PAW_SANDBOX_ALLOWED_HOSTS``. Raises Django's ``ValidationError`` (field
    ``allowed_hosts``, code ``invalid_allowed_hosts``) naming the first bad entry."""
    if not isinstance(entries, list) or len(entries) > MAX_ALLOWED_HOSTS:
        raise ValidationError(
            {"allowed_hosts": f"A list of at most {MAX_ALLOWED_HOSTS} strings."},
            code="invalid_allowed_hosts",
        )
    for entry in entries:
        text = entry.strip().lower() if isinstance(entry, str) else ""
        port = text.rpartition(":")[2] if ":" in text else ""
        if (
            not _HOST_PATTERN.match(text)
            or len(text) > 260
            or (port and not 1 <= int(port) <= 65535)
        ):
            raise ValidationError(
                {
                    "allowed_hosts": f"{str(entry)[:80]!r} is not host, host:port or "
                    "*.domain[:port]."
                },
                code="invalid_allowed_hosts",
            )


def connection_validate(*, dialect: str, connection: Any) -> None:
    """Check datasource connection settings for ``dialect`` (``postgresql``, ``mysql``,
    ``sqlite``).

    Raises ``django.core.exceptions.ValidationError`` (on the ``connection`` field) for:
    a non-object, unknown keys, a bad port, a relative SQLite path, non-scalar options,
    and above all a password (``password``, or any option whose name contains
    "password"/"passwd") that is not exactly one ``{secret:NAME}`` placeholder.
    """

    def refuse(message: str) -> None:
        raise ValidationError({"connection": message}, code="invalid_connection")

    if not isinstance(connection, dict):
        refuse('Connection settings must be a JSON object, e.g. {"host": "...", ...}.')
    allowed = _SQLITE_KEYS if dialect == "sqlite" else _SERVER_KEYS
    unknown = sorted(set(connection) - set(allowed))
    if unknown:
        refuse(f"Unknown key(s) {', '.join(unknown)}; allowed: {', '.join(allowed)}.")

    options = connection.get("options", {})
    if not isinstance(options, dict) or not all(
        isinstance(value, str | int | float | bool) for value in options.values()
    ):
        refuse('"options" must be an object of plain values, e.g. {"sslmode": "require"}.')
    for key in options:
        if not _OPTION_KEY.match(str(key)):
            refuse(f"Option name {key!r} is not a plain parameter name.")
        if key.lower() in _CONNECTION_OPTION_KEYS:
            refuse(
                f'Option "{key}" is not accepted: where to connect and as whom are the '
                '"host", "port", "database" and "user" fields.'
            )
    passwords = [("password", connection["password"])] if "password" in connection else []
    passwords += [(f"options.{k}", v) for k, v in options.items() if _is_password_key(k)]
    for key, value in passwords:
        if value in ("", None):
            continue
        if placeholder_whole(value) is None:
            refuse(
                f'A literal password is not accepted in "{key}": store it as a secret '
                "(admin > Secrets, or `manage.py secret set DB_PASSWORD`) and write its "
                'placeholder instead, e.g. "{secret:DB_PASSWORD}".'
            )

    for key in ("host", "user", "database"):
        if key in connection and not isinstance(connection[key], str):
            refuse(f'"{key}" must be a string.')
    host = connection.get("host")
    if host and not PLACEHOLDER.search(host) and host_literal(host) is None:
        refuse(
            f'"host" must be a host name or an IP address (no port, comma or slash), not {host!r}.'
        )
    if dialect == "sqlite":
        database = connection.get("database", "")
        if not database:
            refuse('An SQLite datasource needs "database": the absolute path of its file.')
        if not PLACEHOLDER.search(database) and not Path(database).is_absolute():
            refuse(f'"database" must be an absolute path, not {database!r}.')
        return
    if not connection.get("database"):
        refuse('"database" is required (the database name on the server).')
    port = connection.get("port")
    if isinstance(port, str) and PLACEHOLDER.search(port):
        return  # checked once resolved (connection_resolved_check)
    if port not in (None, ""):
        try:
            number = int(port)
        except (TypeError, ValueError):
            number = 0
        if not 0 < number < 65536:
            refuse(f'"port" must be a number from 1 to 65535, not {port!r}.')


def host_literal(host: str) -> str | None:
    """``host`` as it goes in a URL: a host name as is, an IP address (IPv6 in brackets,
    given with or without them); None when it is neither (a port, a comma-separated host
    list, a path, anything else a URL would read as more than one host)."""
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    with contextlib.suppress(ValueError):
        address = ipaddress.ip_address(bare)
        return f"[{address.compressed}]" if address.version == 6 else address.compressed
    if bare is host and _HOSTNAME.match(host):
        return host
    return None


def connection_resolved_check(*, dialect: str, connection: dict[str, Any]) -> None:
    """Check *resolved* connection settings (placeholders substituted) before they make a
    URL or a connection: ``host`` a host name or IP literal only, ``port`` an integer from
    1 to 65535, ``database``/``user``/option values text without NUL characters, option
    names plain and never a connection parameter (``host``, ``port``, ``dbname``...).

    Raises ``ValueError`` with a message naming the field (never its value: it may come
    from a secret).
    """
    for key in ("host", "database", "user", "password"):
        value = connection.get(key)
        if value is not None and (not isinstance(value, str | int) or "\x00" in str(value)):
            raise ValueError(f'"{key}" must be text without NUL characters.')
    if dialect != "sqlite":
        host = connection.get("host")
        if host not in (None, "") and host_literal(str(host)) is None:
            raise ValueError(
                '"host" must be a host name or an IP address once its placeholders are '
                "resolved (no port, comma, slash or list of hosts)."
            )
        port = connection.get("port")
        if port not in (None, ""):
            text = str(port)
            if not text.isdigit() or not 0 < int(text) < 65536:
                raise ValueError('"port" must be a number from 1 to 65535 once resolved.')
    options = connection.get("options") or {}
    if not isinstance(options, dict):
        raise ValueError('"options" must be an object.')
    for key, value in options.items():
        if not _OPTION_KEY.match(str(key)) or str(key).lower() in _CONNECTION_OPTION_KEYS:
            raise ValueError(f"option {key!r} is not accepted.")
        if "\x00" in str(value):
            raise ValueError(f'option "{key}" must be text without NUL characters.')


_LOCAL_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", ""}


def _host_addresses(host: str) -> set[str]:
    """The addresses ``host`` names, with every address of this machine (loopback, the
    unspecified address, its own name's addresses, or a Unix socket: an empty host or a
    path) as the one word ``"local"``."""
    host = (host or "").strip().lower()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if host in _LOCAL_NAMES or host.startswith("/"):
        return {"local"}
    addresses: set[str] = set()
    with contextlib.suppress(OSError, UnicodeError):
        for info in socket.getaddrinfo(host, None):
            addresses.add(str(info[4][0]).split("%", 1)[0])
    if not addresses:
        addresses.add(host)
    own: set[str] = set()
    with contextlib.suppress(OSError, UnicodeError):
        own = set(socket.gethostbyname_ex(socket.gethostname())[2])
    found = set()
    for address in addresses:
        try:
            parsed = ipaddress.ip_address(address)
        except ValueError:
            found.add(address)
            continue
        if parsed.version == 6 and parsed.ipv4_mapped is not None:
            parsed = parsed.ipv4_mapped  # ::ffff:127.0.0.1 is 127.0.0.1
        if parsed.is_loopback or parsed.is_unspecified or parsed.compressed in own:
            found.add("local")
        else:
            found.add(parsed.compressed)
    return found


def _paw_sqlite_forbidden(path: str) -> bool:
    """Whether an SQLite path is PAW's own database file (or its journal), or any file
    under ``PAW_VAR_DIR`` (but the offline demo's own folder, ``DEMO_DATA_DIR``) or the
    workspace root (each compared by real path)."""
    real = os.path.realpath(path)

    def under(folder: Any) -> bool:
        root = os.path.realpath(str(folder))
        return real == root or real.startswith(root.rstrip(os.sep) + os.sep)

    from django.db import connections

    paw = connections["default"].settings_dict
    if "sqlite" in str(paw.get("ENGINE", "")) and str(paw.get("NAME") or "") not in (
        "",
        ":memory:",
    ):
        own = os.path.realpath(str(paw["NAME"]))
        if real in (own, own + "-wal", own + "-shm", own + "-journal"):
            return True
    demo = getattr(settings, "DEMO_DATA_DIR", None)
    if demo and under(demo) and real != os.path.realpath(str(demo)):
        return False  # the demo's tips file (runpaw makes it there)
    for folder in (
        getattr(settings, "VAR_DIR", None),
        getattr(settings, "PAW_WORKSPACE_ROOT", None),
    ):
        if folder and under(folder):
            return True
    return False


def connection_is_paw_database(*, dialect: str, connection: dict[str, Any]) -> bool:
    """Whether *resolved* connection settings reach PAW's own database
    (``settings.DATABASES["default"]``), whose tables hold every session key and password
    hash: for PostgreSQL / MySQL the same host (``localhost``, ``127.0.0.1``, ``::1``, this
    machine's own addresses and a Unix socket count as one; names are resolved), port and
    database name; for SQLite PAW's database file, or any file under ``PAW_VAR_DIR`` or
    the workspace root (by real path, so links do not help)."""
    if dialect == "sqlite":
        database = str(connection.get("database") or "")
        return bool(database) and _paw_sqlite_forbidden(database)
    from django.db import connections

    paw = connections["default"].settings_dict
    engine = str(paw.get("ENGINE", ""))
    if "sqlite" in engine:
        return False
    default_port = 3306 if "mysql" in engine else 5432
    paw_port = int(paw.get("PORT") or default_port)
    own_default = 3306 if dialect == "mysql" else 5432
    port_text = str(connection.get("port") or own_default)
    if not port_text.isdigit():
        return False  # not a port: connection_resolved_check refuses it
    port = int(port_text)
    # Names compared without case: MySQL's may ignore it, and a false alarm costs nothing.
    database = str(connection.get("database") or "").casefold()
    if port != paw_port or database != str(paw.get("NAME") or "").casefold():
        return False
    paw_hosts = _host_addresses(str(paw.get("HOST") or ""))
    return bool(paw_hosts & _host_addresses(str(connection.get("host") or "localhost")))


#: The error code of a datasource that reaches PAW's own database.
PAW_DATABASE_CODE = "datasource_is_paw_database"
PAW_DATABASE_MESSAGE = (
    "This connection reaches PAW's own database (its sessions and password hashes): a "
    "datasource must be another database."
)


def connection_url(*, dialect: str, connection: dict[str, Any], read_only: bool) -> str:
    """The URL of a datasource from its *resolved* connection settings (see the module
    docstring for the forms), checked first with :func:`connection_resolved_check`.
    Raises ``ValueError`` for an unknown dialect or settings that check refuses."""
    connection_resolved_check(dialect=dialect, connection=connection)
    options = {key: _option_text(value) for key, value in connection.get("options", {}).items()}
    if dialect == "sqlite":
        if read_only:
            options["mode"] = "ro"
        path = quote(str(connection["database"]), safe="/")
        return f"sqlite:///{path}" + (f"?{urlencode(options)}" if options else "")
    if dialect not in ("postgresql", "mysql"):
        raise ValueError(f"unknown dialect {dialect!r}")
    if dialect == "postgresql" and read_only:
        flag = "-c default_transaction_read_only=on"
        options["options"] = f"{options['options']} {flag}" if options.get("options") else flag
    user = quote(str(connection.get("user") or ""), safe="")
    password = quote(str(connection.get("password") or ""), safe="")
    userinfo = ""
    if user or password:
        userinfo = user + (f":{password}" if password else "") + "@"
    host = host_literal(str(connection.get("host") or "localhost")) or "localhost"
    port = f":{int(connection['port'])}" if connection.get("port") not in (None, "") else ""
    database = quote(str(connection.get("database") or ""), safe="")
    query = f"?{urlencode(options, quote_via=quote)}" if options else ""
    return f"{dialect}://{userinfo}{host}{port}/{database}{query}"


def _option_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@dataclass(frozen=True)
class ConnectionTestResult:
    """What a connection test found: ``ok`` and a one-line ``message`` for the operator
    (the server version, or why it failed); for a read-only PostgreSQL or MySQL
    datasource, ``privileges``: what its user can do beyond reading (None when not
    checked: another dialect, or no connection)."""

    ok: bool
    message: str
    privileges: UserPrivileges | None = None


#: PostgreSQL roles whose members reach beyond the database's rows — the server's files
#: and programs, other sessions (PostgreSQL 17 manual, "Predefined Roles"): the user of a
#: read-only datasource is refused when it is a superuser or a member of one.
POSTGRESQL_REFUSED_ROLES = (
    "pg_read_server_files", "pg_write_server_files", "pg_execute_server_program",
    "pg_signal_backend",
)  # fmt: skip
#: PostgreSQL's administration functions that only a superuser may run unless EXECUTE
#: is granted (PostgreSQL 17 manual, "System Administration Functions"; PUBLIC has none
#: of them): the server's files and directories, large-object files, configuration,
#: logs, WAL and backups, statistics resets. A read-only datasource's user that may
#: execute one (itself or through a role it is a member of) is refused. Not here:
#: ``pg_cancel_backend`` / ``pg_terminate_backend`` and ``set_config``, which every role
#: may execute and which check for themselves (another role's sessions need
#: ``pg_signal_backend``, refused above; a user's own settings are the judge's business).
POSTGRESQL_ADMIN_FUNCTIONS = (
    "pg_read_file", "pg_read_binary_file", "pg_ls_dir", "pg_stat_file", "pg_ls_logdir",
    "pg_ls_waldir", "pg_ls_tmpdir", "pg_ls_archive_statusdir", "pg_ls_logicalsnapdir",
    "pg_ls_logicalmapdir", "pg_ls_replslotdir", "pg_current_logfile", "lo_import",
    "lo_export", "pg_reload_conf", "pg_rotate_logfile", "pg_promote", "pg_backup_start",
    "pg_backup_stop", "pg_start_backup", "pg_stop_backup", "pg_switch_wal",
    "pg_create_restore_point", "pg_log_backend_memory_contexts", "pg_stat_reset",
    "pg_stat_reset_shared", "pg_stat_reset_single_table_counters",
    "pg_stat_reset_single_function_counters", "pg_stat_reset_slru",
    "pg_stat_reset_replication_slot", "pg_replication_origin_create",
    "pg_replication_origin_drop", "pg_replication_origin_advance", "pg_file_write",
    "pg_file_rename", "pg_file_unlink", "pg_file_sync", "pg_logdir_ls",
)  # fmt: skip
#: PostgreSQL role attributes that reach beyond reading (roles, databases, row security,
#: the WAL stream), with their ``pg_roles`` columns in the order the check reads them:
#: refused on the user and on any role it is a member of (SET ROLE).
_POSTGRESQL_REFUSED_ATTRIBUTES = (
    ("CREATEROLE", "rolcreaterole"), ("CREATEDB", "rolcreatedb"),
    ("REPLICATION", "rolreplication"), ("BYPASSRLS", "rolbypassrls"),
)  # fmt: skip
#: PostgreSQL roles worth saying, whose powers a read-only transaction contains.
_POSTGRESQL_NOTED_ROLES = ("pg_write_all_data",)
#: The MySQL / MariaDB privileges that only read: any other one a read-only datasource's
#: user holds (``FILE``, ``SUPER``, ``PROCESS``, every write privilege...) is refused.
MYSQL_READ_PRIVILEGES = frozenset({"USAGE", "SELECT", "SHOW VIEW", "SHOW DATABASES"})


@dataclass(frozen=True)
class UserPrivileges:
    """What a database user can do beyond reading. ``refused``: the powers for which PAW
    refuses it as the user of a read-only datasource (``superuser``, ``member of
    pg_signal_backend``, ``FILE``, ``INSERT``...); ``noted``: more it can do that the
    read-only transaction contains (``can change 3 tables``, ``CREATEDB``)."""

    refused: tuple[str, ...] = ()
    noted: tuple[str, ...] = ()

    def text(self) -> str:
        """One sentence for the operator ("Its user can only read." or what more)."""
        if not self.refused and not self.noted:
            return "Its user can only read."
        shown = list(self.refused[:12]) + (
            [f"{len(self.refused) - 12} more"] if len(self.refused) > 12 else []
        )
        parts = []
        if shown:
            parts.append("Its user can do more than read: " + ", ".join(shown) + ".")
        if self.noted:
            parts.append(
                "It can also " + "; ".join(self.noted) + " (the read-only transaction stops that)."
            )
        return " ".join(parts)


def user_privileges(*, dialect: str, conn: Any) -> UserPrivileges:
    """What the user of the open DB-API connection ``conn`` can do beyond reading
    (PostgreSQL: superuser, membership of :data:`POSTGRESQL_REFUSED_ROLES`, EXECUTE on
    :data:`POSTGRESQL_ADMIN_FUNCTIONS` or a superuser's SECURITY DEFINER function, role
    attributes, tables it may change; MySQL / MariaDB: every privilege outside
    :data:`MYSQL_READ_PRIVILEGES`, global, per database, table or column, its own and its
    roles'). SQLite has no users: nothing. Driver errors pass through."""
    if dialect == "postgresql":
        return _postgresql_privileges(conn)
    if dialect == "mysql":
        return _mysql_privileges(conn)
    return UserPrivileges()


def _postgresql_privileges(conn: Any) -> UserPrivileges:
    """What a PostgreSQL user can do beyond reading. Refused: superuser; membership of a
    superuser role or of :data:`POSTGRESQL_REFUSED_ROLES`; EXECUTE on one of
    :data:`POSTGRESQL_ADMIN_FUNCTIONS`; EXECUTE on a superuser's ``SECURITY DEFINER``
    function outside ``pg_catalog`` / ``information_schema`` (it runs as the superuser);
    ``CREATEROLE``, ``CREATEDB``, ``REPLICATION``, ``BYPASSRLS`` — each held by the user or
    by a role it is a member of (``pg_has_role(…, 'MEMBER')``: ``NOINHERIT`` members too,
    since ``SET ROLE`` gives them all). Noted: tables it may change, ``pg_write_all_data``."""
    row = conn.execute(
        "SELECT rolsuper, current_user FROM pg_roles WHERE rolname = current_user"
    ).fetchone()
    superuser, user = (bool(row[0]), str(row[1])) if row else (False, "")
    refused = ["superuser"] if superuser else []
    if not superuser:
        # A member of a superuser role (NOINHERIT too) becomes one with SET ROLE.
        refused += [
            f"member of the superuser role {name}"
            for (name,) in conn.execute(
                "SELECT rolname FROM pg_roles WHERE rolsuper AND rolname <> current_user "
                "AND pg_has_role(current_user, oid, 'MEMBER') ORDER BY rolname"
            ).fetchall()
        ]
    roles = list(POSTGRESQL_REFUSED_ROLES + _POSTGRESQL_NOTED_ROLES)
    members = {
        name
        for (name,) in conn.execute(
            "SELECT r FROM unnest(%s::text[]) AS r "
            "WHERE to_regrole(r) IS NOT NULL AND pg_has_role(current_user, r, 'MEMBER')",
            [roles],
        ).fetchall()
    }
    if not superuser:  # a superuser counts as a member of every role: say it once
        refused += [f"member of {name}" for name in POSTGRESQL_REFUSED_ROLES if name in members]
        refused += _postgresql_executable(conn)
        for role, *held in conn.execute(
            "SELECT rolname, rolcreaterole, rolcreatedb, rolreplication, rolbypassrls "
            "FROM pg_roles WHERE pg_has_role(current_user, oid, 'MEMBER') AND NOT rolsuper "
            "ORDER BY rolname <> current_user, rolname"
        ).fetchall():
            refused += [
                word if role == user else f"{word} through role {role}"
                for (word, _), has in zip(_POSTGRESQL_REFUSED_ATTRIBUTES, held, strict=True)
                if has
            ]
    writable = conn.execute(
        "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE c.relkind IN ('r', 'p') "
        "AND n.nspname NOT IN ('pg_catalog', 'information_schema') "
        "AND n.nspname NOT LIKE 'pg_toast%' "
        "AND has_table_privilege(c.oid, 'INSERT, UPDATE, DELETE, TRUNCATE')"
    ).fetchone()[0]
    noted = [f"change {writable} table{'s' if writable != 1 else ''}"] if writable else []
    noted += [
        f"member of {name}" for name in _POSTGRESQL_NOTED_ROLES if name in members and not superuser
    ]
    return UserPrivileges(refused=tuple(refused), noted=tuple(noted))


def _postgresql_executable(conn: Any) -> list[str]:
    """``EXECUTE on <function>`` for each of :data:`POSTGRESQL_ADMIN_FUNCTIONS` and each
    superuser-owned ``SECURITY DEFINER`` function outside the system schemas (in a schema
    it may use) that the user, or a role it is a member of, may execute."""
    admin = [
        f"EXECUTE on {name}"
        for (name,) in conn.execute(
            "SELECT DISTINCT p.proname FROM pg_proc p "
            "JOIN pg_namespace n ON n.oid = p.pronamespace "
            "JOIN pg_roles r ON pg_has_role(current_user, r.oid, 'MEMBER') AND NOT r.rolsuper "
            "WHERE n.nspname = 'pg_catalog' AND p.proname = ANY(%s) "
            "AND has_function_privilege(r.oid, p.oid, 'EXECUTE') ORDER BY 1",
            [list(POSTGRESQL_ADMIN_FUNCTIONS)],
        ).fetchall()
    ]
    definer = [
        f"EXECUTE on {name}, a superuser's SECURITY DEFINER function"
        for (name,) in conn.execute(
            "SELECT DISTINCT n.nspname || '.' || p.proname FROM pg_proc p "
            "JOIN pg_namespace n ON n.oid = p.pronamespace "
            "JOIN pg_roles o ON o.oid = p.proowner "
            "JOIN pg_roles r ON pg_has_role(current_user, r.oid, 'MEMBER') AND NOT r.rolsuper "
            "WHERE p.prosecdef AND o.rolsuper "
            "AND n.nspname NOT IN ('pg_catalog', 'information_schema') "
            "AND has_schema_privilege(r.oid, n.oid, 'USAGE') "
            "AND has_function_privilege(r.oid, p.oid, 'EXECUTE') ORDER BY 1 LIMIT 20"
        ).fetchall()
    ]
    return admin + definer


def _mysql_privileges(conn: Any) -> UserPrivileges:
    """Every privilege the user holds, read from ``SHOW GRANTS`` — its own, each role it
    may take (``SET ROLE`` each in turn: a role's grants show only while it is the
    current one, nested roles included) and ``PUBLIC``'s (MariaDB 10.11+) — since
    ``information_schema``'s privilege views leave out roles and ``PUBLIC``. What is not a
    read: any privilege outside :data:`MYSQL_READ_PRIVILEGES`, ``WITH GRANT OPTION``,
    ``PROXY``, a privilege on a routine, and any grant line that cannot be read."""
    lines: list[str] = []
    with conn.cursor() as cursor:
        cursor.execute("SHOW GRANTS")
        lines += [str(row[0]) for row in cursor.fetchall()]
        roles: list[str] = []
        with contextlib.suppress(Exception):  # roles: MariaDB 10.0.5+, MySQL 8.0.19+
            cursor.execute("SELECT ROLE_NAME FROM information_schema.APPLICABLE_ROLES")
            roles = [str(name) for (name,) in cursor.fetchall()]
        for role in roles:
            with contextlib.suppress(Exception):
                cursor.execute("SET ROLE %s", (role,))
                cursor.execute("SHOW GRANTS")
                lines += [str(row[0]) for row in cursor.fetchall()]
        with contextlib.suppress(Exception):
            cursor.execute("SET ROLE DEFAULT")
        with contextlib.suppress(Exception):  # PUBLIC: MariaDB 10.11+
            cursor.execute("SHOW GRANTS FOR PUBLIC")
            lines += [str(row[0]) for row in cursor.fetchall()]
        # The privilege views too: they spell ALL PRIVILEGES out (FILE, SUPER...).
        cursor.execute("SELECT CURRENT_USER()")
        user, _, host = str(cursor.fetchone()[0]).rpartition("@")
        found: set[str] = set()
        for table in ("USER_PRIVILEGES", "SCHEMA_PRIVILEGES", "TABLE_PRIVILEGES",
                      "COLUMN_PRIVILEGES"):  # fmt: skip
            cursor.execute(
                f"SELECT PRIVILEGE_TYPE FROM information_schema.{table} "  # noqa: S608 - fixed names
                "WHERE GRANTEE = %s",
                [f"'{user}'@'{host}'"],
            )
            found.update(str(name).upper() for (name,) in cursor.fetchall())
    found -= MYSQL_READ_PRIVILEGES
    for line in dict.fromkeys(lines):
        found.update(_mysql_grant_powers(line))
    return UserPrivileges(refused=tuple(sorted(found)))


def _mysql_grant_powers(line: str) -> set[str]:
    """What one ``SHOW GRANTS`` line gives beyond reading: ``GRANT <privileges> ON
    <object> TO <grantee> [... WITH GRANT OPTION]`` → the privileges outside
    :data:`MYSQL_READ_PRIVILEGES` (``ALL PRIVILEGES`` as is), ``EXECUTE on a routine``,
    ``GRANT OPTION``, ``PROXY``, ``SELECT on *.*`` (every database, ``mysql`` with its
    password hashes too) and ``SELECT on mysql.…``; a role grant (``GRANT role TO user``:
    no ``ON``) gives nothing by itself (its grants are read with the role), nor does the
    ``SET DEFAULT ROLE role FOR user`` line MariaDB adds to them. Tokens by sqlglot's MySQL
    tokenizer (names and quotes as the server writes them); a line it cannot read counts
    as ``an unreadable grant``."""
    from sqlglot.dialects.dialect import Dialect
    from sqlglot.tokens import TokenType

    try:
        tokens = Dialect.get_or_raise("mysql").tokenize(line)
    except Exception:
        return {f"an unreadable grant ({line[:60]})"}
    # Quoted names and strings are objects and grantees, never the grammar's words.
    quoted = (TokenType.STRING, TokenType.IDENTIFIER)
    words = [t.text.upper() if t.token_type not in quoted else "`" for t in tokens]
    if words[:3] == ["SET", "DEFAULT", "ROLE"]:
        return set()  # MariaDB lists the user's default role among its grants: no grant
    if not words or words[0] != "GRANT" or "TO" not in words:
        return {f"an unreadable grant ({line[:60]})"}
    powers: set[str] = set()
    if "WITH" in words and "GRANT" in words[words.index("WITH") :]:
        powers.add("GRANT OPTION")
    if "ON" not in words or words.index("ON") > words.index("TO"):
        return powers  # a role granted: its own grants are read with it
    on = words.index("ON")
    privileges, current, depth = [], [], 0
    for word in words[1:on]:
        if word == "(":
            depth += 1
        elif word == ")":
            depth -= 1
        elif depth == 0 and word == ",":
            privileges.append(" ".join(current))
            current = []
        elif depth == 0:
            current.append(word)
    privileges.append(" ".join(current))
    target = words[on + 1] if on + 1 < len(words) else ""
    # The object as the server names it: `mysql`.* → mysql.*, *.* → *.* (lower case).
    to = words.index("TO", on)
    grant_object = "".join(str(t.text) for t in tokens[on + 1 : to]).lower()
    database = grant_object.partition(".")[0]
    for privilege in filter(None, privileges):
        if privilege == "PROXY":
            powers.add("PROXY")
        elif target in ("FUNCTION", "PROCEDURE", "PACKAGE"):
            powers.add(f"{privilege} on a {target.lower()}")
        elif privilege not in MYSQL_READ_PRIVILEGES:
            powers.add(privilege)
        elif privilege == "SELECT" and grant_object == "*.*":
            # Every database's tables: mysql.user / mysql.global_priv (password hashes)
            # and any other application's data on the server.
            powers.add("SELECT on *.*")
        elif privilege == "SELECT" and database == "mysql":
            powers.add(f"SELECT on {grant_object}")
    return powers


def connection_test(
    *, dialect: str, connection: dict[str, Any], read_only: bool
) -> ConnectionTestResult:
    """Really connect to the database described by *resolved* ``connection`` settings and
    run one harmless query, within :data:`CONNECT_TIMEOUT` seconds. Never raises for a
    database failure: it is reported in the result. The caller masks secret values in
    the message (a driver may echo what it was given)."""
    try:
        if dialect == "postgresql":
            return _test_postgresql(connection, read_only)
        if dialect == "sqlite":
            return _test_sqlite(connection, read_only)
        if dialect == "mysql":
            return _test_mysql(connection, read_only)
        return ConnectionTestResult(False, f"Unknown dialect {dialect!r}.")
    except ImportError:
        return ConnectionTestResult(False, "The MySQL driver (PyMySQL) is not installed.")
    except Exception as exc:  # any driver failure is the answer
        return ConnectionTestResult(False, f"Connection failed: {driver_message(exc)}")


def _test_postgresql(connection: dict[str, Any], read_only: bool) -> ConnectionTestResult:
    with database_connection(
        dialect="postgresql", connection=connection, read_only=read_only, timeout=CONNECT_TIMEOUT
    ) as conn:
        version = conn.execute("SHOW server_version").fetchone()[0]
        ro = conn.execute("SHOW default_transaction_read_only").fetchone()[0] == "on"
        privileges = user_privileges(dialect="postgresql", conn=conn) if read_only else None
    mode = "read-only" if ro else "read-write"
    return _with_privileges(f"Connected to PostgreSQL {version} ({mode}).", privileges)


def _with_privileges(message: str, privileges: UserPrivileges | None) -> ConnectionTestResult:
    """A successful connection's result; a read-only datasource's user that can do more
    than read makes it a failure (PAW would not save it)."""
    if privileges is None:
        return ConnectionTestResult(True, message)
    return ConnectionTestResult(
        not privileges.refused, f"{message} {privileges.text()}", privileges=privileges
    )


def _test_sqlite(connection: dict[str, Any], read_only: bool) -> ConnectionTestResult:
    with database_connection(
        dialect="sqlite", connection=connection, read_only=read_only, timeout=CONNECT_TIMEOUT
    ) as conn:
        tables = conn.execute("SELECT count(*) FROM sqlite_master WHERE type = 'table'")
        count = tables.fetchone()[0]
    mode_text = "read-only" if read_only else "read-write"
    return ConnectionTestResult(
        True, f"Connected to SQLite {sqlite3.sqlite_version} ({mode_text}), {count} table(s)."
    )


def _test_mysql(connection: dict[str, Any], read_only: bool) -> ConnectionTestResult:
    with (
        database_connection(
            dialect="mysql", connection=connection, read_only=read_only, timeout=CONNECT_TIMEOUT
        ) as conn,
        conn.cursor() as cursor,
    ):
        cursor.execute("SELECT VERSION()")
        version = cursor.fetchone()[0]
        privileges = user_privileges(dialect="mysql", conn=conn) if read_only else None
    mode = "read-only" if read_only else "read-write"
    return _with_privileges(f"Connected to MySQL/MariaDB {version} ({mode}).", privileges)


class ConnectionFailed(Exception):
    """The database could not be reached or refused a statement; the message is the
    driver's (the caller masks secret values in it)."""


@contextlib.contextmanager
def database_connection(
    *, dialect: str, connection: dict[str, Any], read_only: bool, timeout: float
) -> Iterator[Any]:
    """An open DB-API connection to the database described by *resolved* ``connection``
    settings, closed (its transaction rolled back) on exit.

    ``read_only`` makes the database itself refuse writes: PostgreSQL read-only
    transactions, MySQL/MariaDB ``SET SESSION TRANSACTION READ ONLY``, SQLite
    ``mode=ro``. ``timeout`` seconds bound connecting and each statement (PostgreSQL
    ``statement_timeout``, MariaDB ``max_statement_time`` / MySQL ``max_execution_time``,
    SQLite an interrupt). An SQLite file that does not exist is an error (sqlite3 would
    create it); an SQLite connection makes no value over ``paw_sqlcheck.SQLITE_MAX_LENGTH``
    bytes. The session must lex statements as ``paw_sqlcheck`` does (PostgreSQL
    ``standard_conforming_strings`` on; MySQL without ``ANSI_QUOTES`` and
    ``NO_BACKSLASH_ESCAPES`` once PAW removed them): ``paw_sqlcheck.SessionMismatch``
    otherwise. Driver exceptions pass through; ``ImportError`` when PyMySQL is missing.
    """
    if dialect == "postgresql":
        import psycopg
        from psycopg.conninfo import conninfo_to_dict

        url = connection_url(dialect="postgresql", connection=connection, read_only=read_only)
        # The URL's own options (a read-only datasource's default) stay beside the timeout.
        options = conninfo_to_dict(url).get("options") or ""
        conn = psycopg.connect(
            url,
            connect_timeout=max(1, int(timeout)),
            options=(
                f"{options} -c statement_timeout={int(timeout * 1000)} {POSTGRESQL_SESSION_OPTIONS}"
            ).strip(),
            application_name="paw",
        )
        if conn.info.parameter_status("standard_conforming_strings") != "on":
            conn.close()
            raise SessionMismatch(
                "the server keeps standard_conforming_strings off: PAW cannot tell what a "
                "statement does there"
            )
        if read_only:
            conn.read_only = True
        with contextlib.closing(conn):
            yield conn
            conn.rollback()
    elif dialect == "mysql":
        import pymysql

        connection_resolved_check(dialect="mysql", connection=connection)
        conn = pymysql.connect(
            host=connection.get("host") or "localhost",
            port=int(connection.get("port") or 3306),
            user=connection.get("user") or None,
            password=connection.get("password") or "",
            database=connection.get("database") or None,
            connect_timeout=max(1, int(timeout)),
            read_timeout=timeout + 5,  # a backstop: the server's own limit comes first
            charset="utf8mb4",
            **{k: v for k, v in connection.get("options", {}).items() if k in MYSQL_OPTIONS},
        )
        with contextlib.closing(conn):
            with conn.cursor() as cursor:
                # A deliberate twin of paw-agent's _run_mysql set-up (the runtime imports
                # nothing of PAW's server): the same limits and the parser's sql_mode.
                cursor.execute("SELECT VERSION()")
                if "mariadb" in str(cursor.fetchone()[0]).lower():
                    cursor.execute(f"SET SESSION max_statement_time = {float(timeout)}")
                else:
                    cursor.execute(f"SET SESSION max_execution_time = {int(timeout * 1000)}")
                cursor.execute("SELECT @@SESSION.sql_mode")
                cursor.execute("SET SESSION sql_mode = %s", (mysql_sql_mode(cursor.fetchone()[0]),))
                cursor.execute("SELECT @@SESSION.sql_mode")
                if not mysql_mode_lexes_as_parsed(cursor.fetchone()[0]):
                    raise SessionMismatch(
                        "the server keeps ANSI_QUOTES or NO_BACKSLASH_ESCAPES on: PAW cannot "
                        "tell what a statement does there"
                    )
                if read_only:
                    cursor.execute("SET SESSION TRANSACTION READ ONLY")
            yield conn
            conn.rollback()
    elif dialect == "sqlite":
        path = Path(str(connection.get("database", "")))
        if not path.is_file():
            raise ConnectionFailed(f"no such file {path}.")
        mode = "ro" if read_only else "rw"
        uri = f"file:{quote(str(path), safe='/')}?mode={mode}"
        conn = sqlite_limit(sqlite3.connect(uri, uri=True, timeout=min(timeout, CONNECT_TIMEOUT)))
        timer = threading.Timer(timeout, conn.interrupt)
        timer.daemon = True
        timer.start()
        try:
            with contextlib.closing(conn):
                yield conn
                conn.rollback()
        finally:
            timer.cancel()
    else:
        raise ValueError(f"unknown dialect {dialect!r}")


#: PyMySQL ``connect()`` parameters an operator may set in ``options`` (TLS).
MYSQL_OPTIONS = frozenset(
    {"ssl_ca", "ssl_cert", "ssl_key", "ssl_verify_cert", "ssl_verify_identity", "ssl_disabled"}
)


def driver_message(exc: BaseException) -> str:
    """A driver error as one line of text (what the database said)."""
    return " ".join(str(exc).split()) or type(exc).__name__


@dataclass(frozen=True)
class QueryCheck:
    """A statement run read-only: ``columns`` and how many ``rows`` came back (at most
    ``QUERY_CHECK_ROWS`` are read)."""

    columns: list[str]
    rows: int


QUERY_CHECK_ROWS = 1000


class NotARead(ValueError):
    """A statement that is not one read by ``paw_sqlcheck.judge`` (the rule paw-agent's
    ``run_sql`` applies): refused before anything reaches the database. ``code`` is the
    verdict's (``writes``, ``function``...); the message is its reason."""

    def __init__(self, message: str, *, code: str) -> None:
        super().__init__(message)
        self.code = code


def query_check(
    *, dialect: str, connection: dict[str, Any], sql: str, timeout: float
) -> QueryCheck:
    """Run ``sql`` read-only on the database (whatever the datasource's own flag), within
    ``timeout`` seconds, and roll back. It must return a result set: an example is a
    question and the query that answers it.

    First ``sql`` must be one read by the rule ``run_sql`` applies (``paw_sqlcheck.judge``
    for ``dialect``: one SELECT / WITH / EXPLAIN, nothing in its tree that changes data,
    only allow-listed functions): otherwise :class:`NotARead` is raised and nothing is
    sent to the database (``COPY ... TO PROGRAM``, ``ATTACH DATABASE``,
    ``pg_read_file(...)`` never run). The read-only transaction and the timeout stay as
    the second line.

    Raises :class:`ConnectionFailed` with the database's own message when it cannot
    connect, refuses or fails the statement, times out, or returns no result set.
    """
    verdict = judge(sql, dialect=dialect)
    if not verdict.read:
        raise NotARead(
            f"an example's SQL must be one read, and this is not: {verdict.reason}.",
            code=verdict.code,
        )
    try:
        with database_connection(
            dialect=dialect, connection=connection, read_only=True, timeout=timeout
        ) as conn:
            cursor = conn.cursor()
            try:
                cursor.execute(sql)
                if cursor.description is None:
                    raise ConnectionFailed(
                        "the statement returned no rows to look at (an example must be a query)."
                    )
                columns = [str(d[0]) for d in cursor.description]
                rows = len(cursor.fetchmany(QUERY_CHECK_ROWS))
            finally:
                cursor.close()
    except ConnectionFailed:
        raise
    except Exception as exc:  # every driver's error is the answer
        raise ConnectionFailed(driver_message(exc)) from exc
    return QueryCheck(columns=columns, rows=rows)
