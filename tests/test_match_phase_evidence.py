"""The phase a failure is reported in follows the evidence of its own log, not the failure line's shape alone.

- A one-element collective timing out reads as an early timeout with no training step seen (NC002) only while the
  file shows no progress of its own: after step bars or loss lines it is the training-time rule (NC007), in the
  phase the file's last markers name (a save announced after fit ended is a checkpoint save).
- An exception raised while another was being handled prints the inner frames first; the chain's last traceback
  has the outer frames (Trainer ``_save_checkpoint``) that say what the job was doing.
"""

from __future__ import annotations

from conftest import analyzed, analyzed_root

WATCHDOG = ("[rank0]:[E0521 18:02:44.617090524 ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective operation "
            "timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=1800000) ran for "
            "1800090 milliseconds before timing out.")
EPOCH_BAR = "Epoch 9: 100%|██████████| 125/125 [00:41<00:00,  3.01it/s, v_num=0, train_loss=0.0112]"
FIT_STOPPED = "`Trainer.fit` stopped: `max_epochs=10` reached."
SAVE = "INFO:myproj.train:Training finished; saving final checkpoint to outputs/run_7/checkpoints/final.ckpt"
TOKENIZE = "Running tokenizer on dataset: 100%|██████████| 20000/20000 [00:09<00:00, 2140.64 examples/s]"


def test_one_element_timeout_at_start_up_stays_before_training(tmp_path):
    root = analyzed_root(tmp_path, TOKENIZE + "\n" + WATCHDOG.format(seq=4) + "\n")
    assert (root.rule, root.category, root.phase) == ("NC002", "nccl_timeout", "init")


def test_one_element_timeout_after_the_files_own_steps_is_in_training(tmp_path):
    root = analyzed_root(tmp_path, EPOCH_BAR + "\n" + WATCHDOG.format(seq=912) + "\n")
    assert (root.rule, root.category, root.phase) == ("NC007", "nccl_timeout", "training")


def test_one_element_timeout_after_fit_and_a_save_announcement_is_a_checkpoint_save(tmp_path):
    root = analyzed_root(tmp_path, "\n".join([EPOCH_BAR, FIT_STOPPED, SAVE, WATCHDOG.format(seq=40417)]) + "\n")
    assert (root.rule, root.phase) == ("NC007", "checkpoint_save")


def test_one_element_timeout_after_fit_ended_is_shutdown(tmp_path):
    root = analyzed_root(tmp_path, "\n".join([EPOCH_BAR, FIT_STOPPED, WATCHDOG.format(seq=40417)]) + "\n")
    assert (root.rule, root.phase) == ("NC007", "shutdown")


def _frame(path: str, line: int, func: str, code: str) -> str:
    return f'  File "{path}", line {line}, in {func}\n    {code}\n'


SITE = "/venv/lib/python3.10/site-packages"
INNER = ("Traceback (most recent call last):\n"
         + _frame(f"{SITE}/peft/peft_model.py", 287, "__getattr__", "return super().__getattr__(name)")
         + _frame(f"{SITE}/torch/nn/modules/module.py", 1614, "__getattr__", "raise AttributeError(")
         + "AttributeError: 'PeftModelForCausalLM' object has no attribute 'save_checkpoint'\n")
OUTER = ("Traceback (most recent call last):\n"
         + _frame("train.py", 98, "main", "trainer.train()")
         + _frame(f"{SITE}/transformers/trainer.py", 1884, "_inner_training_loop", "self._maybe_log_save_evaluate()")
         + _frame(f"{SITE}/transformers/trainer.py", 2196, "_maybe_log_save_evaluate", "self._save_checkpoint(model)")
         + _frame(f"{SITE}/transformers/trainer.py", 2257, "_save_checkpoint", "self.model_wrapped.save_checkpoint(d)")
         + _frame(f"{SITE}/peft/peft_model.py", 289, "__getattr__", "return getattr(self.base_model, name)")
         + _frame(f"{SITE}/torch/nn/modules/module.py", 1614, "__getattr__", "raise AttributeError(")
         + "AttributeError: 'LlamaForCausalLM' object has no attribute 'save_checkpoint'\n")
LOSS = "{'loss': 1.7142, 'learning_rate': 1.9e-05, 'epoch': 0.02}\n"


def test_a_handled_exception_takes_the_phase_of_its_chains_outer_frames(tmp_path):
    log = LOSS + INNER + "\nDuring handling of the above exception, another exception occurred:\n\n" + OUTER
    report = analyzed(tmp_path, log)
    inner = [f for f in report.findings if any("PeftModelForCausalLM" in e.text for e in f.evidence)]
    assert inner and all(f.phase == "checkpoint_save" for f in inner)


def test_an_unchained_exception_keeps_the_phase_of_its_markers(tmp_path):
    log = LOSS + INNER + "[INFO] launch.py: Killing subprocess 3318207\n"
    report = analyzed(tmp_path, log)
    inner = [f for f in report.findings if any("PeftModelForCausalLM" in e.text for e in f.evidence)]
    assert inner and all(f.phase == "training" for f in inner)


def test_a_barrier_thousands_of_collectives_into_the_run_is_not_before_training(tmp_path):
    """The watchdog line's own sequence number (2000 and more: the collective_seqnum marker) shows the job ran."""
    line = WATCHDOG.format(seq=5012).replace("OpType=ALLREDUCE, NumelIn=1, NumelOut=1", "OpType=BARRIER, NumelIn=0, NumelOut=0")
    root = analyzed_root(tmp_path, line + "\n")
    assert (root.rule, root.phase) == ("NC007", "training")
    low = analyzed_root(tmp_path, line.replace("SeqNum=5012", "SeqNum=512") + "\n")
    assert (low.rule, low.phase) == ("NC002", "init")
