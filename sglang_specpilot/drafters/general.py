"""General chat prompts for drafter self-distillation: everyday topics and arithmetic, written for this project.

Why: the documentation sources of ``drafters.corpus`` are all about software, so a drafter trained on them
alone learns how the target talks about APIs, not how it writes a letter, argues a point or works a sum.
Chat traffic (and the held-out chat set we measure on) is mostly the latter. This module supplies the
missing register from text written here: a list of topics across everyday, scientific, historical,
creative and practical subjects, task templates that ask for the kinds of answers chat users ask for,
and arithmetic word problems with seeded random numbers. No evaluation text was consulted to write it; the
corpus builder still drops any prompt equal to an MT-Bench question.

Each topic is a snippet of kind ``general`` (``corpus`` draws templates for it like for any snippet);
each word problem is a snippet of kind ``arith`` whose prompt is the problem itself.
"""

from __future__ import annotations

import random

# Topics, grouped only for reading; every group feeds every general template.
TOPICS = {
    "science": (
        "photosynthesis", "black holes", "plate tectonics", "the water cycle", "vaccines", "antibiotic "
        "resistance", "the greenhouse effect", "DNA replication", "the speed of light", "ocean tides",
        "volcanoes", "the human immune system", "quantum entanglement", "evolution by natural selection",
        "the periodic table", "nuclear fusion", "earthquakes", "the nitrogen cycle", "coral reefs",
        "the theory of relativity", "magnetism", "sleep and the brain", "the microbiome", "solar eclipses",
        "rainbows", "batteries", "superconductors", "the Big Bang", "exoplanets", "bird migration",
        "honeybee colonies", "the placebo effect", "climate models", "entropy", "semiconductors",
    ),
    "history": (
        "the printing press", "the Silk Road", "the Industrial Revolution", "ancient Rome's aqueducts",
        "the invention of the telephone", "the Renaissance", "the first Moon landing", "the fall of the "
        "Berlin Wall", "the history of vaccines", "ancient Egyptian pyramids", "the Age of Exploration",
        "the invention of writing", "medieval castles", "the history of money", "the Olympic Games",
        "the steam engine", "the origins of the internet", "the history of chess", "the Great Wall of China",
        "the abolition of slavery", "the spread of railways", "women's suffrage", "the Cold War space race",
    ),
    "everyday": (
        "saving money on groceries", "learning a new language as an adult", "keeping houseplants alive",
        "planning a weekend trip on a budget", "cooking rice perfectly", "starting to run", "decluttering a "
        "home", "writing a good resume", "preparing for a job interview", "sleeping better", "making "
        "friends in a new city", "teaching a child to ride a bike", "choosing a laptop", "time management "
        "for students", "hosting a dinner party", "adopting a dog", "composting at home", "public speaking",
        "reducing screen time", "staying motivated while working from home", "negotiating a salary",
        "packing for a long flight", "baking bread", "learning to play the guitar", "moving to a new apartment",
    ),
    "society": (
        "remote work", "electric cars", "social media and teenagers", "universal basic income", "public "
        "libraries", "recycling programs", "renewable energy", "urban cycling", "four-day work weeks",
        "online education", "tourism in small towns", "volunteering", "open-source software", "privacy "
        "online", "artificial intelligence in hospitals", "fast fashion", "video games", "city parks",
        "local newspapers", "self-driving trucks", "space tourism", "vertical farming", "minimum wage",
    ),
    "arts": (
        "impressionist painting", "jazz improvisation", "writing a mystery novel", "film editing", "street "
        "photography", "ballet", "graphic novels", "poetry slams", "architecture of bridges", "pottery",
        "movie soundtracks", "stand-up comedy", "folk tales", "calligraphy", "theatre lighting",
        "science fiction", "museum design", "origami", "opera", "typography",
    ),
    "business": (
        "opening a small bakery", "customer service", "supply chains", "marketing a mobile app", "running "
        "a team meeting", "pricing a product", "startup funding", "inflation", "a company's first hire",
        "giving feedback to a coworker", "writing a business plan", "franchises", "online reviews",
        "subscription services", "managing a project deadline", "hiring remotely", "brand loyalty",
    ),
    "health": (
        "drinking enough water", "stretching after exercise", "a balanced breakfast", "stress at work",
        "strength training for beginners", "the benefits of walking", "reading food labels", "meditation",
        "posture at a desk", "healthy snacks for kids", "first aid for minor burns", "caffeine",
    ),
    "nature": (
        "rainforests", "wolves", "octopuses", "deserts at night", "the Arctic", "mushrooms", "whales",
        "autumn leaves", "thunderstorms", "mountain glaciers", "monarch butterflies", "rivers", "owls",
        "the night sky", "sea turtles", "bamboo", "hurricanes", "tide pools",
    ),
}  # fmt: skip

