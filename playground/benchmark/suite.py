"""The benchmark's prompt suite: written for this project, separate from the training prompts
(playground/eagle/prompts.py) and from `train eval`'s held-out prompts.

Categories follow SPEED-Bench's split: short everyday categories, long context at about 1k, 2k
and 4k prompt tokens (the project's own documents in assets/bench and assets/presets, cut at a
paragraph to the budget), chat templates the drafters never saw, and system prompts far from
the training personas.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from playground.request import GenerationRequest

ASSETS = Path(__file__).resolve().parents[2] / "assets"
DOCUMENTS = {
    "council": ASSETS / "bench" / "council_minutes.md",
    "observatory": ASSETS / "bench" / "observatory_manual.md",
    "harbor": ASSETS / "presets" / "harbor_report.md",
}


@dataclass(frozen=True)
class BenchPrompt:
    category: str
    prompt: str
    system: str | None = None
    template: str = "model"

    def request(self, drafter: str, k: int, max_tokens: int) -> GenerationRequest:
        return GenerationRequest(prompt=self.prompt, system=self.system, template=self.template,
                                 drafter=drafter, k=k, max_tokens=max_tokens)


CHAT = [
    "My houseplants keep dying even though I water them every day. What am I doing wrong?",
    "How can I make new friends after moving to a new city?",
    "What is a good way to prepare for a job interview the night before?",
    "Is it better to rent or buy a home? Give me the main points to think about.",
]
CODING = [
    "Write a Python function that groups a list of words by their first letter and returns a dictionary.",
    "Write a JavaScript function that debounces another function by a given number of milliseconds.",
    "Write a Python script that reads a text file and prints the ten most common words with their counts.",
    "Write a Go function that checks whether a slice of integers is sorted in ascending order.",
]
MATH = [
    "A train travels 180 km in 2 hours and then 120 km in 1.5 hours. What is its average speed? Show your steps.",
    "Solve the equation 3x + 7 = 2x - 5 and check your answer.",
    "What is 15% of 240, and how do you calculate it in your head?",
    "A rectangle has a perimeter of 36 cm and its length is twice its width. Find its area.",
]
WRITING = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Write a friendly email to a neighbour asking them to water my plants while I am away.",
    "Write a product description for a handmade wooden chess set.",
    "Write a poem about the first snow of winter.",
]
LONG_CONTEXT = {  # budget in tokens -> (documents in order, questions about the first one)
    1000: (("council",), ("What did the council decide about the skate park, and how will it be paid for?",
                          "What did residents ask for during the public comments?",
                          "Why is the meeting held in the main hall of the community centre?")),
    2000: (("observatory", "council"), ("What must a volunteer check before opening the dome?",
                                        "What are the safety rules for visitors in the dome?",
                                        "Describe the steps for closing down the observatory.")),
    4000: (("harbor", "observatory", "council"), ("What were the main findings of the report?",
                                                   "Summarise the budget figures in the report.",
                                                   "What does the report recommend for next year?")),
}
PERTURBED = [  # the model's own template is the only one in training
    ("How do I remove a coffee stain from a white shirt?", "plain"),
    ("What are some fun things to do on a rainy weekend?", "markdown"),
    ("Write a Python function that returns the second largest number in a list.", "plain"),
    ("Explain why the sky looks blue during the day.", "markdown"),
]
OOD_SYSTEM = [
    ("What is the capital of Australia?", "Answer only in JSON with the keys \"answer\" and \"confidence\"."),
    ("Describe a sunrise.", "You are a Linux terminal. Reply only with terminal output inside a code block."),
    ("How do vaccines work?", "Write every answer as a numbered list of exactly five short points, all in capital letters."),
    ("Tell me about elephants.", "You are a medieval town crier. Begin every answer with 'Hear ye, hear ye!'."),
]
CATEGORIES = ("chat", "coding", "math", "writing", "long context 1k", "long context 2k", "long context 4k",
              "perturbed template", "odd system prompt")


def long_context(budget: int, documents: tuple[str, ...], tokenizer) -> str:
    """The documents in order, cut at a paragraph so the text stays within `budget` tokens."""
    paragraphs = [p for name in documents for p in DOCUMENTS[name].read_text().split("\n\n")]
    kept, used = [], 0
    for p in paragraphs:
        n = len(tokenizer(p + "\n\n", add_special_tokens=False).input_ids)
        if used + n > budget:
            break
        kept.append(p)
        used += n
    return "\n\n".join(kept)


def suite(tokenizer, categories: tuple[str, ...] = CATEGORIES, per_category: int | None = None) -> list[BenchPrompt]:
    prompts = []
    for category in categories:
        if category in ("chat", "coding", "math", "writing"):
            chosen = [BenchPrompt(category, p) for p in {"chat": CHAT, "coding": CODING, "math": MATH,
                                                         "writing": WRITING}[category]]
        elif category.startswith("long context"):
            budget = int(category.split()[-1].rstrip("k")) * 1000
            documents, questions = LONG_CONTEXT[budget]
            text = long_context(budget, documents, tokenizer)
            chosen = [BenchPrompt(category, f"Read the text below and answer the question after it.\n\n{text}"
                                            f"\n\nQuestion: {q}") for q in questions]
        elif category == "perturbed template":
            chosen = [BenchPrompt(category, p, template=t) for p, t in PERTURBED]
        elif category == "odd system prompt":
            chosen = [BenchPrompt(category, p, system=s) for p, s in OOD_SYSTEM]
        else:
            raise KeyError(f"unknown category {category!r}; choose from {', '.join(CATEGORIES)}")
        prompts += chosen[:per_category]
    return prompts
