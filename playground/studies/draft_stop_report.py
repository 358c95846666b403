"""`bench draft-stop`'s report as records (studies/draft_stops.py measures): a row per method, drafter and
prompt set against fixed k=5, the rules chosen, and the table; `to_json` writes results.json's shape and
`from_json` reads it back."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable

from playground.evaluation.machine import described
from playground.evaluation.tables import markdown_table, read_record


@dataclass(frozen=True)
class StopRow:
    """One method of one drafter over one prompt set, against fixed k=5 on the same prompts (paired ratios,
    95% intervals over its units: the prompts, the questions about one document together)."""
    prompt_set: str
    drafter: str
    method: str
    k: int
    rule: str | None                  # the rule that ends its chains; None for fixed k
    prompts: int
    tau: float
    tokens_per_step: float            # tokens after the prefill, over every verify step
    tokens_per_step_vs_k5: float
    tokens_per_step_vs_k5_ci: list[float]
    tokens_per_s: float
    speedup_vs_k5: float
    speedup_vs_k5_ci: list[float]
    drafted_per_step: float
    refused_per_step: float           # drafted, not accepted
    draft_ms: float
    verify_ms: float
    answers_differ: int               # prompts whose answer differs from k=5's
    units: int = 0                    # what the intervals resample (0: written before they were counted)

    def to_json(self) -> dict:
        row = asdict(self)
        if not row["units"]:   # a row read from a file written before units were counted is written as it was
            del row["units"]
        return {"set": row.pop("prompt_set"), **row}

    @classmethod
    def from_json(cls, row: dict) -> StopRow:
        return read_record(cls, row, prompt_set=row["set"])


@dataclass(frozen=True)
class DraftStopReport:
    choice: list[StopRow]             # every candidate on the held-out prompts (none where rules were given)
    chosen: dict[str, list[str]]      # drafter -> its rules, one per signal
    evaluation: list[StopRow]         # on the chat sample and the long documents
    config: dict                      # the DraftStopConfig, as asdict writes it
    machine: dict | None = None

    @property
    def lossless(self) -> bool:
        return not any(r.answers_differ for r in self.evaluation)

    def to_json(self) -> dict:
        out = {"choice": [r.to_json() for r in self.choice], "chosen": self.chosen,
               "evaluation": [r.to_json() for r in self.evaluation], "config": self.config}
        return out | ({"machine": self.machine} if self.machine is not None else {})

    @classmethod
    def from_json(cls, res: dict) -> DraftStopReport:
        return cls([StopRow.from_json(r) for r in res["choice"]], res["chosen"],
                   [StopRow.from_json(r) for r in res["evaluation"]], res["config"], res.get("machine"))


COLUMNS: tuple[tuple[str, Callable[[StopRow], object]], ...] = (
    ("prompts", lambda r: f"{r.prompt_set} ({r.prompts}" + (f" on {r.units} texts)" if 0 < r.units < r.prompts
                                                            else ")")), ("drafter", lambda r: r.drafter),
    ("method", lambda r: r.method), ("tau", lambda r: f"{r.tau:.2f}"),
    ("tokens/step", lambda r: f"{r.tokens_per_step:.2f}"), ("tok/s", lambda r: f"{r.tokens_per_s:.1f}"),
    ("vs k=5 (95% CI over {over})", lambda r: f"{r.speedup_vs_k5:.2f}x" + ("" if r.units == 1   # no interval
                                                               else " ({:.2f}-{:.2f})".format(*r.speedup_vs_k5_ci))),
    ("drafted/step", lambda r: f"{r.drafted_per_step:.2f}"), ("refused/step", lambda r: f"{r.refused_per_step:.2f}"),
    ("draft ms/step", lambda r: f"{r.draft_ms:.1f}"), ("verify ms/step", lambda r: f"{r.verify_ms:.1f}"),
    ("answers differing", lambda r: r.answers_differ))


def table(rows: list[StopRow]) -> str:
    """The rows' table; rows written before units were counted had their intervals over prompts, and say so."""
    over = "the set's units" if any(r.units for r in rows) else "prompts"
    head = [name.format(over=over) for name, _ in COLUMNS]
    return markdown_table(head, ([cell(r) for _, cell in COLUMNS] for r in rows))


def markdown(result: DraftStopReport) -> str:
    host = f"{described(result.machine)}\n\n" if result.machine is not None else ""
    choice = (f"### The thresholds, chosen on held-out prompts\n\n{table(result.choice)}\n\nchosen: " +
              "; ".join(f"{d}: {', '.join(rules)}" for d, rules in result.chosen.items()) + "\n\n"
              if result.choice else "")
    return f"{host}{choice}### Against fixed k, on prompts the choice never saw\n\n{table(result.evaluation)}\n"
