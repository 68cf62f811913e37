"""One reading of a traceback frame's file for the whole matcher (diagnose.match.frames: frame_file, is_library),
used by the stack a job ran (match/stack.py) and by the category inference (match/inference.py), which each had their
own. The readings differed: the stack found ``File "`` anywhere in a line and counted ``/torch/`` and ``<frozen ...>``
as library code; the inference read only a line that starts with the frame (missing a Ray actor's prefixed frames)
and knew /lib/python3 but not /lib/python2.7 or the interpreter's pseudo-files, but knew framework checkouts. The
one reading: the file after ``File "`` (at the start or after a prefix, never inside a word); library code is an
installed package, the interpreter's modules (any Python), a framework's checkout, or no file (``<...>``)."""

from __future__ import annotations

import pytest

from diagnose.match.frames import frame_file, is_library
from diagnose.match.inference import package_of, raised_in_library
from diagnose.match.stack import stack_of_frames

TORCH = '  File "/opt/conda/lib/python3.10/site-packages/torch/nn/modules/module.py", line 1501, in _call_impl'


@pytest.mark.parametrize("path, library", [
    ("/opt/conda/lib/python3.10/site-packages/torch/nn/functional.py", True),
    ("/usr/lib/python2.7/json/decoder.py", True),
    ("/usr/lib/python3/dist-packages/apt/cache.py", True),
    ("/workspace/Megatron-LM/megatron/core/tensor_parallel/layers.py", True),
    ("/pytorch/torch/csrc/autograd/python_engine.py", True),
    ("torch/nn/modules/module.py", True),  # a relative path under a root
    ("<frozen runpy>", True),
    ("/home/u/project/train.py", False),
    ("train.py", False),
])
def test_what_is_library_code(path, library):
    assert is_library(path) is library


RAY = ('(MegatronPolicyWorker pid=188232, ip=10.12.6.41)   File "/home/ray/.venv/lib/python3.12/site-packages/'
       'torch/distributed/distributed_c10d.py", line 4811, in barrier')


def test_a_frame_is_read_after_the_prefix_the_traceback_reader_left_on_it():
    assert frame_file('    File "C:\\Users\\u\\site-packages\\pkg\\m.py", line 3, in f') == "C:/Users/u/site-packages/pkg/m.py"
    assert frame_file(RAY).endswith("torch/distributed/distributed_c10d.py")
    assert frame_file('    myFile "x.py"') == ""
    # the inference reads a Ray actor's frames as the stack does (it read none: its reading was anchored)
    assert raised_in_library([RAY])


def test_stack_and_inference_read_a_frame_alike():
    python2 = '  File "/usr/lib/python2.7/json/decoder.py", line 380, in raw_decode'
    frozen = '  File "<frozen runpy>", line 198, in _run_module_as_main'
    # the inference's innermost frame in the interpreter is library code, as the stack counted it
    assert raised_in_library([python2]) and raised_in_library([frozen])
    assert stack_of_frames([python2, TORCH]) == ""  # no frame of the job's own code: not "pytorch"
    assert stack_of_frames(['  File "/home/u/x.py", line 3, in <module>', TORCH]) == "pytorch"
    assert package_of('  File "/workspace/Megatron-LM/megatron/core/parallel_state.py", line 3, in f') == "megatron"


AXOLOTL = [
    '  File "/home/u/.venv/bin/axolotl", line 8, in <module>',
    '  File "/home/u/.venv/lib/python3.10/site-packages/click/core.py", line 788, in invoke',
    '  File "/home/u/src/axolotl/src/axolotl/cli/train.py", line 48, in do_train',
    '  File "/home/u/src/axolotl/src/axolotl/core/builders/causal.py", line 421, in build',
]


def test_a_console_scripts_own_package_is_library_code_where_an_editable_install_keeps_it():
    # (t36b) pip's wrapper <env>/bin/axolotl started the traceback: axolotl's frames, run from a checkout by an
    # editable install, are the package's code, not the user's script
    from diagnose.match.frames import console_script_package
    assert console_script_package(AXOLOTL) == "axolotl"
    assert raised_in_library(AXOLOTL)
    assert console_script_package(['  File "/usr/local/bin/llama-factory", line 8, in <module>']) == "llama_factory"
    # a script run by path is no console script; another checkout under the same entry is not that package
    assert console_script_package(['  File "/home/u/proj/bin/train.py", line 8, in <module>']) == ""
    assert not raised_in_library([AXOLOTL[0], '  File "/home/u/proj/train.py", line 12, in main'])
    assert not raised_in_library(['  File "/home/u/src/axolotl/src/axolotl/core/builders/causal.py", line 421, in build'])
