"""Options a parser refused: typed by the user (configuration) or added by a framework (version skew)."""

from diagnose.match.command_line import _latest_command, options_not_typed, refused_options

SWIFT = (
    b"run sh: `python -m torch.distributed.run --nproc_per_node 8 /env/swift/cli/_megatron/sft.py --load m --bf16 true`\n"
    b"usage: sft.py [-h] [--num-layers NUM_LAYERS]\n"
    b"sft.py: error: unrecognized arguments: --softmax-type learnable --quick-geglu\n"
)
TYPED = (
    b"+ torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 24 --activations-checkpoint-method uniform\n"
    b"pretrain_gpt.py: error: unrecognized arguments: --activations-checkpoint-method uniform\n"
)


def _start_of_last_line(buf: bytes) -> int:
    return buf.rstrip(b"\n").rfind(b"\n") + 1


def command_line_before(buf: bytes, start: int, prog: str) -> str | None:
    """The latest line before ``start`` that runs ``prog`` with options, as the engine finds it."""
    found = _latest_command(buf, start, prog)
    return found[1] if found else None


def test_refused_options_are_the_option_words_only():
    assert refused_options("--softmax-type learnable --window-size 128,0 --local_rank=1") == [
        "--softmax-type", "--window-size", "--local_rank"]
    assert refused_options("uniform 7") == []


def test_the_launch_line_is_found_and_usage_or_error_lines_are_not_it():
    assert command_line_before(SWIFT, _start_of_last_line(SWIFT), "sft.py").startswith("run sh:")
    only_errors = b"usage: sft.py [-h]\nsft.py: error: unrecognized arguments: --x\n"
    assert command_line_before(only_errors, _start_of_last_line(only_errors), "sft.py") is None


def test_options_missing_from_the_command_line_were_not_typed():
    assert options_not_typed(SWIFT, _start_of_last_line(SWIFT), "sft.py", "--softmax-type learnable --quick-geglu", {})


def test_an_option_on_the_command_line_was_typed_by_the_user():
    start = _start_of_last_line(TYPED)
    assert not options_not_typed(TYPED, start, "pretrain_gpt.py", "--activations-checkpoint-method uniform", {})


def test_without_a_visible_command_line_nothing_is_concluded():
    buf = b"pretrain_gpt.py: error: unrecognized arguments: --foo\n"
    assert not options_not_typed(buf, 0, "pretrain_gpt.py", "--foo", {})


def test_a_command_line_with_unexpanded_variables_proves_nothing():
    buf = b"python pretrain_gpt.py --num-layers 2 $EXTRA_ARGS\npretrain_gpt.py: error: unrecognized arguments: --foo\n"
    assert not options_not_typed(buf, _start_of_last_line(buf), "pretrain_gpt.py", "--foo", {})


def test_a_remembered_answer_never_hides_a_later_command_line():
    """The answer per (program, options) is remembered across ranks' identical errors, but a command line printed
    after an earlier error counts for the errors after it (as a fresh search from each error would say)."""
    error = b"sft.py: error: unrecognized arguments: --softmax-type learnable\n"
    buf = error + SWIFT.splitlines(keepends=True)[0] + error
    first, second = 0, len(buf) - len(error)
    memo: dict = {}
    answers = [options_not_typed(buf, s, "sft.py", "--softmax-type learnable", memo) for s in (first, second)]
    assert answers == [False, True]
    assert answers == [options_not_typed(buf, s, "sft.py", "--softmax-type learnable", {}) for s in (first, second)]
    typed_later = error + b"python sft.py --softmax-type learnable\n" + error
    memo = {}
    assert [options_not_typed(typed_later, s, "sft.py", "--softmax-type learnable", memo)
            for s in (0, len(typed_later) - len(error))] == [False, False]


def test_options_after_a_run_of_blanks_are_on_the_command_line():
    # (t36b) a command pasted with its continuation lines joined keeps their indentation between the script and its
    # options; torch >= 2.0's torch.distributed.launch then adds --local-rank=N, which the user never typed
    pasted = (
        b"$ python3 -m torch.distributed.launch --nproc_per_node=1 src/gpt2_ft.py     --train_data x.jsonl     --lr 2e-4\n"
        b"gpt2_ft.py: error: unrecognized arguments: --local-rank=0\n"
    )
    start = _start_of_last_line(pasted)
    assert command_line_before(pasted, start, "gpt2_ft.py").startswith("$ python3 -m torch.distributed.launch")
    assert options_not_typed(pasted, start, "gpt2_ft.py", "--local-rank=0", {})
    typed = pasted.replace(b"--lr 2e-4", b"--local-rank=0")
    assert not options_not_typed(typed, _start_of_last_line(typed), "gpt2_ft.py", "--local-rank=0", {})
    # a name followed by words, not options, is no command line (a sentence that mentions the script)
    prose = b"running gpt2_ft.py     now\ngpt2_ft.py: error: unrecognized arguments: --local-rank=0\n"
    assert command_line_before(prose, _start_of_last_line(prose), "gpt2_ft.py") is None
