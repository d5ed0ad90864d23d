"""Factories for test data (factory-boy)."""

from __future__ import annotations

import uuid

import factory
from django.contrib.auth import get_user_model

from conversations.models import Conversation
from secrets_vault.models import Datasource
from secrets_vault.services import datasource_create
from teams.models import Access


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda u: f"{u.username}@example.org")
    password = factory.PostGenerationMethodCall("set_password", "correct-horse-battery")

    @factory.post_generation
    def _save(obj, create, extracted, **kwargs):
        if create:
            obj.save()


class ConversationFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Conversation

    user = factory.SubFactory(UserFactory)
    title = factory.Sequence(lambda n: f"Conversation {n}")


def conversation_of(user, **fields) -> Conversation:
    """A conversation of ``user`` with exactly ``fields`` (the model's defaults otherwise)."""
    return Conversation.objects.create(user=user, **fields)


def missing_id() -> str:
    """A UUID no row has."""
    return str(uuid.uuid4())


def datasource_made(**fields) -> Datasource:
    """A datasource made as an operator makes one (``services.datasource_create``: checked,
    its database user's privileges too), open to everyone signed in unless ``access``
    says otherwise: for the tests that are not about access (a new datasource is for staff
    only by default)."""
    return datasource_create(**{"access": Access.EVERYONE, **fields})
