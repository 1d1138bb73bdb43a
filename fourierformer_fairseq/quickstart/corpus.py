"""A synthetic parallel corpus with real translation structure, made offline from a seed.

The source side is a small English fragment; the target side ("Fourieran", language code
``fx``) is an invented language that differs from it in the ways natural languages do:

* lexicon: every English word maps to an invented stem (``cat`` -> ``mizo``);
* word order: subject - object - verb (English is subject - verb - object), adjectives after
  the noun and in mirrored order, postpositions instead of prepositions, negation before the verb;
* agreement: nouns have a gender; determiners and adjectives agree with the gender and number of
  their noun (``the big cat`` -> ``la mizo grandela``, ``the big cats`` -> ``li mizoi grandeli``);
  the verb agrees with the number of the subject and carries the tense as a suffix, while
  English marks tense with ``did`` / ``will`` or a past form and number on the present only.

So a model has to learn a bilingual lexicon, long-distance reordering (the verb moves past the
whole object phrase) and agreement that depends on words several positions away; a model
that copies or translates word by word scores low. Sentences are 3 to ~20 words.

    from fourierformer_fairseq.quickstart.corpus import write_corpus
    write_corpus("corpus/", train=20000, valid=400, test=400, seed=1)

writes ``{train,valid,test}.{en,fx}`` (one sentence per line, space-tokenised), with no
test or valid sentence occurring in train.
"""
from __future__ import annotations

import os
import random
from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

SOURCE_LANG = "en"
TARGET_LANG = "fx"

NOUNS = [
    "cat", "dog", "bird", "horse", "farmer", "teacher", "child", "king", "queen", "doctor", "student",
    "baker", "fox", "wolf", "girl", "boy", "sailor", "painter", "lion", "mouse", "soldier", "singer",
    "judge", "rabbit",
]
IRREGULAR_PLURALS = {"child": "children", "mouse": "mice", "wolf": "wolves", "fox": "foxes"}
PLACES = ["garden", "house", "forest", "city", "river", "market", "school", "castle", "village", "bridge"]
ADJECTIVES = [
    "big", "small", "old", "young", "happy", "sad", "red", "black", "white", "quick", "lazy", "clever",
    "brave", "tired",
]
# verb: (3rd person singular present, plural present, past)
VERBS = {
    "see": ("sees", "see", "saw"),
    "like": ("likes", "like", "liked"),
    "follow": ("follows", "follow", "followed"),
    "find": ("finds", "find", "found"),
    "help": ("helps", "help", "helped"),
    "call": ("calls", "call", "called"),
    "watch": ("watches", "watch", "watched"),
    "feed": ("feeds", "feed", "fed"),
    "paint": ("paints", "paint", "painted"),
    "visit": ("visits", "visit", "visited"),
    "meet": ("meets", "meet", "met"),
    "chase": ("chases", "chase", "chased"),
}
PREPOSITIONS = ["in", "near", "behind", "under", "beside"]

# target morphology
DEFINITE = {("m", "sg"): "lo", ("f", "sg"): "la", ("m", "pl"): "li", ("f", "pl"): "le"}
INDEFINITE = {("m", "sg"): "un", ("f", "sg"): "una", ("m", "pl"): "alki", ("f", "pl"): "alke"}
ADJECTIVE_SUFFIX = {("m", "sg"): "o", ("f", "sg"): "ela", ("m", "pl"): "i", ("f", "pl"): "eli"}
NOUN_PLURAL_SUFFIX = "i"
VERB_SUFFIX = {("present", "sg"): "a", ("present", "pl"): "an", ("past", "sg"): "eto",
               ("past", "pl"): "eton", ("future", "sg"): "ira", ("future", "pl"): "iran"}
NEGATION = "ne"

_ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "tr", "gl", "sk"]
_VOWELS = ["a", "e", "i", "o", "u"]


def _invent_stems(words: Sequence[str], rng: random.Random, reserved: set) -> Dict[str, str]:
    """A distinct invented stem (two or three CV syllables) per word."""
    stems = {}
    for word in words:
        while True:
            stem = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(rng.choice((2, 2, 3))))
            if stem not in reserved:
                break
        reserved.add(stem)
        stems[word] = stem
    return stems


@dataclass
class NounPhrase:
    noun: str
    number: str  # "sg" / "pl"
    definite: bool
    adjectives: List[str]


