"""Fixtures of the twin's tests (helpers live in ``sim_helpers``)."""

from __future__ import annotations

import pytest

from sim_helpers import PATH


@pytest.fixture(params=[False, True], ids=["plain", "fast"])
def both_paths(request):
    """Run the test on the plain step and on the decode-group fast path."""
    PATH["fast_forward"] = request.param
    yield request.param
    PATH["fast_forward"] = True
