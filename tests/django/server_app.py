"""``application``: the WSGI app gunicorn serves in tests/django/test_servers.py."""

from __future__ import annotations

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.django.server_settings")

from django.core.wsgi import get_wsgi_application

application = get_wsgi_application()
