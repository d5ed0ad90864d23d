"""Celery beat, as PAW runs it: ``python -m paw_project.beat`` (see :mod:`paw_project.worker`)."""

from __future__ import annotations

from paw_project.worker import main

if __name__ == "__main__":
    main("beat")
