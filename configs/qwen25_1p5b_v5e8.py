r"""A real model: Qwen2.5-1.5B-class experts and MOPD on a TPU v5e-8, with local JSONL data.

  python -m smjax.main --config=configs/qwen25_1p5b_v5e8.py:hf_path=/data/Qwen2.5-1.5B-Instruct,math=/data/gsm8k.jsonl,code=/data/mbpp.jsonl --workdir=gs://.../run
  (or launch/tpu.sh run ... -- python -m smjax.main --config=... on every worker)

Arguments: `hf_path` (a local HF directory with config.json, safetensors and tokenizer.json),
`math` ({question, answer} JSONL/Parquet, verified with math-verify) and `code` ({prompt, tests,
entry_point}, verified in the sandbox). Nothing is downloaded: fetch the weights and data first
(`hf download Qwen/Qwen2.5-1.5B-Instruct --local-dir /data/Qwen2.5-1.5B-Instruct`; GSM8K, MATH,
MBPP and HumanEval files as published, or `python -m smjax.prepare` for the study's JSONL with a
train/test split). Every prompt goes through the model's chat template (its tokenizer_config.json;
`--config.model.chat_template=none` feeds raw text).
Mesh: fsdp=8 over the 8 chips (params and Adam moments sharded; rows over data x fsdp), bf16
compute. Check memory before paying for the slice:
  python -m smjax.precheck --preset qwen2.5-1.5b --mesh fsdp=8 --batch 64 --seq 1024 --topology v5e-8

Expected runtime / result: not measured yet (no TPU has run this config); the FLOP ledger gives
each step's cost, and the report the same tables as the toy study (docs/study.md).
"""

from smjax.study.config import parse_arg, study_defaults


def get_config(arg=None):
  a = parse_arg(arg, hf_path="", math="", code="")
  if not (a.hf_path and a.math and a.code):
    raise ValueError("configs/qwen25_1p5b_v5e8.py needs hf_path=DIR,math=FILE,code=FILE")
  c = study_defaults()
  c.name = "qwen25_1p5b_v5e8"
  c.model.hf_path = a.hf_path
  c.model.dtype = "bfloat16"
  c.model.max_seq_len = 1536
  c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 1, 8, 1
  c.domains = (f"jsonl_math:{a.math}", f"jsonl_code:{a.code}")
  c.phases = ("base", "joint", "experts", "mopd")
  c.base.steps = 0            # the instruct checkpoint is the base
  # The band is the toy study's calibration; a real base is what it is (a warning says where it
  # lies against the band).
  c.band.check = False
  c.heldout_size = 500
  c.rl.prompts_per_step = 64
  c.rl.samples_per_prompt = 8
  c.rl.max_new_tokens = 512
  c.rl.learning_rate = 1e-6
  c.rl.micro_batches = 4
  c.opd.prompts_per_step = 64
  c.opd.samples_per_prompt = 4
  c.opd.learning_rate = 1e-6
  c.opd.micro_batches = 4
  c.joint.steps = 400
  c.experts.steps = 200
  c.mopd.steps = 100
  c.eval.batch_size = 250
  c.eval.points = 10
  c.checkpoint_every = 20
  return c
