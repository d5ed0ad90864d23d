# Datasources get an access rule. The ones that exist stay open to everyone signed in (as
# they were); a new one starts limited to teams, with none: staff only.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("auth", "0012_alter_user_first_name_max_length"),
        ("secrets_vault", "0005_knowledge_flag_reason"),
    ]

    operations = [
        migrations.AddField(
            model_name="datasource",
            name="access",
            field=models.CharField(
                choices=[
                    ("everyone", "Everyone signed in"),
                    ("teams", "Members of its teams (and staff)"),
                ],
                default="everyone",
                help_text="Everyone signed in, or only the members of the teams below (staff always).",
                max_length=16,
            ),
        ),
        migrations.AlterField(
            model_name="datasource",
            name="access",
            field=models.CharField(
                choices=[
                    ("everyone", "Everyone signed in"),
                    ("teams", "Members of its teams (and staff)"),
                ],
                default="teams",
                help_text="Everyone signed in, or only the members of the teams below (staff always).",
                max_length=16,
            ),
        ),
        migrations.AddField(
            model_name="datasource",
            name="teams",
            field=models.ManyToManyField(
                blank=True,
                help_text="The teams whose members may use it, when access is limited to teams.",
                related_name="+",
                to="auth.group",
            ),
        ),
    ]
