"""DOQ as the broker of other task frameworks: Celery (:mod:`doq_lib.integrations.celery`)
and Django's Tasks framework (:mod:`doq_lib.integrations.django`)."""
