"""Which PAW user an identity at the OpenID Connect provider is."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class OidcIdentity(models.Model):
    """A person at the provider, ``(issuer, subject)`` (the ID token's ``iss`` and
    ``sub``, which OpenID Connect Core 1.0 §2 makes the one stable identifier), and the PAW
    user they sign in as. Made at the first sign-in, with a new user: an identity is never
    attached to an existing account by name or e-mail (that would hand a local account to
    whoever the provider calls by the same name). An operator may point it at another user
    in the admin."""

    issuer = models.CharField(max_length=255)
    subject = models.CharField(max_length=255)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="oidc_identities"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    last_sign_in_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "single sign-on identity"
        verbose_name_plural = "single sign-on identities"
        constraints = [
            models.UniqueConstraint(fields=["issuer", "subject"], name="oidc_identity_unique")
        ]

    def __str__(self) -> str:
        return f"{self.subject} at {self.issuer}"
