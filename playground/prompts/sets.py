"""Every fixed prompt set and document: the benchmark's suite, `train eval`'s held-out prompts and
kinds, and the long-context documents (the page's presets take theirs from here too). All are
written for this project and are absent from the training prompts (playground/training/prompts.py).

Categories follow SPEED-Bench's split: short everyday categories, long context at about 1k, 2k
and 4k prompt tokens (the project's own documents in assets/bench and assets/presets, cut at a
paragraph to the budget), chat templates the drafters never saw, and system prompts far from
the training personas.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from playground.engines.request import GenerationRequest

ASSETS = Path(__file__).resolve().parents[2] / "assets"
DOCUMENTS = {
    "council": ASSETS / "bench" / "council_minutes.md",
    "observatory": ASSETS / "bench" / "observatory_manual.md",
    "harbor": ASSETS / "presets" / "harbor_report.md",
}


def document_prompt(text: str, question: str, intro: str = "Read this report and answer the question after it.") -> str:
    """A question after a document: every long-context prompt of the page, the benchmark and the evaluation."""
    return f"{intro}\n\n{text}\n\nQuestion: {question}"


def report_prompt(question: str) -> str:
    """A question about the harbor report (the page's preset and the held-out long-context kind)."""
    return document_prompt(DOCUMENTS["harbor"].read_text(), question)


def documents_prompt(question: str) -> str:
    """A question after all three documents, the report last (~4,400 tokens)."""
    return document_prompt("\n\n".join(path.read_text() for path in DOCUMENTS.values()), question,
                           "Read these three documents and answer the question after them.")


@dataclass(frozen=True)
class BenchPrompt:
    category: str
    prompt: str
    system: str | None = None
    template: str = "model"
    document: str | None = None   # a long-context category's one text, which all its questions ask about

    @property
    def id(self) -> str:
        """The prompt's opening words: how the report names a prompt whose answers differed."""
        return self.prompt[:60]

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
            chosen = [BenchPrompt(category, document_prompt(text, q, "Read the text below and answer the question "
                                                                     "after it."), document=category)
                      for q in questions]
        elif category == "perturbed template":
            chosen = [BenchPrompt(category, p, template=t) for p, t in PERTURBED]
        elif category == "odd system prompt":
            chosen = [BenchPrompt(category, p, system=s) for p, s in OOD_SYSTEM]
        else:
            raise KeyError(f"unknown category {category!r}; choose from {', '.join(CATEGORIES)}")
        prompts += chosen[:per_category]
    return prompts


# `train eval`'s held-out prompts: written for evaluation, absent from the training prompt set
HELDOUT_CHAT = [
    "What should I pack for a weekend hiking trip in autumn?",
    "Can you suggest three ideas for a child's birthday party at home?",
    "How do I politely decline an invitation to a wedding?",
    "What is the difference between weather and climate?",
    "Give me tips for falling asleep faster.",
    "Why do cats purr?",
    "How can I keep my houseplants alive while I am on holiday for two weeks?",
    "What is a good way to start running if I have never exercised?",
    "My neighbour's dog barks all night. How should I bring it up with them?",
    "Can you explain what a mortgage is in simple words?",
    "What are some cheap and healthy meals I can cook in twenty minutes?",
    "How do I prepare for my first job interview?",
    "Why is the sky blue?",
    "What should I consider when adopting a rescue dog?",
    "How can I learn a new language when I only have fifteen minutes a day?",
    "Is it better to rent or buy a car if I drive only on weekends?",
    "What are the signs that I need new running shoes?",
    "How do I remove a coffee stain from a white shirt?",
    "Can you help me plan a relaxing Sunday?",
    "Why do leaves change colour in the autumn?",
    "What is a polite way to ask my manager for a raise?",
    "How can I stop procrastinating on my homework?",
    "What are the benefits of drinking enough water?",
    "How do vaccines train the body to fight a disease?",
]
HELDOUT_CODE = [
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "Write a JavaScript function that removes duplicate values from an array.",
    "Write a SQL query that finds the five customers with the highest total order amount.",
    "Write a Python class for a simple stack with push, pop and peek methods.",
    "Write a bash script that counts the lines in every .txt file in a folder.",
    "Write a C function that reverses a string in place.",
    "Write a Python function that checks whether two words are anagrams.",
    "Write a JavaScript function that capitalises the first letter of every word in a sentence.",
    "Write a Python script that reads a text file and prints its ten most common words.",
    "Write a SQL query that counts the orders placed in each month of 2023.",
    "Write a Java method that returns the largest value in an array of integers.",
    "Write a Python function that converts a Roman numeral to an integer.",
    "Write a Go function that sums the even numbers in a slice.",
    "Write a Rust function that returns the length of the longest word in a string.",
    "Write a Python function that validates a password: at least eight characters, one digit and one capital letter.",
    "Write a TypeScript interface for a user with a name, an email and an optional age.",
    "Write a Python function that splits a list into chunks of a given size.",
    "Write a bash one-liner that finds all files larger than 100 MB in the home directory.",
    "Write a C++ function that checks whether a year is a leap year.",
    "Write a Python function that returns the second largest number in a list.",
    "Write a JavaScript function that debounces another function.",
    "Write a Python function that counts how often each character appears in a string.",
    "Write an HTML page with a form that asks for a name and an email address.",
    "Write a Python function that rotates a list by k positions to the right.",
]
HELDOUT_LONG_QUESTIONS = [
    "How many samples did the laboratory take, and why did the number increase?",
    "What are the main risks the board sees for next year?",
    "How much will a typical household pay more per year after the price increase?",
    "Summarise what happened with the smart meter project.",
    "What does the utility plan to do next year, and how much will it invest?",
    "What did customers ask for most often, and what did the utility change as a result?",
    "How did the utility's staffing change during the year?",
    "Write a short email to residents that explains the report's three most important points.",
]
# Unusual system prompts, unlike the training personas (training/prompts.py SYSTEMS), with the model's template.
HELDOUT_SYSTEMS = [
    "Reply only with a JSON object with the keys \"answer\" and \"confidence\".",
    "You are a sports commentator. Describe everything as if it were a live match.",
    "You are a medieval knight. Speak in old-fashioned English and address the user as 'my liege'.",
    "Answer like a telegram: short phrases, capital letters, and STOP after each sentence.",
    "You are the customer support assistant of Lumen Bank. Be polite, never give financial advice, "
    "and end every answer by asking whether there is anything else you can help with.",
    "You are a grumpy cat who reluctantly helps humans.",
    "Write every answer as a recipe, with ingredients and numbered steps.",
    "You are a tour guide in the year 2300, and everything you explain is ancient history to you.",
]
# `train eval`'s kinds: the command line's name -> the name in tables
EVAL_KINDS = {"chat": "chat", "code": "code", "long-context": "long context", "perturbed": "perturbed format",
              # the two halves of "perturbed format", to tell which perturbation a difference comes from
              "templates": "other templates", "systems": "unusual system prompts",
              # the long-context questions after three documents (~4,400 tokens), the report last
              "longer-context": "longer context",
              # not held out: prompts the shipped drafters trained on (training/prompts.py training_requests)
              "training": "training prompts"}
KINDS = tuple(EVAL_KINDS[k] for k in ("chat", "code", "long-context", "perturbed"))   # the default four
OTHER_TEMPLATES, UNUSUAL_SYSTEMS = EVAL_KINDS["templates"], EVAL_KINDS["systems"]
LONGER_CONTEXT, TRAINING_PROMPTS = EVAL_KINDS["longer-context"], EVAL_KINDS["training"]
