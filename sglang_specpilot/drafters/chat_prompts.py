"""A second set of general chat prompts for drafter self-distillation (``--prompts chat[:N]``), written here.

Why: the committed offline set (``drafters.corpus``) is 16,130 prompts, of which 13,154 are built from
software documentation and 2,976 are general chat and arithmetic (``drafters.general``). Its drafter
(4fb4ff5, H200) accepts 4.18 tokens per tree round on held-out HumanEval but 2.94 on MT-Bench turn 1,
which is general chat: writing, role play, reasoning, math, extraction, science and the humanities. The
register chat users ask in is the one the training set has least of. This module adds it, from lists
written for this project: topics in subjects the first set does not cover, task templates of kinds it
does not use, short made-up passages to extract facts from, and number and logic problems. No evaluation
text was consulted to write it; ``train-drafter`` still refuses any prompt equal to an MT-Bench question.

Disjoint from ``drafters.general`` by construction (its own topic, template, persona and place lists), so
``general.heldout_general``, the tuner's chat prompts the drafter never trained on, stays held out.
Deterministic for a seed and pure Python (the GPU machine builds the same list without a data file).
"""

from __future__ import annotations

import random

TOPICS = {
    "food": (
        "fermenting vegetables", "the chemistry of baking", "street food in Southeast Asia", "olive oil",
        "making fresh pasta", "the history of chocolate", "vegetarian protein sources", "spices of the Silk "
        "Road", "sourdough starters", "food waste", "tea ceremonies", "cheese making", "knife skills",
        "meal planning for a family", "the science of umami", "coffee roasting", "regional barbecue styles",
        "preserving fruit", "cooking with cast iron", "school lunches",
    ),
    "geography": (
        "the Amazon rainforest", "the Sahara desert", "river deltas", "island nations", "the Himalayas",
        "the Great Barrier Reef", "glaciers", "monsoon seasons", "megacities", "the Mediterranean climate",
        "time zones", "the Arctic tundra", "fjords", "wetlands", "population growth", "borders drawn by "
        "rivers", "the Ring of Fire", "steppes and grasslands", "port cities", "map projections",
    ),
    "technology": (
        "smartphone batteries", "password managers", "how search engines rank pages", "3D printing",
        "cloud storage", "machine translation", "noise-cancelling headphones", "electric bicycles", "GPS",
        "video streaming", "smart thermostats", "the history of the personal computer", "QR codes",
        "wireless charging", "drones for deliveries", "computer viruses", "e-readers", "robot vacuum "
        "cleaners", "two-factor authentication", "satellite internet",
    ),
    "psychology": (
        "habit formation", "procrastination", "the bystander effect", "memory and forgetting", "motivation",
        "cognitive biases", "stress and the body", "growth mindset", "decision fatigue", "introverts and "
        "extroverts", "the psychology of colour", "peer pressure", "gratitude", "curiosity", "burnout",
        "first impressions", "daydreaming", "optimism", "boredom", "the fear of missing out",
    ),
    "philosophy": (
        "free will", "the trolley problem", "what makes a life meaningful", "the ethics of eating meat",
        "stoicism", "the ship of Theseus", "justice and fairness", "lying to protect someone", "the "
        "social contract", "happiness", "personal identity", "moral luck", "the value of art", "tolerance",
        "duty and friendship", "the ethics of zoos", "privacy as a right", "the meaning of courage",
        "honesty in advertising", "whether machines can think",
    ),
    "economics": (
        "hyperinflation in history", "supply and demand", "compound interest", "the gig economy",
        "trade tariffs", "index funds", "budgeting for students", "credit scores", "minimum viable products",
        "the tragedy of the commons", "opportunity cost", "small business loans", "the housing market",
        "cryptocurrency",
        "insurance", "central banks", "crowdfunding", "subscription pricing", "retirement savings",
        "the cost of living in big cities",
    ),
    "sports": (
        "marathon training", "the offside rule in football", "swimming technique", "the history of "
        "basketball", "rock climbing", "yoga for beginners", "cycling tours", "chess as a sport", "tennis "
        "scoring", "team captains", "sports injuries", "the Tour de France", "skiing safely", "cricket",
        "home workouts", "sportsmanship", "esports", "stretching", "the Paralympic Games", "surfing",
    ),
    "environment": (
        "plastic in the oceans", "rewilding", "electric grids and solar power", "deforestation", "air "
        "quality in cities", "endangered species", "water scarcity", "sustainable fishing", "light "
        "pollution", "bees and pesticides", "wind farms", "carbon footprints", "flood defences", "urban "
        "heat islands", "soil erosion", "wildfires", "green roofs", "invasive species", "repair cafes",
        "zero-waste shopping",
    ),
    "literature": (
        "unreliable narrators", "the hero's journey", "Greek myths", "fairy tales and their morals", "the "
        "sonnet", "dystopian novels", "letters as a form of literature", "translation of poetry", "detective "
        "fiction", "children's picture books", "the epic of Gilgamesh", "satire", "magical realism",
        "diaries and memoirs", "the short story", "plot twists", "book clubs", "metaphor", "oral "
        "storytelling", "world-building in fantasy",
    ),
    "mathematics": (
        "prime numbers", "the Fibonacci sequence", "probability in card games", "fractions", "the "
        "Pythagorean theorem", "infinity", "statistics in the news", "symmetry in nature", "graphs and "
        "networks", "percentages and discounts", "the number zero", "geometry of soap bubbles", "exponential "
        "growth", "averages and medians", "logic puzzles", "the golden ratio", "cryptography and codes",
        "estimation", "tessellations", "the Monty Hall problem",
    ),
    "work": (
        "giving constructive feedback", "running a good meeting", "working in a remote team", "asking for a "
        "promotion", "writing a cover letter", "changing careers at forty", "mentoring", "onboarding new "
        "employees", "handling a difficult customer", "setting priorities", "freelancing", "delegating",
        "job interviews over video", "workplace conflicts", "learning on the job", "apprenticeships",
        "writing a project proposal", "leading without authority", "taking breaks", "saying no politely",
    ),
    "family": (
        "bedtime routines", "teenagers and chores", "grandparents and technology", "sibling rivalry",
        "homeschooling", "family traditions", "moving house with children", "pocket money", "reading aloud "
        "to children", "screen rules at home", "caring for an elderly parent", "family road trips", "school "
        "choice", "teaching kindness", "pets and children", "celebrating birthdays on a budget", "twins",
        "raising bilingual children", "family meals", "helping with homework",
    ),
    "civics": (
        "how laws are made", "jury duty", "local elections", "freedom of the press", "human rights",
        "public transport funding", "census data", "voting systems", "the separation of powers", "petitions",
        "community gardens", "neighbourhood watch", "taxes and public services", "the role of a mayor",
        "consumer rights", "international aid", "civil disobedience", "the United Nations", "public health "
        "campaigns", "town hall meetings",
    ),
    "music": (
        "learning to read music", "the history of rock and roll", "orchestras", "the blues", "writing song "
        "lyrics", "music and memory", "vinyl records", "drumming", "choirs", "electronic music", "national "
        "anthems", "film scores", "music festivals", "the piano", "folk music", "hip hop", "busking",
        "perfect pitch", "music streaming and artists' income", "lullabies",
    ),
    "medicine": (
        "the discovery of penicillin", "vaccination schedules", "first aid for burns", "blood donation",
        "allergies", "the human heart", "eyesight and screens", "vitamins", "hearing loss", "dental health",
        "the common cold", "organ transplants", "telemedicine", "hydration", "posture", "sunscreen",
        "medical imaging", "the history of anaesthesia", "nutrition labels", "healthy ageing",
    ),
}  # fmt: skip

