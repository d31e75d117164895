"""Flask integration: ``RateLimiter``, a Flask extension with flask-limiter's idioms (``@limit``,
``shared_limit``, ``exempt``, default and application limits, ``app.config`` keys) on ratewarden's
check layer: the same keys, stores, failure policy and answers as every other integration."""

try:
    import flask  # noqa: F401
except ImportError:  # pragma: no cover - the flask extra is not installed
    raise ImportError("ratewarden.flask needs Flask: pip install 'ratewarden[flask]'") from None

from .declared import Declared
from .extension import EXTENSION_KEY, RateLimiter
from .responses import RateLimitExceeded
from .settings import CONFIG_KEYS, Settings

__all__ = ["CONFIG_KEYS", "EXTENSION_KEY", "Declared", "RateLimitExceeded", "RateLimiter", "Settings"]