# Persona and place lists for role-play and travel-style prompts (written here).
PERSONAS = (
    "a ship's captain from the 1700s", "a friendly librarian", "a grumpy wizard", "a sports coach before a "
    "final", "a tour guide in an old city", "a detective in 1920s London", "a nervous first-time chef",
    "an astronaut on the space station", "a medieval blacksmith", "a kind kindergarten teacher",
    "a pirate who loves poetry", "a robot learning to feel emotions", "a time traveller from the year 3000",
    "a talk-show host", "a park ranger",
)  # fmt: skip
PLACES = (
    "Lisbon", "Kyoto", "a small mountain village", "Iceland", "Cape Town", "a seaside town in Scotland",
    "Mexico City", "Vancouver", "Marrakesh", "the Norwegian fjords", "Buenos Aires", "a desert oasis",
    "Prague", "New Zealand's South Island", "Istanbul",
)  # fmt: skip

# name, kind, template. Kind ``general`` gets {concept} (a topic) and {other} (a second topic); the
# persona/place fields are filled from the lists above by the renderer.
GENERAL_TEMPLATES = {
    "g_explain_child": "Explain {concept} to a ten-year-old.",
    "g_explain_detail": "Give a clear, detailed explanation of {concept}, with one concrete example.",
    "g_essay": "Write a short persuasive essay (about 250 words) on {concept}.",
    "g_pros_cons": "What are the main advantages and disadvantages of {concept}? Answer as two lists.",
    "g_blog": "Write an engaging blog post introduction about {concept}.",
    "g_story": "Write a short story (under 250 words) that involves {concept}.",
    "g_poem": "Write a poem of four stanzas about {concept}.",
    "g_limerick": "Write a funny limerick about {concept}.",
    "g_email": "Write a polite email to my manager proposing a short workshop on {concept}.",
    "g_letter": "Write a letter to a friend describing what you recently learned about {concept}.",
    "g_plan": "Create a step-by-step, four-week plan for someone who wants to get better at {concept}.",
    "g_tips": "Give me seven practical tips about {concept}.",
    "g_myths": "What are three common misconceptions about {concept}, and what is actually true?",
    "g_compare": "Compare {concept} and {other}. How are they alike, and how are they different?",
    "g_debate": "Write a short debate between two people who disagree about {concept}.",
    "g_interview": "Write five interview questions for an expert on {concept}, with brief model answers.",
    "g_summary_table": "Summarise the key facts about {concept} in a markdown table with three columns.",
    "g_role": "Pretend you are {persona}. In character, tell me what you think about {concept}.",
    "g_travel": "Write a travel diary entry about a day spent in {place}, mentioning {concept}.",
    "g_speech": "Draft a two-minute speech for a school assembly about {concept}.",
    "g_headline": "Write a news headline and a 100-word news story about a surprising discovery related to "
    "{concept}.",
    "g_reason": "Someone claims that {concept} matters less today than it did fifty years ago. Reason step by "
    "step about whether that is true.",
    "g_json": "Give five facts about {concept} as a JSON list of objects with the keys \"fact\" and \"why_it_"
    "matters\".",
    "g_quiz": "Write a four-question multiple-choice quiz about {concept}, and give the answers at the end.",
    "g_rewrite": "Rewrite this sentence to be more formal, then more casual: \"Honestly, {concept} is way more "
    "interesting than people think.\"",
}  # fmt: skip


def topics() -> list[str]:
    return [t for group in TOPICS.values() for t in group]


