from django.contrib import admin

from paw_project.adminkit import PawModelAdmin
from sso.models import OidcIdentity


@admin.register(OidcIdentity)
class OidcIdentityAdmin(PawModelAdmin):
    """Identities at the provider and their PAW users. Changing the user moves the
    identity to another account (e.g. to an existing one, after its first sign-in made
    a new one)."""

    list_display = ("subject", "issuer", "user", "created_at", "last_sign_in_at")
    list_select_related = ("user",)
    search_fields = ("subject", "user__username", "user__email")
    readonly_fields = ("issuer", "subject", "created_at", "last_sign_in_at")
    raw_id_fields = ("user",)
