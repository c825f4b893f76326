"""``import ffrecord`` for code written against HFAiLab's ffrecord.

This module replaces itself with ``ffkit.ffrecord`` while it is imported, and
a finder maps every submodule ``ffrecord.X`` to ``ffkit.ffrecord.X``, so
``ffrecord`` *is* ``ffkit.ffrecord`` and ``ffrecord.torch`` *is*
``ffkit.ffrecord.torch``: one set of classes, whichever name a program (or a
pickle) uses, and ``import ffrecord`` still never imports torch.
"""
import importlib
import importlib.abc
import importlib.util
import sys

import ffkit.ffrecord as _ffrecord

_PREFIX = __name__ + "."


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ffrecord.X as the module ffkit.ffrecord.X."""

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith(_PREFIX):
            return None
        target_name = "ffkit.ffrecord." + fullname[len(_PREFIX):]
        if importlib.util.find_spec(target_name) is None:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        return importlib.import_module("ffkit.ffrecord." + spec.name[len(_PREFIX):])

    def exec_module(self, module):
        pass  # already executed under its ffkit name


if not any(isinstance(f, _Alias) for f in sys.meta_path):
    sys.meta_path.insert(0, _Alias())
sys.modules[__name__] = _ffrecord