PERSONAS = (
    "a Victorian inventor", "a retired lighthouse keeper", "a cheerful barista", "a strict museum guard",
    "a Roman senator", "a marine biologist", "a fairy-tale dragon", "a taxi driver who has seen everything",
    "a nervous substitute teacher", "a famous chef judging a contest", "an alien visiting Earth",
    "a sports commentator", "a wise old tortoise", "a news anchor in 1950", "a travelling salesperson",
)  # fmt: skip
PLACES = (
    "Seoul", "Lima", "a Greek island", "Montreal", "Hanoi", "the Scottish Highlands", "Nairobi", "Seville",
    "a ski resort", "Copenhagen", "a night market", "Patagonia", "Singapore", "a farm in the countryside",
    "Edinburgh", "Havana", "a space station", "the Atacama desert",
)  # fmt: skip
AUDIENCES = (
    "a group of retirees", "first-year university students", "a room of engineers", "primary school pupils",
    "new parents", "small business owners", "a book club", "tourists", "a city council", "nurses",
)  # fmt: skip

# name -> template; fields: {concept}, {other} (a second topic of this module), {persona}, {place},
# {audience}, {n} (a small count).
TEMPLATES = {
    "c_faq": "Write a short FAQ (five questions and answers) about {concept}.",
    "c_lesson": "Outline a 45-minute lesson on {concept} for {audience}, with timings.",
    "c_analogy_pair": "Explain {concept} using an analogy from {other}.",
    "c_critique": "Here is an opinion: \"{concept} is overrated.\" Give the strongest argument for it, the "
    "strongest against it, and your conclusion.",
    "c_recipe_style": "Describe {concept} as if it were a recipe, with ingredients and steps.",
    "c_checklist": "Make a checklist of {n} things to consider before getting involved in {concept}.",
    "c_timeline": "Give a short timeline of the key moments in the story of {concept}.",
    "c_product": "Write a catchy product description for an imaginary gadget that helps with {concept}.",
    "c_dialogue_expert": "Write a conversation in which an expert explains {concept} to a sceptical friend.",
    "c_socratic": "Teach me about {concept} the Socratic way: ask me questions one at a time, starting now.",
    "c_persona_advice": "You are {persona}. Give me advice about {concept}, staying in character.",
    "c_postcard": "Write a postcard from {place} that somehow involves {concept}.",
    "c_summary_levels": "Summarise {concept} in one sentence, then in one paragraph, then in five bullet points.",
    "c_mistakes": "What are the {n} most common mistakes people make with {concept}, and how can they be "
    "avoided?",
    "c_future": "How might {concept} change over the next twenty years? Give three scenarios.",
    "c_haiku_series": "Write a series of three haiku about {concept}.",
    "c_song": "Write the lyrics of a short song with a chorus about {concept}.",
    "c_newsletter": "Write the opening section of a community newsletter about {concept}.",
    "c_glossary": "Write a glossary of {n} terms someone should know about {concept}.",
    "c_link": "What is the connection between {concept} and {other}? Explain in two paragraphs.",
    "c_speech_audience": "Write a three-minute talk about {concept} for {audience}.",
    "c_review": "Write a balanced review of a book (invented) about {concept}.",
    "c_steps": "Explain, step by step, how a beginner could start learning about {concept}.",
    "c_table_compare": "Compare {concept} and {other} in a markdown table with at least four rows.",
}  # fmt: skip

