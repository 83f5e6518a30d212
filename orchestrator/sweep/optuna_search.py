"""Ray's ``OptunaSearch``, made safe for a resumed driver.

After ``kill -9`` of the driver, Tune's last experiment snapshot (saved every ~10 s) can be
older than the Optuna study in ``<sweep>/optuna.db``: a trial the study already holds as
finished is still "running" in the snapshot, so the restored Tune re-starts it and reports for
it, and Ray's ``OptunaSearch.on_trial_result`` then raises ``UpdateFinishedTrialError`` and
stops the whole sweep. Here a result for a finished study trial is ignored (the trial driver
also returns at once for trials the Parquet dataset already holds as finished: trial.py).
"""

from __future__ import annotations

from typing import Any

from ray.tune.search.optuna import OptunaSearch

__all__ = ["ResumableOptunaSearch"]


class ResumableOptunaSearch(OptunaSearch):
    def _finished(self, trial_id: str) -> bool:
        ot_trial = self._ot_trials.get(trial_id)
        if ot_trial is None:
            return False
        frozen = self._ot_study._storage.get_trial(ot_trial._trial_id)
        return frozen.state.is_finished()

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        if self._finished(trial_id):
            return
        super().on_trial_result(trial_id, result)
