from django.apps import AppConfig


class PawProjectConfig(AppConfig):
    """The project package as an app: it holds the ``runpaw`` management command and wires
    the request-id reset and the login-lockout glue."""

    name = "paw_project"
    verbose_name = "PAW"

    def ready(self) -> None:
        from django.contrib.auth.signals import user_login_failed
        from django.core.signals import request_finished

        from paw_project.logging import reset_request_id
        from paw_project.login_lockout import mark_lockout_on_django_request

        request_finished.connect(reset_request_id, dispatch_uid="paw-reset-request-id")
        user_login_failed.connect(mark_lockout_on_django_request, dispatch_uid="paw-mark-lockout")