_NAMES = ("Amara", "Bruno", "Chen", "Dalia", "Emil", "Fatima", "Gustav", "Hana", "Ivan", "Jia", "Kofi", "Lena")
_ORGS = ("the Riverside Library", "Northwind Bakery", "the Hillcrest Chess Club", "Bluebird Travel",
         "the Oakmont Youth Orchestra", "Greenleaf Clinic", "Harbor Robotics", "the Maple Street School")  # fmt: skip
_MONTHS = ("January", "March", "April", "June", "August", "October", "November", "December")


def topics() -> list[str]:
    return [t for group in TOPICS.values() for t in group]


def _render(name: str, topic: str, rng: random.Random, group: dict[str, tuple[str, ...]]) -> str:
    others = [t for t in group[topic] if t != topic]  # a second topic of the same subject: comparable
    return TEMPLATES[name].format(
        concept=topic, other=rng.choice(others), persona=rng.choice(PERSONAS), place=rng.choice(PLACES),
        audience=rng.choice(AUDIENCES), n=rng.choice((4, 5, 6, 7, 8)),
    )  # fmt: skip


def _extraction(rng: random.Random, pool: list[str]) -> str:
    """A made-up note about a topic of ``pool`` and a request to pull its facts out (names, places, dates,
    numbers) as structure."""
    a, b = rng.sample(_NAMES, 2)
    org, place, month = rng.choice(_ORGS), rng.choice(PLACES), rng.choice(_MONTHS)
    day, people, cost = rng.randint(1, 28), rng.randint(8, 120), rng.randint(3, 90) * 10
    topic = rng.choice(pool)
    note = (
        f"On {month} {day}, {a} from {org} met {b} in {place} to plan an event about {topic}. They expect "
        f"{people} guests, set a budget of ${cost}, and agreed that {b} will send the invitations."
    )
    ask = rng.choice((
        "Extract every person, organisation, place, date and number from this note as JSON.",
        "List the facts in this note as a markdown table with the columns 'field' and 'value'.",
        "Who is responsible for what in this note? Answer in two bullet points, then give the date.",
        "Turn this note into a short, formal meeting summary with a title.",
    ))  # fmt: skip
    return f"{ask}\n\n{note}"


