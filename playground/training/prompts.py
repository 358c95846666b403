"""The training prompt set, built here (nothing downloaded), from two sources.

Templates: kinds chat, coding, math, writing, reasoning, multi-turn, each with a varied system
prompt (none = the model's default, or one of many personas).
Self-written: the target writes the user turn itself, continuing its own chat template after a
system turn and a few opening words (the "Magpie" trick); far more varied than any template.
Evaluation and benchmark prompts are written separately (playground/prompts/sets.py)
and never come from these generators, except `train eval --kinds training`, which measures the
shipped drafters on prompts they trained on (`training_requests`).
"""

from __future__ import annotations

import random
from typing import Iterator

from playground.engines.request import GenerationRequest
from playground.prompts.sets import TRAINING_PROMPTS

TOPICS = [
    "black holes", "photosynthesis", "the French Revolution", "machine learning", "coffee brewing",
    "volcanoes", "the stock market", "honeybees", "climate change", "the Roman Empire", "quantum computing",
    "sleep", "jazz music", "the immune system", "electric cars", "chess openings", "the water cycle",
    "ancient Egypt", "vaccines", "solar panels", "the human brain", "origami", "inflation", "coral reefs",
    "the printing press", "gardening", "plate tectonics", "the Silk Road", "meditation", "cryptography",
    "the Moon landing", "bread baking", "dinosaurs", "renewable energy", "the Olympic Games", "rainbows",
    "DNA", "public speaking", "the internet", "marathon training", "tea ceremonies", "glaciers",
    "the Renaissance", "recycling", "octopuses", "time management", "the periodic table", "democracy",
    "wind turbines", "the Great Wall of China", "nutrition", "earthquakes", "bird migration", "podcasts",
    "the theory of relativity", "bicycles", "mushrooms", "the Industrial Revolution", "friendship",
    "budgeting", "lighthouses", "tides", "video games", "the Amazon rainforest", "poetry", "submarines",
]
CHAT = [
    "What is {t}?", "Explain {t} to a ten-year-old.", "Give me three interesting facts about {t}.",
    "Why is {t} important?", "What are the pros and cons of {t}?", "How would you summarize {t} in one paragraph?",
    "What are common misconceptions about {t}?", "Can you recommend how to start learning about {t}?",
    "Compare {t} and {u}.", "What is the history of {t}?", "How does {t} affect everyday life?",
    "Tell me something surprising about {t}.", "What questions should I ask an expert on {t}?",
]
LANGUAGES = ["Python", "JavaScript", "C", "Rust", "Go", "Java", "SQL", "Bash", "TypeScript", "C++"]
CODE_TASKS = [
    "reverses a string", "checks whether a number is prime", "computes the nth Fibonacci number",
    "sorts a list of numbers with merge sort", "counts the words in a text", "finds the maximum in a list",
    "removes duplicates from a list", "checks if a string is a palindrome", "reads a CSV file and sums a column",
    "implements binary search", "converts Celsius to Fahrenheit", "flattens a nested list",
    "computes the factorial of a number", "validates an email address", "merges two sorted lists",
    "implements a stack", "counts vowels in a string", "finds the greatest common divisor of two numbers",
    "parses a date string", "generates all permutations of a list", "implements a simple linked list",
    "computes the average of a list", "transposes a matrix", "implements a queue with two stacks",
]
CODE = [
    "Write a {lang} function that {task}.", "How do I write code in {lang} that {task}?",
    "Show me a {lang} program that {task}, with comments.", "Write a short {lang} snippet that {task} and explain it.",
    "Explain this {lang} idea: a function that {task}. Then write it.",
]
MATH = [
    "What is {a} plus {b}?", "What is {a} times {b}?", "Solve for x: {a}x + {b} = {c}.",
    "A shop sells apples for {a} cents each. How much do {b} apples cost?",
    "If a train travels {a} km in {b} hours, what is its average speed?",
    "What is {a}% of {c}?", "Is {c} divisible by {b}? Explain.", "What is the area of a rectangle {a} by {b}?",
    "Tom has {a} marbles and gives away {b}. How many are left?", "Explain how to compute {a} squared.",
    "A recipe needs {a} eggs for {b} people. How many eggs for {c} people?",
]
WRITING = [
    "Write a short poem about {t}.", "Write a haiku about {t}.", "Write a short story involving {t}.",
    "Write a product description for a book about {t}.", "Write a tweet about {t}.",
    "Write an email to a friend about {t}.", "Write a limerick about {t}.", "Write a blog post intro about {t}.",
    "Write a motivational speech that mentions {t}.", "Describe {t} in the style of a news report.",
]
REASONING = [
    "If all {p} are {q} and some {q} are {r}, are some {p} {r}? Explain step by step.",
    "I have {a} apples and eat {b}, then buy {c} more. How many do I have? Think step by step.",
    "Which is heavier, a kilogram of {m} or a kilogram of {n}? Explain.",
    "What comes next in the sequence {a}, {b}, {c}? Explain your reasoning.",
    "Give a step-by-step plan to learn {t} in a month.", "What would happen if {t} disappeared tomorrow?",
    "List the steps to make a decision about {t}.",
]
NOUNS = ["cats", "birds", "robots", "teachers", "students", "trees", "cars", "artists", "doctors", "stars"]
MATERIALS = ["feathers", "steel", "bricks", "water", "sand", "cotton", "gold", "ice"]
SYSTEMS = [
    None, None, None,  # the model's default system prompt, most often
    "You are a helpful assistant.", "You are a concise assistant. Answer briefly.",
    "You are a friendly teacher who explains things simply.", "You are an expert software engineer.",
    "You are a pirate. Answer like a pirate.", "You are a careful math tutor. Show your work.",
    "You are a poet.", "Answer in a formal tone.", "You are a cheerful assistant who loves emojis.",
    "You are a historian.", "Always answer with a numbered list.", "You are a skeptical scientist.",
    "Keep every answer under fifty words.", "You are a travel guide.", "You are Shakespeare.",
]
FOLLOW_UPS = [
    "Can you explain that in simpler terms?", "Give me an example.", "Can you make it shorter?",
    "Why?", "What else should I know?", "Can you put that in a list?", "Thanks! One more detail, please.",
]
OPENINGS = [
    "How", "How do I", "What", "What is the best way to", "Why", "Can you", "Could you", "Write", "Explain",
    "I", "I need", "Give me", "Help me", "Is it", "My", "Create", "Tell me", "Which", "Should I", "Describe",
    "Please", "Summarize", "List", "Compare", "Translate", "Fix", "Suggest", "Plan", "Do you", "When",
    "Where", "Who", "Imagine", "Draft", "Rewrite", "Solve", "Calculate", "In Python,", "Hi!", "Hey,",
    # everyday requests, the bulk of real chat traffic
    "What should I", "Any tips for", "How can I", "Can you suggest", "What's the difference between",
    "I'm planning", "I'm trying to", "My friend", "Is it normal", "Recommend", "Help me decide", "What are some",
    "How often should I", "What can I do", "I feel", "Our team", "I have a", "Can I", "Why does my",
    "What happens if", "How long does it take to", "Brainstorm", "Outline", "Give me ideas for", "Quick question:",
    "I'm new to", "I want to", "How should I",
]
# who is asking: what people say about themselves before a request ("people" source)
PERSONAS = [
    "I'm a nurse working night shifts.", "I'm a first-year computer science student.", "I run a small bakery.",
    "I'm 68 and new to smartphones.", "I teach chemistry at a high school.", "I'm a freelance translator.",
    "We're a startup of five people.", "I'm a parent of two toddlers.", "I'm learning Spanish on my own.",
    "I'm a data analyst at a bank.", "I'm a junior web developer.", "I'm a retired engineer.",
    "I'm a graduate student in biology.", "I manage a team of twelve.", "I'm a truck driver.",
    "I'm a high school student.", "I volunteer at an animal shelter.", "I'm a landlord with two flats.",
    "I work in a warehouse.", "I'm a musician.", "I'm a primary school teacher.", "I'm an accountant.",
    "I'm writing my first novel.", "I just moved to a new city.", "I'm training for a half marathon.",
    "I'm a sysadmin.", "I'm a product manager.", "I'm a nursing student.", "I'm a chef.",
    "I'm a small-business owner.", "English is not my first language.", "I'm a beginner at programming.",
    "I'm a physics PhD student.", "I work in customer support.", "I'm a lawyer.", "I'm a farmer.",
    "I'm a game developer.", "I'm recovering from a knee injury.", "I'm planning a wedding.",
    "My kid asked me this and I didn't know.", "I'm preparing for a job interview.", "I'm a photographer.",
]
# how some people ask for the answer to be shaped, after their request
FORMATS = [
    "Answer in a table.", "Use bullet points.", "Keep it under 100 words.", "Reply in JSON.",
    "Give me step-by-step instructions.", "Explain it like I'm five.", "Write it as an email.",
    "Include a code example.", "Be brief.", "Format it as a checklist.", "Give me three options.",
    "Start with a one-line summary.", "Use simple English.", "Add a short example at the end.",
    "Number the steps.", "No more than five sentences, please.", "Use headings.", "Be honest, even if it's bad news.",
]
PASTE_TEXT = [
    "Summarize this:", "Can you proofread this?", "Turn this into bullet points:", "Explain this in simple words:",
    "What is the main point of this?", "Rewrite this to be more concise:", "Translate this into Spanish:",
    "Write three questions a student might ask about this:", "Is anything in this unclear? Suggest improvements:",
    "Give this a title and a one-sentence summary:", "What does this mean?", "tl;dr please:",
]
PASTE_CODE = [
    "What does this function do?", "Find possible bugs in this code:", "Add type hints and a docstring to this function:",
    "Write unit tests for this function:", "Explain this code line by line:", "Rewrite this function to be more readable:",
    "Convert this Python function to JavaScript:", "How could this code be made faster?", "Review this code:",
    "Is this code safe to use? Why or why not?",
]
PASTE_SHARE = 0.25    # of the people source's conversations: a pasted paragraph or function with an instruction
PERSONA_SHARE = 0.5   # of the others: a persona before the opening words
FORMAT_SHARE = 0.3    # of the others: a format wish after the user turn the target wrote
KINDS = ("chat", "code", "math", "writing", "reasoning", "multiturn")


