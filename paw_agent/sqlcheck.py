"""What counts as a read: one ``SELECT`` / ``WITH`` / ``EXPLAIN`` statement that changes
nothing. Pure (the standard library only, nothing else of paw-agent), so PAW's server
reuses it too: a knowledge example is checked by the very rule ``run_sql`` applies
(``secrets_vault.connections.query_check``; the one import of paw-agent PAW's
import-linter contracts allow).

A statement is a read when it is a single statement (top-level ``;`` split, comments and
string literals blanked), its first keyword is ``SELECT``, ``WITH`` or ``EXPLAIN``, no
data-changing keyword appears anywhere (:data:`WRITE_KEYWORDS`: ``SELECT … INTO
OUTFILE``, data-modifying CTEs, ``EXPLAIN ANALYZE DELETE``, ``FOR UPDATE``...), and it
calls none of :data:`SIDE_EFFECT_FUNCTIONS` (signalling other sessions, reading or
writing the server's files, large objects, remote links, advisory locks, settings),
which a database runs even inside a read-only transaction.
"""

from __future__ import annotations

import re

READ_KEYWORDS = frozenset({"select", "with", "explain"})
# Keywords that make a SELECT / WITH / EXPLAIN change data: data-modifying CTEs, EXPLAIN
# ANALYZE of a write, SELECT INTO (and MySQL's INTO OUTFILE / DUMPFILE), row locks (FOR
# UPDATE). Other statements already fail the first-keyword test.
WRITE_KEYWORDS = frozenset(
    {"insert", "update", "delete", "merge", "upsert", "into", "create", "drop", "alter",
     "truncate", "copy", "grant", "revoke", "lock", "outfile", "dumpfile"}
)  # fmt: skip
#: Functions with effects beyond the statement's own rows, allowed by PostgreSQL, MySQL
#: / MariaDB or SQLite even in a read-only transaction: a call to any of them (with or
#: without a schema, quoted or not) makes a statement a write.
SIDE_EFFECT_FUNCTIONS = frozenset(
    {
        # PostgreSQL: other sessions, the server, its files, large objects, links, locks.
        "pg_cancel_backend", "pg_terminate_backend", "pg_reload_conf", "pg_rotate_logfile",
        "pg_log_backend_memory_contexts", "pg_switch_wal", "pg_create_restore_point",
        "pg_promote", "pg_wal_replay_pause", "pg_wal_replay_resume", "pg_backup_start",
        "pg_backup_stop", "pg_start_backup", "pg_stop_backup", "pg_read_file",
        "pg_read_binary_file", "pg_ls_dir", "pg_stat_file", "pg_ls_logdir", "pg_ls_waldir",
        "pg_ls_tmpdir", "pg_ls_archive_statusdir", "pg_file_write", "pg_file_unlink",
        "pg_file_rename", "lo_import", "lo_export", "lo_unlink", "lo_create", "lo_creat",
        "lo_from_bytea", "lo_put", "lowrite", "lo_truncate", "dblink", "dblink_exec",
        "dblink_connect", "dblink_connect_u", "dblink_send_query", "set_config",
        "pg_advisory_lock", "pg_advisory_lock_shared", "pg_advisory_xact_lock",
        "pg_advisory_xact_lock_shared", "pg_try_advisory_lock", "pg_try_advisory_xact_lock",
        "pg_notify", "pg_replication_origin_create", "pg_create_logical_replication_slot",
        "pg_create_physical_replication_slot", "pg_drop_replication_slot",
        # MySQL / MariaDB: the server's files, locks, UDF shells.
        "load_file", "get_lock", "release_lock", "release_all_locks", "sys_exec", "sys_eval",
        # SQLite: extensions and the shell's file functions.
        "load_extension", "writefile", "readfile", "edit", "fts3_tokenizer",
    }
)  # fmt: skip

_STRIP = re.compile(
    r"""--[^\n]*|/\*.*?\*/|'(?:[^']|'')*'|"(?:[^"]|"")*"|\$([A-Za-z_]*)\$.*?\$\1\$""",
    re.DOTALL,
)
# Comments and string literals only: quoted identifiers keep their text (a function may be
# called by its quoted name).
_STRIP_LITERALS = re.compile(
    r"""--[^\n]*|/\*.*?\*/|'(?:[^']|'')*'|\$([A-Za-z_]*)\$.*?\$\1\$""", re.DOTALL
)
_CALL = re.compile(r"([A-Za-z_][A-Za-z0-9_$]*)\s*\(")


def statements(sql: str) -> list[str]:
    """The statements of ``sql`` with comments and string literals blanked out (for
    keyword checks only), split on top-level ``;``; empty ones dropped."""
    blanked = _STRIP.sub(" '' ", sql)
    return [part.strip() for part in blanked.split(";") if part.strip()]


def called_functions(sql: str) -> set[str]:
    """The lower-case names of every function ``sql`` calls (``name(``, quoted names
    unquoted, a schema prefix ignored), comments and string literals left out."""
    text = _STRIP_LITERALS.sub(" '' ", sql).replace('"', "").replace("`", "")
    return {match.group(1).lower() for match in _CALL.finditer(text)}


def is_read_only(sql: str) -> bool:
    """True when ``sql`` is one SELECT / WITH / EXPLAIN statement with no data-changing
    keyword anywhere (``EXPLAIN ANALYZE DELETE``, ``WITH … DELETE``, ``SELECT … INTO``
    are writes) and no call to a function with side effects
    (:data:`SIDE_EFFECT_FUNCTIONS`, e.g. ``pg_cancel_backend``, ``lo_export``,
    ``load_file``)."""
    parts = statements(sql)
    if len(parts) != 1:
        return False
    words = {w.lower() for w in re.findall(r"[A-Za-z_]+", parts[0])}
    first = re.match(r"\(*\s*([A-Za-z]+)", parts[0])
    if not first or first.group(1).lower() not in READ_KEYWORDS or words & WRITE_KEYWORDS:
        return False
    return not (called_functions(sql) & SIDE_EFFECT_FUNCTIONS)
