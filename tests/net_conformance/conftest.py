"""The ``impl`` fixture: every conformance test runs once per implementation of the seam."""

from __future__ import annotations

import pytest

from net_conformance.harness import IMPLS, Impl


@pytest.fixture(params=IMPLS)
def impl(request: pytest.FixtureRequest) -> Impl:
    return Impl(request.param)
