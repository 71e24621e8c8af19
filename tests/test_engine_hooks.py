"""Lifecycle hooks (reference core §7.5): order, arguments and failure rules."""

from __future__ import annotations

from typing import Any

import pytest

from helpers.engine import applied, calls, captured_logger, make_migrator, write_simple
from migronaut import ConfigInvalidError, HookFailedError, Hooks, MigrationExecutionFailedError


class Recorder:
    """Hooks that log their calls; ``fail`` names hooks that raise."""

    def __init__(self, *fail: str) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.fail = set(fail)

    def _maybe_fail(self, hook: str) -> None:
        if hook in self.fail:
            raise RuntimeError(f"{hook} exploded")

    def before_all(self, ctx: Any) -> None:
        self.calls.append(("before_all", ctx.run.direction))
        self._maybe_fail("before_all")

    def after_all(self, ctx: Any, summary: dict[str, Any]) -> None:
        self.calls.append(("after_all", dict(summary)))
        self._maybe_fail("after_all")

    def before_each(self, name: str, ctx: Any, info: dict[str, Any]) -> None:
        self.calls.append(("before_each", name, dict(info), ctx.run.migration))
        self._maybe_fail("before_each")

    def after_each(self, name: str, duration_ms: int, ctx: Any, info: dict[str, Any]) -> None:
        assert isinstance(duration_ms, int) and duration_ms >= 0
        self.calls.append(("after_each", name, dict(info)))
        self._maybe_fail("after_each")

    def on_error(self, name: str, error: Exception, ctx: Any) -> None:
        self.calls.append(("on_error", name, getattr(error, "code", None)))
        self._maybe_fail("on_error")

    def hooks(self) -> Hooks:
        return Hooks(
            before_all=self.before_all,
            after_all=self.after_all,
            before_each=self.before_each,
            after_each=self.after_each,
            on_error=self.on_error,
        )

    @property
    def names(self) -> list[str]:
        return [
            c[0] if c[0] in ("before_all", "after_all") else f"{c[0]}:{c[1]}" for c in self.calls
        ]


FAILING = """
def up(ctx):
    raise ValueError("boom")

def down(ctx):
    pass
"""


def test_order_and_arguments_on_success(project: Any, db: Any) -> None:
    write_simple(project, "0001_a", "0002_b")
    rec = Recorder()
    with make_migrator(project, hooks=rec.hooks()) as migrator:
        migrator.up()
    assert rec.calls == [
        ("before_all", "up"),
        ("before_each", "0001_a.py", {"direction": "up", "index": 0, "total": 2}, "0001_a.py"),
        ("after_each", "0001_a.py", {"direction": "up", "index": 0, "total": 2}),
        ("before_each", "0002_b.py", {"direction": "up", "index": 1, "total": 2}, "0002_b.py"),
        ("after_each", "0002_b.py", {"direction": "up", "index": 1, "total": 2}),
        ("after_all", {"success": True, "applied": 2, "direction": "up"}),
    ]


def test_hooks_wrap_each_body(project: Any, db: Any) -> None:
    """before_each runs before the body, after_each after it (observed through the database)."""
    write_simple(project, "0001_a")
    seen: list[tuple[str, list[str]]] = []

    def snap(label: str) -> Any:
        return lambda *a: seen.append((label, calls(db)))

    hooks = Hooks(before_each=snap("before"), after_each=snap("after"))
    with make_migrator(project, hooks=hooks) as migrator:
        migrator.up()
    assert seen == [("before", []), ("after", ["0001_a"])]


def test_order_when_a_migration_fails(project: Any, db: Any) -> None:
    project.write_migration("0001_fail", FAILING)
    write_simple(project, "0002_b")
    rec = Recorder()
    with (
        make_migrator(project, hooks=rec.hooks()) as migrator,
        pytest.raises(MigrationExecutionFailedError),
    ):
        migrator.up()
    assert rec.names == [
        "before_all",
        "before_each:0001_fail.py",
        "on_error:0001_fail.py",
        "after_all",
    ]
    assert rec.calls[2][2] == "MIGRATION_EXECUTION_FAILED"
    assert rec.calls[-1][1] == {"success": False, "applied": 0, "direction": "up"}
    assert calls(db) == []


def test_no_hooks_when_there_is_nothing_to_run(project: Any, db: Any) -> None:
    write_simple(project, "0001_a")
    rec = Recorder()
    with make_migrator(project, hooks=rec.hooks()) as migrator:
        migrator.up()
        rec.calls.clear()
        assert migrator.up() == []
        assert [r.status for r in migrator.up("0001_a.py")] == ["skipped"]
    assert rec.calls == []  # skipped files get no hooks either


@pytest.mark.parametrize("hook", ["before_all", "before_each", "after_each"])
def test_a_raising_hook_fails_the_run_with_hook_failed(project: Any, db: Any, hook: str) -> None:
    write_simple(project, "0001_a", "0002_b")
    rec = Recorder(hook)
    with (
        make_migrator(project, hooks=rec.hooks()) as migrator,
        pytest.raises(HookFailedError) as info,
    ):
        migrator.up()
    error = info.value
    assert error.exit_code == 12 and error.code == "HOOK_FAILED"
    assert error.context["hook"] == hook
    assert f"{hook} exploded" in error.message
    expected_applied = ["0001_a.py"] if hook == "after_each" else []
    assert applied(db) == expected_applied
    assert calls(db) == [n.removesuffix(".py") for n in expected_applied]


