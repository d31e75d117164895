"""The framework-neutral check-and-answer layer every integration calls.

``check`` decides a request against its matched rules with the failure policy applied;
``answers`` builds the 429 and 503 bodies and headers. Sending them is the integration's part
(``ratewarden.asgi.responses`` for ASGI).
"""
