"""List pages: size, tokens that resume after the last item shown, and a byte ceiling per page."""
import pytest

from service_kit.errors import InvalidArgument
from service_kit.pagination import MAX_PAGE_BYTES, page

ITEMS = [f"a{i:03d}" for i in range(120)]


def walk(size, size_of=None):
    token, pages = "", []
    while True:
        shown, token = page(ITEMS, lambda x: [x], size, token, size_of=size_of)
        pages.append(shown)
        if not token:
            return pages


@pytest.mark.parametrize("size, size_of, lengths", [
    (0, None, [50, 50, 20]),  # 0: the default page size
    (100, None, [100, 20]),
    (120, None, [120]),
    # Items of a third of the byte ceiling: three do not fit one page, whatever page_size says.
    (100, lambda x: MAX_PAGE_BYTES // 3 + 1, [2] * 60),
    # One item larger than the ceiling still gets a page of its own.
    (100, lambda x: MAX_PAGE_BYTES + 1, [1] * 120),
])
def test_pages(size, size_of, lengths):
    pages = walk(size, size_of)
    assert [len(p) for p in pages] == lengths and sum(pages, []) == ITEMS


def test_a_token_resumes_after_the_last_item_even_when_the_list_grew():
    shown, token = page(ITEMS, lambda x: [x], 10, "")
    grown = sorted(ITEMS + ["a0005b", "zzz"])
    more, _ = page(grown, lambda x: [x], 10, token)
    assert more[0] == "a010" and "a0005b" not in more


def test_a_forged_token_is_invalid_argument():
    with pytest.raises(InvalidArgument) as e:
        page(ITEMS, lambda x: [x], 10, "not-a-token")
    assert e.value.reason == "BAD_PAGE_TOKEN"