def general_snippets() -> list[dict]:
    """One ``general`` snippet per topic (the corpus draws templates for it)."""
    return [
        {"source": "general", "kind": "general", "module": "general", "name": t, "ref": f"general:{t}", "text": t}
        for t in topics()
    ]


def render_general(template: str, topic: str, rng: random.Random) -> str:
    others = [t for t in topics() if t != topic]
    return GENERAL_TEMPLATES[template].format(
        concept=topic, other=rng.choice(others), persona=rng.choice(PERSONAS), place=rng.choice(PLACES)
    )


# ---- arithmetic word problems ------------------------------------------------------------------------

_ITEMS = ("apples", "notebooks", "tickets", "bottles of juice", "pencils", "loaves of bread", "T-shirts", "plants")
_NAMES = ("Ana", "Ben", "Chloe", "Dev", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Kemi", "Luca")


def _problem(rng: random.Random) -> str:
    a, b, c = rng.randint(2, 40), rng.randint(2, 25), rng.randint(2, 12)
    name, other, item = rng.choice(_NAMES), rng.choice(_NAMES), rng.choice(_ITEMS)
    price = rng.choice((0.5, 0.75, 1.25, 2, 3.5, 4, 6, 12))
    kind = rng.randrange(10)
    if kind == 0:
        return f"{name} buys {a} {item} at ${price} each and pays with a ${a * 10} bill. How much change is due?"
    if kind == 1:
        return (
            f"A train travels {a * 10} km in {c} hours, then {b * 10} km in {c + 1} hours. What is its average "
            "speed over the whole trip? Show your work."
        )
    if kind == 2:
        return f"Solve for x: {c}x + {a} = {c * b + a}. Explain each step."
    if kind == 3:
        return (
            f"{name} has {a + b} {item}. {name} gives {other} {b} of them and then buys {c} times as many as "
            "are left. How many does " + name + " have now?"
        )
    if kind == 4:
        return f"What is {a}% of {b * 40}? Then increase the result by {c}% and explain the calculation."
    if kind == 5:
        return (
            f"A rectangle is {a} cm long and {b} cm wide. What are its area and perimeter? If each side grows "
            f"by {c} cm, by how much does the area grow?"
        )
    if kind == 6:
        n = rng.randint(3, 6)
        s = rng.randint(n, 6 * n)
        return (
            f"If you roll {n} fair dice, is a total of {s} more or less likely than a total of {s + 1}? Reason it out."
        )
    if kind == 7:
        return (
            f"A recipe for {c} people needs {a * 25} g of flour and {b * 10} ml of milk. How much of each is "
            f"needed for {c + b} people?"
        )
    if kind == 8:
        return f"What is the sum of all integers from 1 to {a * 10}, and what is a quick way to compute it?"
    return (
        f"{name} saves ${a} in the first week and ${c} more each week than the week before. How much has "
        f"{name} saved after {b} weeks?"
    )


def arith_snippets(count: int = 900, seed: int = 7) -> list[dict]:
    """``count`` distinct word problems (kind ``arith``: the text is the prompt)."""
    rng = random.Random(seed)
    seen, out = set(), []
    for _ in range(count * 4):
        if len(out) >= count:
            break
        p = _problem(rng)
        if p in seen:
            continue
        seen.add(p)
        out.append({"source": "arith", "kind": "arith", "module": "arith", "name": "arithmetic",
                    "ref": f"arith:{len(out)}", "text": p})  # fmt: skip
    return out


def heldout_general(n: int, trained: set[str], seed: int = 1234) -> list[str]:
    """``n`` general chat prompts that are not in ``trained`` (the committed training set's prompts).

    For tuning on chat-like text the drafter never trained on (MT-Bench is an evaluation set and never
    tuned on): the same topics and task kinds as the ``general`` source, in combinations training did not
    draw. Deterministic for a seed.
    """
    rng = random.Random(seed)
    combos = [(t, name) for t in topics() for name in GENERAL_TEMPLATES]
    rng.shuffle(combos)
    out: list[str] = []
    for topic, name in combos:
        if len(out) >= n:
            break
        prompt = render_general(name, topic, rng)
        if prompt not in trained and prompt not in out:
            out.append(prompt)
    return out
