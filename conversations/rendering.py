"""The agent's answers as safe HTML: Markdown rendered on the server, then sanitized.

The model's text is untrusted (it can repeat anything a file or a web page said), so the
HTML that Python-Markdown produces goes through nh3 (the ammonia sanitizer) with an
allow-list of tags and attributes: no scripts, styles, event handlers, forms or frames.
HTML in the answer is not interpreted (it shows as text). Links keep ``http``, ``https``
and ``mailto`` targets and open with
``rel="noopener noreferrer"``. Images may only show the conversation's own artifacts: a
relative ``src`` (``chart.png``, ``out/fig.png``) becomes the artifact's inline URL, any
other image is dropped (an outside image would tell its server who reads the answer).
A relative link becomes the artifact's download URL.
"""

from __future__ import annotations

import posixpath
from urllib.parse import quote, urlsplit
from uuid import UUID

import markdown
import nh3
from markdown.extensions.tables import TableExtension

#: Tags an answer may use (what Markdown, its tables and fenced code produce).
ALLOWED_TAGS = frozenset(
    {
        "a", "abbr", "b", "blockquote", "br", "code", "del", "em", "h1", "h2", "h3", "h4",
        "h5", "h6", "hr", "i", "img", "kbd", "li", "ol", "p", "pre", "s", "strong", "sub",
        "sup", "table", "tbody", "td", "th", "thead", "tr", "ul",
    }
)  # fmt: skip
ALLOWED_ATTRIBUTES = {
    "a": {"href", "title"},
    "img": {"src", "alt", "title"},
    "th": {"align"},
    "td": {"align"},
    "code": {"class"},
}
URL_SCHEMES = frozenset({"http", "https", "mailto"})
#: Longest answer rendered as Markdown (characters); a longer one is shown as plain text
#: (Markdown's run time grows with pathological input).
MAX_MARKDOWN_CHARS = 200_000

# Table alignment as the align attribute: a style attribute would be stripped here and
# refused by the pages' Content-Security-Policy anyway.
_MARKDOWN_EXTENSIONS = [TableExtension(use_align_attribute=True), "fenced_code", "sane_lists"]


def _artifact_path(value: str) -> str | None:
    """The workspace-relative path a relative URL names, or ``None`` when it is not one."""
    parts = urlsplit(value)
    if parts.scheme or parts.netloc or not parts.path or parts.path.startswith("/"):
        return None
    path = posixpath.normpath(parts.path.removeprefix("./"))
    if path.startswith("..") or path == ".":
        return None
    return path


def markdown_render(
    text: str, *, conversation_id: UUID | str | None = None, files_base: str | None = None
) -> str:
    """``text`` (Markdown) as sanitized HTML (a ``str`` safe to insert into a page).

    With ``conversation_id``, relative image sources and links point at that
    conversation's artifacts (``/api/conversations/<id>/artifacts/<path>``, images with
    ``?inline=1``); with ``files_base`` (a URL path ending in ``/``, e.g. a share's
    ``/api/shares/<id>/files/``) at the files under it instead; with neither they are
    dropped. Text over ``MAX_MARKDOWN_CHARS`` is escaped into one ``<pre>`` block instead
    of being parsed.
    """
    if not text:
        return ""
    if len(text) > MAX_MARKDOWN_CHARS:
        return "<pre>" + nh3.clean_text(text) + "</pre>"
    renderer = markdown.Markdown(extensions=_MARKDOWN_EXTENSIONS, output_format="html")
    # HTML the model wrote is text, shown as written: as markup it could swallow the rest
    # of the answer (an unclosed block) even where nh3 would strip it.
    renderer.preprocessors.deregister("html_block")
    renderer.inlinePatterns.deregister("html")
    html = renderer.convert(text)
    base = files_base or (
        f"/api/conversations/{conversation_id}/artifacts/" if conversation_id else None
    )

    def attribute_filter(tag: str, attribute: str, value: str) -> str | None:
        if (tag, attribute) not in (("img", "src"), ("a", "href")):
            return value
        if tag == "a" and urlsplit(value).scheme:
            return value  # an absolute link: nh3 keeps it only for URL_SCHEMES
        path = _artifact_path(value)
        if path is None or base is None:
            return None  # outside images, other relative or scheme-less URLs
        return base + quote(path) + ("?inline=1" if tag == "img" else "")

    return nh3.clean(
        html,
        tags=set(ALLOWED_TAGS),
        attributes={tag: set(names) for tag, names in ALLOWED_ATTRIBUTES.items()},
        attribute_filter=attribute_filter,
        url_schemes=set(URL_SCHEMES),
        link_rel="noopener noreferrer",
        strip_comments=True,
    )