def test_after_all_raising_after_success_fails_the_run(project: Any, db: Any) -> None:
    write_simple(project, "0001_a")
    rec = Recorder("after_all")
    with (
        make_migrator(project, hooks=rec.hooks()) as migrator,
        pytest.raises(HookFailedError) as info,
    ):
        migrator.up()
    assert info.value.context["hook"] == "after_all"
    assert applied(db) == ["0001_a.py"]


def test_after_all_raising_after_a_failure_is_only_warned(project: Any, db: Any) -> None:
    project.write_migration("0001_fail", FAILING)
    rec = Recorder("after_all")
    with (
        captured_logger() as (logger, handler),
        make_migrator(project, hooks=rec.hooks(), logger=logger) as migrator,
        pytest.raises(MigrationExecutionFailedError),
    ):
        migrator.up()
    assert handler.has("after_all hook failed after a failed run")


def test_on_error_raising_never_masks_the_original(project: Any, db: Any) -> None:
    project.write_migration("0001_fail", FAILING)
    rec = Recorder("on_error")
    with (
        captured_logger() as (logger, handler),
        make_migrator(project, hooks=rec.hooks(), logger=logger) as migrator,
        pytest.raises(MigrationExecutionFailedError) as info,
    ):
        migrator.up()
    assert "boom" in info.value.message
    assert handler.has("on_error hook failed for 0001_fail.py")
    assert rec.names[-1] == "after_all"


def test_on_error_gets_the_session_of_a_transactional_migration(project: Any, db: Any) -> None:
    project.write_migration("0001_txn_fail", "use_transaction = True\n" + FAILING)
    sessions: list[Any] = []
    hooks = Hooks(on_error=lambda name, error, ctx: sessions.append(ctx.session))
    with (
        make_migrator(project, hooks=hooks) as migrator,
        pytest.raises(MigrationExecutionFailedError),
    ):
        migrator.up()
    assert len(sessions) == 1
    assert sessions[0] is not None


def test_hooks_fire_for_each_half_of_redo(project: Any, db: Any) -> None:
    write_simple(project, "0001_a")
    with make_migrator(project) as migrator:
        migrator.up()
    rec = Recorder()
    with make_migrator(project, hooks=rec.hooks()) as migrator:
        migrator.redo()
    assert rec.names == [
        "before_all",
        "before_each:0001_a.py",
        "after_each:0001_a.py",
        "after_all",
        "before_all",
        "before_each:0001_a.py",
        "after_each:0001_a.py",
        "after_all",
    ]
    assert [c[1] for c in rec.calls if c[0] == "after_all"] == [
        {"success": True, "applied": 1, "direction": "down"},
        {"success": True, "applied": 1, "direction": "up"},
    ]


def test_down_hooks(project: Any, db: Any) -> None:
    write_simple(project, "0001_a", "0002_b")
    with make_migrator(project) as migrator:
        migrator.up()
    rec = Recorder()
    with make_migrator(project, hooks=rec.hooks()) as migrator:
        migrator.down()
    assert rec.names == [
        "before_all",
        "before_each:0002_b.py",
        "after_each:0002_b.py",
        "before_each:0001_a.py",
        "after_each:0001_a.py",
        "after_all",
    ]
    assert rec.calls[1][2] == {"direction": "down", "index": 0, "total": 2}


def test_async_hooks_and_mapping_form(project: Any, db: Any) -> None:
    write_simple(project, "0001_a")
    seen: list[str] = []

    async def before_all(ctx: Any) -> None:
        seen.append("before_all")

    with make_migrator(
        project,
        hooks={"before_all": before_all, "after_all": lambda ctx, s: seen.append("after_all")},
    ) as m:
        m.up()
    assert seen == ["before_all", "after_all"]


@pytest.mark.parametrize("hooks", [{"before_everything": print}, {"before_all": "not callable"}])
def test_invalid_hooks_are_config_errors(project: Any, db: Any, hooks: Any) -> None:
    write_simple(project, "0001_a")
    with make_migrator(project, hooks=hooks) as migrator, pytest.raises(ConfigInvalidError) as info:
        migrator.up()
    assert "hooks." in info.value.message
    assert calls(db) == []


def test_hooks_from_migronaut_config_py(project: Any, db: Any) -> None:
    project.write(
        "migronaut_config.py",
        """
        from migronaut import Hooks

        def before_each(name, ctx, info):
            ctx.db["hook_calls"].insert_one({"hook": "before_each", "name": name})

        config = {"hooks": Hooks(before_each=before_each), "env_file": False}
    """,
    )
    write_simple(project, "0001_a")
    from migronaut import Migrator

    with Migrator(cwd=project.path) as migrator:  # uri/db from MIGRONAUT_URI/MIGRONAUT_DB
        migrator.up()
    assert [d["name"] for d in db["hook_calls"].find()] == ["0001_a.py"]
