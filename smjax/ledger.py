"""The FLOP ledger: FLOPs x invocations per phase, persisted, and FLOPs-to-reach-accuracy.

Phases (docs/design.md#ledger-phases) are "<namespace>/<name>": `rollout/prefill`,
`rollout/decode`, `train/policy`, `train/reference`, `train/teacher` count towards training
totals; `eval/*` (held-out and stop-set evaluation) and `base/*` (what no arm is charged: the
base model's SFT, the external teacher's, claim (d)'s degradation) are reported separately and
excluded from them.

The ledger keeps records (phase, program, flops_per_call, calls, useful, step) and per-phase totals,
updated together so that a phase's total is always exactly the sum of its records' flops_per_call x
calls (FLOPs are Python ints: exact at any size). Records of the same (phase, program,
flops_per_call) are merged into one aggregate (calls and useful summed, first/last step kept) when
there are more than `max_records`, and always in `to_dict()`, so a checkpoint stays small over
thousands of steps. `to_dict()` is JSON-safe (ints may exceed int64: save it as JSON, not as an
array); `from_dict` rebuilds the ledger and checks the stored totals against the records.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Sequence

from smjax.flops import ProgramCall

PHASES = ("rollout/prefill", "rollout/decode", "train/policy", "train/reference", "train/teacher",
          "eval/*", "base/*")
TRAINING_NAMESPACES = ("rollout", "train")
NAMESPACES = TRAINING_NAMESPACES + ("eval", "base")
_VERSION = 1


def _check_phase(phase: str) -> str:
  namespace, _, name = phase.partition("/")
  if namespace not in NAMESPACES or not name:
    raise ValueError(f"ledger phase {phase!r} must be '<namespace>/<name>' with namespace in "
                     f"{NAMESPACES}; standard phases: {PHASES}")
  return phase


def is_training(phase: str) -> bool:
  return phase.partition("/")[0] in TRAINING_NAMESPACES


def _as_int(value, what: str) -> int:
  out = int(round(float(value))) if not isinstance(value, int) else value
  if out < 0:
    raise ValueError(f"ledger: {what}={value} must be >= 0")
  return out


@dataclasses.dataclass
class FlopRecord:
  """`calls` runs of one program (flops_per_call each) in `phase`; `useful` is the analytic count
  for all of them. An aggregate of `adds` records spans steps [step, last_step]."""
  phase: str
  program: str
  flops_per_call: int
  calls: int
  useful: int = 0
  step: int | None = None
  last_step: int | None = None
  adds: int = 1

  @property
  def flops(self) -> int:
    return self.flops_per_call * self.calls

  @property
  def key(self) -> tuple[str, str, int]:
    return (self.phase, self.program, self.flops_per_call)


def _merge_step(a, b, pick):
  return b if a is None else a if b is None else pick(a, b)


class FlopLedger:
  """FLOPs x invocations per phase. See the module docstring for phases and invariants."""

  def __init__(self, *, max_records: int = 2048):
    self.max_records = max_records
    self._records: list[FlopRecord] = []
    self._flops: dict[str, int] = {}
    self._useful: dict[str, int] = {}
    self._calls: dict[str, int] = {}

  # ------------------------------------------------------------------ adding
  def _append(self, record: FlopRecord) -> int:
    _check_phase(record.phase)
    self._records.append(record)
    self._flops[record.phase] = self._flops.get(record.phase, 0) + record.flops
    self._useful[record.phase] = self._useful.get(record.phase, 0) + record.useful
    self._calls[record.phase] = self._calls.get(record.phase, 0) + record.calls
    if len(self._records) > self.max_records:
      self.compact()
    return record.flops

  def add(self, call: ProgramCall | Iterable[ProgramCall], *, step: int | None = None) -> int:
    """Adds a `ProgramCall` (or several) at training step `step`; returns the FLOPs added.

    Compiles each program once per shape signature (cached) to read its FLOPs.
    """
    if not isinstance(call, ProgramCall):
      return sum(self.add(c, step=step) for c in call)
    return self._append(FlopRecord(
        _check_phase(call.phase), call.program_name(),
        _as_int(call.flops_per_call(), f"{call.phase} flops_per_call"),
        _as_int(call.calls, f"{call.phase} calls"), _as_int(call.useful, f"{call.phase} useful"),
        step, step))

  def add_flops(self, phase: str, flops: float, calls: int = 1, useful: float = 0, *,
                step: int | None = None, program: str = "") -> int:
    """Adds `calls` runs of work costing `flops` FLOPs each (useful: analytic count of all runs)."""
    return self._append(FlopRecord(
        _check_phase(phase), program, _as_int(flops, f"{phase} flops"),
        _as_int(calls, f"{phase} calls"), _as_int(useful, f"{phase} useful"), step, step))

  def merge(self, other: "FlopLedger") -> "FlopLedger":
    """Adds every record of `other` (e.g. an arm = its experts' ledgers + the distillation's)."""
    for r in other.records:
      self._append(dataclasses.replace(r))
    return self

  def compact(self) -> None:
    """Merges records of the same (phase, program, flops_per_call); totals are unchanged."""
    merged: dict[tuple, FlopRecord] = {}
    for r in self._records:
      if r.key not in merged:
        merged[r.key] = dataclasses.replace(r)
        continue
      m = merged[r.key]
      m.calls += r.calls
      m.useful += r.useful
      m.adds += r.adds
      m.step = _merge_step(m.step, r.step, min)
      m.last_step = _merge_step(m.last_step, r.last_step, max)
    self._records = list(merged.values())

  # ------------------------------------------------------------------ reading
  @property
  def records(self) -> tuple[FlopRecord, ...]:
    return tuple(self._records)

  def by_phase(self) -> dict[str, int]:
    return dict(sorted(self._flops.items()))

  def useful_by_phase(self) -> dict[str, int]:
    return dict(sorted(self._useful.items()))

  def calls_by_phase(self) -> dict[str, int]:
    return dict(sorted(self._calls.items()))

  def total(self, training_only: bool = True) -> int:
    """Measured FLOPs: training phases (rollout/*, train/*) only, or every phase."""
    return sum(v for p, v in self._flops.items() if is_training(p) or not training_only)

  def useful_total(self, training_only: bool = True) -> int:
    return sum(v for p, v in self._useful.items() if is_training(p) or not training_only)

  def namespace_total(self, namespace: str) -> int:
    return sum(v for p, v in self._flops.items() if p.partition("/")[0] == namespace)

  def metrics(self) -> dict[str, float]:
    """A flat dict for the metrics stream: "flops/<phase>", "useful_flops/<phase>", totals."""
    out = {f"flops/{p}": float(v) for p, v in self.by_phase().items()}
    out.update({f"useful_flops/{p}": float(v) for p, v in self.useful_by_phase().items()})
    training, useful = self.total(), self.useful_total()
    out["flops/total_training"] = float(training)
    out["flops/total_eval"] = float(self.namespace_total("eval"))
    out["flops/total_base"] = float(self.namespace_total("base"))
    out["flops/total"] = float(self.total(training_only=False))
    out["useful_flops/total_training"] = float(useful)
    if training:
      out["flops/useful_fraction_training"] = useful / training
    return out

  # ------------------------------------------------------------------ persistence
  def to_dict(self) -> dict:
    """JSON-safe: compacted records plus per-phase totals (checked again by `from_dict`)."""
    snapshot = FlopLedger(max_records=self.max_records)
    snapshot._records = [dataclasses.replace(r) for r in self._records]
    snapshot.compact()
    return {"version": _VERSION, "max_records": self.max_records,
            "records": [dataclasses.asdict(r) for r in snapshot._records],
            "flops": self.by_phase(), "useful": self.useful_by_phase(),
            "calls": self.calls_by_phase()}

  @classmethod
  def from_dict(cls, d: dict) -> "FlopLedger":
    if d.get("version") != _VERSION:
      raise ValueError(f"FlopLedger.from_dict: version={d.get('version')!r}, expected {_VERSION}")
    ledger = cls(max_records=int(d.get("max_records", 2048)))
    for r in d["records"]:
      ledger._append(FlopRecord(
          r["phase"], r["program"], _as_int(r["flops_per_call"], "flops_per_call"),
          _as_int(r["calls"], "calls"), _as_int(r["useful"], "useful"),
          None if r["step"] is None else int(r["step"]),
          None if r["last_step"] is None else int(r["last_step"]), int(r["adds"])))
    for field, got in (("flops", ledger._flops), ("useful", ledger._useful),
                       ("calls", ledger._calls)):
      stored = {p: _as_int(v, f"{field}[{p}]") for p, v in d.get(field, {}).items()}
      if stored != got:
        raise ValueError(f"FlopLedger.from_dict: stored per-phase {field} {stored} != the sum of "
                         f"the records {got}")
    return ledger

  def __repr__(self) -> str:
    return (f"FlopLedger(training={self.total():.4g}, all={self.total(False):.4g}, "
            f"phases={self.by_phase()})")


# ----------------------------------------------------------------------------- accuracy vs FLOPs

def flops_to_reach(curve: Sequence[tuple[float, float]], target: float) -> float | None:
  """FLOPs at which an accuracy-vs-FLOPs curve first reaches `target` (None: never reached).

  `curve` is [(flops, accuracy), ...] in order of non-decreasing FLOPs. The first point with
  accuracy >= target is the first crossing; before it, accuracy was below target, and the FLOPs are
  interpolated linearly between that point and the one before. Reached at the first point: its
  FLOPs.
  """
  prev = None
  for i, (flops, acc) in enumerate(curve):
    flops, acc = float(flops), float(acc)
    if prev is not None and flops < prev[0]:
      raise ValueError(f"flops_to_reach: curve[{i}] flops={flops} < curve[{i - 1}] "
                       f"flops={prev[0]}; the curve must be in order of non-decreasing FLOPs")
    if acc >= target:
      if prev is None:
        return flops
      (f0, a0), (f1, a1) = prev, (flops, acc)
      return f0 + (target - a0) / (a1 - a0) * (f1 - f0)
    prev = (flops, acc)
  return None


def describe_reach(flops: float | None) -> str:
  """How reports print a `flops_to_reach` result."""
  return "never reached" if flops is None else f"{flops:.3e}"
