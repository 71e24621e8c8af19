"""The one "did you mean" of every unknown name: intent aliases first, then the other spelling
convention, then the closest spelling — always one of the known names, or nothing."""

from __future__ import annotations

import pytest

from migronaut._suggest import camel_case, snake_case, suggest

KNOWN = ("batch_size", "max_parallel", "unique", "expireAfterSeconds")


@pytest.mark.parametrize(("name", "meant"), [
    ("batchSize", "batch_size"),          # the other convention wins over spelling
    ("max_paralel", "max_parallel"),
    ("uniqe", "unique"),
    ("expireAfterSecond", "expireAfterSeconds"),
    ("expire_after_seconds", "expireAfterSeconds"),
])
def test_the_known_name_meant(name: str, meant: str) -> None:
    assert suggest(name, KNOWN) == meant


def test_nothing_close_suggests_nothing() -> None:
    assert suggest("zzz", KNOWN) is None
    assert suggest(3, KNOWN) is None
    assert suggest("unique", ()) is None


def test_an_alias_of_intent_wins_and_its_misspelling_leads_to_it_too() -> None:
    commands = ("up", "down", "create", "status")
    aliases = {"rollback": "down", "migrate": "up", "nowhere": "missing"}
    assert suggest("rollback", commands, aliases=aliases) == "down"
    assert suggest("migrate", commands, aliases=aliases) == "up"
    assert suggest("rollbak", commands, aliases=aliases) == "down"
    assert suggest("nowhere", commands, aliases=aliases) is None  # an alias of nothing known
    assert suggest("migrate", commands) == "create"  # without intents, spelling decides


def test_the_cutoff_is_the_callers() -> None:
    assert suggest("max_par", KNOWN) == "max_parallel"
    assert suggest("max_par", KNOWN, cutoff=0.9) is None


def test_spelling_conventions() -> None:
    assert snake_case("expireAfterSeconds") == "expire_after_seconds"
    assert camel_case("expire_after_seconds") == "expireAfterSeconds"
