"""``during_import`` (inference.imported_package): an exception that came while an installed package's module was
being imported, read from a second ``in <module>`` frame of library code under the script's own (IF931)."""

from __future__ import annotations

import pytest

from diagnose.match.inference import imported_package

SCRIPT = 'File "/home/u/rl/grpo.py", line 4, in <module>'
UNSLOTH_INIT = 'File "/usr/local/lib/python3.12/dist-packages/unsloth/__init__.py", line 247, in <module>'
PATCH = 'File "/usr/local/lib/python3.12/dist-packages/unsloth/models/rl.py", line 854, in patch_functions'
RUNPY = ['File "<frozen runpy>", line 198, in _run_module_as_main', 'File "<frozen runpy>", line 88, in _run_code']


@pytest.mark.parametrize(
    "frames, imported",
    [
        # the user's import ran unsloth's top level, which called the function that raised
        ([SCRIPT, UNSLOTH_INIT, PATCH], "/usr/local/lib/python3.12/dist-packages/unsloth/__init__.py"),
        # raised at the imported module's own top level
        ([SCRIPT, UNSLOTH_INIT], "/usr/local/lib/python3.12/dist-packages/unsloth/__init__.py"),
        # a library module run as the program (python -m): one <module> frame, its run is not an import
        ([*RUNPY, 'File "/env/lib/python3.10/site-packages/verl/trainer/main.py", line 40, in <module>', PATCH], ""),
        # the user's own package being imported is not an installed package's
        ([SCRIPT, 'File "/home/u/rl/mylib/__init__.py", line 3, in <module>', 'File "/home/u/rl/mylib/a.py", line 9, in f'], ""),
        # no import at all: the script called into a library
        ([SCRIPT, PATCH], ""),
        ([], ""),
    ],
)
def test_imported_package(frames, imported):
    assert imported_package(frames) == imported
