"""DOQ as the broker of other task frameworks: Celery (:mod:`doq_lib.integrations.celery`)."""
