"""The "garden" language: a small synthetic English corpus built in, with no downloads.

Parallel-training checks need real next-token data that is tiny, deterministic and free
of network access; this module writes it. A small world of creatures (beasts, birds,
people), plants, tools and places, with colours, moods and weather, is described in simple
sentences from a small grammar: subject-verb-object clauses with adjectives and
prepositional phrases, joined by "and", "but" or "because", plus question-and-answer pairs
("where is the rake ? the rake is in the shed ."). Verbs only take the subjects and
objects that make sense (beasts and birds eat plants, people water them and carry tools),
and within one document a thing keeps its colour and its place, so the language has
structure a small LM can learn (and copy from context).

Documents are a few sentences, wrapped as ``[bos] + words + [eos]``, and their lengths
vary widely (about 6 to 60 tokens): that is the point of the corpus, since padding and
token-weighted losses only matter when documents differ in length.

The vocabulary is word-level and fixed (independent of the seed): ids 0, 1, 2, 3 are
pad, bos, eos and unk, then punctuation and words. Everything is deterministic from the
seed through a private ``random.Random``; the global RNG is never touched.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property

from shardlab.errors import SpecError, require_nonnegative_int

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIALS: tuple[str, ...] = (PAD, BOS, EOS, UNK)
PUNCT: tuple[str, ...] = (".", ",", "?")

MIN_BUDGET, MAX_DOC_TOKENS = 5, 60  # a document's drawn length budget, in tokens (bos/eos in)

# --- the world ------------------------------------------------------------------------
# Kinds of things; a verb lists the kinds it accepts as subject and as object.
NOUNS: dict[str, tuple[str, ...]] = {
    "beast": ("cat", "dog", "fox", "frog", "rabbit", "mouse", "snail", "bee"),
    "bird": ("hen", "duck", "owl", "robin"),
    "person": ("gardener", "child", "farmer"),
    "plant": ("rose", "tulip", "daisy", "oak", "fern", "ivy", "carrot", "bean", "apple",
              "pear", "cabbage", "moss"),
    "tool": ("spade", "rake", "hoe", "bucket", "hose", "basket", "shears", "ladder"),
    "place": ("shed", "pond", "lawn", "hedge", "orchard", "path", "wall", "gate", "meadow",
              "greenhouse"),
}
ANIMATE = ("beast", "bird", "person")
COLOURED = ("beast", "bird", "plant", "tool")  # people and places have no colour here

COLOURS = ("red", "blue", "green", "yellow", "white", "brown", "black", "purple")
ADJECTIVES: dict[str, tuple[str, ...]] = {  # non-colour adjectives each kind may take
    "beast": ("small", "big", "old", "happy", "sleepy", "hungry"),
    "bird": ("small", "big", "old", "happy", "sleepy", "hungry"),
    "person": ("old", "young", "happy", "tired"),
    "plant": ("small", "big", "tall", "young", "fresh"),
    "tool": ("small", "big", "old", "new", "rusty", "heavy"),
    "place": ("small", "big", "old", "quiet", "wet"),
}
PREPOSITIONS = ("in", "on", "near", "behind", "beside", "under", "by")

# (base form, third person, subject kinds, object kinds)
TRANSITIVE: tuple[tuple[str, str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("eat", "eats", ("beast", "bird"), ("plant",)),
    ("chase", "chases", ("beast", "bird"), ("beast", "bird")),
    ("see", "sees", ANIMATE, ("beast", "bird", "plant", "tool")),
    ("watch", "watches", ANIMATE, ("beast", "bird", "person")),
    ("find", "finds", ANIMATE, ("beast", "bird", "plant", "tool")),
    ("like", "likes", ANIMATE, ("beast", "bird", "plant")),
    ("smell", "smells", ANIMATE, ("plant",)),
    ("follow", "follows", ANIMATE, ("beast", "bird", "person")),
    ("water", "waters", ("person",), ("plant",)),
    ("plant", "plants", ("person",), ("plant",)),
    ("cut", "cuts", ("person",), ("plant",)),
    ("pick", "picks", ("person",), ("plant",)),
    ("carry", "carries", ("person",), ("tool",)),
    ("use", "uses", ("person",), ("tool",)),
    ("clean", "cleans", ("person",), ("tool",)),
    ("fix", "fixes", ("person",), ("tool",)),
    ("dig", "digs", ("beast", "person"), ("place",)),
)
INTRANSITIVE: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("sleeps", ANIMATE), ("runs", ("beast", "person")), ("sings", ("bird", "person")),
    ("flies", ("bird",)), ("swims", ("beast", "bird")), ("hides", ("beast", "bird")),
    ("waits", ANIMATE), ("rests", ANIMATE), ("grows", ("plant",)), ("blooms", ("plant",)),
)
WEATHER = ("sunny", "rainy", "windy", "cold", "warm", "cloudy", "foggy")
WEATHER_EVENT = {  # a weather state that also has a "the X verbs" sentence
    "sunny": ("the", "sun", "shines"), "rainy": ("the", "rain", "falls"),
    "windy": ("the", "wind", "blows"),
}
FUNCTION_WORDS = ("the", "a", "an", "it", "is", "and", "but", "because", "then", "today",
                  "where", "what", "colour", "does", "not", "yes", "no")

_KIND_OF: dict[str, str] = {n: k for k, ns in NOUNS.items() for n in ns}
_TOKEN_RE = re.compile(r"[a-z']+|[.,?]|<[a-z]+>")


def _vocab_words() -> tuple[str, ...]:
    """Every word the grammar can write, in a fixed order (specials first)."""
    words: list[str] = [*SPECIALS, *PUNCT, *FUNCTION_WORDS, *PREPOSITIONS, *COLOURS,
                        *WEATHER]
    for group in NOUNS.values():
        words += group
    for adjs in ADJECTIVES.values():
        words += adjs
    for base, third, _, _ in TRANSITIVE:
        words += (base, third)
    words += (v for v, _ in INTRANSITIVE)
    for event in WEATHER_EVENT.values():
        words += event
    return tuple(dict.fromkeys(words))  # dedupe, keep first position


@dataclass(frozen=True)
class Vocab:
    """A word-level vocabulary: ``words[i]`` is the word of id ``i``.

    Ids 0, 1, 2, 3 are pad, bos, eos, unk. Words are lower case; ``.``, ``,`` and ``?``
    are tokens of their own.
    """

    words: tuple[str, ...]

    def __post_init__(self) -> None:
        if self.words[: len(SPECIALS)] != SPECIALS:
            raise SpecError("vocab", self.words[: len(SPECIALS)],
                            f"must start with {', '.join(SPECIALS)}")
        if len(set(self.words)) != len(self.words):
            raise SpecError("vocab", len(self.words), "words must be distinct")

    @cached_property
    def _index(self) -> dict[str, int]:
        return {w: i for i, w in enumerate(self.words)}

    @property
    def pad(self) -> int:
        """Id of the padding token (0)."""
        return 0

    @property
    def bos(self) -> int:
        """Id of the beginning-of-document token (1)."""
        return 1

    @property
    def eos(self) -> int:
        """Id of the end-of-document token (2)."""
        return 2

    @property
    def unk(self) -> int:
        """Id of the unknown-word token (3)."""
        return 3

    @property
    def size(self) -> int:
        """Number of ids (the model's vocab)."""
        return len(self.words)

    def encode(self, text: str) -> list[int]:
        """Ids of the words and punctuation in ``text`` (case-folded; unknown words -> unk).

        No bos/eos is added.
        """
        return [self._index.get(t, self.unk) for t in _TOKEN_RE.findall(text.lower())]

    def decode(self, ids: Iterable[int]) -> str:
        """The text of ``ids``: pad, bos and eos dropped, unk shown as ``<unk>``,
        punctuation attached to the word before it."""
        out: list[str] = []
        for i in ids:
            i = int(i)
            if not 0 <= i < self.size:
                raise SpecError("ids", i, f"must be in [0, {self.size})")
            if i in (self.pad, self.bos, self.eos):
                continue
            word = self.words[i]
            if word in PUNCT and out:
                out[-1] += word
            else:
                out.append(word)
        return " ".join(out)


def garden_vocab() -> Vocab:
    """The garden language's vocabulary (fixed; the same for every seed)."""
    return Vocab(_vocab_words())


class _Writer:
    """Writes one document; remembers each thing's colour and place so they stay put."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.weather = rng.choice(WEATHER)
        self.colour: dict[str, str] = {}
        self.place: dict[str, tuple[str, str]] = {}
        self.food: dict[str, str] = {}
        self.facts: dict[tuple[str, str, str], bool] = {}

    # -- noun phrases --
    def noun(self, kinds: tuple[str, ...]) -> str:
        return self.rng.choice(NOUNS[self.rng.choice(kinds)])

    def colour_of(self, noun: str) -> str:
        return self.colour.setdefault(noun, self.rng.choice(COLOURS))

    def place_of(self, noun: str) -> tuple[str, str]:
        return self.place.setdefault(noun, (self.rng.choice(PREPOSITIONS),
                                            self.rng.choice(NOUNS["place"])))

    def phrase(self, noun: str) -> list[str]:
        """'the [adjective] [colour] noun' (or 'a'/'an' now and then)."""
        kind = _KIND_OF[noun]
        words: list[str] = []
        if self.rng.random() < 0.3:
            words.append(self.rng.choice(ADJECTIVES[kind]))
        if kind in COLOURED and self.rng.random() < 0.35:
            words.append(self.colour_of(noun))
        words.append(noun)
        if self.rng.random() < 0.2:
            return ["an" if words[0][0] in "aeiou" else "a", *words]
        return ["the", *words]

    def where(self, noun: str) -> list[str]:
        prep, place = self.place_of(noun)
        return [prep, "the", place]

    # -- clauses (no final punctuation) --
    def transitive(self) -> list[str]:
        _, third, subj_kinds, obj_kinds = self.rng.choice(TRANSITIVE)
        subj, obj = self.noun(subj_kinds), self.noun(obj_kinds)
        while obj == subj:
            obj = self.noun(obj_kinds)
        if third == "eats":
            self.food.setdefault(subj, obj)
        words = [*self.phrase(subj), third, *self.phrase(obj)]
        if _KIND_OF[obj] != "place" and self.rng.random() < 0.4:
            words += self.where(obj)
        return words

    def intransitive(self) -> list[str]:
        verb, kinds = self.rng.choice(INTRANSITIVE)
        subj = self.noun(kinds)
        words = [*self.phrase(subj), verb]
        if self.rng.random() < 0.5:
            words += self.where(subj)
        return words

    def description(self) -> list[str]:
        kind = self.rng.choice(tuple(NOUNS))
        noun = self.rng.choice(NOUNS[kind])
        if kind in COLOURED and self.rng.random() < 0.5:
            return ["the", noun, "is", self.colour_of(noun)]
        if kind == "place":
            return ["the", noun, "is", self.rng.choice(ADJECTIVES["place"])]
        return ["the", noun, "is", *self.where(noun)]

    def weather_clause(self) -> list[str]:
        if self.weather in WEATHER_EVENT and self.rng.random() < 0.5:
            return list(WEATHER_EVENT[self.weather])
        return ["it", "is", self.weather]

    def clause(self) -> list[str]:
        r = self.rng.random()
        if r < 0.4:
            return self.transitive()
        if r < 0.7:
            return self.intransitive()
        if r < 0.9:
            return self.description()
        return self.weather_clause()

    # -- sentences (with punctuation) --
    def question(self) -> list[str]:
        """A question and its answer, consistent with what this document has said."""
        r = self.rng.random()
        if r < 0.3:
            noun = self.noun(("beast", "bird", "tool"))
            return ["where", "is", "the", noun, "?", "the", noun, "is", *self.where(noun), "."]
        if r < 0.55:
            noun = self.noun(("beast", "bird", "plant", "tool"))
            return ["what", "colour", "is", "the", noun, "?",
                    "the", noun, "is", self.colour_of(noun), "."]
        if r < 0.75:
            noun = self.noun(("beast", "bird"))
            food = self.food.setdefault(noun, self.rng.choice(NOUNS["plant"]))
            return ["what", "does", "the", noun, "eat", "?", "the", noun, "eats", "the", food,
                    "."]
        if r < 0.88:
            return self.yes_no()
        asked = self.rng.choice(WEATHER)
        if asked == self.weather:
            return ["is", "it", asked, "?", "yes", ",", "it", "is", asked, "."]
        return ["is", "it", asked, "?", "no", ",", "it", "is", self.weather, "."]

    def yes_no(self) -> list[str]:
        """'does the S <verb> the O ?' and a yes or no answer (said once, kept after)."""
        base, third, subj_kinds, obj_kinds = self.rng.choice(TRANSITIVE)
        subj, obj = self.noun(subj_kinds), self.noun(obj_kinds)
        while obj == subj:
            obj = self.noun(obj_kinds)
        yes = self.facts.setdefault((subj, base, obj), self.rng.random() < 0.5)
        answer = (["yes", ",", "the", subj, third, "the", obj] if yes
                  else ["no", ",", "the", subj, "does", "not", base, "the", obj])
        return ["does", "the", subj, base, "the", obj, "?", *answer, "."]

    def sentence(self) -> list[str]:
        r = self.rng.random()
        if r < 0.15:
            return self.question()
        if r < 0.25:
            # a weather clause as the cause only: "it is cold because it is cold" is no sentence
            return [*self.rng.choice((self.transitive, self.intransitive))(), "because",
                    *self.weather_clause(), "."]
        if r < 0.4:
            return [*self.clause(), self.rng.choice(("and", "but")), *self.clause(), "."]
        if r < 0.45:
            return ["then", *self.clause(), "."]
        if r < 0.5:
            return ["today", *self.weather_clause(), "."]
        return [*self.clause(), "."]


def _document_words(rng: random.Random) -> list[str]:
    """Sentences until a drawn length budget (tokens, bos/eos included) would be passed.

    The budget is uniform in [MIN_BUDGET, MAX_DOC_TOKENS], so lengths spread widely; the
    first sentence is always kept (a sentence is far shorter than MAX_DOC_TOKENS - 2).
    """
    writer = _Writer(rng)
    budget = rng.randint(MIN_BUDGET, MAX_DOC_TOKENS) - 2  # room for bos and eos
    words = writer.sentence()
    misses = 0
    while misses < 3:  # a few tries to fill the budget with shorter sentences
        nxt = writer.sentence()
        if len(words) + len(nxt) <= budget:
            words += nxt
        else:
            misses += 1
    return words


def garden_documents(n_docs: int, seed: int = 0) -> list[list[int]]:
    """``n_docs`` garden documents as id lists ``[bos] + words + [eos]``.

    Lengths (in tokens, bos and eos included) lie in about [6, 60]. The same ``seed``
    gives identical output; only a private ``random.Random(seed)`` is used.
    """
    require_nonnegative_int("n_docs", n_docs)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise SpecError("seed", seed, "must be an integer")
    vocab = garden_vocab()
    index = {w: i for i, w in enumerate(vocab.words)}
    rng = random.Random(seed)
    return [[vocab.bos, *(index[w] for w in _document_words(rng)), vocab.eos]
            for _ in range(n_docs)]
