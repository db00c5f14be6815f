from __future__ import annotations

import pathlib
import sys

# Lets tests import shared helpers as ``tests.profile.*`` / ``tests.tune.*``.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
