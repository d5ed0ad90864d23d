"""Routes under ``/api/`` (included by ``paw_project.urls``)."""

from __future__ import annotations

from django.urls import path

from secrets_vault.api import (
    datasources,
    knowledge,
    operators,
    provider_access,
    providers,
    secrets,
)

urlpatterns = [
    path("secrets", secrets.SecretListApi.as_view(), name="secret-list"),
    path("secrets/<str:name>", secrets.SecretDetailApi.as_view(), name="secret-detail"),
    path("datasources", datasources.DatasourceListApi.as_view(), name="datasource-list"),
    path(
        "datasources/<str:slug>",
        knowledge.DatasourceDetailApi.as_view(),
        name="datasource-detail",
    ),
    path("providers", providers.ProviderListApi.as_view(), name="provider-list"),
    path("providers/default", providers.ProviderDefaultApi.as_view(), name="provider-default"),
    path(
        "admin/providers",
        provider_access.AdminProviderAccessListApi.as_view(),
        name="admin-provider-access-list",
    ),
    path(
        "admin/providers/<str:name>",
        provider_access.AdminProviderAccessDetailApi.as_view(),
        name="admin-provider-access-detail",
    ),
    path("admin/secrets", operators.AdminSecretListApi.as_view(), name="admin-secret-list"),
    path(
        "admin/secrets/<int:secret_id>",
        operators.AdminSecretDetailApi.as_view(),
        name="admin-secret-detail",
    ),
    path(
        "admin/datasources",
        operators.AdminDatasourceListApi.as_view(),
        name="admin-datasource-list",
    ),
    path(
        "admin/datasources/<str:slug>",
        operators.AdminDatasourceDetailApi.as_view(),
        name="admin-datasource-detail",
    ),
    path(
        "admin/datasources/<str:slug>/test",
        operators.AdminDatasourceTestApi.as_view(),
        name="admin-datasource-test",
    ),
    path(
        "admin/datasources/<str:slug>/credentials",
        operators.AdminCredentialListApi.as_view(),
        name="admin-datasource-credential-list",
    ),
    path(
        "admin/datasources/<str:slug>/credentials/<int:credential_id>",
        operators.AdminCredentialDetailApi.as_view(),
        name="admin-datasource-credential-detail",
    ),
    path(
        "admin/datasources/<str:slug>/refresh-schema",
        knowledge.AdminDatasourceRefreshSchemaApi.as_view(),
        name="admin-datasource-refresh-schema",
    ),
    path(
        "admin/datasources/<str:slug>/knowledge",
        knowledge.AdminKnowledgeListApi.as_view(),
        name="admin-knowledge-list",
    ),
    path(
        "admin/datasources/<str:slug>/knowledge/<int:entry_id>",
        knowledge.AdminKnowledgeDetailApi.as_view(),
        name="admin-knowledge-detail",
    ),
    path(
        "admin/datasources/<str:slug>/knowledge/<int:entry_id>/verify",
        knowledge.AdminKnowledgeVerifyApi.as_view(),
        name="admin-knowledge-verify",
    ),
    path(
        "admin/datasources/<str:slug>/knowledge/<int:entry_id>/unverify",
        knowledge.AdminKnowledgeUnverifyApi.as_view(),
        name="admin-knowledge-unverify",
    ),
]