def _numbers(rng: random.Random) -> dict:
    a, b = rng.randint(2, 99), rng.randint(2, 30)
    return {"a": a, "b": b, "c": rng.randint(a + 1, 400)}


def _user_message(kind: str, rng: random.Random) -> str:
    t, u = rng.sample(TOPICS, 2)
    if kind == "chat":
        return rng.choice(CHAT).format(t=t, u=u)
    if kind == "code":
        return rng.choice(CODE).format(lang=rng.choice(LANGUAGES), task=rng.choice(CODE_TASKS))
    if kind == "math":
        return rng.choice(MATH).format(**_numbers(rng))
    if kind == "writing":
        return rng.choice(WRITING).format(t=t)
    p, q, r = rng.sample(NOUNS, 3)
    m, n = rng.sample(MATERIALS, 2)
    return rng.choice(REASONING).format(t=t, p=p, q=q, r=r, m=m, n=n, **_numbers(rng))


def conversation(index: int, seed: int = 0) -> list[dict]:
    """The index-th training conversation (deterministic): messages ending with a user turn. In a
    multi-turn one the first assistant turn's content is None: the target writes it (data.py)."""
    rng = random.Random(f"{seed}:{index}")
    kind = KINDS[index % len(KINDS)]
    system = rng.choice(SYSTEMS)
    messages = [{"role": "system", "content": system}] if system else []
    if kind == "multiturn":
        first = _user_message(rng.choice(KINDS[:-1]), rng)
        messages += [{"role": "user", "content": first}, {"role": "assistant", "content": None},
                     {"role": "user", "content": rng.choice(FOLLOW_UPS)}]
    else:
        messages.append({"role": "user", "content": _user_message(kind, rng)})
    return messages


