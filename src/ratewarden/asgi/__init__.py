"""ASGI integration: the middleware and WebSocket limits."""

from .middleware import RateLimitMiddleware
from .websocket import WebSocketLimits

__all__ = ["RateLimitMiddleware", "WebSocketLimits"]
