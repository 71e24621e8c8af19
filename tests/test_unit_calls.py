"""Telling an ``async def`` body from a plain one as ``inspect`` does, for any callable."""

from __future__ import annotations

import functools
import inspect
import sys
from typing import Any

import pytest

from migronaut.core._calls import is_coroutine_function


def plain(ctx: Any) -> None:
    pass


async def coroutine(ctx: Any) -> None:
    pass


class Holder:
    def method(self, ctx: Any) -> None:
        pass

    async def async_method(self, ctx: Any) -> None:
        pass

    async def __call__(self, ctx: Any) -> None:
        pass


def marked() -> Any:
    def body(ctx: Any) -> Any:
        return coroutine(ctx)

    if sys.version_info >= (3, 12):
        inspect.markcoroutinefunction(body)
    return body


CALLABLES = {
    "def": plain, "async def": coroutine, "lambda": lambda ctx: None, "builtin": len,
    "method": Holder().method, "async method": Holder().async_method,
    "async __call__": Holder(), "partial of async": functools.partial(coroutine),
    "partial of def": functools.partial(plain), "marked": marked(),
}


@pytest.mark.parametrize("name", sorted(CALLABLES))
def test_agrees_with_inspect(name: str) -> None:
    fn = CALLABLES[name]
    assert is_coroutine_function(fn) is inspect.iscoroutinefunction(fn)


def test_the_answers_differ_where_they_should() -> None:
    assert is_coroutine_function(coroutine) and not is_coroutine_function(plain)
    if sys.version_info >= (3, 12):
        assert is_coroutine_function(CALLABLES["marked"])