def conversations(count: int, seed: int = 0, start: int = 0) -> Iterator[list[dict]]:
    for i in range(start, start + count):
        yield conversation(i, seed)


def self_prompt_start(index: int, seed: int = 0) -> tuple[str | None, str]:
    """The system prompt and the opening words of the index-th self-written prompt (deterministic)."""
    rng = random.Random(f"{seed}:self:{index}")
    return rng.choice(SYSTEMS), rng.choice(OPENINGS)


def people_start(index: int, seed: int = 0) -> tuple[str | None, str, str | None]:
    """The system prompt, the opening words (a persona first, half the time) and the format wish
    (or None) of the index-th self-written prompt of the people source (deterministic)."""
    rng = random.Random(f"{seed}:people:{index}")
    system, opening = rng.choice(SYSTEMS), rng.choice(OPENINGS)
    if rng.random() < PERSONA_SHARE:
        opening = f"{rng.choice(PERSONAS)} {opening}"
    return system, opening, rng.choice(FORMATS) if rng.random() < FORMAT_SHARE else None


def is_paste(index: int, seed: int = 0) -> bool:
    return random.Random(f"{seed}:paste?:{index}").random() < PASTE_SHARE


def paste_conversation(pastes: list[dict], index: int, seed: int = 0) -> list[dict]:
    """A pasted paragraph or function with an instruction before (or, one time in three, after) it."""
    rng = random.Random(f"{seed}:paste:{index}")
    paste = pastes[index % len(pastes)]
    if paste["form"] == "code":
        instruction, body = rng.choice(PASTE_CODE), f"```python\n{paste['text']}\n```"
    else:
        instruction, body = rng.choice(PASTE_TEXT), paste["text"]
    user = f"{body}\n\n{instruction}" if rng.random() < 1 / 3 else f"{instruction}\n\n{body}"
    system = rng.choice(SYSTEMS)
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]


def training_requests(drafter: str, k: int, max_tokens: int) -> list[GenerationRequest]:
    """The first six single-turn template conversations (seed 0: one of each single-turn kind, then
    a second chat one), which the shipped drafters trained on: their gap to the held-out kinds
    measures how far the drafters generalise."""
    single_turn = [conversation(i) for i in range(2 * len(KINDS)) if KINDS[i % len(KINDS)] != "multiturn"][:6]
    requests = []
    for messages in single_turn:
        system = messages[0]["content"] if messages[0]["role"] == "system" else None
        turns = messages[1:] if system else messages
        requests.append(GenerationRequest(prompt=turns[-1]["content"], system=system, history=tuple(turns[:-1]),
                                          drafter=drafter, k=k, max_tokens=max_tokens))
    return requests


def heldout_or_training_requests(kind: str, drafter: str, k: int, max_tokens: int) -> list[GenerationRequest]:
    """`train eval`'s requests of a kind: the training prompts for TRAINING_PROMPTS, else the held-out ones."""
    if kind == TRAINING_PROMPTS:
        return training_requests(drafter, k, max_tokens)
    from playground.evaluation.heldout import eval_requests   # the data steps need none of the engine it loads

    return eval_requests(kind, drafter, k, max_tokens)
