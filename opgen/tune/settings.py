"""The budgets and rules of a tuning campaign, and the fixed value a campaign is built from.

Uses ``bench``, ``hardware``, ``spec``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from ..run import bench
from ..spec.hardware import ChipProfile
from ..spec.spec import OpSpec


@dataclass(frozen=True)
class Settings:
    """Budgets and rules of a campaign (the single source of its defaults).

    Attributes:
        trials: measured points per study at most.
        study_seconds, campaign_seconds: wall-clock budgets; a study gets at most
            ``study_seconds`` and at most an equal share of what the campaign has left
            (:meth:`Settings.study_budget`), so a tight campaign still reaches every study.
        exhaustive_below: feasible spaces this small are searched exhaustively.
        top_k: best points of each study re-measured side by side.
        tie_margin: relative gap under which two times are a tie (broken by the smaller
            on-chip estimate, then by the point's name).
        seed: sampler seed.
        point_timeout: seconds a single point may take (compile, check and timing).
        rounds: interleaved rounds of the side-by-side re-measure.
        compile_workers: extra worker processes that compile and check a batch of points in
            parallel before the timing worker measures them one by one (0: none).
    """

    trials: int = 40
    study_seconds: float = 900.0
    campaign_seconds: float = 3 * 3600.0
    exhaustive_below: int = 64
    top_k: int = 3
    tie_margin: float = 0.02
    seed: int = 0
    point_timeout: float = 300.0
    rounds: int = 5
    compile_workers: int = 0
    protocol: bench.Protocol = bench.DEFAULT

    def study_budget(self, campaign_left: float, studies_left: int) -> float:
        """Seconds for the next study: ``study_seconds``, or an equal share of the campaign's
        remaining seconds over the studies still to run when that is less (time a short study
        leaves unused flows to the later ones)."""
        return max(0.0, min(self.study_seconds, campaign_left / max(1, studies_left)))

    @property
    def batch(self) -> int:
        """Points asked at once: one per compile worker (1 without them)."""
        return max(1, self.compile_workers)


@dataclass(frozen=True)
class CampaignConfig:
    """What a campaign runs on, fixed for its whole run (``opgen.tune.campaign.open_campaign``).

    Attributes:
        spec, profile: the op and the chip.
        root: project root (its ``generated/`` is measured).
        backend, device, programs: where points run and the device's core count.
        toolchain: versions keying the studies and records.
        kernel_hash: variant name -> content hash of its generated kernel module.
        settings: budgets and rules.
        worker_env: environment of the worker processes (e.g. TRITON_INTERPRET=1).
        max_rel_l2: dtype name -> precision bar (rel L2 against the golden), from the spec.
        progress: show a progress bar.
    """

    spec: OpSpec
    profile: ChipProfile
    root: str
    backend: str
    device: str
    programs: int
    toolchain: dict[str, str]
    kernel_hash: dict[str, str]
    settings: Settings = Settings()
    worker_env: dict[str, str] = field(default_factory=dict)
    max_rel_l2: dict[str, float] = field(default_factory=dict)
    progress: bool = True

