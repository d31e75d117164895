"""``ratewarden bench``: ratewarden against its peers, same app, same scenarios, same machine.

Needs the ``bench`` extra (``pip install 'ratewarden[bench]'``); nothing here is imported by the core.
"""
