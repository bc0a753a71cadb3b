"""What the GRPO peer benchmarks share on both sides: model shapes, the fixed batch, the reward, the
token text format, timing, the machine's CPU name, and the peer virtual environments.

Imported by the smjax-side drivers (benchmarks/grpo_step_vs_*.py, smjax's venv) and by the peer
scripts (benchmarks/_peer_*.py, run inside the peer's own venv), so it needs only the standard
library and numpy at import time.

Token text format: id i >= 3 is the word "t<i>"; 0, 1, 2 are pad, bos, eos. A prompt string is
its ids as words ("t17 t5 t301"), so every side tokenises it to exactly the same ids.

Legend: B rows (prompts x G), G group size, P prompt length (padded), C completion length.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import select
import statistics
import subprocess
import sys
import time
import traceback

import numpy as np

# Each peer's venv (`<envs-dir>/<peer>`), pinned so that figures stay comparable across runs.
TUNIX_REQUIREMENTS = ["google-tunix==0.1.7"]

PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
FIRST_WORD_ID = 3

SIZES = {  # Qwen3-style: vocab, d_model, d_ff, layers, heads, kv_heads, head_dim
    "tiny": (512, 64, 128, 2, 4, 2, 16),       # smoke tests
    "small": (4096, 256, 768, 4, 4, 2, 64),    # ~5M params
    "mid": (8192, 384, 1024, 4, 6, 2, 64),     # ~13M params
}


def hf_config_kwargs(size: str) -> dict:
  """`transformers.Qwen3Config` keyword arguments of a size (untied head, f32)."""
  vocab, d, ff, layers, heads, kv, hd = SIZES[size]
  return dict(vocab_size=vocab, hidden_size=d, intermediate_size=ff, num_hidden_layers=layers,
              num_attention_heads=heads, num_key_value_heads=kv, head_dim=hd,
              max_position_embeddings=1024, rope_theta=1e6, tie_word_embeddings=False,
              rms_norm_eps=1e-6, pad_token_id=PAD_ID, bos_token_id=BOS_ID, eos_token_id=EOS_ID)


def ids_to_text(ids) -> str:
  return " ".join(f"t{int(i)}" for i in ids)


def text_to_ids(text: str) -> list[int]:
  """Inverse of ids_to_text; special-token words map to their ids, anything else is skipped."""
  special = {"<pad>": PAD_ID, "<bos>": BOS_ID, "<eos>": EOS_ID}
  out = []
  for w in text.split():
    if w in special:
      out.append(special[w])
    elif w.startswith("t") and w[1:].isdigit():
      out.append(int(w[1:]))
  return out


def reward_of_ids(ids) -> float:
  """The benchmark's reward: the fraction of completion tokens with an even id (any cheap,
  deterministic function of the completion does; every side calls this one)."""
  ids = [int(i) for i in ids if int(i) >= FIRST_WORD_ID]
  return sum(1 for i in ids if i % 2 == 0) / max(len(ids), 1)


def make_prompts(*, prompts: int, prompt_len: tuple[int, int], vocab: int, seed: int):
  """`prompts` lists of word ids with lengths uniform in [lo, hi]."""
  rng = np.random.RandomState(seed)
  lo, hi = prompt_len
  return [[int(t) for t in rng.randint(FIRST_WORD_ID, vocab, rng.randint(lo, hi + 1))]
          for _ in range(prompts)]


def grpo_advantages(rewards_B: np.ndarray, group_size: int, eps: float = 1e-6) -> np.ndarray:
  """(r - group mean) / (unbiased group std + eps), 0 for constant groups: the advantage smjax
  computes (mode "grpo"); handed to the peers so all sides take the same gradient."""
  r = rewards_B.reshape(-1, group_size).astype(np.float64)
  std = r.std(axis=1, ddof=1, keepdims=True)
  constant = np.ptp(r, axis=1, keepdims=True) == 0
  adv = np.where(constant, 0.0, (r - r.mean(axis=1, keepdims=True)) / np.where(constant, 1.0,
                                                                                std + eps))
  return adv.reshape(-1).astype(np.float32)


def prompt_bucket(max_prompt_len: int) -> int:
  """The padded prompt length: the next power of two (the smjax sampler's bucket)."""
  return 1 << (max_prompt_len - 1).bit_length()


def make_step_batch(*, prompts: int, group_size: int, prompt_len: tuple[int, int],
                    completion_len: int, vocab: int, seed: int,
                    pad_to: int | None = None) -> dict[str, np.ndarray]:
  """A fixed GRPO batch as numpy arrays: prompts left-padded to P = `pad_to` (default: the
  longest prompt) [B, P], right-padded completions [B, C] whose lengths vary in [C/2, C] (pad id
  after the end), binary rewards and their advantages. Rows are [prompt0 x G, prompt1 x G, ...];
  the prompts are `make_prompts(...)` of the same arguments."""
  plist = make_prompts(prompts=prompts, prompt_len=prompt_len, vocab=vocab, seed=seed)
  rng = np.random.RandomState(seed + 1)
  B, P, C = prompts * group_size, max(len(p) for p in plist), completion_len
  if pad_to is not None:
    if pad_to < P:
      raise ValueError(f"make_step_batch: {pad_to=} is shorter than the longest prompt ({P})")
    P = pad_to
  prompt_BP = np.full((B, P), PAD_ID, np.int64)
  prompt_mask_BP = np.zeros((B, P), np.int64)
  for i, p in enumerate(plist):
    rows = slice(i * group_size, (i + 1) * group_size)
    prompt_BP[rows, P - len(p):] = p
    prompt_mask_BP[rows, P - len(p):] = 1
  lengths_B = rng.randint(max(C // 2, 1), C + 1, B)
  completion_BC = rng.randint(FIRST_WORD_ID, vocab, (B, C)).astype(np.int64)
  completion_mask_BC = (np.arange(C)[None, :] < lengths_B[:, None]).astype(np.int64)
  completion_BC[completion_mask_BC == 0] = PAD_ID
  rewards_B = rng.randint(0, 2, B).astype(np.float32)
  return dict(prompt_BP=prompt_BP, prompt_mask_BP=prompt_mask_BP, completion_BC=completion_BC,
              completion_mask_BC=completion_mask_BC, rewards_B=rewards_B,
              advantages_B=grpo_advantages(rewards_B, group_size))


def timed(fn, reps: int, faults: list[int] | None = None) -> list[float]:
  """Wall times of `reps` calls of `fn`; each call's minor page faults are appended to `faults`
  when one is given."""
  times = []
  for _ in range(reps):
    f0, t0 = minor_faults(), time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
    if faults is not None:
      faults.append(minor_faults() - f0)
  return times


def summary(times: list[float], faults: list[int] | None = None) -> dict:
  """Median and runs of `times`; with `faults` (minor page faults of the same calls, all threads
  of this process) also their mean per call: how many pages each call mapped in afresh."""
  out = dict(median_s=statistics.median(times), runs_s=list(times))
  if faults is not None:
    out["minor_faults_per_call"] = sum(faults) / max(len(faults), 1)
  return out


def cpu_name() -> str:
  """The CPU's model name (/proc/cpuinfo), or the machine type where there is none: what every
  benchmark's JSON records of the machine it timed."""
  try:
    with open("/proc/cpuinfo") as f:
      return next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
  except (OSError, StopIteration):
    return platform.machine()


def minor_faults() -> int:
  """This process's minor page faults so far (getrusage; every thread's)."""
  return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def pin_threads(threads: int) -> int:
  """Pins this process (and so every child it starts) to the first `threads` allowed CPUs and
  sets OMP_NUM_THREADS to match (0: leave both as they are); returns the CPU count in use."""
  if threads:
    cpus = sorted(os.sched_getaffinity(0))
    if threads > len(cpus):
      raise ValueError(f"--threads {threads} exceeds the {len(cpus)} CPUs this process may use")
    os.sched_setaffinity(0, cpus[:threads])
    os.environ["OMP_NUM_THREADS"] = str(threads)
  return len(os.sched_getaffinity(0))


# ------------------------------------------------------------------------------- peer venvs

def ensure_venv(env_dir: str, requirements: list[str], *, log=print) -> str:
  """The python of a venv at `env_dir` holding `requirements` (created and installed on first
  use; a stamp file records what was installed, so a changed list reinstalls). Returns its path.
  Raises RuntimeError naming the failing command and the tail of its output."""
  python = os.path.join(env_dir, "bin", "python")
  stamp = os.path.join(env_dir, "smjax-bench-requirements.json")
  if os.path.exists(stamp):
    with open(stamp) as f:
      if json.load(f) == requirements:
        return python
  if not os.path.exists(python):
    log(f"creating venv {env_dir}")
    _run([sys.executable, "-m", "venv", env_dir], "python -m venv")
  log(f"installing into {env_dir}: {' '.join(requirements)} (first run only; several minutes)")
  _run([python, "-m", "pip", "install", "--disable-pip-version-check", *requirements],
       f"pip install {' '.join(requirements)}")
  with open(stamp, "w") as f:
    json.dump(requirements, f)
  return python


def _run(cmd: list[str], what: str) -> None:
  proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
  if proc.returncode:
    tail = (proc.stdout + proc.stderr)[-3000:]
    raise RuntimeError(f"{what} failed (exit {proc.returncode}):\n{tail}")


def read_spec(description: str) -> tuple[dict, str]:
  """A peer script's command line (`--spec s.json --out r.json`, as run_peer passes it): the spec
  and the path its result goes to."""
  import argparse  # pylint: disable=import-outside-toplevel
  ap = argparse.ArgumentParser(description=description)
  ap.add_argument("--spec", required=True)
  ap.add_argument("--out", required=True)
  cli = ap.parse_args()
  with open(cli.spec) as f:
    return json.load(f), cli.out


def run_peer(python: str, script: str, spec: dict, work_dir: str, *, timeout_s: float,
             extra_env: dict | None = None, log=print) -> dict:
  """Runs `python script --spec spec.json --out result.json` (inheriting this process's CPU
  affinity, thread variables and environment, plus `extra_env`) and returns its result JSON.
  Raises RuntimeError with the peer's output tail when it fails or writes no result."""
  spec_path = os.path.join(work_dir, "spec.json")
  out_path = os.path.join(work_dir, "result.json")
  with open(spec_path, "w") as f:
    json.dump(spec, f)
  env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.abspath(__file__)),
             **(extra_env or {}))
  log(f"running peer: {python} {os.path.basename(script)} (timeout {timeout_s:.0f} s"
      + (f"; {' '.join(f'{k}={v}' for k, v in extra_env.items())}" if extra_env else "") + ")")
  try:
    proc = subprocess.run([python, script, "--spec", spec_path, "--out", out_path], env=env,
                          capture_output=True, text=True, timeout=timeout_s, check=False)
  except subprocess.TimeoutExpired as e:
    raise RuntimeError(f"peer {os.path.basename(script)} ran past {timeout_s:.0f} s") from e
  if proc.returncode or not os.path.exists(out_path):
    tail = (proc.stdout + proc.stderr)[-4000:]
    raise RuntimeError(f"peer {os.path.basename(script)} failed (exit {proc.returncode}):\n{tail}")
  with open(out_path) as f:
    return json.load(f)


# ------------------------------------------------------------------------- a peer that serves

# A serving peer answers one JSON line per request on its stdout, marked so that whatever else a
# library prints there cannot be mistaken for an answer.
_MARK = "@@peer "


def serve(handlers: dict, ready: dict) -> None:
  """A peer script's request loop (the peer side of PeerSession): announces `ready`, then answers
  each request line `{"op": name, "args": {...}}` with `handlers[name](**args)` until `{"op":
  "quit"}` or end of input. A handler's exception is answered with its traceback, then the peer
  exits non-zero."""
  def say(obj):
    sys.stdout.write(_MARK + json.dumps(obj) + "\n")
    sys.stdout.flush()
  say(dict(ready=ready))
  for line in sys.stdin:
    req = json.loads(line)
    if req["op"] == "quit":
      return
    try:
      say(dict(answer=handlers[req["op"]](**req.get("args", {}))))
    except Exception:  # pylint: disable=broad-except
      say(dict(error=traceback.format_exc()[-3000:]))
      sys.exit(1)


class PeerSession:
  """A peer script kept running between requests, so that a benchmark can interleave its timed
  rounds with the other sides' (a peer in its own venv cannot run in this process). Starts
  `python script --spec spec.json --out <unused>` (this process's CPU affinity, thread variables
  and environment, plus `extra_env`) and waits for it to announce itself; `ready` is what it
  announced. `call` sends one request and returns the answer; `close` ends the peer. Every failure
  (exit, error, no answer in time) raises RuntimeError with the peer's output tail."""

  def __init__(self, python: str, script: str, spec: dict, work_dir: str, *, timeout_s: float,
               extra_env: dict | None = None, log=print):
    self.name = os.path.basename(script)
    spec_path = os.path.join(work_dir, "spec.json")
    with open(spec_path, "w") as f:
      json.dump(spec, f)
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.abspath(__file__)),
               **(extra_env or {}))
    log(f"starting peer: {python} {self.name} (serving; start-up timeout {timeout_s:.0f} s)")
    self._err_path = os.path.join(work_dir, "peer_stderr.txt")
    self._err = open(self._err_path, "w")  # pylint: disable=consider-using-with
    self._proc = subprocess.Popen(  # pylint: disable=consider-using-with
        [python, script, "--spec", spec_path, "--out", os.path.join(work_dir, "unused.json")],
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err)
    self._buf, self._seen = b"", []
    self.ready = self._read(timeout_s)["ready"]

  def call(self, op: str, *, timeout_s: float, **args):
    self._proc.stdin.write((json.dumps(dict(op=op, args=args)) + "\n").encode())
    self._proc.stdin.flush()
    return self._read(timeout_s)["answer"]

  def close(self) -> None:
    if self._proc.poll() is None:
      try:
        self._proc.stdin.write(b'{"op": "quit"}\n')
        self._proc.stdin.close()
        self._proc.wait(timeout=60)
      except (OSError, subprocess.TimeoutExpired):
        self._proc.kill()
        self._proc.wait()
    self._err.close()

  def _fail(self, why: str):
    self._proc.kill()
    self._proc.wait()
    self._err.close()
    with open(self._err_path, errors="replace") as f:
      tail = ("\n".join(self._seen) + "\n" + f.read())[-4000:]
    raise RuntimeError(f"peer {self.name} {why}:\n{tail}")

  def _read(self, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    fd = self._proc.stdout.fileno()
    while True:
      while b"\n" in self._buf:
        line, self._buf = self._buf.split(b"\n", 1)
        text = line.decode(errors="replace")
        if text.startswith(_MARK):
          msg = json.loads(text[len(_MARK):])
          if "error" in msg:
            self._seen.append(msg["error"])
            self._fail("failed")
          return msg
        self._seen = (self._seen + [text])[-50:]
      left = deadline - time.monotonic()
      if left <= 0:
        self._fail(f"gave no answer within {timeout_s:.0f} s")
      if select.select([fd], [], [], left)[0]:
        chunk = os.read(fd, 65536)
        if not chunk:
          self._proc.wait()
          self._fail(f"exited (code {self._proc.returncode}) without an answer")
        self._buf += chunk
