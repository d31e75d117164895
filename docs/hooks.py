"""mkdocs hooks: the site's home page is the README (links to it from the docs lead there), and
links from the docs to files outside docs/ (the examples) point at the repository, so the same
Markdown reads well on GitHub and builds strictly as a site."""

from __future__ import annotations

from pathlib import Path
from typing import Any

README = Path(__file__).resolve().parent.parent / "README.md"


def on_page_markdown(markdown: str, page: Any, config: Any, **_: Any) -> str:
    if page.file.src_uri == "index.md":
        markdown = README.read_text(encoding="utf-8").replace("](docs/", "](")
    blob = f"{config['repo_url'].rstrip('/')}/blob/main/"
    markdown = markdown.replace("](../README.md", "](index.md")  # the README is the site's home page
    for folder in ("examples", "scripts"):  # from docs/ and from docs/gateways/
        for prefix in (f"](../../{folder}/", f"](../{folder}/", f"]({folder}/"):
            markdown = markdown.replace(prefix, f"]({blob}{folder}/")
    return markdown
