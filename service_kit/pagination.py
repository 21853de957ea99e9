"""List pages (AIP-158): a page size with a default and a ceiling, and opaque tokens that resume after the last
item shown, so a list that grows between calls neither repeats nor skips an item."""
from __future__ import annotations

import base64
import json
from typing import Callable, Sequence, TypeVar

from service_kit.errors import InvalidArgument

T = TypeVar("T")
DEFAULT_PAGE_SIZE = 50
# A page also stops short of this many bytes, so it fits a client's default 4 MiB receive limit.
MAX_PAGE_BYTES = 2 * 2**20


def page(items: Sequence[T], key: Callable[[T], list], page_size: int, page_token: str, descending: bool = False,
         size_of: Callable[[T], int] | None = None) -> tuple[list[T], str]:
    """One page of `items` (already sorted by `key`), and the token of the next page ('' on the last).

    With `size_of` (an item's bytes on the wire), the page also ends before MAX_PAGE_BYTES (one item at least)."""
    size = page_size or DEFAULT_PAGE_SIZE
    if page_token:
        after = _decode(page_token)
        items = [i for i in items if (key(i) < after if descending else key(i) > after)]
    shown, total = [], 0
    for item in items[:size]:
        total += size_of(item) if size_of else 0
        if shown and total > MAX_PAGE_BYTES:
            break
        shown.append(item)
    more = len(items) > len(shown)
    return shown, _encode(key(shown[-1])) if more and shown else ""


def _encode(key: list) -> str:
    return base64.urlsafe_b64encode(json.dumps(key).encode()).decode()


def _decode(token: str) -> list:
    try:
        key = json.loads(base64.urlsafe_b64decode(token.encode()))
        if not isinstance(key, list):
            raise ValueError
        return key
    except (ValueError, UnicodeDecodeError):
        raise InvalidArgument("page_token is not one this service issued; pass next_page_token unchanged",
                              reason="BAD_PAGE_TOKEN", field="page_token") from None
