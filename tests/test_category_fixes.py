"""The next step a generic finding gets once its category is read from the evidence (rules/06_category_fixes.toml).

A generic rule's fix can only say "read the traceback"; an inferred category says where to look. The category's fix
replaces the generic one on inferred findings only: a finding no table read keeps "read the traceback", and a
specific rule keeps its own fix.
"""

from __future__ import annotations

from conftest import analyzed_root

from diagnose.match import match_text
from diagnose.match.rules import load_catalogue, load_rule_file
from diagnose.model import CATEGORIES

# an exception whose words an [[infer]] table reads as a setting refused (IF470: config_validation), no rule knowing it
# (a made-up library, so that no specific rule a later round adds can take it over)
REFUSED = """Traceback (most recent call last):
  File "/opt/app/train.py", line 41, in <module>
    main()
  File "/usr/lib/python3/dist-packages/somelib/trainer.py", line 212, in setup
    raise ValueError(
ValueError: `pack_sequences=True` is not compatible with `attention_impl=eager`
"""
UNREAD = """Traceback (most recent call last):
  File "/opt/app/train.py", line 88, in <module>
    item = instances[0]
IndexError: list index out of range
"""


def test_every_category_but_other_has_a_next_step():
    fixes = load_catalogue().category_fixes
    assert set(fixes) == set(CATEGORIES) - {"other"}
    for category, fix in fixes.items():
        assert fix.summary and fix.steps and fix.safety == "manual", category
        assert fix.steps[0].startswith("Open the evidence line"), category


def test_an_inferred_generic_finding_gets_its_categorys_fix(tmp_path):
    root = analyzed_root(tmp_path, REFUSED)
    assert (root.rule, root.category, root.basis) == ("PY001", "config_validation", "inferred")
    assert root.fix.summary == load_catalogue().category_fixes["config_validation"].summary
    assert not any("rules/README.md" in s for s in root.fix.steps)


def test_a_finding_no_table_read_keeps_read_the_traceback(tmp_path):
    root = analyzed_root(tmp_path, UNREAD)
    assert (root.rule, root.category) == ("PY001", "other")
    assert root.fix.summary.startswith("Read the traceback")


def test_a_generic_rule_with_a_fix_of_its_own_keeps_it():
    # HW001 (an illegal memory access) says how to find the kernel; read as the release of the package that launched
    # it, it still does
    text = "\n".join(["Traceback (most recent call last):", '  File "/srv/job/train.py", line 12, in <module>',
                      '  File "/opt/venv/lib/python3.10/site-packages/vllm/model_executor/layers/sampler.py", line 512, '
                      "in _random_sample", "    x = call()",
                      "RuntimeError: CUDA error: an illegal memory access was encountered"]) + "\n"
    root = match_text(text, load_catalogue()).root
    assert (root.rule, root.basis) == ("HW001", "inferred") and root.category != "hardware"
    assert [e.name for e in root.fix.env] == ["CUDA_LAUNCH_BLOCKING"]


def test_the_rules_whose_fix_is_replaced_are_generic_rules_that_only_say_read_it():
    catalogue = load_catalogue()
    assert catalogue.category_fix_rules
    for code in catalogue.category_fix_rules:
        rule = catalogue.by_code(code)
        assert rule is not None and rule.tier == "generic", code
        assert not rule.fix.env and not rule.fix.overrides, code


def test_a_specific_rules_fix_is_never_replaced(tmp_path):
    root = analyzed_root(tmp_path, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 "
                                   "has a total capacity of 79.10 GiB of which 1.50 GiB is free.\n")
    assert root.category == "cuda_oom" and root.basis != "inferred"
    assert root.fix.summary != load_catalogue().category_fixes["cuda_oom"].summary


def test_a_broken_entry_is_a_load_problem_not_a_silent_drop(tmp_path):
    f = tmp_path / "fixes.toml"
    f.write_text('[[category_fix]]\ncategory = "other"\nsummary = "x"\nsteps = ["y"]\n'
                 '[[category_fix]]\ncategory = "data"\nsummary = "x"\nsteps = ["y"]\nsafety = "safe"\n'
                 '[[category_fix]]\ncategory = "data"\nsummary = "x"\nsteps = ["y"]\n'
                 '[[category_fix]]\ncategory = "data"\nsummary = "x"\nsteps = ["y"]\n'
                 '[[category_fix]]\ncategory = "disk"\nsummary = "x"\nsteps = ["y"]\n')
    loaded = load_rule_file(f)
    fixes, errors = loaded.category_fixes, loaded.errors
    assert list(fixes) == ["data"]
    assert len(errors) == 4
    assert any("'other'" in e for e in errors) and any("unknown key" in e for e in errors)
    assert any("second entry" in e for e in errors) and any("'disk'" in e for e in errors)


def test_a_users_folder_replaces_a_categorys_fix(tmp_path):
    (tmp_path / "mine.toml").write_text('[[category_fix]]\ncategory = "data"\nsummary = "Ask the data team"\n'
                                        'steps = ["Open the evidence line", "post it in #data"]\n')
    assert load_catalogue([tmp_path]).category_fixes["data"].summary == "Ask the data team"


def test_two_files_of_one_folder_for_one_category_is_a_load_problem(tmp_path):
    """Across folders a later one replaces; inside one folder which entry wins would hang on the files' names."""
    for name in ("a.toml", "b.toml"):
        (tmp_path / name).write_text('[[category_fix]]\ncategory = "data"\nsummary = "x"\nsteps = ["Open the evidence line"]\n')
    errors = load_catalogue([tmp_path], include_default=False).errors
    assert any("b.toml" in e and "second entry" in e for e in errors), errors


def test_the_first_step_names_the_frame_that_raised_and_the_package(tmp_path):
    root = analyzed_root(tmp_path, REFUSED)
    assert root.facts["raised_at"] == "somelib/trainer.py:212 in setup"
    assert root.facts["raising_package"] == "somelib"
    assert root.fix.steps[0].startswith("Open the evidence line and the frame that raised it "
                                        "(somelib/trainer.py:212 in setup): ")


SKEWED = """Traceback (most recent call last):
  File "/workspace/app/train.py", line 9, in <module>
    build()
  File "/usr/local/lib/python3.12/dist-packages/otherlib/core/util.py", line 83, in build_model
    if kind == Kind.encoder_and_decoder:
AttributeError: type object 'Kind' has no attribute 'encoder_and_decoder'
"""


def test_a_version_skew_step_says_which_package_to_look_up(tmp_path):
    root = analyzed_root(tmp_path, SKEWED)
    assert (root.category, root.basis) == ("import_version", "inferred")
    assert any("`pip show otherlib`" in s for s in root.fix.steps), root.fix.steps
    assert not any("PACKAGE" in s for s in root.fix.steps)
    # the catalogue's own entry is untouched: the next finding gets the words, not this one's package
    assert any("PACKAGE" in s for s in load_catalogue().category_fixes["import_version"].steps)


def test_without_a_python_frame_the_step_keeps_the_categorys_words(tmp_path):
    root = analyzed_root(tmp_path, "ValueError: `pack_sequences=True` is not compatible with `attention_impl=eager`\n")
    assert (root.basis, root.category) == ("inferred", "config_validation")
    assert "raised_at" not in root.facts
    assert root.fix.steps[0].startswith("Open the evidence line and the frames above it")
