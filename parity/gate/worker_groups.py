"""One worker per module fixture: under pytest-xdist, the tests that share a module-scoped fixture run
on the same worker, so the fixture is built once, not once per worker that happens to get one of them.

xdist hands tests out one by one (--dist loadgroup); a module- or class-scoped fixture then lives once
per worker, and an expensive one (the sam2 reference model and ours, built and given an image) was
built by up to every worker: tests/unit/test_sam2_predictor.py took 180 s of test time over the
gate's 7 CPU workers and 49 s in one process. `group_module_fixtures` gives each such test the xdist
group of its module, which --dist loadgroup keeps on one worker. Tests that name a group of their own
keep it; tests that share nothing wider than a function still go one by one. tests/conftest.py
registers ModuleFixtureGroups in every pytest process (the xdist workers collect too).
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest

# fixture scopes that live longer than one test but not for the whole worker (a session fixture is
# built once per worker whatever the grouping)
SHARED_SCOPES = ("class", "module")


def shares_a_module_fixture(item) -> bool:
    """Whether the test uses a fixture that pytest keeps for its class or module."""
    info = getattr(item, "_fixtureinfo", None)  # doctests and other non-function items have none
    if info is None:
        return False
    return any(definitions[-1].scope in SHARED_SCOPES for definitions in info.name2fixturedefs.values() if definitions)


def module_group(item) -> str:
    return "module:" + item.nodeid.split("::")[0]


def group_module_fixtures(items: Iterable) -> None:
    """Mark every test that shares a module fixture, and has no xdist group yet, with its module's group."""
    for item in items:
        if item.get_closest_marker("xdist_group") is None and shares_a_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(module_group(item)))


class ModuleFixtureGroups:
    """The pytest plugin. Its collection hook runs first: xdist's (in each worker) writes a test's
    group into its node id, and must see the marks given here."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, items) -> None:
        group_module_fixtures(items)
