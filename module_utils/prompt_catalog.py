"""The decode benchmark's prompt catalog: the single source of truth (Python data, no PyYAML needed).

Benchmark hosts may have a bare Python and no network, so the catalog ships as a module_util that
Ansible sends along with ``decode_bench``; there is no ``files/prompts.yml``. Override it per run with the
module's ``prompts`` option (type -> list of prompts).

Rules for the prompts (docs/reference.md section 8 and 11): fixed per type, varied natural text, never one
repeated token (that overstates the Engram row cache and speculative acceptance), long enough answers
to fill ``max_tokens``. Request slot i of a wave always sends prompt ``i % len(prompts)`` of its type, so
every repetition of a condition sends the same prompts and greedy outputs can be compared by hash.
"""
from __future__ import annotations

CATALOG: dict[str, list[str]] = {
    "prose": [
        "Tell the story of a lighthouse keeper who finds an unexpected visitor on the rocks after a winter "
        "storm. Describe the sea, the weather and the keeper's thoughts as the night goes on.",
        "Explain to a curious teenager why the sky is blue during the day and red at sunset, and how "
        "scientists first worked this out.",
        "Write an essay about how small towns changed when railways arrived in the nineteenth century, "
        "covering trade, daily habits and the way people thought about distance.",
        "Describe a walk through an old market in a port city at dawn: the sounds, the smells, the "
        "traders setting up and the first customers arriving.",
        "Argue for and against working four days a week, then say which side you find more convincing "
        "and why.",
        "Summarise the history of the printing press and its effect on science, religion and politics in "
        "Europe.",
    ],
    "code": [
        "Write a Python function that merges overlapping intervals given as a list of (start, end) tuples, "
        "with type hints, a docstring and a few unit tests using pytest.",
        "Implement a thread-safe LRU cache class in Python with get and put methods, capacity eviction and "
        "statistics on hits and misses.",
        "Write a Bash script that rotates log files in a directory: compress files older than a day, delete "
        "archives older than a week, and print a summary.",
        "Implement Dijkstra's shortest path algorithm in Rust for a graph stored as an adjacency list, and "
        "explain the complexity in comments.",
        "Write a SQL schema for a small library: books, members and loans, with constraints, indexes and "
        "three example queries for overdue loans.",
        "Refactor this JavaScript callback code into async/await with error handling: a function that reads "
        "a config file, fetches a URL from it and writes the response to disk.",
    ],
    "structured": [
        "Make a table comparing five common houseplants by light needs, watering frequency, pet safety and "
        "difficulty, then add a short note under the table.",
        "Write a numbered checklist for preparing a bicycle for a long tour: frame, wheels, brakes, gears, "
        "luggage and spare parts.",
        "Produce a Markdown outline for a one-day workshop on public speaking, with sections, timings and "
        "the goal of each session.",
        "Create a weekly meal schedule as a table with breakfast, lunch and dinner for seven days, "
        "vegetarian, with a shopping list at the end.",
        "Give a bulleted comparison of trains, buses and planes for a 600 km trip: cost, time, comfort, "
        "emissions and reliability.",
        "Write a YAML document describing a small web service: name, version, three endpoints with methods "
        "and a list of environment settings.",
    ],
    "json": [
        "Return a JSON object describing three fictional books, each with title, author, year, genres as an "
        "array and a short summary.",
        "Produce JSON for a weather report of five cities with fields city, country, temperature_c, "
        "condition and a forecast array for the next three days.",
        "Give a JSON array of ten products for an online shop with id, name, price, currency, stock and "
        "tags; vary the categories.",
        "Output a JSON configuration for a home automation system: rooms, devices per room, schedules and "
        "alert rules.",
        "Write JSON describing a conference: name, dates, venue, tracks with talks, and speakers with "
        "affiliations.",
        "Create a JSON document for a recipe with ingredients (name, quantity, unit), steps, timing and "
        "nutrition per serving.",
    ],
}

# Exact-answer prompts for after-restart smoke checks (T=0, thinking off): prompt -> expected answer.
SMOKE: dict[str, str] = {
    "What is 19 + 23? Reply only with the number.": "42",
    "What is 7 * 8? Reply only with the number.": "56",
    "What is the capital of France? Reply with one word.": "Paris",
    "Spell the word 'spark' backwards. Reply only with the letters.": "kraps",
}

DEFAULT_TYPES = ["prose", "code", "structured", "json"]


def prompts_for(types: list[str], override: dict | None = None) -> dict[str, list[str]]:
    """The prompts of each requested type: the override where it names the type, else the catalog.

    Raises ValueError naming the type when a type has no prompts or a prompt is not a non-empty string.
    """
    override = override or {}
    chosen = {}
    for kind in types:
        prompts = override.get(kind, CATALOG.get(kind))
        if not prompts:
            known = sorted(set(CATALOG) | set(override))
            raise ValueError(f"no prompts for type {kind!r}: give them in 'prompts' or use one of {known}")
        if isinstance(prompts, str) or not all(isinstance(p, str) and p.strip() for p in prompts):
            raise ValueError(f"prompts for type {kind!r} must be a list of non-empty strings")
        chosen[kind] = list(prompts)
    return chosen
