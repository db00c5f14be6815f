"""The vLLM scheduler plugin, seen from the ``profile`` stage (re-export).

The implementation is :mod:`tuner.vllm_plugin`, outside ``tuner.profile`` so that
``vllm serve --scheduler-cls tuner.vllm_plugin.CacheAwareScheduler`` imports only vLLM and
the standard library. Importing this module needs vLLM installed. The names re-exported
are exactly ``tuner.vllm_plugin.__all__``, so the list lives in one place.
"""

from tuner.vllm_plugin import *  # noqa: F401,F403
from tuner.vllm_plugin import __all__  # noqa: F401
