"""The layouts a layout search considers (docs/planner.md, "Searching for a layout"): every way to run one
config on `n` devices with the same global batch and the same math — data × expert (experts within a node)
× context, micro-batches × sequences per device, remat policy, `train.overlap_collectives` — and, for each,
what the search knows before compiling it: the expert capacity it needs, a floor under its memory per device
and an analytic estimate of its step time.

**Expert capacity.** Expert-parallel layouts run `ep_ragged` (`zaya_jax.model.expert_parallel`): each device
receives its E_l = E / n_ep experts' tokens from the n_ep devices of its expert group into one buffer of
B = ceil(cf · T) rows per micro-batch (T tokens per device); what would land past B is dropped. How many
overflow depends on how unevenly the group's tokens spread over the experts: the global imbalance the router
biases leave (load CV g), the content of the group's sequences, and sampling. The model here: one expert's
load in the group is normal with mean n_ep·T/E and relative spread σ_e = sqrt(g² + s² / (n_ep·k) + (1 − 1/E) /
(n_ep·T/E)) — k sequences per device per micro-batch, each adding an independent content spread s — and a
device's load, the sum of E_l such experts taken as independent, has σ = σ_e / sqrt(E_l). The expected dropped
fraction is σ · (φ(z) − z · (1 − Φ(z))) with z = (B/T − 1) / σ. g defaults to `LOAD_CV` = 0.3, the most a run
the trainer calls balanced may have (`train.health`; set it from a run's `moe/max_load_cv`); s =
`SPREAD_PER_SEQUENCE` = 0.45 fits the README's tiny example under the per-expert capacity of `ep` (one 128-token
sequence per device, 16 experts, load CV 0.26, capacity factor 2: 1.35% and 1.82% dropped; `dropped_fraction`,
the same model for one device's tokens per expert, gives 1.4%). Normal tails are thin, so the model errs low
where drops are rare (the demo, 2 sequences of 256 tokens at capacity 3: up to 0.2% measured). The search
picks, per layout, the smallest capacity factor of `CAPACITY_GRID` whose expected drop is at most
`max_dropped`; data-only layouts train dropless (no capacity, nothing dropped).
"""

from __future__ import annotations

import copy
import dataclasses
import math

import ml_collections

from zaya_jax.model.expert_parallel import receive_rows
from zaya_jax.model.experts import capacity
from zaya_jax.train.health import BALANCED_CV

CAPACITY_GRID = (1.0, 1.125, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0)
SPREAD_PER_SEQUENCE = 0.45  # relative per-expert load spread one sequence adds (fitted, module docstring)
LOAD_CV = BALANCED_CV  # global expert-load CV assumed (the trainer's balanced bound)
SEARCH_REMAT = ("none", "dots", "full")
CONTEXT_SEQ_LEN = 16_384  # sequences at least this long also try context parallelism within a node


