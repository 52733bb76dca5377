"""The grader: reward 1.0 when the answer the workflow left in ``ctx.artifacts_dir`` is the label."""

from __future__ import annotations

import math

from osmosis_ai.rollout import Grader, GraderConfig, GraderContext


class CalcGraderConfig(GraderConfig):
    name: str = "calc-grader"
    tolerance: float = 1e-6


calc_grader_config = CalcGraderConfig()


class CalcGrader(Grader):
    async def grade(self, ctx: GraderContext) -> float:
        config = self.config or CalcGraderConfig()
        answer_file = ctx.artifacts_dir / "answer.txt" if ctx.artifacts_dir is not None else None
        answer = answer_file.read_text().strip() if answer_file is not None and answer_file.is_file() else None
        reward = 1.0 if same_answer(answer, ctx.label, config.tolerance) else 0.0
        ctx.set_reward(reward)
        return reward


def same_answer(answer: str | None, label: str | None, tolerance: float) -> bool:
    if answer is None or label is None:
        return False
    try:
        return math.isclose(float(answer), float(label), rel_tol=0.0, abs_tol=tolerance)
    except ValueError:
        return answer == label.strip()
