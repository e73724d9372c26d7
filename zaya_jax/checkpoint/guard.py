"""Loss guard: flags non-finite losses / gradient norms and loss spikes (z-score over a window).

The trainer feeds it every step's (loss, grad_norm) and rolls back to the last good checkpoint when
`check` returns a reason. A flagged value never enters the window, so one spike does not mask the next.
"""

from __future__ import annotations

import collections
import math


class LossGuard:
    """`check(step, loss, grad_norm) -> None | reason`.

    nan_guard: flag NaN/Inf loss or grad norm. spike_zscore > 0: flag `loss > mean + z·std` over the last
    `window` accepted losses (only once the window is full; std floored at 1e-6·|mean| so a flat
    curve does not turn noise into spikes).
    """

    def __init__(self, *, nan_guard: bool = True, spike_zscore: float = 0.0, window: int = 32):
        self.nan_guard, self.spike_zscore, self.window = nan_guard, float(spike_zscore), int(window)
        self.history: collections.deque[tuple[int, float]] = collections.deque(maxlen=max(self.window, 1))

    @property
    def enabled(self) -> bool:
        return self.nan_guard or self.spike_zscore > 0

    def check(self, step: int, loss: float, grad_norm: float | None = None) -> str | None:
        if self.nan_guard and not math.isfinite(loss):
            return f"non-finite loss {loss}"
        if self.nan_guard and grad_norm is not None and not math.isfinite(grad_norm):
            return f"non-finite gradient norm {grad_norm}"
        if self.spike_zscore > 0 and len(self.history) >= self.window:
            values = [v for _, v in self.history]
            mean = sum(values) / len(values)
            std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
            z = (loss - mean) / max(std, 1e-6 * abs(mean), 1e-12)
            if z > self.spike_zscore:
                return f"loss spike {loss:.4g} (z-score {z:.1f} > {self.spike_zscore} over {len(values)} steps)"
        self.history.append((int(step), float(loss)))
        return None

    def rewind(self, step: int) -> None:
        """Forget losses of steps after `step` (they are replayed or skipped after a rollback)."""
        kept = [(s, v) for s, v in self.history if s <= step]
        self.history.clear()
        self.history.extend(kept)
