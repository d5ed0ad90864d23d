"""How a sandbox process is put together: its private folders, the variables kept out of
its environment, the SQLite files bound into its jail."""

from __future__ import annotations

import os

import pytest

from sandboxes.host_folder import host_file_put, host_file_remove, host_files
from sandboxes.launch import (
    private_variables,
    sandbox_dirs,
    sqlite_datasource_binds,
)
from secrets_vault.services.sandbox import RunDatasource


def datasource(slug: str, dialect: str, env_name: str, *, read_only: bool = True) -> RunDatasource:
    """A run's datasource as the sandbox spec carries it."""
    return RunDatasource(
        slug=slug, name=slug, dialect=dialect, description="", env_name=env_name,
        read_only=read_only,
    )  # fmt: skip


def test_private_folders_are_made_real_even_where_the_agent_left_a_symlink(tmp_path):
    """The workspace is the agent's: a `.paw` symlink to elsewhere (or a dangling one)
    must not lead PAW's own mkdir outside it, nor break the conversation."""
    workspace, outside = tmp_path / "workspace", tmp_path / "outside"
    workspace.mkdir()
    outside.mkdir()
    (workspace / ".paw").symlink_to(outside)
    dirs = sandbox_dirs(workspace)
    assert list(outside.iterdir()) == []
    assert not (workspace / ".paw").is_symlink()
    assert all(path.is_dir() and not path.is_symlink() for path in dirs.values())
    (workspace / ".paw" / "tmp").rmdir()
    (workspace / ".paw" / "tmp").symlink_to(tmp_path / "gone")  # dangling
    (workspace / ".paw" / "home" / ".cache").rmdir()
    (workspace / ".paw" / "home" / ".cache").write_text("a file where a folder belongs")
    dirs = sandbox_dirs(workspace)
    assert dirs["tmp"].is_dir() and not dirs["tmp"].is_symlink()
    assert dirs["cache"].is_dir()


def test_the_provider_key_and_datasource_urls_are_the_private_variables():
    env = {
        "OPENAI_API_KEY": "sk-1",
        "OPENAI_BASE_URL": "http://model/v1",
        "SHOP_DB": "postgres://u:pw@db/shop",
        "PAW_DATASOURCE_OTHER_URL": "sqlite:////x.db",
        "MY_TOKEN": "the user's own, for their tools",
    }
    assert private_variables(env, (datasource("shop", "postgresql", "SHOP_DB"),)) == {
        "OPENAI_API_KEY": "sk-1",
        "SHOP_DB": "postgres://u:pw@db/shop",
        "PAW_DATASOURCE_OTHER_URL": "sqlite:////x.db",
    }


def test_sqlite_files_are_bound_read_only_unless_the_datasource_may_write(tmp_path):
    datasources = (
        datasource("ro", "sqlite", "RO_URL", read_only=True),
        datasource("rw", "sqlite", "RW_URL", read_only=False),
        datasource("pg", "postgresql", "PG_URL"),
    )
    env = {
        "RO_URL": "sqlite:////data/shop%20file.db?mode=ro",
        "RW_URL": "sqlite:////data/rw/notes.db",
        "PG_URL": "postgres://db/x",
    }
    binds = sqlite_datasource_binds(env, datasources)
    assert binds[:3] == ["--ro-bind-try", "/data/shop file.db", "/data/shop file.db"]
    assert "/data/shop file.db-wal" in binds
    assert binds[-3:] == ["--bind-try", "/data/rw", "/data/rw"]
    assert not any("db/x" in item for item in binds)


def test_files_go_into_the_sandboxs_host_folder_never_through_a_link(tmp_path):
    """PAW's own files for the sandbox (knowledge indexes) land in ``.paw/host``; a link the
    agent left (for the file, or for the folder itself) is replaced or refused, never
    followed outside the workspace."""
    workspace, outside = tmp_path / "workspace", tmp_path / "outside"
    workspace.mkdir()
    outside.mkdir()
    (outside / "precious").write_text("keep me")
    knowledge = sandbox_dirs(workspace)["knowledge"]
    (knowledge / "shop.v1.sqlite3").symlink_to(outside / "precious")
    host_file_put(workspace, ("knowledge",), "shop.v1.sqlite3", b"index")
    assert (outside / "precious").read_text() == "keep me"
    target = knowledge / "shop.v1.sqlite3"
    assert not target.is_symlink() and target.read_bytes() == b"index"
    assert oct(target.stat().st_mode & 0o777) == "0o444"
    (knowledge / "dangling").symlink_to(outside / "nothing")
    assert host_files(workspace, ("knowledge",)) == ["shop.v1.sqlite3"]  # no links listed
    host_file_remove(workspace, ("knowledge",), "shop.v1.sqlite3")
    assert not target.exists()
    # The folder itself swapped for a link: refused, nothing written outside.
    os.rename(knowledge, tmp_path / "moved")
    knowledge.symlink_to(outside)
    with pytest.raises(OSError):
        host_file_put(workspace, ("knowledge",), "shop.v2.sqlite3", b"index")
    assert [p.name for p in outside.iterdir()] == ["precious"]