@dataclasses.dataclass(frozen=True)
class Layout:
    """One way to run the step on `data · expert · context` devices: each batch shard (data × expert) takes
    `microbatches` micro-batches of `sequences` sequences per optimizer step."""

    data: int
    expert: int
    context: int
    microbatches: int
    sequences: int
    remat: str
    overlap_collectives: bool = False
    capacity_factor: float = 1.0  # receive buffer (ep_ragged dispatch); 1.0 and unused on data-only meshes
    expected_dropped: float = 0.0  # expected fraction of routed tokens over capacity (module docstring)

    @property
    def devices(self) -> int:
        return self.data * self.expert * self.context

    @property
    def global_batch(self) -> int:
        return self.data * self.expert * self.microbatches * self.sequences

    @property
    def mesh(self) -> dict[str, int]:
        return {"data": self.data, "expert": self.expert, "context": self.context}

    @property
    def dispatch(self) -> str:
        """What the trainer runs: the ragged all-to-all under an expert axis, else the dropless GEMMs."""
        return "ep_ragged" if self.expert > 1 else "dropless"

    def name(self) -> str:
        mesh = " × ".join(f"{a}:{s}" for a, s in self.mesh.items() if s > 1 or a == "data")
        extra = " +overlap" if self.overlap_collectives else ""
        cf = f", cf {self.capacity_factor:g}" if self.expert > 1 else ""
        return f"{mesh}, {self.microbatches}×{self.sequences} seq, remat {self.remat}{extra}{cf}"

    def overrides(self) -> dict[str, object]:
        """The config fields (section.field) that run this layout, added to the config the search was given."""
        out: dict[str, object] = {f"mesh.{a}": s for a, s in self.mesh.items()}
        out |= {
            "train.global_batch_size": self.global_batch,
            "train.microbatches": self.microbatches,
            "model.remat": self.remat,
            "train.overlap_collectives": self.overlap_collectives,
            "model.dispatch": self.dispatch,
        }
        if self.expert > 1:
            out["model.capacity_factor"] = self.capacity_factor
        return out

    def train_flags(self) -> list[str]:
        """The `launch.train` flags of `overrides`."""
        return [
            f"--config.{k}={v:g}" if isinstance(v, float) else f"--config.{k}={v}" for k, v in self.overrides().items()
        ]

    def apply(self, config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
        """A copy of `config` with `overrides` set."""
        config = copy.deepcopy(config)
        with config.unlocked():
            for key, value in self.overrides().items():
                section, field = key.split(".")
                config[section][field] = value
        return config


def divisors(x: int) -> list[int]:
    return [d for d in range(1, x + 1) if x % d == 0]


def load_spread(tokens: int, num_experts: int, sequences: int, spread: float, load_cv: float) -> float:
    """σ of the module docstring: relative spread of one device's per-expert load."""
    mean = tokens / num_experts
    return math.sqrt(load_cv**2 + spread**2 / max(sequences, 1) + (1 - 1 / num_experts) / mean)


def dropped_fraction(
    cf: float, tokens: int, num_experts: int, sequences: int, spread: float = SPREAD_PER_SEQUENCE,
    load_cv: float = LOAD_CV,
) -> float:  # fmt: skip
    """Expected fraction of one device's `tokens` routed tokens (of `sequences` sequences) over `ep`'s capacity of
    ceil(cf · tokens / E) per expert: the module docstring's model for one device's tokens per expert."""
    sigma = load_spread(tokens, num_experts, sequences, spread, load_cv)
    return _overflow(sigma, capacity(tokens, num_experts, cf) / (tokens / num_experts))


def _overflow(sigma: float, buffer_over_mean: float) -> float:
    """E[max(0, L − B)] / E[L] for a load L normal with mean 1 and relative spread σ, B = buffer_over_mean."""
    z = (buffer_over_mean - 1) / sigma
    pdf = math.exp(-z * z / 2) / math.sqrt(2 * math.pi)
    tail = 0.5 * math.erfc(z / math.sqrt(2))
    return max(0.0, sigma * (pdf - z * tail))


def receive_dropped_fraction(
    cf: float, tokens: int, num_experts: int, expert_devices: int, sequences: int,
    spread: float = SPREAD_PER_SEQUENCE, load_cv: float = LOAD_CV,
) -> float:  # fmt: skip
    """Expected fraction of routed tokens over `ep_ragged`'s receive buffers (module docstring): `tokens` per device
    of `sequences` sequences, `expert_devices` devices in an expert group."""
    group, rows = tokens * expert_devices, receive_rows(tokens, expert_devices, cf)
    if rows >= group:  # a buffer that holds the whole group's tokens
        return 0.0
    sigma = load_spread(group, num_experts, sequences * expert_devices, spread, load_cv)
    return _overflow(sigma / math.sqrt(num_experts // expert_devices), rows / tokens)


def pick_capacity(
    tokens: int, num_experts: int, expert_devices: int, sequences: int, spread: float, load_cv: float,
    max_dropped: float,
) -> tuple[float, float] | None:  # fmt: skip
    """(smallest capacity factor of CAPACITY_GRID whose expected `ep_ragged` drop ≤ max_dropped, that drop), else
    None."""
    for cf in CAPACITY_GRID:
        dropped = receive_dropped_fraction(cf, tokens, num_experts, expert_devices, sequences, spread, load_cv)
        if dropped <= max_dropped:
            return cf, dropped
    return None


def enumerate_layouts(
    config: ml_collections.ConfigDict,
    num_devices: int,
    gpus_per_node: int,
    global_batch: int,
    *,
    remats: tuple[str, ...] = SEARCH_REMAT,
    spread: float = SPREAD_PER_SEQUENCE,
    load_cv: float = LOAD_CV,
    max_dropped: float = 0.01,
) -> tuple[list[Layout], list[str]]:
    """Every layout of `config` on `num_devices` with `global_batch` sequences per step (module docstring), and
    one line per family left out with the reason (e.g. no capacity keeps drops under `max_dropped`)."""
    m, seq = config.model, int(config.train.seq_len)
    zero1 = config.train.param_sharding == "zero1"
    contexts = [1] + ([c for c in (2, 4, 8) if c <= gpus_per_node] if seq >= CONTEXT_SEQ_LEN else [])
    layouts, skipped = [], []
    for expert in (e for e in divisors(gpus_per_node) if m.num_experts % e == 0):
        for context in contexts:
            if expert * context > gpus_per_node or num_devices % (expert * context):
                continue
            data = num_devices // (expert * context)
            shards = data * expert
            if global_batch % shards:
                skipped.append(
                    f"data:{data} × expert:{expert} × context:{context}: {global_batch} sequences "
                    f"do not split over {shards} batch shards"
                )
                continue
            for microbatches in divisors(global_batch // shards):
                sequences = global_batch // shards // microbatches
                cf, dropped = 1.0, 0.0
                if expert > 1:
                    tokens = sequences * seq // context
                    picked = pick_capacity(tokens, m.num_experts, expert, sequences, spread, load_cv, max_dropped)
                    if picked is None:
                        skipped.append(
                            f"data:{data} × expert:{expert}, {microbatches}×{sequences} seq: no capacity "
                            f"factor up to {CAPACITY_GRID[-1]:g} keeps drops ≤ {max_dropped:.0%}"
                        )
                        continue
                    cf, dropped = picked
                for remat in remats:
                    for overlap in (False, True) if zero1 and remat == "full" else (False,):
                        layouts.append(
                            Layout(data, expert, context, microbatches, sequences, remat, overlap, cf, dropped)
                        )
    return layouts, skipped
