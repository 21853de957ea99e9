"""List pages (AIP-158): a page size with a default and a ceiling, and opaque tokens that resume after the last
item shown, so a list that grows between calls neither repeats nor skips an item."""
from __future__ import annotations

import base64
import json
from typing import Callable, Sequence, TypeVar

from service_kit.errors import InvalidArgument

T = TypeVar("T")
DEFAULT_PAGE_SIZE = 50


def page(items: Sequence[T], key: Callable[[T], list], page_size: int, page_token: str,
         descending: bool = False) -> tuple[list[T], str]:
    """One page of `items` (already sorted by `key`), and the token of the next page ('' on the last)."""
    size = page_size or DEFAULT_PAGE_SIZE
    if page_token:
        after = _decode(page_token)
        items = [i for i in items if (key(i) < after if descending else key(i) > after)]
    shown = list(items[:size])
    more = len(items) > size
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
