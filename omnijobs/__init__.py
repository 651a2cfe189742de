"""omnijobs: the console script (``omnijobs.cli``). The service's code lives in the
top-level packages ``api``, ``tasks``, ``storage``, ``core``, ``media`` and ``pipelines``."""

from importlib.metadata import version

__version__ = version("omnijobs")