class Grammar:
    """The two languages: a random lexicon (fixed by ``seed``) and the rules above."""

    def __init__(self, seed: int = 1):
        rng = random.Random(f"fourieran-lexicon-{seed}")
        reserved = set(DEFINITE.values()) | set(INDEFINITE.values()) | {NEGATION}
        self.noun_stem = _invent_stems(NOUNS + PLACES, rng, reserved)
        self.gender = {noun: rng.choice(("m", "f")) for noun in NOUNS + PLACES}
        self.adjective_stem = _invent_stems(ADJECTIVES, rng, reserved)
        self.verb_stem = _invent_stems(list(VERBS), rng, reserved)
        self.postposition = _invent_stems(PREPOSITIONS, rng, reserved)

    # ---------------------------------------------------------------- sampling

    def sample_noun_phrase(self, rng: random.Random, nouns: Sequence[str], max_adjectives: int) -> NounPhrase:
        k = rng.choices(range(max_adjectives + 1), weights=[5, 4, 2, 1][: max_adjectives + 1])[0]
        return NounPhrase(
            noun=rng.choice(nouns),
            number=rng.choice(("sg", "sg", "pl")),
            definite=rng.random() < 0.6,
            adjectives=rng.sample(ADJECTIVES, k),
        )

    def sample(self, rng: random.Random) -> Tuple[str, str]:
        """One (English, Fourieran) sentence pair."""
        subject = self.sample_noun_phrase(rng, NOUNS, 2)
        obj = self.sample_noun_phrase(rng, NOUNS, 2)
        verb = rng.choice(list(VERBS))
        tense = rng.choices(("present", "past", "future"), weights=(3, 2, 1))[0]
        negated = rng.random() < 0.2
        place = None
        if rng.random() < 0.4:
            place = (rng.choice(PREPOSITIONS), self.sample_noun_phrase(rng, PLACES, 1))
        return self.english(subject, verb, tense, negated, obj, place), \
            self.fourieran(subject, verb, tense, negated, obj, place)

    # ---------------------------------------------------------------- English

    @staticmethod
    def _english_np(np_: NounPhrase) -> List[str]:
        if np_.number == "sg":
            det = "the" if np_.definite else ("an" if (np_.adjectives or [np_.noun])[0][0] in "aeiou" else "a")
            noun = np_.noun
        else:
            det = "the" if np_.definite else "some"
            noun = IRREGULAR_PLURALS.get(np_.noun, np_.noun + "s")
        return [det] + np_.adjectives + [noun]

    def english(self, subject, verb, tense, negated, obj, place) -> str:
        sg3, plural, past = VERBS[verb]
        if tense == "present":
            if negated:
                verb_words = ["does" if subject.number == "sg" else "do", "not", verb]
            else:
                verb_words = [sg3 if subject.number == "sg" else plural]
        elif tense == "past":
            verb_words = ["did", "not", verb] if negated else [past]
        else:
            verb_words = ["will", "not", verb] if negated else ["will", verb]
        words = self._english_np(subject) + verb_words + self._english_np(obj)
        if place is not None:
            words += [place[0]] + self._english_np(place[1])
        return " ".join(words)

    # ---------------------------------------------------------------- Fourieran

    def _fourieran_np(self, np_: NounPhrase) -> List[str]:
        agreement = (self.gender[np_.noun], np_.number)
        det = (DEFINITE if np_.definite else INDEFINITE)[agreement]
        noun = self.noun_stem[np_.noun] + (NOUN_PLURAL_SUFFIX if np_.number == "pl" else "")
        adjectives = [self.adjective_stem[a] + ADJECTIVE_SUFFIX[agreement] for a in reversed(np_.adjectives)]
        return [det, noun] + adjectives

    def fourieran(self, subject, verb, tense, negated, obj, place) -> str:
        words = self._fourieran_np(subject)
        if place is not None:
            words += self._fourieran_np(place[1]) + [self.postposition[place[0]]]
        words += self._fourieran_np(obj)
        words += ([NEGATION] if negated else []) + [self.verb_stem[verb] + VERB_SUFFIX[(tense, subject.number)]]
        return " ".join(words)


def make_splits(train: int, valid: int, test: int, seed: int = 1) -> Dict[str, List[Tuple[str, str]]]:
    """Train / valid / test sentence pairs; test and valid sentences are distinct and never occur in train."""
    for name, n in (("train", train), ("valid", valid), ("test", test)):
        if n < 1:
            raise ValueError(f"the {name} split needs at least one sentence, got {n}")
    grammar = Grammar(seed)
    rng = random.Random(f"fourieran-sentences-{seed}")
    held_out = set()
    splits: Dict[str, List[Tuple[str, str]]] = {}
    for name, n in (("test", test), ("valid", valid), ("train", train)):
        pairs: List[Tuple[str, str]] = []
        for _ in range(100 * n + 1000):
            if len(pairs) == n:
                break
            pair = grammar.sample(rng)
            if pair[0] in held_out:
                continue
            if name != "train":
                held_out.add(pair[0])
            pairs.append(pair)
        else:
            raise RuntimeError(f"could not draw {n} {name} sentences")
        splits[name] = pairs
    return splits


def write_corpus(out_dir: str, train: int = 20000, valid: int = 400, test: int = 400, seed: int = 1) -> Dict[str, str]:
    """Writes {train,valid,test}.{en,fx} into out_dir; returns {split: path prefix}."""
    os.makedirs(out_dir, exist_ok=True)
    prefixes = {}
    for name, pairs in make_splits(train, valid, test, seed).items():
        prefix = os.path.join(out_dir, name)
        with open(f"{prefix}.{SOURCE_LANG}", "w", encoding="utf-8") as src, \
                open(f"{prefix}.{TARGET_LANG}", "w", encoding="utf-8") as tgt:
            for s, t in pairs:
                src.write(s + "\n")
                tgt.write(t + "\n")
        prefixes[name] = prefix
    return prefixes
