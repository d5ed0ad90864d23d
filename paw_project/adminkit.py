"""What every app's admin shares: help texts shown as written, add forms without the
times a new object does not have yet, and the admin log's entry of an operator's write
made over the REST API (:func:`operator_write_log`).

- Django's admin templates print a field's ``help_text`` as HTML (``|safe``), so text such
  as ``PAW_DATASOURCE_<SLUG>_URL`` lost its ``<SLUG>`` as an unknown tag: PAW's help texts
  are plain text, and :class:`PawModelAdmin` escapes them.
- On an add form, read-only times (``created_at``, ``updated_at`` …) would show as ``-``:
  they are left out until the object exists.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

from django.contrib import admin
from django.contrib.admin.models import ADDITION, CHANGE, DELETION, LogEntry
from django.http import HttpRequest
from django.utils.html import escape

#: Fields an add form leaves out (the object has none of them before it is saved).
ADD_FORM_HIDDEN_FIELDS = frozenset(
    {
        "created", "created_at", "updated", "updated_at", "last_used_at", "last_sign_in_at",
        "schema_requested_at", "schema_refreshed_at", "schema_error", "decided_at", "used_at",
    }
)  # fmt: skip


def _without(fields: Any, hidden: frozenset[str]) -> list[Any]:
    """``fields`` (names, or tuples of names on one line) less the ``hidden`` names."""
    kept: list[Any] = []
    for field in fields:
        if isinstance(field, list | tuple):
            row = [name for name in field if name not in hidden]
            if row:
                kept.append(tuple(row))
        elif field not in hidden:
            kept.append(field)
    return kept


class PawModelAdmin(admin.ModelAdmin):
    """A ``ModelAdmin`` whose help texts are escaped (plain text, shown as written) and
    whose add form leaves out :data:`ADD_FORM_HIDDEN_FIELDS`."""

    add_form_hidden_fields: frozenset[str] = ADD_FORM_HIDDEN_FIELDS

    def formfield_for_dbfield(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        formfield = super().formfield_for_dbfield(db_field, request, **kwargs)
        if formfield is not None and formfield.help_text:
            formfield.help_text = escape(formfield.help_text)
        return formfield

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        fieldsets = super().get_fieldsets(request, obj)
        if obj is not None:
            return fieldsets
        return [
            (name, {**options, "fields": _without(options["fields"], self.add_form_hidden_fields)})
            for name, options in fieldsets
        ]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        readonly = super().get_readonly_fields(request, obj)
        if obj is not None:
            return readonly
        return _without(readonly, self.add_form_hidden_fields)


_FLAGS = {"add": ADDITION, "change": CHANGE, "delete": DELETION}
_VERBS = {"add": "Added", "change": "Changed", "delete": "Deleted"}


def operator_write_log(
    *,
    request: Any,
    obj: Any,
    action: Literal["add", "change", "delete"],
    fields: Iterable[str] = (),
    note: str = "",
) -> LogEntry:
    """Record an operator's write made over the REST API (``/api/admin/...``) in Django's
    admin log (``LogEntry``), where the admin records its own: by ``request.user``, of
    model instance ``obj`` (its content type, pk and ``str``), ``action`` one of ``add``,
    ``change``, ``delete``. The message says what and how, never a value: "Changed
    description, value over the REST API (PATCH /api/admin/secrets/3)." (``fields``: the
    names of the fields given; ``note``: a few words more, e.g. "schema refresh
    requested"). For a delete, call it before deleting (``obj`` still has its pk), in
    the same transaction. Returns the entry."""
    words = _VERBS[action]
    if fields:
        words += " " + ", ".join(fields)
    if note:
        words += f" ({note})" if fields else f": {note}"
    message = f"{words} over the REST API ({request.method} {request.path})."
    return LogEntry.objects.log_actions(
        user_id=request.user.pk,
        queryset=[obj],
        action_flag=_FLAGS[action],
        change_message=message,
        single_object=True,
    )
