"""Real servers for the operations tests (the same session fixtures as the store tests)."""

from tests.stores.conftest import memcached_server, redis_standalone

__all__ = ["memcached_server", "redis_standalone"]
