"""The TRL side of benchmarks/grpo_step_vs_trl.py; runs inside the TRL venv, not smjax's.

Usage (the driver does this): `<envs-dir>/trl/bin/python _peer_trl.py --spec s.json --out r.json`.
The spec names the saved HF model directory, the fixed batch (.npz), prompts and settings.

Both measurements run TRL's own `GRPOTrainer.train()` loop (HF Trainer: `training_step` =
`compute_loss` forward + backward, then grad-norm clipping, the torch AdamW step, the scheduler
and per-step logging), timed per optimizer step by a `TrainerCallback` from `on_step_begin` to
`on_step_end`:
- step: `_generate_and_score_completions` is replaced by a function returning the fixed batch (the
  same prompt/completion ids, masks and advantages smjax trains on), so a step is TRL's update
  alone: its GRPO loss (`loss_type="dapo"`, i.e. token-mean over the batch) on logits of the
  completion positions (`logits_to_keep`), backward, clip, AdamW.
- iteration: nothing replaced: `transformers.generate` of G samples per prompt (`min_new_tokens`
  = max length, so every row runs the full length as on the smjax side), the python reward, the
  advantages and the same update.
Settings as the smjax side: f32 (`bf16=False`), no gradient checkpointing (TRL's default turns it
on; smjax does not recompute), beta 0 (no reference model), eps 0.2/0.28, max_grad_norm 1.0,
AdamW (0.9, 0.999, 1e-8, no decay), constant learning rate, one optimizer step per generation.
"""

from __future__ import annotations

import json
import os
import tempfile
import time

import numpy as np

import _peer_common as common


def make_tokenizer(vocab: int):
  """A word-level HF tokenizer for the "t<id>" text format (ids map one to one)."""
  # pylint: disable-next=import-outside-toplevel
  from tokenizers import Tokenizer, models, pre_tokenizers
  from transformers import PreTrainedTokenizerFast  # pylint: disable=import-outside-toplevel
  words = {"<pad>": common.PAD_ID, "<bos>": common.BOS_ID, "<eos>": common.EOS_ID}
  words.update({f"t{i}": i for i in range(common.FIRST_WORD_ID, vocab)})
  tok = Tokenizer(models.WordLevel(words, unk_token="<pad>"))
  tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>",
                                 eos_token="<eos>", padding_side="left")


def even_token_reward(completions, **_):
  """_peer_common.reward_of_ids on the decoded completion text."""
  return [common.reward_of_ids(common.text_to_ids(c)) for c in completions]


