"""Reads for accounts."""

from __future__ import annotations

from django.db.models import QuerySet

from accounts.models import PersonalToken, User


def personal_token_list(*, user: User) -> QuerySet[PersonalToken]:
    """``user``'s personal API tokens that a logout or password change has not revoked,
    newest first (expired ones included: they show as expired until deleted)."""
    return PersonalToken.objects.filter(user=user, token_version=user.token_version)
