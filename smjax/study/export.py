"""`smjax export WORKDIR --phase ARM --out DIR [--seed N]`: a finished study arm's model as a
Hugging Face directory, which `transformers.AutoModelForCausalLM` / `AutoTokenizer` and
`smjax eval` (smjax.model_eval) load.

  smjax export runs/demo --phase split_merge --out /tmp/student    # MOPD's student, seed 0
  smjax export gs://BUCKET/run --phase joint_grpo --seed 2 --out gs://BUCKET/run/export/joint

ARM is an arm as the report names it (base, joint_grpo, expert_<domain>, split_merge,
split_merge@<bar>, external_teacher, control_teacher, external_opd, control_opd, degrade,
recover_self, recover_external, recover_grpo, the last four also with @<fraction> for a further
depth of the degradation; in a strong-to-weak study base_strong and joint_grpo_strong) or a
phase directory of the seed; an arm's parameters are its phase's final ones,
`WORKDIR/seed_N/<phase>/final/` (`phase_of`: the split_merge arms are the `mopd` phases, every
other arm is the phase of its name), in the shape of the model that phase ran (`_model`:
the external teacher's preset, in a strong-to-weak study experts.preset for base_strong,
joint_grpo_strong and the experts, else the student's). Two more of the checkpoints the report
reads are kept and exported (`checkpoint_of`): `<arm>@rule`, a teachers' arm run on to its cap
where its stop rule would have ended it (the same as `<arm>` where the rule never did, or the
arm was ended by its rule), and `expert_<domain>@<bar>`, an expert where it first held that
fraction of joint GRPO's gain (the checkpoint split_merge@<bar> distilled from).

Written to DIR: config.json (the architecture the model's flags name: Qwen3 with qk_norm, Qwen2
with qkv_bias, else Llama; a study on an HF model keeps its source's), model.safetensors (sharded
past 4 GiB, with its index), generation_config.json, the tokenizer files and smjax_export.json
(which study, seed, arm and phase, and the step and accuracy of the evaluation of the exported
parameters). A study on an HF model (`model.hf_path`) has its source directory's tokenizer files
copied, its chat template with them where it has one; a toy study's char tokenizer is written
as a tokenizer.json (smjax.models.tokenizer.char_tokenizer_files: `AutoTokenizer` gives the ids
the study fed the model; smjax reloads it as the char tokenizer itself). The export is written
beside DIR and moved into place (locally) or uploaded file by file with smjax_export.json last
(gs://), so a directory holding smjax_export.json is whole; DIR may replace an earlier export,
never another directory. Why it is built this way: docs/design.md#export-and-evaluation.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile

import ml_collections as mlc

from smjax import paths
from smjax.json_io import read_json
from smjax.study.records import ARMS_FILE   # not run's: run pulls in every phase
from smjax.study.rules import AT_RULE

# Files a Hugging Face model directory may keep its tokenizer, chat template and generation
# defaults in; those of a study's source model that exist are copied into its export.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "added_tokens.json", "vocab.json", "merges.txt", "tokenizer.model",
                   "chat_template.jinja", "chat_template.json", "generation_config.json")
EXPORT_FILE = "smjax_export.json"
# Token-id fields of a source config.json that `generate` reads, kept in the export's.
_TOKEN_FIELDS = ("bos_token_id", "eos_token_id", "pad_token_id")
# The arms a study can have (smjax.study.run names them), as patterns.
_ARMS = re.compile(r"^(base(_strong)?|joint_grpo(_strong)?|expert_.+|split_merge(@.+)?|"
                   r"external_teacher|control_teacher|external_opd|control_opd|"
                   r"(degrade|recover_(self|external|grpo))(@.+)?)$")
# A snapshot an arm's run kept (smjax.study.store.snapshot_dir): "<arm>@rule" for any arm,
# "expert_<domain>@<bar>".
_SNAPSHOT = re.compile(r"^(?P<arm>.+)(?P<at>" + re.escape(AT_RULE) + r")$|"
                       r"^(?P<expert>expert_[^@]+)@(?P<bar>.+)$")
# The phases that run experts.preset's model when it is set (strong-to-weak, smjax.study.run).
_EXPERTS_MODEL = re.compile(r"^(base_strong|joint_grpo_strong|expert_.+)$")


def phase_of(arm: str) -> str:
  """The phase directory that holds `arm`'s parameters: `split_merge[@<bar>]` is MOPD's student,
  `mopd[@<bar>]`; every other arm is the phase of its own name (smjax.study.run)."""
  if arm == "split_merge" or arm.startswith("split_merge@"):
    return "mopd" + arm.removeprefix("split_merge")
  return arm


def checkpoint_of(arm: str) -> tuple[str, str | None]:
  """(the arm whose run holds `arm`'s parameters, the snapshot label they are kept under, None
  for the run's final parameters): "external_opd@rule" -> ("external_opd", "rule"),
  "expert_math@0.9" -> ("expert_math", "0.9"), "split_merge@0.9" -> ("split_merge@0.9", None)
  (a run of its own)."""
  m = _SNAPSHOT.match(arm)
  if m is None:
    return arm, None
  if m["at"]:
    return m["arm"], AT_RULE.removeprefix("@")
  return m["expert"], m["bar"]


def _weights(seed_dir: str, phase: str, arm: str, result: dict) -> tuple[str, dict]:
  """(the directory of `arm`'s parameters, the curve point they were evaluated at); a one-line
  error where a snapshot `arm` names was never kept."""
  from smjax.study import store  # pylint: disable=import-outside-toplevel
  curve, extra = result.get("curve") or [{}], result.get("extra") or {}
  final = (paths.join(seed_dir, phase, "final"), curve[-1])
  _, label = checkpoint_of(arm)
  if label is None:
    return final
  if label == store.RULE_SNAPSHOT:
    end = extra.get("rule_end")
    # Ended by its rule (run without to_cap), or its rule never ended it: the run's end is both.
    if not (end or {}).get("met"):
      return final
    kept = store.snapshot_dir(seed_dir, phase, label)
    if not paths.exists(kept):
      raise FileNotFoundError(
          f"--phase {arm}: {phase} kept no parameters where its stop rule would have ended it "
          f"(no {kept}; it ran before smjax kept them); export {phase} (its cap) or rerun it")
    return kept, curve[min(int(end["index"]), len(curve) - 1)]
  snaps = extra.get("snapshots") or {}
  if label not in snaps:
    raise ValueError(f"--phase {arm}: {phase} kept no checkpoint at {label!r}; it kept "
                     f"{', '.join(sorted(snaps)) or 'none'} (its bars of joint GRPO's gain)")
  step = snaps[label]["step"]
  return (store.snapshot_dir(seed_dir, phase, label),
          next((p for p in curve if p.get("step") == step), {"step": step}))


def resolve(workdir: str, arm: str, seed: int) -> tuple[str, str]:
  """(the seed's directory, the finished phase that backs `arm`); a one-line error naming the
  seed's finished arms when `arm` names none, or its phase has not finished."""
  seed_dir = paths.join(workdir, f"seed_{seed}")
  if not paths.exists(seed_dir):
    seeds = [n.removeprefix("seed_") for n in paths.listdir(workdir) if n.startswith("seed_")]
    raise FileNotFoundError(f"{seed_dir}: no such seed directory; give --seed one of the seeds "
                            f"this workdir has ({', '.join(seeds) or 'none yet'})")
  arms_file = paths.join(seed_dir, ARMS_FILE)
  arms = [a.get("arm") for a in read_json(
      arms_file, "rerun the study command, which rewrites it", keys=("arms",))["arms"]
          ] if paths.exists(arms_file) else []
  done = [d for d in paths.listdir(seed_dir)
          if paths.exists(paths.join(seed_dir, d, "result.json"))]
  finished = f"seed {seed} has finished {', '.join(arms or done) or 'no arm yet'}"
  run = checkpoint_of(arm)[0]
  if run not in arms and run not in done and not _ARMS.match(run):
    raise ValueError(f"--phase {arm}: no such arm; expected an arm as the report names it "
                     f"(e.g. split_merge, joint_grpo, expert_math, external_opd@rule, base): "
                     f"{finished}")
  phase = phase_of(run)
  if not paths.exists(paths.join(seed_dir, phase, "result.json")):
    raise FileNotFoundError(f"--phase {arm}: its phase {phase!r} has not finished in {seed_dir} "
                            f"(no {phase}/result.json); {finished}")
  return seed_dir, phase


def _model(config: mlc.ConfigDict, phase: str, workdir: str):
  """(ModelConfig of `phase`'s parameters, the source HF directory or None, the architecture)."""
  # pylint: disable=import-outside-toplevel
  from smjax.models import hf
  from smjax.models.presets import get_preset
  from smjax.study.config import experts_model_cfg
  m = config.model
  strong = (experts_model_cfg(config) if _EXPERTS_MODEL.match(phase) and experts_preset(config)
            else None)
  if phase == "external_teacher":   # a larger preset of its own (smjax.study.phases)
    cfg, source = get_preset(config.external.teacher_preset), None
  elif strong is not None:          # experts.preset's bigger model (strong-to-weak)
    cfg, source = strong, None
  elif m.hf_path:
    source = m.hf_path
    if not os.path.exists(os.path.join(source, "config.json")):
      raise FileNotFoundError(
          f"config.model.hf_path={source} (in {paths.join(workdir, 'config.json')}): no "
          f"{os.path.join(source, 'config.json')}; the export takes that model's config and "
          "tokenizer files: run it where the study's model directory is")
    # The source's context length, not the study's (model.max_seq_len only sized its buffers).
    cfg = hf.config_from_hf(source, param_dtype=m.param_dtype, dtype=m.dtype)
  else:
    cfg, source = get_preset(m.preset, param_dtype=m.param_dtype, dtype=m.dtype,
                             **({"max_seq_len": m.max_seq_len} if m.max_seq_len else {})), None
  if source is not None:
    arch = read_json(os.path.join(source, "config.json"), "fix the model directory",
                     keys=("architectures",))["architectures"][0]
  else:
    arch = ("Qwen3ForCausalLM" if cfg.qk_norm else "Qwen2ForCausalLM" if cfg.qkv_bias
            else "LlamaForCausalLM")
  return cfg, source, arch


def experts_preset(config: mlc.ConfigDict) -> str:
  """The study's experts.preset ("" before the field existed, or for experts of the student's
  model)."""
  return config.get("experts", {}).get("preset", "")


def _tokenizer_files(cfg, source: str | None) -> dict[str, bytes]:
  """{file name: bytes} of the export's tokenizer files and generation_config.json."""
  if source is None:
    # pylint: disable=import-outside-toplevel
    from smjax.models.tokenizer import CharTokenizer, char_tokenizer_files
    tok = CharTokenizer()
    files = {n: t.encode() for n, t in char_tokenizer_files(cfg.max_seq_len).items()}
    files["generation_config.json"] = json.dumps(
        {"bos_token_id": tok.bos_id, "eos_token_id": tok.eos_id, "pad_token_id": tok.pad_id},
        indent=1).encode()
    return files
  return {n: paths.read_bytes(os.path.join(source, n)) for n in TOKENIZER_FILES
          if os.path.exists(os.path.join(source, n))}


def _has_chat_template(files: dict[str, bytes]) -> bool:
  if "chat_template.jinja" in files or "chat_template.json" in files:
    return True
  try:
    return bool(json.loads(files.get("tokenizer_config.json", b"{}")).get("chat_template"))
  except ValueError:
    return False


def _check_out(out: str) -> None:
  """DIR may be absent, empty or an earlier export (it holds EXPORT_FILE); nothing else."""
  if paths.exists(out) and paths.listdir(out) and not paths.exists(paths.join(out, EXPORT_FILE)):
    raise FileExistsError(f"--out {out}: exists and holds files that are not an earlier export "
                          f"(no {EXPORT_FILE}); give a new or empty directory")


def export(workdir: str, arm: str, out: str, *, seed: int = 0) -> dict:
  """Writes arm `arm` of study seed `seed` in `workdir` as a Hugging Face directory `out` (module
  docstring); returns what it wrote: {"out", "arm", "phase", "seed", "architecture", "dtype",
  "parameters", "files", "tokenizer", "chat_template"}. Both paths may be gs:// URLs."""
  for where, ckpts in ((workdir, True), (out, False)):
    paths.check_workdir(where, checkpoints=ckpts)
  workdir, out = paths.resolve(workdir), paths.resolve(out)
  cfg_path = paths.join(workdir, "config.json")
  if not paths.exists(cfg_path):
    raise FileNotFoundError(f"{workdir}: not a study workdir (no config.json); give the "
                            "directory a study ran in (its --workdir)")
  config = mlc.ConfigDict(read_json(cfg_path, "rerun the study command, which writes it",
                                    keys=("model",)))
  seed_dir, phase = resolve(workdir, arm, seed)
  _check_out(out)
  result = read_json(paths.join(seed_dir, phase, "result.json"),
                     f"delete {paths.join(seed_dir, phase)} to rerun that phase")
  where, point = _weights(seed_dir, phase, arm, result)
  # Whether the experts were a bigger model is the phase's own config's word (the workdir's
  # config.json is the latest run's, which may have changed experts.preset since).
  if isinstance(result.get("config"), dict) and "experts" in config:
    config.experts.preset = result["config"].get("experts", {}).get("preset", "")
  cfg, source, arch = _model(config, phase, workdir)
  # pylint: disable=import-outside-toplevel
  import jax
  import numpy as np
  from smjax.models import hf
  from smjax.models.transformer import init_params
  from smjax.study import store
  template = jax.eval_shape(lambda: init_params(cfg, jax.random.key(0)))
  params = store.load_params(where, template, f"{arm!r} of seed {seed}")
  params = jax.tree.map(np.asarray, params)
  files = _tokenizer_files(cfg, source)
  if source is not None:
    src = read_json(os.path.join(source, "config.json"), "fix the model directory")
    extra = {k: src[k] for k in _TOKEN_FIELDS if k in src}
  else:
    gen = json.loads(files["generation_config.json"])
    extra = {k: gen[k] for k in _TOKEN_FIELDS}
  model = source or config.model.preset
  if phase == "external_teacher":
    model = config.external.teacher_preset
  elif _EXPERTS_MODEL.match(phase) and experts_preset(config):
    model = experts_preset(config)
  meta = {"workdir": workdir, "seed": seed, "arm": arm, "phase": phase, "model": model,
          "architecture": arch, "dtype": cfg.param_dtype,
          "accuracy": point.get("accuracy"), "step": point.get("step"), "smjax": _version()}
  stage = tempfile.mkdtemp(prefix="smjax-export-") if paths.is_url(out) else out + ".partial"
  try:
    if os.path.exists(stage) and not paths.is_url(out):
      shutil.rmtree(stage)
    hf.save_params(stage, cfg, params, architecture=arch, extra_config=extra)
    for name, data in files.items():
      with open(os.path.join(stage, name), "wb") as f:
        f.write(data)
    with open(os.path.join(stage, EXPORT_FILE), "w") as f:
      json.dump(meta, f, indent=1)
    names = sorted(os.listdir(stage))
    if paths.is_url(out):
      paths.rmtree(out)   # an earlier export (`_check_out`): none of its shards is left behind
      # One upload per file, smjax_export.json last: a directory that holds it is whole.
      for name in [n for n in names if n != EXPORT_FILE] + [EXPORT_FILE]:
        with open(os.path.join(stage, name), "rb") as f:
          paths.write_atomic(paths.join(out, name), f.read())
    else:
      if os.path.exists(out):
        shutil.rmtree(out)
      os.replace(stage, out)
  finally:
    if os.path.exists(stage):
      shutil.rmtree(stage, ignore_errors=True)
  n_params = int(sum(np.asarray(x).size for x in jax.tree_util.tree_leaves(params)))
  return {"out": out, "arm": arm, "phase": phase, "seed": seed, "architecture": arch,
          "dtype": cfg.param_dtype, "parameters": n_params, "files": names,
          "tokenizer": "source" if source is not None else "char",
          "chat_template": _has_chat_template(files)}


def _version() -> str:
  from smjax.main import version  # pylint: disable=import-outside-toplevel
  return version()


def main(argv: list[str] | None = None) -> int:
  """`smjax export` (module docstring): prints where the export went and what it holds."""
  from smjax.main import OneLineParser  # pylint: disable=import-outside-toplevel
  p = OneLineParser(prog="smjax export", description=__doc__.split("\n\n")[0])
  p.add_argument("workdir", help="a study's --workdir (local or gs://)")
  p.add_argument("--phase", required=True, metavar="ARM",
                 help="the arm as the report names it, e.g. split_merge, joint_grpo, "
                 "expert_math, external_opd@rule, base (or a phase directory, e.g. mopd); "
                 "expert_<domain>@<bar>: an expert's checkpoint at that bar")
  p.add_argument("--out", required=True, metavar="DIR",
                 help="the Hugging Face directory to write (new, empty or an earlier export)")
  p.add_argument("--seed", type=int, default=0, metavar="N", help="the study seed (default 0)")
  a = p.parse_args(argv)
  r = export(a.workdir, a.phase, a.out, seed=a.seed)
  print(f"exported arm {r['arm']} (seed {r['seed']}, phase {r['phase']}): {r['architecture']}, "
        f"{r['parameters']:,} parameters, {r['dtype']}")
  print(f"  to {r['out']}: {', '.join(r['files'])}")
  if r["tokenizer"] == "char":
    print("  tokenizer: the toy char tokenizer as tokenizer.json (transformers' AutoTokenizer "
          "loads it; smjax reloads it as the char tokenizer); no chat template")
  else:
    print(f"  tokenizer: the source model's files, "
          f"{'with' if r['chat_template'] else 'without'} a chat template")
  print(f"  evaluate: smjax eval {r['out']} --data FILE")
  return 0


if __name__ == "__main__":
  sys.exit(main())