def run_trainer(spec: dict, *, steps: int, fixed_inputs=None) -> dict:
  """Runs GRPOTrainer.train() for `steps` optimizer steps; per-step times and the log."""
  import datasets  # pylint: disable=import-outside-toplevel
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  from trl import GRPOConfig, GRPOTrainer  # pylint: disable=import-outside-toplevel

  class StepTimer(transformers.TrainerCallback):
    def __init__(self):
      self.begin, self.end, self.faults = [], [], []

    def on_step_begin(self, args, state, control, **kwargs):
      self.faults.append(-common.minor_faults())
      self.begin.append(time.perf_counter())

    def on_step_end(self, args, state, control, **kwargs):
      self.end.append(time.perf_counter())
      self.faults[-1] += common.minor_faults()

  G, C = spec["group_size"], spec["completion_len"]
  prompts = [common.ids_to_text(p) for p in spec["prompts"]]
  rows = len(prompts) * G
  model = transformers.AutoModelForCausalLM.from_pretrained(spec["model_dir"],
                                                            dtype=torch.float32)
  timer = StepTimer()
  with tempfile.TemporaryDirectory() as out_dir:
    args = GRPOConfig(
        output_dir=out_dir, per_device_train_batch_size=rows, gradient_accumulation_steps=1,
        num_generations=G, max_completion_length=C, generation_kwargs={"min_new_tokens": C},
        temperature=1.0, top_p=1.0, top_k=0, learning_rate=spec["lr"],
        lr_scheduler_type="constant", beta=0.0, epsilon=0.2, epsilon_high=0.28,
        loss_type="dapo", scale_rewards="group", num_iterations=1, bf16=False, fp16=False,
        use_cpu=True, gradient_checkpointing=False, max_grad_norm=1.0, weight_decay=0.0,
        adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, max_steps=steps, logging_steps=1,
        report_to="none", save_strategy="no", seed=spec["seed"], dataloader_num_workers=0,
        disable_tqdm=True, shuffle_dataset=False)
    dataset = datasets.Dataset.from_dict({"prompt": prompts * (steps + 1)})
    trainer = GRPOTrainer(model=model, reward_funcs=even_token_reward, args=args,
                          train_dataset=dataset, processing_class=make_tokenizer(spec["vocab"]),
                          callbacks=[timer])
    if fixed_inputs is not None:
      # pylint: disable-next=protected-access
      trainer._generate_and_score_completions = lambda _batch: dict(fixed_inputs)
    trainer.train()
    optim = getattr(trainer.args.optim, "value", str(trainer.args.optim))
  times = [e - b for b, e in zip(timer.begin, timer.end)]
  logs = [h for h in trainer.state.log_history if "grad_norm" in h]
  return dict(times=times, faults=timer.faults, logs=logs, optim=optim)


def fixed_batch_inputs(batch_npz: str) -> dict:
  """The fixed step batch in the dict `_generate_and_score_completions` returns."""
  import torch  # pylint: disable=import-outside-toplevel
  b = np.load(batch_npz)
  mask = torch.from_numpy(b["completion_mask_BC"]).long()
  return {"prompt_ids": torch.from_numpy(b["prompt_BP"]).long(),
          "prompt_mask": torch.from_numpy(b["prompt_mask_BP"]).long(),
          "completion_ids": torch.from_numpy(b["completion_BC"]).long(),
          "completion_mask": mask,
          "advantages": torch.from_numpy(b["advantages_B"]).float(),
          "num_items_in_batch": mask.sum().float()}


def main():
  spec, out_path = common.read_spec(__doc__.split("\n\n")[0])
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  import trl  # pylint: disable=import-outside-toplevel
  threads = len(os.sched_getaffinity(0))
  torch.set_num_threads(threads)
  result = dict(threads=threads, torch=torch.__version__, transformers=transformers.__version__,
                trl=trl.__version__)
  if "step" in spec["modes"]:
    warm, reps = spec["warmup"], spec["reps"]
    run = run_trainer(spec, steps=warm + reps, fixed_inputs=fixed_batch_inputs(spec["batch_npz"]))
    result["step"] = dict(common.summary(run["times"][warm:], run["faults"][warm:]),
                          first_call_s=run["times"][0],
                          first_grad_norm=run["logs"][0]["grad_norm"],
                          first_loss=run["logs"][0]["loss"], optim=run["optim"],
                          what="GRPOTrainer.train() optimizer step on the fixed batch "
                               "(generation replaced): compute_loss (dapo) + backward + clip + "
                               f"AdamW ({run['optim']}); on_step_begin..on_step_end")
  if "iteration" in spec["modes"]:
    warm, reps = spec["iter_warmup"], spec["iter_reps"]
    run = run_trainer(spec, steps=warm + reps)
    result["iteration"] = dict(common.summary(run["times"][warm:], run["faults"][warm:]),
                               first_call_s=run["times"][0],
                               optim=run["optim"],
                               what="GRPOTrainer.train() optimizer step: transformers.generate "
                                    "(G samples, min_new_tokens = max) + reward + advantages + "
                                    "the update; on_step_begin..on_step_end")
  with open(out_path, "w") as f:
    json.dump(result, f, indent=2)


if __name__ == "__main__":
  main()