def _reasoning(rng: random.Random) -> str:
    """A number or logic problem that asks for the reasoning (kinds ``drafters.general`` does not use)."""
    kind = rng.randrange(8)
    a, b, c = rng.randint(3, 30), rng.randint(2, 15), rng.randint(2, 9)
    x, y = rng.sample(_NAMES, 2)
    if kind == 0:
        return f"What is the next number in the sequence {a}, {a + b}, {a + 2 * b}, {a + 3 * b}, ...? Explain the rule."
    if kind == 1:
        return f"{x} is {c} years older than {y}, and their ages add up to {2 * a + c}. How old is each? Explain."
    if kind == 2:
        return f"Convert {a * 3} miles per hour to kilometres per hour and to metres per second. Show each step."
    if kind == 3:
        return (
            f"A bag holds {a} red and {b} blue marbles. Two are drawn without replacement. What is the "
            "probability that both are the same colour?"
        )
    if kind == 4:
        return (
            f"Three friends, {x}, {y} and Sam, each own one pet: a cat, a dog or a parrot. {x} is allergic to "
            f"fur and {y} does not own the dog. Who owns which pet? Explain your deduction."
        )
    if kind == 5:
        return f"Is {a * b + 1} a prime number? Explain how you checked."
    if kind == 6:
        return (
            f"A shop lowers a price by {c * 5}% and later raises the new price by {c * 5}%. Is the final price "
            "higher, lower or the same as the original? Explain with an example."
        )
    return (
        f"A tank fills in {a} minutes with one pipe and in {a + b} minutes with another. How long does it take "
        "with both pipes open? Show the working."
    )


def chat_prompts(n: int | None = None, seed: int = 0) -> list[str]:
    """Up to ``n`` distinct prompts (default: all the lists give, about 9,000): topic x template
    combinations, extraction notes and reasoning problems, shuffled by ``seed``."""
    rng = random.Random(seed)
    group = {t: ts for ts in TOPICS.values() for t in ts}
    pool = topics()
    combos = [(t, name) for t in pool for name in TEMPLATES]
    rng.shuffle(combos)
    out = [_render(name, t, rng, group) for t, name in combos]
    out += [_extraction(rng, pool) for _ in range(900)] + [_reasoning(rng) for _ in range(900)]
    seen: set[str] = set()
    unique = [p for p in out if not (p in seen or seen.add(p))]
    rng.shuffle(unique)
    return unique if n is None else unique[:n]
